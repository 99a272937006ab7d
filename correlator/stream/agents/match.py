"""The match role's work on one batch: raw forwarder values in, signals (and dead letters) out.

LogBatchReader (match_batches.py) hands each fetched batch of the logs topic here. One-line JSON
values are screened first by one raw scan (correlator/diagnosis/prefilter.py); the rest, and the
screened values that can give a signal, are decoded with the same decoders `rootrank diagnose` uses
and scanned once with hyperscan (SignalExtractor). Signals go to the signals topic as JSON keyed by
job id, so one job's signals land in one partition. A value that
cannot be decoded never stops the worker: it goes to the dead-letter topic with the reason and the
raw bytes. Every value read is counted exactly once as processed or dead-lettered.
"""

from __future__ import annotations

import base64
import gc
import logging
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter

from correlator.diagnosis.framing import frame_line, line_process
from correlator.diagnosis.matcher import Hit
from correlator.diagnosis.models import Signal
from correlator.diagnosis.prefilter import JsonScreen
from correlator.diagnosis.signals import SignalExtractor
from ingest.decoders import (
    DecodedLines,
    DecodeError,
    RawRecord,
    decode_lines,
    to_event,
)
from ingest.decoders.events import file_line_event
from ingest.event import LogEvent
from ingest.order import line_order, message_position, record_key
from ingest.ship.wire_format import SHIP_SOURCE

log = logging.getLogger(__name__)

RAW_MESSAGES = Counter(
    "rootrank_raw_messages_total", "raw values read from the logs topic, by outcome", ["outcome"]
)
LINES = Counter("rootrank_lines_total", "log lines decoded from raw values")
SIGNALS_SENT = Counter("rootrank_signals_sent_total", "signals sent to the signals topic")


DEADLETTER_MAX_RAW_BYTES = 20 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RawMessage:
    """One value read from the logs topic, with where it came from (for dead letters)."""

    value: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: float | None = None  # Kafka record time, seconds


@dataclass
class MatchOutput:
    signals: list[Signal] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    processed: int = 0
    lines: int = 0


def dead_letter(message: RawMessage, reason: str, detail: str = "", *,
                max_raw_bytes: int = DEADLETTER_MAX_RAW_BYTES) -> dict[str, Any]:
    """The dead-letter record: why, where from, and the raw bytes (base64), whole unless they
    would not fit in one Kafka message (then `raw_truncated` is true and `size` says how big)."""
    raw = message.value or b""
    return {
        "reason": reason,
        "detail": detail[:500],
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
        "timestamp": message.timestamp,
        "size": len(raw),
        "raw_truncated": len(raw) > max_raw_bytes,
        "raw_b64": base64.b64encode(raw[:max_raw_bytes]).decode("ascii"),
    }


def signal_to_bytes(signal: Signal) -> bytes:
    return signal.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8")


SIGNALS_MESSAGE_MAX_BYTES = 512 * 1024


def signal_messages(signals: Sequence[Signal], *, max_bytes: int = SIGNALS_MESSAGE_MAX_BYTES) -> list[tuple[bytes, bytes]]:
    """(key, value) records for the signals topic: a job's signals of one batch go in one record, a
    JSON list in their order (split to stay under `max_bytes`), keyed by the job; a lone signal goes
    as itself. Every record is then read, decoded and applied once instead of once per signal."""
    by_job: dict[str, list[bytes]] = {}
    for signal in signals:
        by_job.setdefault(signal.job_id, []).append(signal_to_bytes(signal))
    out: list[tuple[bytes, bytes]] = []

    def flush(key: bytes, parts: list[bytes]) -> None:
        out.append((key, parts[0] if len(parts) == 1 else b"[" + b",".join(parts) + b"]"))

    for job_id, parts in by_job.items():
        key = job_id.encode("utf-8")
        chunk: list[bytes] = []
        size = 2
        for part in parts:
            if chunk and size + len(part) + 1 > max_bytes:
                flush(key, chunk)
                chunk, size = [], 2
            chunk.append(part)
            size += len(part) + 1
        if chunk:
            flush(key, chunk)
    return out




@dataclass(slots=True)
class _Segment:
    """The lines of one message inside a batch: texts [start, start + len(lines)) of the scan."""

    start: int
    lines: DecodedLines
    offset: int  # the message's Kafka offset: orders the records that carry no position of their own
    owner: int  # index of the message in the batch


class MatchProcessor:
    """The role's work without Kafka: screen, decode, extract, sort out what is poison.

    `invalid_utf8`: "deadletter" sends a value that is not valid UTF-8 to the dead-letter topic
    (kept raw, so nothing is silently altered); "replace" decodes it with U+FFFD instead.
    """

    def __init__(
        self,
        extractor: SignalExtractor,
        *,
        max_value_bytes: int = 4 * 1024 * 1024,
        invalid_utf8: str = "deadletter",
        job_path_regex: str | None = None,
        deadletter_max_raw_bytes: int = DEADLETTER_MAX_RAW_BYTES,
        prefilter: bool = True,
    ) -> None:
        self.extractor = extractor
        self.deadletter_max_raw_bytes = deadletter_max_raw_bytes
        self.max_value_bytes = max_value_bytes
        self.reject_invalid_utf8 = invalid_utf8 == "deadletter"
        self.job_path_regex = job_path_regex
        # One-line JSON values are screened by a raw scan before any is decoded (screen_one_line_json).
        self.prefilter = prefilter
        self.json_screen: JsonScreen | None = None

    @property
    def screen(self) -> JsonScreen:
        """The raw screen of the current rules (a hot reload re-points `extractor`)."""
        matcher = self.extractor.matcher
        if self.json_screen is None or self.json_screen.matcher is not matcher:
            self.json_screen = JsonScreen(matcher, max_value_bytes=self.max_value_bytes)
        return self.json_screen

    def lines_of(self, message: RawMessage) -> DecodedLines:
        """Raises DecodeError (with the reason) for a value that is not a log message."""
        value = message.value
        if value is None or not value.strip():
            raise DecodeError("empty")
        if len(value) > self.max_value_bytes:
            raise DecodeError("too_large", f"{len(value)} bytes > {self.max_value_bytes}")
        if self.reject_invalid_utf8:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DecodeError("not_utf8", f"invalid byte at {exc.start}") from None
        received = (
            datetime.fromtimestamp(message.timestamp, tz=UTC) if message.timestamp is not None else None
        )
        return decode_lines(value, received_ts=received, max_value_bytes=self.max_value_bytes)

    def extract(self, segments: list[_Segment], texts: list[str]) -> list[Signal]:
        """One scan over the raw texts; events (prefix parsing, validation) only for lines that hit."""
        starts = [segment.start for segment in segments]
        one_per_message = len(segments) == len(texts)  # one line per message (Fluent Bit, Vector)
        cache: dict[int, LogEvent] = {}

        def record_at(i: int) -> tuple[RawRecord, int | None]:
            segment = segments[i] if one_per_message else segments[bisect_right(starts, i) - 1]
            return _record_at(segment, i - segment.start)

        def event_at(i: int) -> LogEvent:
            event = cache.get(i)
            if event is None:
                record, offset = record_at(i)
                event = cache[i] = to_event(record, offset=offset, path_regex=self.job_path_regex)
            return event

        def stream_of(i: int) -> tuple[Any, ...]:
            segment = segments[i] if one_per_message else segments[bisect_right(starts, i) - 1]
            return segment.lines.stream_key(i - segment.start)

        def order_of(i: int) -> int:
            event = event_at(i)
            segment = segments[i] if one_per_message else segments[bisect_right(starts, i) - 1]
            base = segment.lines.order_base  # a file's line: its file's place, then its line number
            if base is not None and event.offset is not None:
                return base + event.offset
            # A forwarder's record: its stream's place, then its position (ingest/order.py), as diagnose
            # orders a file of such messages.
            record = segment.lines.record(i - segment.start)
            position = event.offset if event.offset is not None else i
            return line_order(record_key(record.file, record.host), position)

        matcher = self.extractor.matcher

        def frame(i: int, hit: Hit) -> tuple[LogEvent, str, bool]:
            """A file's line (a shipped batch's) framed as `rootrank diagnose` frames it: the same look back
            (the batch's lines before it, then the context the shipper sent), the same identity order."""
            segment = segments[i] if one_per_message else segments[bisect_right(starts, i) - 1]
            lines = segment.lines
            if not lines.from_file:
                return event_at(i), texts[i], False
            local = i - segment.start
            rule_index = hit.rule_index
            framed = frame_line(texts[i], lambda: lines.lines_before(local),
                                lambda text: matcher.matches(rule_index, text),
                                srun_labels="node" if lines.srun_labels == "node" else "auto")
            record, offset = record_at(i)
            own = framed.identity.ts is not None or record.ts is not None
            event = cache[i] = file_line_event(record, framed.identity, framed.ts, offset=offset,
                                               path_regex=self.job_path_regex)
            return event, framed.raw, framed.borrowed and not own

        runs = [] if one_per_message else [
            (segment.start + lo, segment.start + hi) for segment in segments for lo, hi in segment.lines.stream_runs()]
        known = {(segment.start, segment.start + len(segment.lines)): segment.lines.joined
                 for segment in segments if segment.lines.joined is not None}
        framing = any(segment.lines.from_file for segment in segments)
        # Routine lines fold per process, as diagnose folds them: a file (or a forwarder's stream) may hold
        # the lines of many ranks.
        return self.extractor.from_texts(texts, event_at, stream_of, order_of, runs, known,
                                         frame if framing else None, lambda i: line_process(texts[i]))

    def process(self, messages: Sequence[RawMessage]) -> MatchOutput:
        return self.process_values([m.value for m in messages], messages.__getitem__)

    def process_values(self, values: Sequence[bytes | None], message_at: Callable[[int], RawMessage]) -> MatchOutput:
        """The work of one batch: `values` as read, `message_at(i)` the i-th one's RawMessage (built only for
        the values that are decoded or dead-lettered)."""
        # A shipped message decodes into thousands of short-lived lists (one per line); the cyclic
        # garbage collector would walk them (and the worker's long-lived objects) over and over
        # while they are built, for nothing: none of them is part of a cycle. It runs after.
        enabled = gc.isenabled()
        gc.disable()
        try:
            out = MatchOutput()
            decode: Sequence[int] = range(len(values))
            if self.prefilter:
                screened = self.screen.screen(values)
                decode, out.processed, out.lines = screened.decode, screened.skipped, screened.skipped_lines
            self.decode_and_extract([message_at(i) for i in decode], out)
            return out
        finally:
            if enabled:
                gc.enable()

    def decode_and_extract(self, messages: Sequence[RawMessage], out: MatchOutput) -> None:
        segments: list[_Segment] = []
        texts: list[str] = []
        for index, message in enumerate(messages):
            try:
                lines = self.lines_of(message)
            except DecodeError as exc:
                out.dead_letters.append(dead_letter(message, exc.reason, str(exc), max_raw_bytes=self.deadletter_max_raw_bytes))
                continue
            except Exception as exc:
                log.exception("decoder failed on %s[%d]@%d", message.topic, message.partition, message.offset)
                out.dead_letters.append(dead_letter(message, "decoder_error", f"{type(exc).__name__}: {exc}",
                                                    max_raw_bytes=self.deadletter_max_raw_bytes))
                continue
            out.processed += 1
            if len(lines):
                segments.append(_Segment(len(texts), lines, message.offset, index))
                texts.extend(lines.texts)
        out.lines += len(texts)
        if texts:
            try:
                out.signals = self.extract(segments, texts)
            except Exception:
                # Find the value that breaks extraction instead of losing the whole batch.
                log.exception("signal extraction failed on a batch; retrying value by value")
                out.signals = self.extract_one_by_one(messages, segments, out)

    def extract_one_by_one(self, messages: Sequence[RawMessage], segments: list[_Segment],
                            out: MatchOutput) -> list[Signal]:
        signals: list[Signal] = []
        for segment in segments:
            try:
                signals.extend(self.extract([_Segment(0, segment.lines, segment.offset, segment.owner)],
                                             segment.lines.texts))
            except Exception as exc:  # noqa: BLE001 - this value is poison: dead-letter it
                out.processed -= 1
                out.lines -= len(segment.lines)
                out.dead_letters.append(dead_letter(messages[segment.owner], "extract_error", f"{type(exc).__name__}: {exc}",
                                                     max_raw_bytes=self.deadletter_max_raw_bytes))
        return signals


def _record_at(segment: _Segment, index: int) -> tuple[RawRecord, int | None]:
    """The record of a message's `index`-th line, and the order key it gets when it carries no position."""
    record = segment.lines.record(index)
    if record.received_ts is not None and (record.source == SHIP_SOURCE or record.ts is not None):
        # The Kafka record's time is a line's receive time only for a value that carries no time at all
        # (plain text). A shipped line already in its file (no read time) was written whenever: its
        # Kafka time says nothing; the engine times it from the lines before it in its file, as
        # `rootrank diagnose` does. A forwarder's record carries the forwarder's own time (and a syslog
        # header its own), which `rootrank diagnose` of the same messages reads too; a Kafka time
        # beside it would give the stream a clock (the hosts' receive lags) diagnose cannot have.
        record.received_ts = None
    # A position the forwarder sent (Filebeat's log.offset) wins; else the Kafka offset orders
    # the lines, which is all there is for one-line-per-message forwarders.
    return record, None if record.offset is not None else message_position(segment.offset, index)
