"""rootrank's own batches (`rootrank ship`, ingest/ship/wire_format.py): the batch's identity once, each
line `[ts, stream, text]`; exactly, a record per line, or as texts with records built on demand."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from ingest import timestamps as tsu
from ingest.decoders.records import DecodedLines, DecodeError, RawRecord, records_from_text, runs_of
from ingest.ship.wire_format import (
    ROWS_FORMAT_VERSION,
    SHIP_FORMAT_VERSION,
    ShipBatch,
    ShipFormatError,
    line_columns,
    parse_batch,
)


def decode_batch(obj: dict[str, object], received_ts: datetime | None, max_line_bytes: int) -> list[RawRecord]:
    try:
        batch = parse_batch(obj)
    except ShipFormatError as exc:
        raise DecodeError(exc.reason, str(exc)) from None
    out: list[RawRecord] = []
    for index, (ts, stream, text) in enumerate(batch.lines):
        out.extend(records_from_text(text, _ship_record(batch, index, ts, stream, "", received_ts), max_line_bytes))
    return out


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
        labels=dict(batch.labels),
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

    streams = stream_col if index is None else [stream_col[j] for j in index]
    return DecodedLines(texts, make=make, stream=stream, runs=runs_of(streams), joined=whole)
