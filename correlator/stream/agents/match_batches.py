"""The match role's reader: whole fetched batches of the logs topic, straight from an aiokafka consumer.

Forwarders send one line per Kafka message, and faust's per-message stream (an event, an ack and a few
coroutine hops per message) costs more than the matching itself. The match role keeps nothing between
messages, so it needs none of that: this faust `Service` owns a plain aiokafka consumer in the role's
group (`<app_id>-match`), hands every fetched batch to the MatchProcessor in one call, and sends the
batch's signals and dead letters with faust's producer. The app's own consumer is switched off
(`MatchApp.BootStrategy`); its producer, web server and metrics are the app's as for every role.

Delivery, at least once:
- a batch's offsets are committed only after every signal and dead letter it produced was acknowledged
  by Kafka (acks=all), so a crash redoes at most the uncommitted batch; downstream ids (signals are
  applied by a replay filter, incidents are idempotent) make a redone batch harmless;
- on a partition revocation, aiokafka waits for `on_partitions_revoked`, which waits for the batch in
  flight to be finished and committed before the partitions go;
- a batch is scanned in runs of at most `scan_max_bytes` of values, handing the event loop back between
  runs, so the consumer's heartbeats and the producer keep going during a long scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from mode import Service

from correlator.config import Settings
from correlator.stream import metrics
from correlator.stream.agents.match import (
    LINES,
    RAW_MESSAGES,
    SIGNALS_SENT,
    MatchOutput,
    MatchProcessor,
    RawMessage,
    signal_messages,
)
from correlator.stream.compat import aiokafka_consumer_connected

log = logging.getLogger(__name__)


def consumer_config(settings: Settings, group: str) -> dict[str, Any]:
    """aiokafka consumer settings from the worker's Kafka settings (the same knobs faust's consumer gets)."""
    kafka = settings.kafka
    session_ms = int(kafka.session_timeout_s * 1000)
    conf: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "group_id": group,
        "client_id": f"{group}-reader",
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": kafka.consumer_fetch_max_wait_ms,
        "max_partition_fetch_bytes": kafka.consumer_max_fetch_bytes,
        "fetch_max_bytes": max(kafka.consumer_max_fetch_bytes, 64 * 1024 * 1024),
        "session_timeout_ms": session_ms,
        "heartbeat_interval_ms": int(max(500, min(3000, session_ms / 6))),
        "rebalance_timeout_ms": int(max(session_ms * 2, 20_000)),
        "security_protocol": kafka.security_protocol.upper(),
    }
    if kafka.security_protocol.upper() in ("SSL", "SASL_SSL"):
        import ssl

        conf["ssl_context"] = ssl.create_default_context(cafile=kafka.ssl_cafile)
    if kafka.sasl_mechanism:
        conf.update(sasl_mechanism=kafka.sasl_mechanism, sasl_plain_username=kafka.sasl_username,
                    sasl_plain_password=kafka.sasl_password)
    return conf


class RevocationListener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is imported without types: Any
    """Partitions go only after the batch in flight was finished and committed."""

    def __init__(self, reader: LogBatchReader) -> None:
        self.reader = reader

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if self.reader.batch_lock.locked():
            self.reader.revoked_mid_batch += 1
        async with self.reader.batch_lock:
            self.reader.revocations += 1
            log.debug("match reader: partitions revoked %s", sorted(map(str, revoked)))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.reader.assignment = set(assigned)
        log.debug("match reader: partitions assigned %s", sorted(map(str, assigned)))


class LogBatchReader(Service):
    """Reads `logs_topic` in whole fetched batches and matches them; see the module docstring."""

    def __init__(self, app: Any, settings: Settings, processor: MatchProcessor, *, group: str,
                 max_records: int = 20_000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.app = app
        self.settings = settings
        self.processor = processor
        self.group = group
        self.max_records = max_records
        self.scan_max_bytes = settings.engine.scan_max_bytes
        self.batch_lock = asyncio.Lock()
        self.consumer: AIOKafkaConsumer | None = None
        self.assignment: set[TopicPartition] = set()
        self.revocations = 0
        self.revoked_mid_batch = 0  # revocations that had to wait for a batch in flight
        self.batches = 0
        self.read_offsets: dict[TopicPartition, int] = {}  # last offset matched and committed, per partition
        self.reading: asyncio.Task[None] | None = None
        self.stopping = False

    async def on_start(self) -> None:
        self.consumer = AIOKafkaConsumer(**consumer_config(self.settings, self.group))
        await self.consumer.start()
        self.consumer.subscribe([self.settings.topics.logs], listener=RevocationListener(self))
        self.reading = asyncio.ensure_future(self.read_batches())

    async def on_stop(self) -> None:
        self.stopping = True
        if self.reading is not None:
            try:  # the batch in flight is finished and committed; the next getmany returns within its wait
                await asyncio.wait_for(asyncio.shield(self.reading), timeout=self.settings.kafka.session_timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                self.reading.cancel()
        if self.consumer is not None:
            await self.consumer.stop()

    async def read_batches(self) -> None:
        consumer = self.consumer
        assert consumer is not None
        wait_ms = max(50, int(self.settings.engine.batch_within_s * 1000))
        while not self.stopping:
            try:
                fetched = await consumer.getmany(timeout_ms=wait_ms, max_records=self.max_records)
            except KafkaError as exc:
                log.warning("match reader: fetch failed (%s); retrying", exc)
                await asyncio.sleep(1.0)
                continue
            if not fetched:
                continue
            async with self.batch_lock:
                # A revocation that came in between the fetch and the lock took these partitions away:
                # their records are the next owner's (from the last commit), not ours.
                assigned = consumer.assignment()
                batch = {tp: records for tp, records in fetched.items() if tp in assigned}
                if not batch:
                    continue
                try:
                    await self.handle(batch)
                except Exception:
                    # Not the input (the processor dead-letters what it cannot read): the producer or a
                    # bug. Read the batch again from its first record rather than step over it.
                    log.exception("match reader: batch of %d partition(s) failed; reading it again", len(batch))
                    for tp, records in batch.items():
                        if tp in consumer.assignment():
                            consumer.seek(tp, records[0].offset)
                    await asyncio.sleep(1.0)

    async def handle(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Match every record of `batch`, wait for Kafka's acks of the output, then commit."""
        records = [record for part in batch.values() for record in part]
        values = [record.value for record in records]
        pending: list[Any] = []
        size = sum(map(len, values)) if None not in values else sum(len(v or b"") for v in values)
        if size <= self.scan_max_bytes:  # the usual batch: one run, its values and size known already
            pending.extend(await self.match_chunk(records, values, size))
        else:
            for number, chunk in enumerate(chunks_by_bytes(records, self.scan_max_bytes)):
                if number:
                    await asyncio.sleep(0)  # heartbeats, the producer's sends, the metrics page
                chunk_values = [record.value for record in chunk]
                pending.extend(await self.match_chunk(chunk, chunk_values, sum(len(v or b"") for v in chunk_values)))
        if pending:
            await asyncio.gather(*pending)
        offsets = {tp: part[-1].offset + 1 for tp, part in batch.items()}
        assert self.consumer is not None
        try:
            await self.consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:  # the group moved on: the new owner re-reads
            log.warning("match reader: commit of %d partition(s) refused (%s)", len(offsets), exc)
        else:
            self.read_offsets.update({tp: offset - 1 for tp, offset in offsets.items()})
        self.batches += 1

    async def match_chunk(self, records: Sequence[Any], values: list[bytes | None], size: int) -> list[Any]:
        """Process one run of records (`values` theirs, `size` bytes in all); returns the producer futures of
        its output."""
        started = time.perf_counter()

        def message_at(index: int) -> RawMessage:
            record = records[index]
            stamp = record.timestamp / 1000.0 if record.timestamp is not None else None
            return RawMessage(record.value, record.topic, record.partition, record.offset, stamp)

        out: MatchOutput = self.processor.process_values(values, message_at)
        metrics.count_match_batch(size, out.lines, time.perf_counter() - started)
        metrics.count_signals(out.signals)
        metrics.count_dead_letters("match", out.dead_letters)
        producer = self.app.producer
        topics = self.settings.topics
        futures = [await producer.send(topics.signals, key, value, None, None, None)
                   for key, value in signal_messages(out.signals)]
        futures.extend([await producer.send(topics.deadletter, None, orjson.dumps(letter), None, None, None)
                        for letter in out.dead_letters])
        RAW_MESSAGES.labels("processed").inc(out.processed)
        RAW_MESSAGES.labels("deadletter").inc(len(out.dead_letters))
        LINES.inc(out.lines)
        SIGNALS_SENT.inc(len(out.signals))
        return futures

    # --- what the metrics page and the readiness probe ask -----------------------------------------

    def connected(self) -> bool:
        return self.consumer is not None and aiokafka_consumer_connected(self.consumer)

    def assigned(self) -> set[TopicPartition]:
        if self.consumer is None:
            return set()
        with contextlib.suppress(Exception):
            return set(self.consumer.assignment())
        return set()

    def lag(self) -> dict[TopicPartition, int]:
        """highwater - (last offset matched + 1), per assigned partition the consumer has fetched."""
        out: dict[TopicPartition, int] = {}
        if self.consumer is None:
            return out
        for tp in self.assigned():
            with contextlib.suppress(Exception):
                highwater = self.consumer.highwater(tp)
                if highwater is not None:
                    read = self.read_offsets.get(tp)
                    out[tp] = max(0, highwater - (read + 1 if read is not None else 0))
        return out


def chunks_by_bytes(records: Sequence[Any], max_bytes: int) -> list[Sequence[Any]]:
    """Consecutive runs of records of at most `max_bytes` of values each (a larger value alone)."""
    out: list[Sequence[Any]] = []
    start = size = 0
    for index, record in enumerate(records):
        length = len(record.value or b"")
        if index > start and size + length > max_bytes:
            out.append(records[start:index])
            start, size = index, 0
        size += length
    if start < len(records):
        out.append(records[start:])
    return out
