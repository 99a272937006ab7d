"""Which forwarder sent a value, and its decoder: `decode_value` (a record per line) and `decode_lines`
(a ship batch's texts, records on demand). Recognised in this order: Fluent Bit JSON, Vector JSON,
Filebeat JSON, rootrank's own batch JSON, rsyslog text, plain text."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import orjson

from ingest import timestamps as tsu
from ingest.decoders import filebeat, fluentbit, plain, rootrank_ship, rsyslog, vector
from ingest.decoders.fields import int_field, str_field, str_or_num_field
from ingest.decoders.records import DecodedLines, DecodeError, RawRecord, records_from_text, split_lines
from ingest.ship.wire_format import is_ship_batch

MAX_VALUE_BYTES = 8 * 1024 * 1024


# --- JSON values: one object, JSON lines, or an array of objects -------------------------


def _looks_like_json_object(value: bytes) -> bool:
    """`{"` or `{}` (after whitespace): a JSON object. `{'loss': 1.2}` (a Python dict printed by a
    training script) is a log line, not broken JSON."""
    for byte in value[1:64]:
        if byte in b" \t\r\n":
            continue
        return byte in b'"}'
    return len(value) < 64


def _loads(value: bytes) -> object:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        pass
    try:  # invalid UTF-8 inside an otherwise valid document: keep the record, replace the bytes
        return orjson.loads(value.decode("utf-8", "replace"))
    except orjson.JSONDecodeError as exc:
        raise DecodeError("bad_json", str(exc)[:200]) from None


def _loads_objects(body: bytes) -> list[dict[str, object]]:
    """The JSON object(s) of a value: one object, or newline-delimited objects (JSON lines)."""
    try:
        obj = _loads(body)
    except DecodeError:
        if b"\n" not in body.rstrip():
            raise
        parts = [_loads(part) for part in body.split(b"\n") if part.strip()]
        objects = [o for o in parts if isinstance(o, dict)]
        if len(objects) != len(parts):
            raise DecodeError("bad_json", "a JSON line is not an object") from None
        return objects
    if not isinstance(obj, dict):
        raise DecodeError("bad_json", "not an object")
    return [obj]


def _json_array_of_objects(body: bytes) -> list[dict[str, object]] | None:
    """A JSON array of records (Fluent Bit's `format json` over HTTP), else None: a line that
    merely starts with '[' is far more often log text ("[rank0]: ...") than broken JSON."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(obj, list) and obj and all(isinstance(o, dict) for o in obj):
        return obj
    return None


# --- which JSON forwarder -------------------------------------------------------------------

_EXPLICIT_KEYS = frozenset({"job_id", "rank", "local_rank", "pid", "attempt"})


def _explicit_identity(obj: Mapping[str, object], rec: RawRecord) -> None:
    """`job_id`/`rank`/`local_rank`/`pid`/`attempt` set explicitly on the record (top level, or in
    Filebeat's `fields`) win over anything derived later."""
    fields = obj.get("fields")
    for scope in (obj, fields) if isinstance(fields, dict) else (obj,):
        if scope.keys().isdisjoint(_EXPLICIT_KEYS):
            continue
        if rec.job_id is None and "job_id" in scope:
            rec.job_id = str_or_num_field(scope["job_id"])
        if rec.rank is None and "rank" in scope:
            rec.rank = int_field(scope["rank"])
        if rec.local_rank is None and "local_rank" in scope:
            rec.local_rank = int_field(scope["local_rank"])
        if rec.pid is None and "pid" in scope:
            rec.pid = int_field(scope["pid"])
        if rec.attempt is None and "attempt" in scope:
            rec.attempt = int_field(scope["attempt"])


# The keys a forwarder's object holds its line's text under, in the order `_decode_object` tries them.
TEXT_KEYS = ("log", "message", "MESSAGE", "msg")


def _decode_object(obj: dict[str, object], received_ts: datetime | None, max_line_bytes: int) -> list[RawRecord]:
    if is_ship_batch(obj):
        return rootrank_ship.decode_batch(obj, received_ts, max_line_bytes)
    log = obj.get("log")
    message = obj.get("message")
    rec = RawRecord(text="", received_ts=received_ts)
    if isinstance(log, str):
        rec.source = "fluentbit"
        text = log
        fluentbit.fill_record(obj, rec)
    elif isinstance(message, str):
        if "@metadata" in obj or isinstance(log, dict) or "agent" in obj or "ecs" in obj:
            rec.source = "filebeat"
            text = message
            filebeat.fill_record(obj, rec)
        elif "timestamp" in obj or "source_type" in obj or "@timestamp" not in obj:
            rec.source = "vector"
            text = message
            vector.fill_record(obj, rec)
        else:  # ECS-shaped without Beats metadata: Filebeat's field layout
            rec.source = "filebeat"
            text = message
            filebeat.fill_record(obj, rec)
    elif isinstance(journal := obj.get("MESSAGE"), str):  # Fluent Bit systemd input, no rename
        rec.source = "fluentbit"
        text = journal
        fluentbit.fill_record(obj, rec)
    elif isinstance(msg := obj.get("msg"), str):  # a structured application log line sent as is
        text = msg
        rec.ts = tsu.parse_any(obj.get("time", obj.get("ts")))
        rec.host = str_field(obj.get("host"))
    else:
        raise DecodeError("no_text_field", ",".join(list(obj)[:10]))
    _explicit_identity(obj, rec)
    return records_from_text(text, rec, max_line_bytes)


# --- entry points ------------------------------------------------------------------------------


# What a consumer may hand over as a message value: bytes from Kafka, or text and buffers from callers that
# have them (anything else is a `bad_record`).
RawValue = bytes | bytearray | memoryview | str


def decode_lines(
    value: RawValue,
    *,
    received_ts: datetime | None = None,
    max_line_bytes: int = 65536,
    max_value_bytes: int = MAX_VALUE_BYTES,
) -> DecodedLines:
    """Like `decode_value`, with the records built on demand (`DecodedLines.record`).

    A batch in rootrank's ship format (the one value that carries thousands of lines) is split into
    texts without a record per line; any other value is decoded by `decode_value`.
    """
    body = value.lstrip() if isinstance(value, bytes) else b""
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:].lstrip()
    if body[:1] == b"{" and len(value) <= max_value_bytes and body.find(b'"rootrank"', 0, 4096) >= 0 \
            and _looks_like_json_object(body):
        objects = _loads_objects(body)
        if len(objects) == 1 and is_ship_batch(objects[0]):
            try:
                lazy = rootrank_ship.batch_lines(objects[0], received_ts, max_line_bytes)
            except DecodeError:
                raise
            except (TypeError, ValueError, AttributeError, KeyError, OverflowError, IndexError) as exc:
                raise DecodeError("bad_record", f"{type(exc).__name__}: {exc}"[:200]) from None
            if lazy is not None:
                return lazy
            try:
                return rootrank_ship.batch_records(objects[0], received_ts, max_line_bytes)
            except DecodeError:
                raise
            except (TypeError, ValueError, AttributeError, KeyError, OverflowError, IndexError) as exc:
                raise DecodeError("bad_record", f"{type(exc).__name__}: {exc}"[:200]) from None
    return DecodedLines.of(decode_value(value, received_ts=received_ts, max_line_bytes=max_line_bytes,
                                        max_value_bytes=max_value_bytes))


def decode_value(
    value: RawValue,
    *,
    received_ts: datetime | None = None,
    max_line_bytes: int = 65536,
    max_value_bytes: int = MAX_VALUE_BYTES,
    year_hint: int | None = None,
) -> list[RawRecord]:
    """Records of one Kafka message value. Raises only DecodeError.

    `year_hint`: the year of a syslog header that names none (the traditional format), when known better
    than from `received_ts` (`rootrank diagnose` reads a job's year from its dated lines).

    Non-UTF-8 bytes in text are replaced (U+FFFD), lines longer than `max_line_bytes` are cut
    and flagged `labels["truncated"] = "1"`. A JSON document with nothing to scan in it (an
    empty `log`) gives `[]`, not an error.
    """
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    elif not isinstance(value, bytes):
        try:
            value = bytes(value)
        except (TypeError, ValueError):
            raise DecodeError("bad_record", f"not bytes: {type(value).__name__}") from None
    if not value:
        raise DecodeError("empty")
    if len(value) > max_value_bytes:
        raise DecodeError("too_large", f"{len(value)} bytes")
    body = value.lstrip()
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:].lstrip()
    if not body:
        raise DecodeError("empty")
    objects: list[dict[str, object]] | None = None
    if body[:1] == b"{" and _looks_like_json_object(body):
        objects = _loads_objects(body)
    elif body[:2] == b"[{":
        objects = _json_array_of_objects(body)
    if objects is not None:
        out: list[RawRecord] = []
        try:
            for obj in objects:
                out.extend(_decode_object(obj, received_ts, max_line_bytes))
        except DecodeError:
            raise
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError, IndexError) as exc:
            raise DecodeError("bad_record", f"{type(exc).__name__}: {exc}"[:200]) from None
        return out
    text = value.decode("utf-8", "replace")
    lines = split_lines(text)
    if not lines:
        raise DecodeError("empty")
    c = lines[0][:1]
    if c == "<" or c.isdigit() or c in "ADFJMNOS":
        syslog = rsyslog.decode_syslog_lines(lines, received_ts, max_line_bytes, year_hint)
        if syslog is not None:
            return syslog
    return plain.decode_plain_lines(lines, received_ts, max_line_bytes)
