"""The `match` agent: raw forwarder values in, signals (and dead letters) out.

Reads the logs topic in batches, decodes each value with the same decoders `rootrank diagnose`
uses, scans the whole batch once with hyperscan (SignalExtractor), and sends each signal as JSON
to the signals topic keyed by job id, so one job's signals land in one partition. A value that
cannot be decoded never stops the worker: it goes to the dead-letter topic with the reason and the
raw bytes. Every value read is counted exactly once as processed or dead-lettered.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import logging
import time
from bisect import bisect_right
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from prometheus_client import Counter

from correlator.diagnosis.models import Signal
from correlator.diagnosis.prefilter import JsonScreen
from correlator.diagnosis.signals import SignalExtractor
from correlator.stream import metrics
from ingest.decoders import (
    DecodedLines,
    DecodeError,
    RawRecord,
    decode_lines,
    to_event,
)
from ingest.event import LogEvent
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


# Lines of one message share its Kafka offset; this stride keeps their order inside the message.
LINES_PER_OFFSET = 1_000_000


@dataclass(slots=True)
class _Segment:
    """The lines of one message inside a batch: texts [start, start + len(lines)) of the scan."""

    start: int
    lines: DecodedLines
    base: int  # LINES_PER_OFFSET * Kafka offset: orders lines that carry no position of their own
    owner: int  # index of the message in the batch


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
            record = record_at(i)[0]
            return (record.host, record.rank, record.file, record.stream)

        def order_of(i: int) -> int:
            event = event_at(i)
            return event.offset if event.offset is not None else i

        return self.extractor.from_texts(texts, event_at, stream_of, order_of)

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
                out.dead_letters.append(dead_letter(message, "decoder_error", f"{type(exc).__name__}: {exc}", max_raw_bytes=self.deadletter_max_raw_bytes))
                continue
            out.processed += 1
            if len(lines):
                segments.append(_Segment(len(texts), lines, message.offset * LINES_PER_OFFSET, index))
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
                signals.extend(self.extract([_Segment(0, segment.lines, segment.base, segment.owner)],
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
    if record.source == SHIP_SOURCE and record.ts is None:
        # The shipper found this line already in its file (no read time): when it reached
        # Kafka says nothing about when it was written. Without a receive time the engine
        # times it from the timed lines around it in its file, as `rootrank diagnose` does.
        record.received_ts = None
    # A position the forwarder sent (Filebeat's log.offset) wins; else the Kafka offset orders
    # the lines, which is all there is for one-line-per-message forwarders.
    return record, None if record.offset is not None else segment.base + index


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


def chunks_by_bytes(messages: Sequence[RawMessage], max_bytes: int) -> list[Sequence[RawMessage]]:
    """Consecutive runs of messages of at most `max_bytes` of values each (a larger value alone)."""
    out: list[Sequence[RawMessage]] = []
    start = size = 0
    for index, message in enumerate(messages):
        length = len(message.value or b"")
        if index > start and size + length > max_bytes:
            out.append(messages[start:index])
            start, size = index, 0
        size += length
    if start < len(messages):
        out.append(messages[start:])
    return out


def take_events_bounded(stream: Any, max_events: int, max_bytes: int, within: float,
                        idle_s: float = 0.02) -> AsyncIterator[list[Any]]:
    """faust's `Stream.take_events(max_events, within)`, which also yields as soon as the buffered
    values reach `max_bytes`, or once values stop arriving for `idle_s`.

    Shipped messages are big (256 KiB, thousands of lines): a batch of `max_events` of them is never
    reached, so take_events would wait out `within` before every batch even with a backlog, leaving
    the worker idle for that long each time. Acks are as in take_events: a batch's events are acked
    when the loop asks for the next batch, after its output was sent.
    """
    from mode.utils.futures import notify

    events: list[Any] = []
    size = 0
    buffer_full = asyncio.Event()
    buffer_consumed = asyncio.Event()
    buffer_consuming: asyncio.Future[Any] | None = None
    stream_enable_acks: bool = stream.enable_acks
    channel_it = stream.channel.__aiter__()

    async def add_to_buffer(value: Any) -> Any:
        nonlocal buffer_consuming, size
        try:
            if buffer_consuming is not None:
                try:
                    await buffer_consuming
                finally:
                    buffer_consuming = None
            event = stream.current_event
            if event is None:
                raise RuntimeError("Take buffer found current_event is None")
            events.append(event)
            size += len(event.value or b"") if isinstance(event.value, (bytes, str)) else 0
            if len(events) >= max_events or size >= max_bytes:
                buffer_full.set()
                buffer_consumed.clear()
                await stream.wait(buffer_consumed)
        except asyncio.CancelledError:  # pragma: no cover
            raise
        except Exception as exc:
            log.exception("error adding to the match batch")
            await stream.crash(exc)
        return value

    async def batches() -> AsyncIterator[list[Any]]:
        nonlocal buffer_consuming, size
        stream.enable_acks = False
        stream.add_processor(add_to_buffer)
        stream._enable_passive(channel_it)
        loop = asyncio.get_running_loop()
        try:
            while not stream.should_stop:
                # Wait up to `within` for a full batch, but take what is there as soon as nothing new
                # arrived for `idle_s`: with a backlog, values come in bursts (one fetch at a time),
                # and waiting out the whole window after each burst would leave the worker idle.
                deadline = loop.time() + within
                seen = len(events)
                while not stream.should_stop:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    await stream.wait_for_stopped(buffer_full, timeout=min(remaining, idle_s))
                    if buffer_full.is_set() or (events and len(events) == seen):
                        break
                    seen = len(events)
                if events:
                    buffer_consuming = stream.loop.create_future()
                    try:
                        yield list(events)
                    finally:
                        for event in events:
                            await stream.ack(event)
                        events.clear()
                        size = 0
                        notify(buffer_consuming)
                        buffer_full.clear()
                        buffer_consumed.set()
        finally:
            stream.enable_acks = stream_enable_acks
            stream._processors.remove(add_to_buffer)

    agen = batches()
    tracked = getattr(stream, "_active_agens", None)
    if tracked is not None:  # closed by Stream.on_stop like faust's own take_events
        tracked.add(agen)
    return agen


def make_match_agent(
    app: Any,
    source: Any,
    signals_out: Any,
    deadletter_out: Any,
    processor: MatchProcessor,
    *,
    batch_size: int,
    batch_within_s: float,
    scan_max_bytes: int = 16 * 1024 * 1024,
    name: str = "match",
) -> Any:
    """Register the agent on `app`. `source`/`*_out` are faust channels: topics in production,
    in-memory channels in unit tests. The agent yields one count summary per batch.

    A batch of `batch_size` messages is scanned in runs of at most `scan_max_bytes` of values (shipped
    messages carry thousands of lines each), handing the event loop back between runs so heartbeats,
    the producer and the metrics page keep going. The batch's offsets are committed only once all of
    it was handled and faust has flushed the producer (its commit does), so every signal and dead
    letter of a batch is durable before the batch counts as read.
    """

    async def match(stream: Any) -> AsyncIterator[dict[str, int]]:
        async for events in take_events_bounded(stream, batch_size, scan_max_bytes, batch_within_s):
            raw = [raw_message_of(e) for e in events]
            summary = {"read": len(events), "processed": 0, "deadletter": 0, "lines": 0, "signals": 0}
            for number, chunk in enumerate(chunks_by_bytes(raw, scan_max_bytes)):
                if number:
                    await asyncio.sleep(0)
                started = time.perf_counter()
                out = processor.process(chunk)
                metrics.count_match_batch(sum(len(m.value or b"") for m in chunk), out.lines,
                                          time.perf_counter() - started)
                metrics.count_signals(out.signals)
                metrics.count_dead_letters("match", out.dead_letters)
                for key, value in signal_messages(out.signals):
                    await signals_out.send(key=key, value=value)
                for letter in out.dead_letters:
                    await deadletter_out.send(value=orjson.dumps(letter))
                RAW_MESSAGES.labels("processed").inc(out.processed)
                RAW_MESSAGES.labels("deadletter").inc(len(out.dead_letters))
                LINES.inc(out.lines)
                SIGNALS_SENT.inc(len(out.signals))
                summary["processed"] += out.processed
                summary["deadletter"] += len(out.dead_letters)
                summary["lines"] += out.lines
                summary["signals"] += len(out.signals)
            yield summary

    return app.agent(source, name=name)(match)
