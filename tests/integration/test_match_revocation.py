"""The match role's reader loses nothing and doubles nothing when its partitions are revoked mid-batch.

Two LogBatchReaders in one consumer group on a real broker (Tansu). The first holds a batch in flight
(its output not yet acknowledged) when the second joins: the group rebalances while that batch is
processed. aiokafka waits for `on_partitions_revoked`, which waits for the batch to be finished and
committed, so the second reader starts after it: every value is matched once, by one of the two, and
every failure line gives its signal once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from correlator.config import Settings
from correlator.diagnosis.rules import load_ruleset
from correlator.diagnosis.signals import SignalExtractor
from correlator.stream.agents.correlate import decode_signal_messages
from correlator.stream.agents.match import MatchOutput, MatchProcessor, RawMessage
from correlator.stream.agents.match_batches import LogBatchReader
from tests.fixtures.kafka import BrokerAddress, create_topics

pytestmark = pytest.mark.integration

PARTITIONS = 4
VALUES = 4000  # 1,000 per partition
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.11 GiB"


class ProducerOnly:
    """What LogBatchReader asks of the faust app: `producer.send(...)` returning an awaitable of the ack."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = self

        async def send(topic: str, key: bytes | None, value: bytes, partition: Any, timestamp: Any,
                       headers: Any) -> Any:
            return await producer.send(topic, value, key=key)

        self.send = send


class RecordingProcessor(MatchProcessor):
    """A MatchProcessor that notes every (partition, offset) it was handed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, int]] = []

    def process_values(self, values: Sequence[bytes | None], message_at: Any) -> MatchOutput:
        for index in range(len(values)):
            message: RawMessage = message_at(index)
            self.seen.append((message.partition, message.offset))
        return super().process_values(values, message_at)


def produce_to_partitions(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Round-robin over the partitions, so both readers have work after the split."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i, value in enumerate(values):
            producer.send(topic, value=value, partition=i % PARTITIONS)
        producer.flush(30)
    finally:
        producer.close(5)


def fluent_bit(i: int) -> bytes:
    rank = i % 16
    text = f"[rank{rank}]: {OOM}" if i % 100 == 7 else f"[rank{rank}]: step {i // 16} loss {2 + (i % 7) / 10:.2f}"
    return orjson.dumps({"@timestamp": 1_764_741_000 + i / 100, "log": text + "\n", "stream": "stderr",
                         "hostname": f"gpu-node-{rank // 8:03d}", "job_id": f"revoke-{i % 3}"})


async def read_signals(bootstrap: str, topic: str, wait_s: float) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    out: list[Any] = []
    try:
        deadline = asyncio.get_running_loop().time() + wait_s
        while asyncio.get_running_loop().time() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            if not batch and out:
                break
            for records in batch.values():
                for record in records:
                    out.extend(d.signal for d in decode_signal_messages(record.key, record.value))
    finally:
        await consumer.stop()
    return out


async def scenario(bootstrap: str, settings: Settings) -> tuple[RecordingProcessor, RecordingProcessor, LogBatchReader]:
    extractor = SignalExtractor(load_ruleset())
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    app = ProducerOnly(producer)
    first_processor, second_processor = RecordingProcessor(extractor), RecordingProcessor(extractor)
    group = "rr-revoke-match"
    # The first batch takes three partitions' records (aiokafka fills a batch partition by partition):
    # whatever the split, one of them moves to the second reader.
    first = LogBatchReader(app, settings, first_processor, group=group, max_records=VALUES * 3 // PARTITIONS)
    second = LogBatchReader(app, settings, second_processor, group=group, max_records=VALUES)
    second_joins = asyncio.Event()
    second_partitions: set[int] = set()
    held = asyncio.Event()
    match_chunk = first.match_chunk
    batches = 0

    async def slow_first_batches(records: Sequence[Any], values: list[bytes | None], size: int) -> list[Any]:
        nonlocal batches
        futures = await match_chunk(records, values, size)
        batches += 1
        if batches == 1:
            first.held_partitions = {record.partition for record in records}  # type: ignore[attr-defined]
            # Hold the third batch, its output unacknowledged, until the group asks for the partitions
            # back (the second reader joined): the revocation comes in the middle of this batch.
            held.set()
            await second_joins.wait()
            deadline = asyncio.get_running_loop().time() + 60
            while first.revoked_mid_batch == 0 and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110 - a counter the reader under test keeps: nothing to wait on
                await asyncio.sleep(0.05)
            # Longer than the group takes to hand the partitions on when nothing holds them back
            # (well inside the rebalance timeout, 20 s): a reader that let them go now would see the
            # second reader read this batch's records again.
            await asyncio.sleep(6.0)
        return futures

    first.match_chunk = slow_first_batches  # type: ignore[method-assign]
    try:
        await first.start()
        await asyncio.wait_for(held.wait(), 60)
        await second.start()
        second_joins.set()
        total = 0
        deadline = asyncio.get_running_loop().time() + 120
        while asyncio.get_running_loop().time() < deadline:
            total = len(first_processor.seen) + len(second_processor.seen)
            if total >= VALUES and second.assignment and first.revocations:
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)  # a value read twice would show up by now
        second_partitions.update(tp.partition for tp in second.assignment)
    finally:
        await second.stop()
        await first.stop()
        await producer.stop()
    first.second_partitions = second_partitions  # type: ignore[attr-defined]
    return first_processor, second_processor, first


def test_revoking_partitions_mid_batch_loses_no_line_and_doubles_none(tansu_broker: BrokerAddress, tmp_path: Path) -> None:
    settings = Settings.model_validate({
        "kafka": {"bootstrap_servers": tansu_broker, "session_timeout_s": 10.0, "consumer_fetch_max_wait_ms": 100},
        "topics": {"logs": "rr-revoke.logs", "signals": "rr-revoke.signals", "deadletter": "rr-revoke.deadletter",
                   "partitions": PARTITIONS},
        "engine": {"batch_within_s": 0.1},
        "data_dir": str(tmp_path),
    })
    create_topics(tansu_broker, [settings.topics.logs], partitions=PARTITIONS)
    create_topics(tansu_broker, [settings.topics.signals, settings.topics.deadletter], partitions=1)
    values = [fluent_bit(i) for i in range(VALUES)]
    produce_to_partitions(tansu_broker, settings.topics.logs, values)

    first, second, first_reader = asyncio.run(scenario(tansu_broker, settings))

    assert first_reader.revocations >= 1, "the group never rebalanced"
    assert first_reader.revoked_mid_batch >= 1, "no revocation came while a batch was in flight"
    assert len(first_reader.held_partitions) > 1, "the batch held over the rebalance was one partition's"
    assert first_reader.second_partitions, "the second reader got no partition"
    moved = first_reader.held_partitions & first_reader.second_partitions
    assert moved, "no partition of the batch in flight moved to the second reader"
    seen = first.seen + second.seen
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} value(s) matched twice"
    assert {partition for partition, _ in seen} == set(range(PARTITIONS))
    assert len(seen) == VALUES, f"{VALUES - len(set(seen))} value(s) never matched"

    signals = asyncio.run(read_signals(tansu_broker, settings.topics.signals, 30.0))
    failures = [s for s in signals if s.class_ == "cuda_oom"]
    assert len(failures) == VALUES // 100  # one line in a hundred, each once
