"""rootrank's own batches (`rootrank ship`, ingest/ship/wire_format.py): the batch's identity once, each
line `[ts, stream, text]`; exactly, a record per line, or as texts with records built on demand."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import cast

from ingest import timestamps as tsu
from ingest.decoders.events import SHIPPED_FROM
from ingest.decoders.records import (
    DecodedLines,
    DecodeError,
    RawRecord,
    lines_before_in,
    records_from_text,
    runs_of,
)
from ingest.order import file_key, line_order
from ingest.ship.wire_format import (
    CONTEXT_LINES,
    ROWS_FORMAT_VERSION,
    SHIP_FORMAT_VERSION,
    ShipBatch,
    ShipFormatError,
    line_columns,
    parse_batch,
)


def decode_batch(obj: dict[str, object], received_ts: datetime | None, max_line_bytes: int) -> list[RawRecord]:
    return _decode_rows(obj, received_ts, max_line_bytes)[0]


def _decode_rows(obj: dict[str, object], received_ts: datetime | None,
                 max_line_bytes: int) -> tuple[list[RawRecord], ShipBatch, list[int]]:
    """The batch's records, the batch, and the row (line of the file) of each record."""
    try:
        batch = parse_batch(obj)
    except ShipFormatError as exc:
        raise DecodeError(exc.reason, str(exc)) from None
    out: list[RawRecord] = []
    rows: list[int] = []
    for index, (ts, stream, text) in enumerate(batch.lines):
        records = records_from_text(text, _ship_record(batch, index, ts, stream, "", received_ts), max_line_bytes)
        out.extend(records)
        rows.extend([index] * len(records))
    return out, batch, rows


def batch_records(obj: dict[str, object], received_ts: datetime | None, max_line_bytes: int) -> DecodedLines:
    """A ship batch decoded exactly, a record per line (what `batch_lines` leaves to it), still framed as
    a file's lines: each line looks back at the rows before its own, then the batch's context."""
    records, batch, rows = _decode_rows(obj, received_ts, max_line_bytes)
    texts = [text for _, _, text in batch.lines]

    def before(i: int) -> Iterator[str]:
        return lines_before_in(texts, rows[i], batch.context, CONTEXT_LINES)

    return DecodedLines([r.text for r in records], records, before=before, order_base=_order_base(batch),
                        srun_labels=batch.srun_labels)


def _order_base(batch: ShipBatch) -> int:
    """The order of the batch's file's line 0: from the key the shipper sent (shippers before it: from the
    file's path alone)."""
    key = batch.file_key if batch.file_key is not None else file_key(batch.file or "", "")
    return line_order(key, 0)


def _ship_record(batch: ShipBatch, position: int, ts: float | None, stream: str | None, text: str,
                 received_ts: datetime | None) -> RawRecord:
    """The record of line `position` of a ship batch: the batch's identity, the line's time and stream."""
    return RawRecord(
        text=text,
        source="rootrank",
        host=batch.host,
        job_id=batch.job_id,
        file=batch.file,
        stream=stream or None,
        rank=batch.rank,
        local_rank=batch.local_rank,
        pid=batch.pid,
        attempt=batch.attempt,
        ts=tsu.parse_any(float(ts)) if ts is not None else None,
        received_ts=received_ts,
        labels={**batch.labels, SHIPPED_FROM: batch.shipper} if batch.shipper and not batch.host else dict(batch.labels),
        offset=batch.offset + position if batch.offset is not None else None,
        # The shipper's host (its --host, --host-from, or its machine's name) is where the file was read,
        # not always where each line was written: a line's own host prefix wins (ingest/decoders/events.py).
        host_is_fallback=True,
    )


_THREE = {3}
_TS_TYPES = frozenset({float, int, type(None)})
_STREAM_TYPES = frozenset({str, type(None)})


def batch_lines(obj: dict[str, object], received_ts: datetime | None, max_line_bytes: int) -> DecodedLines | None:
    """A ship batch's lines without a RawRecord per line, or None when the batch needs the exact,
    line-by-line path (a malformed batch, a text with a newline in it, a line that may need cutting):
    that path then decodes it, or raises the same DecodeError as always."""
    ts_col: Sequence[object]
    stream_col: Sequence[object]
    if obj.get("v") == SHIP_FORMAT_VERSION:
        try:
            texts, ts_col, stream_col = line_columns(obj)
        except ShipFormatError:
            return None
        joined = cast(str, obj["text"])  # line_columns checked it
    else:
        raw_lines = obj.get("lines")
        if type(raw_lines) is not list or not raw_lines:
            return None
        try:
            if set(map(len, raw_lines)) != _THREE:
                return None
        except TypeError:  # a row without a length (a number, null)
            return None
        # Rows of three: lists, or strings/objects that fail the column type checks below.
        # (zip's strict=True would check the lengths too, but is ten times slower here.)
        ts_col, stream_col, text_col = zip(*raw_lines, strict=False)
        texts = list(text_col)
        try:
            joined = "\n".join(texts)
        except TypeError:  # a text that is not a string
            return None
        if joined.count("\n") != len(texts) - 1:
            return None  # a text with newlines in it: several records per line
    if not (set(map(type, ts_col)) <= _TS_TYPES and set(map(type, stream_col)) <= _STREAM_TYPES):
        return None
    # The columns' types, checked in bulk just above (a check per value would cost more than the decoding)
    ts_values = cast("Sequence[float | None]", ts_col)
    stream_values = cast("Sequence[str | None]", stream_col)
    if max(map(len, texts)) * 4 > max_line_bytes:
        return None
    all_texts = texts  # every line as sent (blank ones and "\r" included): what a look back reads
    whole: str | None = joined  # the lines as one string, when no line below is changed or dropped
    if "\r" in joined:
        texts = [t.removesuffix("\r") for t in texts]
        whole = None
    index: list[int] | None = None
    if not all(map(str.strip, texts)):  # blank lines are dropped, later lines keep their positions
        index = [i for i, t in enumerate(texts) if t.strip()]
        texts = [texts[i] for i in index]
        whole = None
    try:
        batch = parse_batch({**obj, "v": ROWS_FORMAT_VERSION, "lines": []} if obj.get("v") == SHIP_FORMAT_VERSION
                            else {**obj, "lines": []})  # the header, validated as always
    except ShipFormatError as exc:
        raise DecodeError(exc.reason, str(exc)) from None

    def make(i: int) -> RawRecord:
        j = index[i] if index is not None else i
        return _ship_record(batch, j, ts_values[j], stream_values[j], texts[i], received_ts)

    def stream(i: int) -> tuple[object, ...]:
        return (batch.host, batch.rank, batch.file, stream_values[index[i] if index is not None else i] or None)

    def before(i: int) -> Iterator[str]:
        return lines_before_in(all_texts, index[i] if index is not None else i, batch.context, CONTEXT_LINES)

    streams = stream_col if index is None else [stream_col[j] for j in index]
    return DecodedLines(texts, make=make, stream=stream, runs=runs_of(streams), joined=whole, before=before,
                        order_base=_order_base(batch), srun_labels=batch.srun_labels)
