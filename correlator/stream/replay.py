"""`rootrank replay`: a job's stored lines, read again from the logs topic and diagnosed offline.

After a rule change an operator wants to know what the new rules say about a job that already broke,
without shipping its logs again. The logs topic still holds them (for its retention): this reads the
topic from its start (or from `since`) up to its end when the replay began, decodes every value with
the match role's own processing (`MatchProcessor`: the same decoders, the same framing of a shipped
file's lines, the same extraction), keeps the job's signals, and runs the engine on them as `rootrank
diagnose` does (one state, the job's own clock). The incidents are those the stream would give from
the same lines with the given rules: the same ids, so they can be compared with the stored ones.

Which values are the job's: a `rootrank ship` batch's key is `JOB|host|file` (values of other jobs
are skipped without decoding); a forwarder's value (keyed by file or pod) is decoded and its job read
from its fields, labels, pod, Slurm file or path, as the worker reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from correlator.config import Settings
from correlator.diagnosis.engine import Engine, JobState
from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.models import Incident, Signal
from correlator.diagnosis.rules import RuleSet
from correlator.diagnosis.signals import SignalExtractor
from correlator.stream.agents.match import MatchProcessor, RawMessage

BATCH_VALUES = 5000


@dataclass
class ReplayStats:
    partitions: int = 0
    values: int = 0  # read from the topic
    skipped: int = 0  # another job's shipped batches, not decoded
    decoded: int = 0
    lines: int = 0
    dead_letters: int = 0
    signals: int = 0
    seconds: float = 0.0
    empty_partitions: list[int] = field(default_factory=list)


def _consumer(settings: Settings) -> Any:
    from kafka import KafkaConsumer

    from correlator.stream.setup_topics import kafka_python_config

    return KafkaConsumer(
        **kafka_python_config(settings.kafka), group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
        client_id="rootrank-replay", fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=max(settings.kafka.consumer_max_fetch_bytes, 8 * 1024 * 1024),
        request_timeout_ms=30_000,
    )


def _foreign_batch(key: bytes | None, prefix: bytes) -> bool:
    """A `rootrank ship` batch of another job, by its key `JOB|host|file` alone (not decoded)."""
    return key is not None and key.count(b"|") >= 2 and not key.startswith(prefix)


def replay_job(
    settings: Settings,
    job: str,
    ruleset: RuleSet,
    *,
    since: datetime | None = None,
    progress: Callable[[ReplayStats], None] | None = None,
) -> tuple[list[Incident], list[Signal], ReplayStats]:
    """The incidents of `job` from the lines the logs topic holds (from `since`), with `ruleset`; its
    signals (for the report's picture) and what was read."""
    from kafka import TopicPartition

    started = time.monotonic()
    matcher = Matcher(ruleset)
    engine = settings.engine
    processor = MatchProcessor(SignalExtractor(ruleset, matcher), max_value_bytes=engine.max_value_bytes,
                               invalid_utf8=engine.invalid_utf8, job_path_regex=engine.job_path_regex)
    topic = settings.topics.logs
    stats = ReplayStats()
    signals: list[Signal] = []
    prefix = f"{job}|".encode()
    consumer = _consumer(settings)
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        stats.partitions = len(tps)
        if not tps:
            return [], [], stats
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)  # the topic as it is now: what comes later is not read
        if since is not None:
            found = consumer.offsets_for_times({tp: int(since.timestamp() * 1000) for tp in tps})
            for tp in tps:
                at = found.get(tp)
                consumer.seek(tp, at.offset if at is not None else ends[tp])
        else:
            consumer.seek_to_beginning(*tps)
        remaining = {tp for tp in tps if consumer.position(tp) < ends[tp]}
        stats.empty_partitions = sorted(tp.partition for tp in tps if tp not in remaining)
        pending: list[Any] = []
        while remaining:
            fetched = consumer.poll(timeout_ms=1000, max_records=BATCH_VALUES)
            for tp, records in fetched.items():
                for record in records:
                    if record.offset >= ends[tp]:
                        continue
                    stats.values += 1
                    if _foreign_batch(record.key, prefix):
                        stats.skipped += 1
                    else:
                        pending.append(record)
                if tp in remaining and consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
            if len(pending) >= BATCH_VALUES or (pending and not remaining):
                signals.extend(_match(processor, pending, job, stats))
                pending = []
                if progress is not None:
                    progress(stats)
        if pending:
            signals.extend(_match(processor, pending, job, stats))
    finally:
        consumer.close()
    state = JobState(job_id=job)
    state.add_all(signals)
    incidents = Engine(ruleset).diagnose(state)
    stats.signals = len(signals)
    stats.seconds = time.monotonic() - started
    return incidents, signals, stats


def _match(processor: MatchProcessor, records: list[Any], job: str, stats: ReplayStats) -> list[Signal]:
    """The job's signals of a run of records, as the match role makes them."""
    values = [record.value for record in records]

    def message_at(index: int) -> RawMessage:
        record = records[index]
        stamp = record.timestamp / 1000.0 if record.timestamp is not None else None
        return RawMessage(record.value, record.topic, record.partition, record.offset, stamp)

    out = processor.process_values(values, message_at)
    stats.decoded += len(values)
    stats.lines += out.lines
    stats.dead_letters += len(out.dead_letters)
    return [signal for signal in out.signals if signal.job_id == job]
