"""A line's place in a job's total order, the same for `rootrank diagnose` and the stream.

The engine orders a job's signals by time, then by `order`: lines of one file by their position in it,
lines of different files by their file. `diagnose` knows every file of a job; the stream sees a file's
batches one by one among other hosts' and cannot number the files. So a file is placed by a key both
can compute from the file alone, whatever way its path was written: its name (the last part of its
path), what its path says by convention (`identity_from_path`: torchrun's `attempt_0/3/`, a host's
folder, `rank3.log`) and its first line. Within a file, any position that grows with the line does
(`diagnose` uses the byte offset, a shipped batch the line number): only the order of lines of one
file is compared.

Two files with the same name, path conventions and first line get the same key (rare); their lines are
then ordered by position only, which may differ between the paths when their times are equal.
"""

from __future__ import annotations

import zlib
from pathlib import PurePath

from ingest.prefixes import identity_from_path

FILE_KEY_BITS = 22
POSITION_BITS = 40  # a position (byte offset, line number) below 1 TiB
_KEY_MASK = (1 << FILE_KEY_BITS) - 1
_POSITION_MASK = (1 << POSITION_BITS) - 1


def file_key(name: str, first_line: str) -> int:
    """The key of a file at path `name` whose first line is `first_line`."""
    basename = PurePath(name).name if name else ""
    hints = sorted(identity_from_path(name).items()) if name else []
    data = f"{basename}\n{hints}\n{first_line.rstrip(chr(13))}".encode("utf-8", "replace")
    return zlib.crc32(data) & _KEY_MASK


def first_line_of(head: bytes) -> str:
    """The first line of a file from its first bytes (without its newline)."""
    end = head.find(b"\n")
    return (head if end < 0 else head[:end]).decode("utf-8", "replace")


def record_key(file: str | None, host: str | None) -> int:
    """The key of a forwarder's stream (Fluent Bit, Vector, Filebeat, rsyslog send a line per message):
    the file and host its records name, the same for the forwarder's messages on Kafka and for a file
    of them given to `rootrank diagnose`."""
    return zlib.crc32(f"{file or ''}\n{host or ''}".encode("utf-8", "replace")) & _KEY_MASK


def message_position(message: int, index: int) -> int:
    """The position of the `index`-th record of a forwarder's message at `message` (its Kafka offset, or its
    line in a file of such messages), for records that carry no position of their own (Filebeat's
    log.offset is one): messages of one stream arrive in order, whichever partition holds them."""
    return (message << 8) | min(index, 255)


def line_order(key: int, position: int) -> int:
    """The order of the line at `position` of the file whose key is `key` (below 2**62)."""
    return (key << POSITION_BITS) | (position & _POSITION_MASK)


def key_of_order(order: int) -> int:
    return order >> POSITION_BITS


def position_of_order(order: int) -> int:
    return order & _POSITION_MASK
