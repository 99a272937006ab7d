"""The streams the shipper reads (`Source`), what their readers hand on (`Chunk`), and the queue
between the readers and the batcher (`ChunkQueue`), which spills pipes' chunks to disk when behind."""

from __future__ import annotations

import collections
import contextlib
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ingest.order import file_key, first_line_of
from ingest.prefixes import sniff_srun_labels
from ingest.ship.spool import Spool


@dataclass
class Source:
    """One stream of lines: a followed file, stdin, or one pipe of the wrapped command."""

    id: int
    name: str  # file path, "stdin", "stdout" or "stderr"
    stream: str | None = None
    file: str | None = None
    pid: int | None = None
    carry: bytes = b""
    next_line: int = 0  # line number (in this stream) of the next line
    # Followed files: where the next unsent line starts, and which inode that is in.
    inode: int | None = None
    pos: int = 0
    # The last lines read before `next_line` (at most CONTEXT_LINES): a batch's context (wire_format.py).
    recent: list[str] = field(default_factory=list)
    # The stream's place among a job's files (ingest/order.py), from its name and first line; None until
    # that line is read (`fresh`: the next lines read start the stream, or a rotated file's new generation).
    key: int | None = None
    fresh: bool = True
    # How the stream's `srun -l` labels read ("node": a launcher per node), from its first lines, as
    # `rootrank diagnose` reads a file's head (ingest.prefixes.sniff_srun_labels); None: per rank.
    srun_labels: str | None = None

    def note_head(self, head: bytes) -> None:
        """What the stream's first bytes say before its lines are read (the runner reads a file's head before
        the shipping process forks): its place among the job's files and its `srun -l` reading."""
        if b"\n" in head:
            self.key = file_key(self.file or self.name, first_line_of(head))
            self.srun_labels = srun_labels_of(head.decode("utf-8", "replace").splitlines())
            self.fresh = False


@dataclass(slots=True)
class Chunk:
    source_id: int
    data: bytes
    read_ts: float | None  # None: bytes that were in the file before we started (time unknown)
    end_pos: int | None = None  # file position after `data`
    inode: int | None = None
    eof: bool = False  # end of this stream (or of one file generation): the carry is a last line


_CHUNK_HEADER = struct.Struct(">HdqQ?")


def _pack_chunk(chunk: Chunk) -> bytes:
    return _CHUNK_HEADER.pack(
        chunk.source_id,
        chunk.read_ts if chunk.read_ts is not None else -1.0,
        chunk.end_pos if chunk.end_pos is not None else -1,
        chunk.inode or 0,
        chunk.eof,
    ) + chunk.data


def _unpack_chunk(raw: bytes) -> Chunk:
    source_id, ts, end_pos, inode, eof = _CHUNK_HEADER.unpack_from(raw)
    return Chunk(source_id, raw[_CHUNK_HEADER.size :], None if ts < 0 else ts, None if end_pos < 0 else end_pos,
                 inode or None, eof)


class ChunkQueue:
    """FIFO between the readers and the batcher (in the parent: the forwarder to the shipping process).

    Two ways in. `put`, for pipes (a wrapped command's output, stdin), never blocks: past
    `max_bytes` in memory, chunks go to a disk file (and keep going there until the batcher caught
    up, to stay in order); past that file's bound (--spool-max-mib) they are dropped, counted, and
    said on stderr at once. `put_file`, for files, waits for room in memory instead: a file keeps
    its lines on disk anyway, so reading it simply pauses while the shipper is behind."""

    def __init__(self, max_bytes: int, overflow_dir: Path, overflow_max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: collections.deque[Chunk] = collections.deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._overflow_dir = overflow_dir
        self._overflow_max = overflow_max_bytes
        self._overflow: Spool | None = None
        self.dropped_bytes = 0
        self.dropped_chunks = 0
        self.dropped_lines = 0  # newlines in the dropped bytes: about the lines lost
        self.waits = 0  # times a file reader waited for room
        self._consumer_gone = False  # the forwarder failed (the shipping process is gone): nobody makes room

    def _overflowing(self) -> bool:
        return self._overflow is not None and len(self._overflow) > 0

    def put(self, chunk: Chunk) -> None:
        with self._lock:
            if not self._overflowing() and self._bytes + len(chunk.data) <= self.max_bytes:
                self._items.append(chunk)
                self._bytes += len(chunk.data)
            else:
                if self._overflow is None:
                    self._overflow = Spool(self._overflow_dir, self._overflow_max)
                if not self._overflow.append(_pack_chunk(chunk)):
                    self._drop(chunk)
            self._not_empty.notify()

    def _drop(self, chunk: Chunk) -> None:
        first = not self.dropped_chunks
        self.dropped_bytes += len(chunk.data)
        self.dropped_chunks += 1
        self.dropped_lines += chunk.data.count(b"\n")
        if first:
            with contextlib.suppress(OSError, ValueError):
                print(f"rootrank ship: WARNING: shipping fell behind and the overflow file in {self._overflow_dir} "
                      f"is full (--spool-max-mib {self._overflow_max / 2**20:g}): output is being DROPPED, not "
                      "shipped, until it catches up; raise --spool-max-mib (disk permitting) or make Kafka faster",
                      file=sys.stderr, flush=True)

    def put_file(self, chunk: Chunk, stop: threading.Event | None, poll_s: float = 0.2) -> bool:
        """Queue a file's chunk in memory, waiting (in steps of `poll_s`) while the queue is full.
        False, the chunk not queued, once `stop` is set while waiting. `stop` None: no wait, over the
        bound if need be (one chunk, when a reader ends)."""
        with self._lock:
            waited = False
            while stop is not None and (self._overflowing()
                                        or (self._bytes and self._bytes + len(chunk.data) > self.max_bytes)):
                if stop.is_set() or self._consumer_gone:
                    return False
                if not waited:
                    self.waits += 1
                    waited = True
                self._not_full.wait(poll_s)
            self._items.append(chunk)
            self._bytes += len(chunk.data)
            self._not_empty.notify()
            return True

    def get(self, timeout: float) -> Chunk | None:
        with self._lock:
            if not self._items and not self._overflowing():
                self._not_empty.wait(timeout)
            if self._items:
                chunk = self._items.popleft()
                self._bytes -= len(chunk.data)
                self._not_full.notify_all()
                return chunk
            if self._overflowing():
                assert self._overflow is not None
                raw = self._overflow.peek()
                self._overflow.pop()
                if not len(self._overflow):
                    self._not_full.notify_all()
                return _unpack_chunk(raw) if raw is not None else None
            return None

    def consumer_gone(self) -> None:
        """Nobody will take chunks any more: a file reader waiting for room gives up."""
        with self._lock:
            self._consumer_gone = True
            self._not_full.notify_all()

    def close(self) -> None:
        if self._overflow is not None:
            self._overflow.close()


SNIFF_BYTES = 65536  # the head of a stream its `srun -l` reading is taken from (as `rootrank diagnose` reads it)


def srun_labels_of(first_lines: list[str]) -> str | None:
    """A stream's `srun -l` reading from its lines in its first SNIFF_BYTES: "node" when they show a launcher
    per node."""
    head: list[str] = []
    size = 0
    for line in first_lines:
        if size >= SNIFF_BYTES:
            break
        head.append(line)
        size += len(line) + 1
    return "node" if sniff_srun_labels(head) == "node" else None

