"""Two workers in one consumer group (per role) split the partitions, and every job's incident is
still the offline one, emitted once per revision. Tansu: the broker whose group rebalancing is right."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka.partitioner.default import murmur2

from correlator.diagnosis.rules import load_ruleset
from correlator.tooling.simulate import log_paths, simulate
from tests.fixtures.kafka import (
    BrokerAddress,
    offline_incidents,
    produce,
    rules_snapshot,
    ship_format_messages,
    start_pipeline,
    streamed_essentials,
    wait_for,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4


def partition_of(key: str) -> int:
    """Kafka's default partitioner (the Java client's, aiokafka's and kafka-python's)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % PARTITIONS


def job_ids_covering_partitions(prefix: str) -> list[str]:
    """One job id per signals partition, so both workers' partitions get a job."""
    chosen: dict[int, str] = {}
    n = 0
    while len(chosen) < PARTITIONS:
        job = f"{prefix}-{n}"
        chosen.setdefault(partition_of(job), job)
        n += 1
    return [chosen[p] for p in sorted(chosen)]


def test_two_workers_split_partitions_and_incidents_stay_right(tansu_broker: BrokerAddress, tmp_path: Path) -> None:
    pipeline = start_pipeline(tansu_broker, tmp_path, "rr-two", workers=2)
    try:
        first, second = pipeline.workers
        jobs = job_ids_covering_partitions("split")
        classes = ["cuda_oom", "nccl_timeout", "cuda_oom", "nccl_timeout"]
        expected = {}
        started = time.monotonic()
        for index, (job, cls) in enumerate(zip(jobs, classes, strict=True)):
            out = tmp_path / job
            truth = simulate(cls, world_size=8, hosts=2, seed=20 + index, noise_lines=8, out=out,
                             ruleset=load_ruleset(rules_snapshot()))
            paths = log_paths(out, truth)
            expected[job] = offline_incidents(paths, job)
            for path in paths:
                # Keyed like `rootrank ship` keys a stream, so the raw logs spread over the partitions too.
                produce(tansu_broker, "rootrank.logs", ship_format_messages(job, path), key=f"{job}|{path}".encode())

        def all_right(streamed: list[dict[str, Any]]) -> bool:
            return all(streamed_essentials(streamed, job) == want for job, want in expected.items())

        streamed = pipeline.incidents(None, until=all_right, timeout=90)
        elapsed = time.monotonic() - started
        seen = [(i["incident_id"], i["revision"]) for i in streamed if i["job_id"] in expected]
        assert len(seen) == len(set(seen)), f"a revision was emitted twice: {seen}"

        # Both workers did part of both roles' work: the partitions were split, not idle on one side.
        def both_busy() -> bool:
            raw = 'rootrank_raw_messages_total{outcome="processed"}'
            applied = 'rootrank_signals_applied_total{outcome="added"}'
            return all(m.get(raw, 0) > 0 and m.get(applied, 0) > 0 for m in (first.metrics(), second.metrics()))

        wait_for(both_busy, 10, what="both workers to have processed raw messages and signals")
        raw = 'rootrank_raw_messages_total{outcome="processed"}'
        applied = 'rootrank_signals_applied_total{outcome="added"}'
        m1, m2 = first.metrics(), second.metrics()
        print(f"\n{len(jobs)} jobs on {PARTITIONS} partitions, 2 workers: incidents right after {elapsed:.1f}s; "
              f"raw messages {m1[raw]:.0f} + {m2[raw]:.0f}, signals {m1[applied]:.0f} + {m2[applied]:.0f}")
    finally:
        pipeline.stop()
