"""Plain text: each non-blank line a record, with nothing known about it but when it was received."""

from __future__ import annotations

from datetime import datetime

from ingest.decoders.records import RawRecord, records_from_lines


def decode_plain_lines(lines: list[str], received_ts: datetime | None, max_line_bytes: int) -> list[RawRecord]:
    template = RawRecord(text="", source="plain", received_ts=received_ts)
    return records_from_lines(lines, template, max_line_bytes)
