"""The rootrank shipper's wire format: the single source of truth for both ends.

One Kafka message carries a batch of lines from ONE stream of ONE process (a rank's log file,
a container's stderr), so identity is sent once per batch, not once per line:

    {
      "v": 1,                         # format version; decoders reject versions they do not know
      "source": "rootrank",           # marks the format (forwarder JSON never has it)
      "job_id": "llama70b-run7",      # optional: the job, when the shipper knows it
      "host": "node17",               # optional: the machine the lines were read on
      "rank": 11,                     # optional: global rank (RANK), when one process writes the stream
      "local_rank": 3,                # optional: LOCAL_RANK
      "pid": 52113,                   # optional
      "attempt": 0,                   # optional: restart count (TORCHELASTIC_RESTART_COUNT)
      "file": "/logs/rank11.log",     # optional: the path the lines were read from
      "labels": {"team": "llm"},      # optional: string -> string
      "offset": 5120,                 # optional: line number of lines[0] in its stream (0-based), so
                                      #   every line has a stable position: a re-sent batch decodes
                                      #   to the same events, and order survives equal timestamps
      "lines": [                      # required, at least one
        [1714564800.123456, "stderr", "text of one line, without the newline"],
        [null, null, "a line whose time and stream are unknown"]
      ]
    }

Each line is `[ts, stream, text]`: `ts` is epoch seconds (float) when the shipper read the
line, or null; `stream` is "stdout"/"stderr"/null. Optional keys may be absent or null.
Keep a message under `MAX_BATCH_BYTES` (Kafka's default message.max.bytes is 1 MB):
`encode_batches` splits a long list of lines accordingly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "MAX_BATCH_BYTES",
    "SHIP_FORMAT_VERSION",
    "SHIP_SOURCE",
    "ShipBatch",
    "ShipFormatError",
    "encode_batch",
    "encode_batches",
    "is_ship_batch",
    "parse_batch",
]

SHIP_FORMAT_VERSION = 1
SHIP_SOURCE = "rootrank"
MAX_BATCH_BYTES = 900_000

ShipLine = tuple[float | None, str | None, str]


class ShipFormatError(ValueError):
    """A batch that claims to be rootrank's format but is not valid. `reason` is machine-friendly."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(slots=True)
class ShipBatch:
    lines: list[ShipLine]
    job_id: str | None = None
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    attempt: int | None = None
    file: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    offset: int | None = None


def _header(
    job_id: str | None,
    host: str | None,
    rank: int | None,
    local_rank: int | None,
    pid: int | None,
    attempt: int | None,
    file: str | None,
    labels: Mapping[str, str] | None,
    offset: int | None = None,
) -> dict[str, Any]:
    header: dict[str, Any] = {"v": SHIP_FORMAT_VERSION, "source": SHIP_SOURCE}
    for key, value in (
        ("job_id", job_id),
        ("host", host),
        ("rank", rank),
        ("local_rank", local_rank),
        ("pid", pid),
        ("attempt", attempt),
        ("file", file),
        ("offset", offset),
    ):
        if value is not None:
            header[key] = value
    if labels:
        header["labels"] = {str(k): str(v) for k, v in labels.items()}
    return header


def encode_batch(
    lines: Sequence[ShipLine],
    *,
    job_id: str | None = None,
    host: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    pid: int | None = None,
    attempt: int | None = None,
    file: str | None = None,
    labels: Mapping[str, str] | None = None,
    offset: int | None = None,
) -> bytes:
    """One Kafka message value holding `lines` ([ts, stream, text] each) and their identity."""
    if not lines:
        raise ValueError("a batch needs at least one line")
    body = _header(job_id, host, rank, local_rank, pid, attempt, file, labels, offset)
    body["lines"] = [[ts, stream, text] for ts, stream, text in lines]
    return orjson.dumps(body)


def encode_batches(
    lines: Iterable[ShipLine],
    *,
    max_bytes: int = MAX_BATCH_BYTES,
    job_id: str | None = None,
    host: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    pid: int | None = None,
    attempt: int | None = None,
    file: str | None = None,
    labels: Mapping[str, str] | None = None,
    offset: int | None = None,
) -> list[bytes]:
    """Like `encode_batch`, split into as many messages as needed to stay under `max_bytes`.

    A single line bigger than the limit is cut (the decoder flags over-long lines anyway).
    """
    header = _header(job_id, host, rank, local_rank, pid, attempt, file, labels, offset)
    overhead = len(orjson.dumps(header)) + len(',"lines":[]') + (24 if offset is not None else 0)
    sent = 0  # lines already in earlier messages (advances `offset` per message)
    budget = max(max_bytes - overhead, 256)
    out: list[bytes] = []
    chunk: list[list[Any]] = []
    size = 0
    for ts, stream, text in lines:
        item = [ts, stream, text]
        item_size = len(orjson.dumps(item)) + 1
        if item_size > budget:
            keep = max(budget - 64, 1)
            item = [ts, stream, text.encode("utf-8")[:keep].decode("utf-8", "ignore")]
            item_size = len(orjson.dumps(item)) + 1
        if chunk and size + item_size > budget:
            out.append(orjson.dumps(_with_offset(header, offset, sent) | {"lines": chunk}))
            sent += len(chunk)
            chunk, size = [], 0
        chunk.append(item)
        size += item_size
    if chunk:
        out.append(orjson.dumps(_with_offset(header, offset, sent) | {"lines": chunk}))
    return out


def _with_offset(header: dict[str, Any], offset: int | None, sent: int) -> dict[str, Any]:
    return header if offset is None else {**header, "offset": offset + sent}


def is_ship_batch(obj: Mapping[str, Any]) -> bool:
    return obj.get("source") == SHIP_SOURCE and "lines" in obj


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ShipFormatError("bad_field", key)


def _opt_int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise ShipFormatError("bad_field", key)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ShipFormatError("bad_field", key)


def parse_batch(obj: Mapping[str, Any]) -> ShipBatch:
    """Validate a decoded JSON object in this format. Raises ShipFormatError(reason)."""
    version = obj.get("v", SHIP_FORMAT_VERSION)
    if version != SHIP_FORMAT_VERSION:
        raise ShipFormatError("unsupported_version", repr(version))
    raw_lines = obj.get("lines")
    if not isinstance(raw_lines, list):
        raise ShipFormatError("bad_field", "lines")
    lines: list[ShipLine] = []
    for item in raw_lines:
        if not isinstance(item, list) or len(item) != 3:
            raise ShipFormatError("bad_field", "lines[]")
        ts, stream, text = item
        if not isinstance(text, str):
            raise ShipFormatError("bad_field", "lines[].text")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
            raise ShipFormatError("bad_field", "lines[].ts")
        if stream is not None and not isinstance(stream, str):
            raise ShipFormatError("bad_field", "lines[].stream")
        lines.append((float(ts) if ts is not None else None, stream or None, text))
    labels_obj = obj.get("labels")
    labels: dict[str, str] = {}
    if isinstance(labels_obj, dict):
        labels = {str(k): str(v) for k, v in labels_obj.items() if v is not None}
    elif labels_obj is not None:
        raise ShipFormatError("bad_field", "labels")
    return ShipBatch(
        lines=lines,
        job_id=_opt_str(obj, "job_id"),
        host=_opt_str(obj, "host"),
        rank=_opt_int(obj, "rank"),
        local_rank=_opt_int(obj, "local_rank"),
        pid=_opt_int(obj, "pid"),
        attempt=_opt_int(obj, "attempt"),
        file=_opt_str(obj, "file"),
        labels=labels,
        offset=_opt_int(obj, "offset"),
    )
