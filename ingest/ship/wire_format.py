"""The rootrank shipper's wire format: the single source of truth for both ends.

One Kafka message carries a batch of lines from ONE stream of ONE process (a rank's log file,
a container's stderr), so identity is sent once per batch, not once per line:

    {
      "v": 2,                         # format version; decoders reject versions they do not know
      "source": "rootrank",           # marks the format (forwarder JSON never has it)
      "job_id": "llama70b-run7",      # optional: the job, when the shipper knows it
      "host": "node17",               # optional: the host that wrote the lines, when the shipper knows
                                      #   it (told by --host, or a command it runs; not a file's reader)
      "shipper": "login01",           # optional: the machine the lines were read on, when not `host`
      "rank": 11,                     # optional: global rank (RANK), when one process writes the stream
      "local_rank": 3,                # optional: LOCAL_RANK
      "pid": 52113,                   # optional
      "attempt": 0,                   # optional: restart count (TORCHELASTIC_RESTART_COUNT)
      "file": "/logs/rank11.log",     # optional: the path the lines were read from
      "labels": {"team": "llm"},      # optional: string -> string
      "file_key": 1234567,            # optional: the stream's key among a job's files (ingest/order.py:
                                      #   from its name and first line), which orders lines of different
                                      #   files as `rootrank diagnose` orders them
      "srun_labels": "node",          # optional: how the file's `srun -l` labels read, when its first lines
                                      #   show a launcher per node (ingest.prefixes.sniff_srun_labels),
                                      #   read from the file's head as `rootrank diagnose` reads it
      "offset": 5120,                 # optional: line number of the first line in its stream (0-based),
                                      #   so every line has a stable position: a re-sent batch decodes
                                      #   to the same events, and order survives equal timestamps
      "text": "first line\nsecond line",  # required: the lines joined by "\n" (no line holds one)
      "ts": [1714564800.123456, null], # optional: per line, epoch seconds when the shipper read it, or
                                      #   null; one number for every line; absent or null: unknown
      "stream": "stderr",             # optional: "stdout"/"stderr" for every line, or a list, one per
                                      #   line; absent or null: unknown
      "context": "line 4998\nline 4999" # optional: the lines of the same stream right before the first
                                      #   line (at most CONTEXT_LINES, CONTEXT_MAX_BYTES), never scanned:
                                      #   a line without a time or an owner of its own looks back into
                                      #   them as `rootrank diagnose` looks back in the file
    }

The lines travel as one string, not a row per line, so the worker decodes a batch into one string
it can scan as it is: a row per line cost it three objects per line.

Version 1 (still read, and still written for a batch with a line that holds a newline itself)
has `"lines": [[ts, stream, text], ...]` instead of text/ts/stream, a row per line.
Keep a message under `MAX_BATCH_BYTES` (Kafka's default message.max.bytes is 1 MB):
`encode_batches` splits a long list of lines accordingly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson

__all__ = [
    "CONTEXT_LINES",
    "CONTEXT_MAX_BYTES",
    "MAX_BATCH_BYTES",
    "ROWS_FORMAT_VERSION",
    "SHIP_FORMAT_VERSION",
    "SHIP_SOURCE",
    "ShipBatch",
    "ShipFormatError",
    "encode_batch",
    "encode_batches",
    "is_ship_batch",
    "parse_batch",
]

SHIP_FORMAT_VERSION = 2
ROWS_FORMAT_VERSION = 1  # a row per line: read, and written when a line holds a newline
SHIP_SOURCE = "rootrank"
MAX_BATCH_BYTES = 900_000
CONTEXT_LINES = 64  # correlator.diagnosis.framing.CONTINUATION_LOOKBACK: what a look back can read
CONTEXT_MAX_BYTES = 64 * 1024

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
    context: list[str] = field(default_factory=list)  # the lines right before the first, in file order
    shipper: str | None = None
    file_key: int | None = None
    srun_labels: str | None = None


def bounded_context(lines: Sequence[str], max_bytes: int = CONTEXT_MAX_BYTES) -> list[str]:
    """The last CONTEXT_LINES of `lines` that fit in `max_bytes` (the closest ones kept)."""
    out = list(lines[-CONTEXT_LINES:])
    size = sum(len(line) + 1 for line in out)
    while out and size > max_bytes:
        size -= len(out.pop(0)) + 1
    return out


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
    context: Sequence[str] | None = None,
    shipper: str | None = None,
    file_key: int | None = None,
    srun_labels: str | None = None,
) -> dict[str, object]:
    header: dict[str, object] = {"v": SHIP_FORMAT_VERSION, "source": SHIP_SOURCE}
    given = {"job_id": job_id, "host": host, "shipper": shipper, "rank": rank, "local_rank": local_rank, "pid": pid,
             "attempt": attempt, "file": file, "file_key": file_key, "srun_labels": srun_labels, "offset": offset}
    header.update({key: value for key, value in given.items() if value is not None})
    if labels:
        header["labels"] = {str(k): str(v) for k, v in labels.items()}
    if context:
        header["context"] = "\n".join(bounded_context(context))
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
    version: int = SHIP_FORMAT_VERSION,
    context: Sequence[str] | None = None,
    shipper: str | None = None,
    file_key: int | None = None,
    srun_labels: str | None = None,
) -> bytes:
    """One Kafka message value holding `lines` ((ts, stream, text) each) and their identity. `version`
    1 writes a row per line (what shippers before version 2 sent). `context`: the lines of the stream
    before the first (the last CONTEXT_LINES are sent)."""
    if not lines:
        raise ValueError("a batch needs at least one line")
    return orjson.dumps(_with_lines(_header(job_id, host, rank, local_rank, pid, attempt, file, labels, offset,
                                            context, shipper, file_key, srun_labels), lines, version))


def _with_lines(header: dict[str, object], lines: Sequence[ShipLine], version: int = SHIP_FORMAT_VERSION) -> dict[str, object]:
    """The header with the lines: joined (version 2), or a row per line when asked for or when a line
    holds a newline itself (version 2 cannot carry it)."""
    texts = [text for _, _, text in lines]
    joined = "\n".join(texts)
    if version == ROWS_FORMAT_VERSION or joined.count("\n") != len(texts) - 1:
        return {**header, "v": ROWS_FORMAT_VERSION, "lines": [[ts, stream, text] for ts, stream, text in lines]}
    body = {**header, "text": joined}
    columns: tuple[tuple[str, list[object]], ...] = (
        ("ts", [ts for ts, _, _ in lines]), ("stream", [stream for _, stream, _ in lines]))
    for key, column in columns:
        if column.count(column[0]) == len(column):
            if column[0] is not None:
                body[key] = column[0]  # the same for every line
        else:
            body[key] = column
    return body


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
    context: Sequence[str] | None = None,
    shipper: str | None = None,
    file_key: int | None = None,
    srun_labels: str | None = None,
) -> list[bytes]:
    """Like `encode_batch`, split into as many messages as needed to stay under `max_bytes`; each message's
    context is the lines before it (`context`, then the earlier messages' lines).

    A single line bigger than the limit is cut (the decoder flags over-long lines anyway).
    """
    header = _header(job_id, host, rank, local_rank, pid, attempt, file, labels, offset, shipper=shipper,
                     file_key=file_key, srun_labels=srun_labels)
    # A message's context: at most an eighth of it, which JSON may escape to twice its size.
    context_bytes = min(CONTEXT_MAX_BYTES, max_bytes // 8)
    before = bounded_context(list(context or ()), context_bytes)
    overhead = len(orjson.dumps(header)) + len(',"lines":[]') + (24 if offset is not None else 0) \
        + len(',"context":""') + 2 * context_bytes
    sent = 0  # lines already in earlier messages (advances `offset` per message)
    budget = max(max_bytes - overhead, 256)
    out: list[bytes] = []
    chunk: list[ShipLine] = []
    size = 0
    for ts, stream, text in lines:
        item_size = len(orjson.dumps([ts, stream, text])) + 1
        if item_size > budget:
            keep = max(budget - 64, 1)
            text = text.encode("utf-8")[:keep].decode("utf-8", "ignore")  # noqa: PLW2901 - the line, cut to fit
            item_size = len(orjson.dumps([ts, stream, text])) + 1
        if chunk and size + item_size > budget:
            out.append(orjson.dumps(_with_lines(_with_offset(header, offset, sent, before), chunk)))
            sent += len(chunk)
            before = bounded_context([*before, *(t for _, _, t in chunk)], context_bytes)
            chunk, size = [], 0
        chunk.append((ts, stream, text))
        size += item_size
    if chunk:
        out.append(orjson.dumps(_with_lines(_with_offset(header, offset, sent, before), chunk)))
    return out


def _with_offset(header: dict[str, object], offset: int | None, sent: int, context: Sequence[str] = ()) -> dict[str, object]:
    out = header if offset is None else {**header, "offset": offset + sent}
    return {**out, "context": "\n".join(context)} if context else out


def is_ship_batch(obj: Mapping[str, object]) -> bool:
    return obj.get("source") == SHIP_SOURCE and ("text" in obj or "lines" in obj)


def _opt_str(obj: Mapping[str, object], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ShipFormatError("bad_field", key)


def _opt_int(obj: Mapping[str, object], key: str) -> int | None:
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


def parse_batch(obj: Mapping[str, object]) -> ShipBatch:
    """Validate a decoded JSON object in this format. Raises ShipFormatError(reason)."""
    version = obj.get("v", SHIP_FORMAT_VERSION if "text" in obj else ROWS_FORMAT_VERSION)
    raw_lines: object
    if version == SHIP_FORMAT_VERSION:
        raw_lines = joined_rows(obj)
    elif version == ROWS_FORMAT_VERSION:
        raw_lines = obj.get("lines")
        if not isinstance(raw_lines, list):
            raise ShipFormatError("bad_field", "lines")
    else:
        raise ShipFormatError("unsupported_version", repr(version))
    lines: list[ShipLine] = []
    where = "lines[]." if version == ROWS_FORMAT_VERSION else ""
    for item in raw_lines:
        if not isinstance(item, list) or len(item) != 3:
            raise ShipFormatError("bad_field", "lines[]")
        ts, stream, text = item
        if not isinstance(text, str):
            raise ShipFormatError("bad_field", f"{where}text")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
            raise ShipFormatError("bad_field", f"{where}ts")
        if stream is not None and not isinstance(stream, str):
            raise ShipFormatError("bad_field", f"{where}stream")
        lines.append((float(ts) if ts is not None else None, stream or None, text))
    labels_obj = obj.get("labels")
    labels: dict[str, str] = {}
    if isinstance(labels_obj, dict):
        labels = {str(k): str(v) for k, v in labels_obj.items() if v is not None}
    elif labels_obj is not None:
        raise ShipFormatError("bad_field", "labels")
    context_obj = obj.get("context")
    if context_obj is not None and not isinstance(context_obj, str):
        raise ShipFormatError("bad_field", "context")
    return ShipBatch(
        lines=lines,
        context=context_obj.split("\n") if context_obj else [],
        job_id=_opt_str(obj, "job_id"),
        host=_opt_str(obj, "host"),
        rank=_opt_int(obj, "rank"),
        local_rank=_opt_int(obj, "local_rank"),
        pid=_opt_int(obj, "pid"),
        attempt=_opt_int(obj, "attempt"),
        file=_opt_str(obj, "file"),
        labels=labels,
        offset=_opt_int(obj, "offset"),
        shipper=_opt_str(obj, "shipper"),
        file_key=_opt_int(obj, "file_key"),
        srun_labels=_opt_str(obj, "srun_labels"),
    )


def line_columns(obj: Mapping[str, object]) -> tuple[list[str], Sequence[object], Sequence[object]]:
    """A version 2 batch's texts, and its ts and stream per line (as sent: types are the caller's to
    check). Raises ShipFormatError when text is missing or a column's length is not the lines'."""
    text = obj.get("text")
    if not isinstance(text, str):
        raise ShipFormatError("bad_field", "text")
    texts = text.split("\n")
    columns: list[Sequence[object]] = []
    for key in ("ts", "stream"):
        value = obj.get(key)
        if isinstance(value, list):
            if len(value) != len(texts):
                raise ShipFormatError("bad_field", f"{key}: {len(value)} values for {len(texts)} lines")
            columns.append(value)
        else:
            columns.append([value] * len(texts))
    return texts, columns[0], columns[1]


def joined_rows(obj: Mapping[str, object]) -> list[list[object]]:
    """A version 2 batch as version 1's rows, [ts, stream, text] each."""
    texts, ts_col, stream_col = line_columns(obj)
    return [list(row) for row in zip(ts_col, stream_col, texts, strict=True)]
