"""Kafka message value -> RawRecords -> LogEvent, for whatever forwarder sent it, with no config.

`decode_value` recognises, in this order: Fluent Bit JSON, Vector JSON, Filebeat JSON,
rootrank's own batch JSON (ship_format.py), rsyslog text (RSYSLOG_FileFormat,
RSYSLOG_TraditionalFileFormat, RFC 5424), and plain text. A value may also hold several JSON
records, as JSON lines or as a JSON array of objects. It is on the hot path of the
streaming worker, so it uses orjson and plain dataclasses, and never raises anything but
`DecodeError` (whose `reason` goes to the dead-letter topic).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from ingest import timestamps as tsu
from ingest.event import MAX_LINE_CHARS, LogEvent
from ingest.prefixes import Identity, parse_prefixes
from ingest.ship.wire_format import ShipBatch, ShipFormatError, is_ship_batch, parse_batch

__all__ = ["DecodeError", "DecodedLines", "RawRecord", "decode_lines", "decode_value", "job_id_for", "to_event"]

MAX_VALUE_BYTES = 8 * 1024 * 1024


class DecodeError(ValueError):
    """A message value that cannot be turned into records. `reason` is short and machine-friendly:
    empty, too_large, bad_json, no_text_field, bad_record, unsupported_version."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(slots=True)
class RawRecord:
    """One line as the forwarder delivered it, with the metadata the forwarder attached.

    `labels` carries Kubernetes pod labels as they are, plus rootrank's own keys: `k8s.pod`,
    `k8s.namespace`, `k8s.container`, `k8s.node`, `pod_index`, `syslog_tag`, `truncated`.
    """

    text: str
    source: str = "plain"
    host: str | None = None
    job_id: str | None = None
    file: str | None = None
    stream: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    attempt: int | None = None
    ts: datetime | None = None
    received_ts: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    offset: int | None = None


# --- shared helpers ---------------------------------------------------------------------------


def _str(value: Any) -> str | None:
    return value or None if isinstance(value, str) else None


def _str_or_num(value: Any) -> str | None:
    """For ids and labels, where a number (a Slurm job id, a replica index) is meaningful."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text[:1] == "-":
            return -int(text[1:]) if text[1:].isdigit() else None
        return int(text) if text.isdigit() and len(text) < 19 else None
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _flat_labels(value: Any) -> dict[str, str]:
    """Scalar entries of a label map as strings (nested values are skipped)."""
    out: dict[str, str] = {}
    for key, item in _dict(value).items():
        text = _str_or_num(item)
        if text is not None:
            out[str(key)] = text
    return out


_POD_NAME = re.compile(
    r"^(?P<job>.+)-(?P<role>worker|master|launcher|chief|ps|evaluator)-(?P<idx>[0-9]+|[a-z0-9]{5})$"
)


def _truncate(line: str, max_line_bytes: int) -> tuple[str, bool]:
    if len(line) * 4 <= max_line_bytes:  # fast path: cannot exceed the limit even if all 4-byte
        return line, False
    encoded = line.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_line_bytes:
        return line, False
    return encoded[:max_line_bytes].decode("utf-8", "ignore"), True


def _split_lines(text: str) -> list[str]:
    """Newline-separated lines, without the newline (or CRLF) and without empty lines."""
    if "\n" not in text:
        line = text.removesuffix("\r")
        return [line] if line.strip() else []
    out = []
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if line.strip():
            out.append(line)
    return out


def _records_from_text(text: str, template: RawRecord, max_line_bytes: int) -> list[RawRecord]:
    return _records_from_lines(_split_lines(text), template, max_line_bytes)


def _records_from_lines(lines: list[str], template: RawRecord, max_line_bytes: int) -> list[RawRecord]:
    out: list[RawRecord] = []
    for line in lines:
        line, cut = _truncate(line, max_line_bytes)
        labels = dict(template.labels)
        if cut:
            labels["truncated"] = "1"
        out.append(
            RawRecord(
                text=line,
                source=template.source,
                host=template.host,
                job_id=template.job_id,
                file=template.file,
                stream=template.stream,
                rank=template.rank,
                local_rank=template.local_rank,
                pid=template.pid,
                attempt=template.attempt,
                ts=template.ts,
                received_ts=template.received_ts,
                labels=labels,
                offset=template.offset,
            )
        )
    return out


# --- JSON forwarders --------------------------------------------------------------------------


def _looks_like_json_object(value: bytes) -> bool:
    """`{"` or `{}` (after whitespace): a JSON object. `{'loss': 1.2}` (a Python dict printed by a
    training script) is a log line, not broken JSON."""
    for byte in value[1:64]:
        if byte in b" \t\r\n":
            continue
        return byte in b'"}'
    return len(value) < 64


def _loads(value: bytes) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        pass
    try:  # invalid UTF-8 inside an otherwise valid document: keep the record, replace the bytes
        return orjson.loads(value.decode("utf-8", "replace"))
    except orjson.JSONDecodeError as exc:
        raise DecodeError("bad_json", str(exc)[:200]) from None


def _loads_objects(body: bytes) -> list[dict[str, Any]]:
    """The JSON object(s) of a value: one object, or newline-delimited objects (JSON lines)."""
    try:
        obj = _loads(body)
    except DecodeError:
        if b"\n" not in body.rstrip():
            raise
        objects = [_loads(part) for part in body.split(b"\n") if part.strip()]
        if not all(isinstance(o, dict) for o in objects):
            raise DecodeError("bad_json", "a JSON line is not an object") from None
        return objects
    if not isinstance(obj, dict):
        raise DecodeError("bad_json", "not an object")
    return [obj]


def _json_array_of_objects(body: bytes) -> list[dict[str, Any]] | None:
    """A JSON array of records (Fluent Bit's `format json` over HTTP), else None: a line that
    merely starts with '[' is far more often log text ("[rank0]: ...") than broken JSON."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(obj, list) and obj and all(isinstance(o, dict) for o in obj):
        return obj
    return None


_EXPLICIT_KEYS = frozenset({"job_id", "rank", "local_rank", "pid", "attempt"})


def _explicit_identity(obj: Mapping[str, Any], rec: RawRecord) -> None:
    """`job_id`/`rank`/`local_rank`/`pid`/`attempt` set explicitly on the record (top level, or in
    Filebeat's `fields`) win over anything derived later."""
    fields = obj.get("fields")
    for scope in (obj, fields) if isinstance(fields, dict) else (obj,):
        if scope.keys().isdisjoint(_EXPLICIT_KEYS):
            continue
        if rec.job_id is None and "job_id" in scope:
            rec.job_id = _str_or_num(scope["job_id"])
        if rec.rank is None and "rank" in scope:
            rec.rank = _int(scope["rank"])
        if rec.local_rank is None and "local_rank" in scope:
            rec.local_rank = _int(scope["local_rank"])
        if rec.pid is None and "pid" in scope:
            rec.pid = _int(scope["pid"])
        if rec.attempt is None and "attempt" in scope:
            rec.attempt = _int(scope["attempt"])


def _k8s_labels(
    labels: dict[str, str], pod: str | None, namespace: str | None, container: str | None, node: str | None
) -> None:
    if pod:
        labels["k8s.pod"] = pod
        m = _POD_NAME.match(pod)
        if m is not None and m["idx"].isdigit():
            labels["pod_index"] = m["idx"]
    if namespace:
        labels["k8s.namespace"] = namespace
    if container:
        labels["k8s.container"] = container
    if node:
        labels["k8s.node"] = node


def _fluentbit(obj: Mapping[str, Any], text: str, rec: RawRecord) -> str:
    k8s = _dict(obj.get("kubernetes"))
    labels = _flat_labels(k8s.get("labels"))
    node = _str(k8s.get("host"))
    _k8s_labels(
        labels,
        _str(k8s.get("pod_name")),
        _str(k8s.get("namespace_name")),
        _str(k8s.get("container_name")),
        node,
    )
    rec.labels = labels
    rec.host = node or _str(obj.get("host")) or _str(obj.get("hostname")) or _str(obj.get("_HOSTNAME"))
    rec.stream = _str(obj.get("stream"))
    rec.file = _str(obj.get("file")) or _str(obj.get("filename"))
    for key in ("@timestamp", "date", "time", "timestamp"):
        if key in obj:
            rec.ts = tsu.parse_any(obj[key])
            if rec.ts is not None:
                break
    if rec.ts is None and "_SOURCE_REALTIME_TIMESTAMP" in obj:  # systemd input: microseconds
        rec.ts = tsu.parse_any(_int(obj["_SOURCE_REALTIME_TIMESTAMP"]))
    if "_PID" in obj:
        rec.pid = _int(obj["_PID"])
    if "SYSLOG_IDENTIFIER" in obj and (tag := _str(obj["SYSLOG_IDENTIFIER"])):
        rec.labels["syslog_tag"] = tag
    return text


def _vector(obj: Mapping[str, Any], text: str, rec: RawRecord) -> str:
    k8s = _dict(obj.get("kubernetes"))
    labels = _flat_labels(k8s.get("pod_labels"))
    node = _str(k8s.get("pod_node_name"))
    _k8s_labels(
        labels,
        _str(k8s.get("pod_name")),
        _str(k8s.get("pod_namespace")),
        _str(k8s.get("container_name")),
        node,
    )
    rec.labels = labels
    rec.host = node or _str(obj.get("host")) or _str(obj.get("hostname"))
    rec.stream = _str(obj.get("stream"))
    rec.file = _str(obj.get("file"))
    rec.ts = tsu.parse_any(obj.get("timestamp"))
    if rec.ts is None and "@timestamp" in obj:
        rec.ts = tsu.parse_any(obj["@timestamp"])
    return text


def _filebeat(obj: Mapping[str, Any], text: str, rec: RawRecord) -> str:
    k8s = _dict(obj.get("kubernetes"))
    labels = _flat_labels(obj.get("labels"))  # ECS labels (add_labels processor)
    labels.update(_flat_labels(k8s.get("labels")))
    namespace = k8s.get("namespace")
    node = _str(_dict(k8s.get("node")).get("name"))
    _k8s_labels(
        labels,
        _str(_dict(k8s.get("pod")).get("name")),
        _str(namespace) or _str(_dict(namespace).get("name")),
        _str(_dict(k8s.get("container")).get("name")),
        node,
    )
    for key, value in _flat_labels(obj.get("fields")).items():
        labels.setdefault(key, value)
    rec.labels = labels
    host_field = obj.get("host")
    host_obj = _dict(host_field)
    rec.host = node or _str(host_obj.get("name")) or _str(host_obj.get("hostname")) or _str(host_field)
    log = _dict(obj.get("log"))
    rec.file = _str(_dict(log.get("file")).get("path"))
    rec.offset = _int(log.get("offset"))
    rec.stream = _str(obj.get("stream"))
    rec.ts = tsu.parse_any(obj.get("@timestamp"))
    return text


def _decode_object(obj: dict[str, Any], received_ts: datetime | None, max_line_bytes: int) -> list[RawRecord]:
    if is_ship_batch(obj):
        return _decode_ship(obj, received_ts, max_line_bytes)
    log = obj.get("log")
    message = obj.get("message")
    rec = RawRecord(text="", received_ts=received_ts)
    if isinstance(log, str):
        rec.source = "fluentbit"
        text = _fluentbit(obj, log, rec)
    elif isinstance(message, str):
        if "@metadata" in obj or isinstance(log, dict) or "agent" in obj or "ecs" in obj:
            rec.source = "filebeat"
            text = _filebeat(obj, message, rec)
        elif "timestamp" in obj or "source_type" in obj or "@timestamp" not in obj:
            rec.source = "vector"
            text = _vector(obj, message, rec)
        else:  # ECS-shaped without Beats metadata: Filebeat's field layout
            rec.source = "filebeat"
            text = _filebeat(obj, message, rec)
    elif isinstance(obj.get("MESSAGE"), str):  # Fluent Bit systemd input, no rename
        rec.source = "fluentbit"
        text = _fluentbit(obj, obj["MESSAGE"], rec)
    elif isinstance(obj.get("msg"), str):  # a structured application log line sent as is
        text = obj["msg"]
        rec.ts = tsu.parse_any(obj.get("time", obj.get("ts")))
        rec.host = _str(obj.get("host"))
    else:
        raise DecodeError("no_text_field", ",".join(list(obj)[:10]))
    _explicit_identity(obj, rec)
    return _records_from_text(text, rec, max_line_bytes)


def _decode_ship(obj: dict[str, Any], received_ts: datetime | None, max_line_bytes: int) -> list[RawRecord]:
    try:
        batch = parse_batch(obj)
    except ShipFormatError as exc:
        raise DecodeError(exc.reason, str(exc)) from None
    out: list[RawRecord] = []
    for index, (ts, stream, text) in enumerate(batch.lines):
        out.extend(_records_from_text(text, _ship_record(batch, index, ts, stream, "", received_ts), max_line_bytes))
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
    )


class DecodedLines:
    """The lines of one value: every line's text at once, its RawRecord only when asked for.

    The streaming worker scans the texts and builds records (identity, timestamps, labels) only for
    the lines that hit. `record(i)` is what `decode_value(...)[i]` would be.
    """

    __slots__ = ("_make", "_records", "texts")

    def __init__(self, texts: list[str], records: list[RawRecord] | None = None,
                 make: Callable[[int], RawRecord] | None = None) -> None:
        self.texts = texts
        self._records: list[RawRecord | None] = records if records is not None else [None] * len(texts)  # type: ignore[assignment]
        self._make = make

    @classmethod
    def of(cls, records: list[RawRecord]) -> DecodedLines:
        return cls([r.text for r in records], records)

    def __len__(self) -> int:
        return len(self.texts)

    def record(self, index: int) -> RawRecord:
        record = self._records[index]
        if record is None:
            assert self._make is not None
            record = self._records[index] = self._make(index)
        return record

    def records(self) -> list[RawRecord]:
        return [self.record(i) for i in range(len(self.texts))]


_THREE = {3}
_TS_TYPES = frozenset({float, int, type(None)})
_STREAM_TYPES = frozenset({str, type(None)})


def _ship_lines(obj: dict[str, Any], received_ts: datetime | None, max_line_bytes: int) -> DecodedLines | None:
    """A ship batch's lines without a RawRecord per line, or None when the batch needs the exact,
    line-by-line path (a malformed batch, a text with a newline in it, a line that may need cutting):
    that path then decodes it, or raises the same DecodeError as always."""
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
    ts_col, stream_col, text_col = zip(*raw_lines)
    if not (set(map(type, ts_col)) <= _TS_TYPES and set(map(type, stream_col)) <= _STREAM_TYPES):
        return None
    texts = list(text_col)
    try:
        joined = "\n".join(texts)
    except TypeError:  # a text that is not a string
        return None
    if max(map(len, texts)) * 4 > max_line_bytes:
        return None
    if joined.count("\n") != len(texts) - 1:
        return None  # a text with newlines in it: several records per line
    if "\r" in joined:
        texts = [t.removesuffix("\r") for t in texts]
    index: list[int] | None = None
    if not all(map(str.strip, texts)):  # blank lines are dropped, later lines keep their positions
        index = [i for i, t in enumerate(texts) if t.strip()]
        texts = [texts[i] for i in index]
    try:
        batch = parse_batch({**obj, "lines": []})  # the header, validated as always
    except ShipFormatError as exc:
        raise DecodeError(exc.reason, str(exc)) from None

    def make(i: int) -> RawRecord:
        j = index[i] if index is not None else i
        return _ship_record(batch, j, ts_col[j], stream_col[j], texts[i], received_ts)

    return DecodedLines(texts, make=make)


# --- rsyslog ----------------------------------------------------------------------------------

_TAG = r"([^\s\[\]:]+)(?:\[(\d+)\])?: ?"
# RSYSLOG_FileFormat: 2024-05-01T12:00:00.123456+00:00 host tag[pid]: msg
_RSYSLOG_FILE = re.compile(
    r"(?:<\d{1,3}>)?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) ([\w.:-]+) " + _TAG
)
# RSYSLOG_TraditionalFileFormat / RFC 3164: May  1 12:00:00 host tag[pid]: msg
_RSYSLOG_TRAD = re.compile(
    r"(?:<\d{1,3}>)?(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([ \d]?\d) (\d\d):(\d\d):(\d\d) "
    r"([\w.:-]+) " + _TAG
)
# RFC 5424: <13>1 2024-05-01T12:00:00.123Z host app procid msgid [sd]|- msg
_RFC5424 = re.compile(
    r"<\d{1,3}>1 (\S+) (\S+) (\S+) (\S+) \S+ (?:-|(?:\[(?:[^\]\"\\]|\"(?:[^\"\\]|\\.)*\"|\\.)*\])+)(?: |$)"
)


def _syslog_line(
    line: str, year_hint: int | None
) -> tuple[str, datetime | None, str | None, str | None, int | None] | None:
    """(message, ts, host, tag, pid) when `line` is a syslog line in one of rsyslog's formats."""
    c = line[:1]
    if c == "<":
        m = _RFC5424.match(line)
        if m is not None:
            ts = None if m[1] == "-" else tsu.parse_iso(m[1])
            host = None if m[2] == "-" else m[2]
            tag = None if m[3] == "-" else m[3]
            pid = _int(m[4]) if m[4] != "-" else None
            message = line[m.end() :]
            message = message.removeprefix("\ufeff")
            return message, ts, host, tag, pid
    if c.isdigit() or c == "<":
        m = _RSYSLOG_FILE.match(line)
        if m is not None:
            return line[m.end() :], tsu.parse_iso(m[1]), m[2], m[3], _int(m[4])
    if c.isalpha() or c == "<":
        m = _RSYSLOG_TRAD.match(line)
        if m is not None:
            month = tsu.MONTHS[m[1]]
            day = int(m[2])
            ts = tsu.build(tsu.guess_year(month, day, year_hint), month, day, int(m[3]), int(m[4]), int(m[5]))
            return line[m.end() :], ts, m[6], m[7], _int(m[8])
    return None


def _decode_syslog(
    lines: list[str], received_ts: datetime | None, max_line_bytes: int
) -> list[RawRecord] | None:
    year_hint = received_ts.year if received_ts is not None else None
    first = _syslog_line(lines[0], year_hint)
    if first is None:
        return None
    out: list[RawRecord] = []
    parsed: tuple[str, datetime | None, str | None, str | None, int | None] | None = first
    _, ts, host, tag, pid = first
    for line in lines:
        if parsed is None:
            parsed = _syslog_line(line, year_hint)
        if parsed is not None:
            message, ts, host, tag, pid = parsed
        else:
            message = line  # a line of a multi-line message: same sender
        parsed = None
        message, cut = _truncate(message, max_line_bytes)
        labels = {"syslog_tag": tag} if tag else {}
        if cut:
            labels["truncated"] = "1"
        if not message.strip():
            continue
        out.append(
            RawRecord(
                text=message,
                source="rsyslog",
                host=host,
                pid=pid,
                ts=ts,
                received_ts=received_ts,
                labels=labels,
            )
        )
    return out


# --- entry point ------------------------------------------------------------------------------


def decode_lines(
    value: bytes,
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
                lazy = _ship_lines(objects[0], received_ts, max_line_bytes)
            except DecodeError:
                raise
            except (TypeError, ValueError, AttributeError, KeyError, OverflowError, IndexError) as exc:
                raise DecodeError("bad_record", f"{type(exc).__name__}: {exc}"[:200]) from None
            if lazy is not None:
                return lazy
    return DecodedLines.of(decode_value(value, received_ts=received_ts, max_line_bytes=max_line_bytes,
                                        max_value_bytes=max_value_bytes))


def decode_value(
    value: bytes,
    *,
    received_ts: datetime | None = None,
    max_line_bytes: int = 65536,
    max_value_bytes: int = MAX_VALUE_BYTES,
) -> list[RawRecord]:
    """Records of one Kafka message value. Raises only DecodeError.

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
    objects: list[dict[str, Any]] | None = None
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
    lines = _split_lines(text)
    if not lines:
        raise DecodeError("empty")
    c = lines[0][:1]
    if c == "<" or c.isdigit() or c in "ADFJMNOS":
        syslog = _decode_syslog(lines, received_ts, max_line_bytes)
        if syslog is not None:
            return syslog
    template = RawRecord(text="", source="plain", received_ts=received_ts)
    return _records_from_lines(lines, template, max_line_bytes)


# --- job id -----------------------------------------------------------------------------------

_JOB_LABELS = (
    "training.kubeflow.org/job-name",
    "job-name",
    "kubeflow.org/job-name",
    "batch.kubernetes.io/job-name",
    # Filebeat de-dots label keys by default (labels.dedot: true)
    "training_kubeflow_org/job-name",
    "kubeflow_org/job-name",
    "batch_kubernetes_io/job-name",
    "volcano.sh/job-name",
    "jobset.sigs.k8s.io/jobset-name",
)
_SLURM_LABELS = ("SLURM_JOB_ID", "slurm_job_id", "slurm.job_id")
_SLURM_FILE = re.compile(r"(?:^|/)slurm-(\d+(?:_\d+)?)\.(?:out|err|log)$")


@functools.lru_cache(maxsize=32)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _job_hint(record: RawRecord, path_regex: str | None) -> str | None:
    """Everything job_id_for tries before falling back to the host."""
    if record.job_id:
        return record.job_id
    labels = record.labels
    if labels:
        for key in _JOB_LABELS:
            value = labels.get(key)
            if value:
                return value
    pod = labels.get("k8s.pod") if labels else None
    for name in (pod, record.host):
        if name:
            m = _POD_NAME.match(name)
            if m is not None:
                return m["job"]
    if record.file:
        m = _SLURM_FILE.search(record.file)
        if m is not None:
            return m[1]
    if labels:
        for key in _SLURM_LABELS:
            value = labels.get(key)
            if value:
                return value
    if path_regex and record.file:
        m = _compiled(path_regex).search(record.file)
        if m is not None and m.groupdict().get("job"):
            return m["job"]
    return None


def job_id_for(record: RawRecord, *, path_regex: str | None = None) -> str:
    """The job a record belongs to. First hit of: the explicit `job_id`; a Kubeflow/batch job
    label; the pod name `JOB-worker-N` / `JOB-master-0` / `JOB-launcher-xxxxx` (from the pod
    label, or the host when it is a pod name); Slurm's `slurm-%j.out` file or SLURM_JOB_ID label;
    `path_regex`'s named group `job` on the file path; the host; "unknown"."""
    return _job_hint(record, path_regex) or record.host or "unknown"


# --- LogEvent ---------------------------------------------------------------------------------


def to_event(
    record: RawRecord,
    *,
    identity: Identity | None = None,
    default_job: str | None = None,
    offset: int | None = None,
    path_regex: str | None = None,
) -> LogEvent:
    """The canonical event for one record.

    Identity from the line's prefixes fills what the record lacks (the record's explicit fields
    win); when the two name different hosts, the prefix's goes to `labels["origin_host"]`.
    The time is the line's own when it has one, else the record's. Job: explicit, then labels /
    pod name / Slurm / `path_regex`, then `default_job`, then the host, then "unknown".
    """
    if identity is None:
        identity = parse_prefixes(record.text, year=record.ts.year if record.ts is not None else None)
    job = _job_hint(record, path_regex) or default_job or record.host or "unknown"
    labels = dict(record.labels)
    host = record.host or identity.host
    if identity.host and record.host and identity.host != record.host:
        labels["origin_host"] = identity.host
    line = identity.text
    truncated = labels.get("truncated") == "1"
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS]
        truncated = True
    raw_line = record.text if record.text != line else None
    if raw_line is not None and len(raw_line) > MAX_LINE_CHARS:
        raw_line = raw_line[:MAX_LINE_CHARS]
    return LogEvent(
        job_id=job,
        host=host,
        rank=record.rank if record.rank is not None else identity.rank,
        local_rank=record.local_rank if record.local_rank is not None else identity.local_rank,
        pid=record.pid if record.pid is not None else identity.pid,
        gpu=identity.gpu,
        ts=identity.ts or record.ts,
        received_ts=record.received_ts,
        source=record.source,
        stream=record.stream,
        file=record.file,
        offset=offset if offset is not None else record.offset,
        line=line,
        raw_line=raw_line,
        truncated=truncated,
        attempt=record.attempt,
        labels=labels,
    )
