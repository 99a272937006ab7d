"""The `match` agent: raw forwarder values in, signals (and dead letters) out.

Reads the logs topic in batches, decodes each value with the same decoders `rootrank diagnose`
uses, scans the whole batch once with hyperscan (SignalExtractor), and sends each signal as JSON
to the signals topic keyed by job id, so one job's signals land in one partition. A value that
cannot be decoded never stops the worker: it goes to the dead-letter topic with the reason and the
raw bytes. Every value read is counted exactly once as processed or dead-lettered.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from prometheus_client import Counter

from correlator import metrics
from correlator.models import Signal
from correlator.signals import SignalExtractor
from ingest.decoders import DecodeError, RawRecord, decode_value, to_event
from ingest.event import LogEvent
from ingest.ship_format import SHIP_SOURCE

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


# Lines of one message share its Kafka offset; this stride keeps their order inside the message.
LINES_PER_OFFSET = 1_000_000


class MatchProcessor:
    """The agent's work without faust: decode, extract, sort out what is poison.

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
    ) -> None:
        self.extractor = extractor
        self.deadletter_max_raw_bytes = deadletter_max_raw_bytes
        self.max_value_bytes = max_value_bytes
        self.reject_invalid_utf8 = invalid_utf8 == "deadletter"
        self.job_path_regex = job_path_regex

    def _records_of(self, message: RawMessage) -> list[tuple[RawRecord, int | None]]:
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
        records = decode_value(value, received_ts=received, max_value_bytes=self.max_value_bytes)
        for record in records:
            if record.source == SHIP_SOURCE and record.ts is None:
                # The shipper found this line already in its file (no read time): when it reached
                # Kafka says nothing about when it was written. Without a receive time the engine
                # times it from the timed lines around it in its file, as `rootrank diagnose` does.
                record.received_ts = None
        base = message.offset * LINES_PER_OFFSET
        # A position the forwarder sent (Filebeat's log.offset) wins; else the Kafka offset orders
        # the lines, which is all there is for one-line-per-message forwarders.
        return [(record, None if record.offset is not None else base + index) for index, record in enumerate(records)]

    def _event(self, record: RawRecord, offset: int | None) -> LogEvent:
        return to_event(record, offset=offset, path_regex=self.job_path_regex)

    def _extract(self, pending: list[tuple[RawRecord, int | None]]) -> list[Signal]:
        """One scan over the raw texts; events (prefix parsing, validation) only for lines that hit."""
        cache: dict[int, LogEvent] = {}

        def event_at(i: int) -> LogEvent:
            if i not in cache:
                cache[i] = self._event(*pending[i])
            return cache[i]

        def order_of(i: int) -> int:
            event = event_at(i)
            return event.offset if event.offset is not None else i

        return self.extractor.from_texts(
            [record.text for record, _ in pending],
            event_at,
            lambda i: (pending[i][0].host, pending[i][0].rank, pending[i][0].file, pending[i][0].stream),
            order_of,
        )

    def process(self, messages: Sequence[RawMessage]) -> MatchOutput:
        out = MatchOutput()
        events: list[tuple[RawRecord, int | None]] = []
        owners: list[int] = []  # index of the message each record came from
        for index, message in enumerate(messages):
            try:
                these = self._records_of(message)
            except DecodeError as exc:
                out.dead_letters.append(dead_letter(message, exc.reason, str(exc), max_raw_bytes=self.deadletter_max_raw_bytes))
                continue
            except Exception as exc:
                log.exception("decoder failed on %s[%d]@%d", message.topic, message.partition, message.offset)
                out.dead_letters.append(dead_letter(message, "decoder_error", f"{type(exc).__name__}: {exc}", max_raw_bytes=self.deadletter_max_raw_bytes))
                continue
            events.extend(these)
            owners.extend([index] * len(these))
            out.processed += 1
        out.lines = len(events)
        if events:
            try:
                out.signals = self._extract(events)
            except Exception:
                # Find the value that breaks extraction instead of losing the whole batch.
                log.exception("signal extraction failed on a batch; retrying value by value")
                out.signals = self._extract_one_by_one(messages, events, owners, out)
        return out

    def _extract_one_by_one(
        self, messages: Sequence[RawMessage], events: list[tuple[RawRecord, int | None]], owners: list[int],
        out: MatchOutput,
    ) -> list[Signal]:
        signals: list[Signal] = []
        by_owner: dict[int, list[tuple[RawRecord, int | None]]] = {}
        for event, owner in zip(events, owners):
            by_owner.setdefault(owner, []).append(event)
        for owner, owned in by_owner.items():
            try:
                signals.extend(self._extract(owned))
            except Exception as exc:  # noqa: BLE001 - this value is poison: dead-letter it
                out.processed -= 1
                out.lines -= len(owned)
                out.dead_letters.append(dead_letter(messages[owner], "extract_error", f"{type(exc).__name__}: {exc}",
                                                     max_raw_bytes=self.deadletter_max_raw_bytes))
        return signals


def raw_message_of(event: Any) -> RawMessage:
    """A faust event from the logs topic as a RawMessage."""
    message = event.message
    value = event.value
    if isinstance(value, str):
        value = value.encode("utf-8")
    return RawMessage(
        value=value,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        timestamp=message.timestamp,
    )


def make_match_agent(
    app: Any,
    source: Any,
    signals_out: Any,
    deadletter_out: Any,
    processor: MatchProcessor,
    *,
    batch_size: int,
    batch_within_s: float,
    name: str = "match",
) -> Any:
    """Register the agent on `app`. `source`/`*_out` are faust channels: topics in production,
    in-memory channels in unit tests. The agent yields one count summary per batch."""

    async def match(stream: Any) -> AsyncIterator[dict[str, int]]:
        async for events in stream.take_events(batch_size, within=batch_within_s):
            started = time.perf_counter()
            raw = [raw_message_of(e) for e in events]
            out = processor.process(raw)
            metrics.count_match_batch(sum(len(m.value or b"") for m in raw), out.lines, time.perf_counter() - started)
            metrics.count_signals(out.signals)
            metrics.count_dead_letters("match", out.dead_letters)
            for signal in out.signals:
                await signals_out.send(key=signal.job_id.encode("utf-8"), value=signal_to_bytes(signal))
            for letter in out.dead_letters:
                await deadletter_out.send(value=orjson.dumps(letter))
            RAW_MESSAGES.labels("processed").inc(out.processed)
            RAW_MESSAGES.labels("deadletter").inc(len(out.dead_letters))
            LINES.inc(out.lines)
            SIGNALS_SENT.inc(len(out.signals))
            yield {
                "read": len(events),
                "processed": out.processed,
                "deadletter": len(out.dead_letters),
                "lines": out.lines,
                "signals": len(out.signals),
            }

    return app.agent(source, name=name)(match)
