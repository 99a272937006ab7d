"""Faults across the whole pipeline, effects counted where users see them: Elasticsearch documents
and webhook deliveries.

One `rootrank worker --role match,correlate,es-sink,webhooks` (Tansu broker, noida-db's
Elasticsearch API, a local webhook receiver) is killed with SIGKILL twice: in the middle of a job's
failure (half of its logs read, the incident not yet written), and again right after the first
incident message appeared (the sinks may be mid-write). After the restarts: the incident is the
offline one, there is exactly one document per incident id, and each revision was notified once.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from itertools import zip_longest
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from elasticsearch import Elasticsearch

from correlator.cli import main
from correlator.diagnosis.rules import load_ruleset
from correlator.offline.diagnose import diagnose_paths
from correlator.sinks.elasticsearch.indices import incidents_names
from correlator.sinks.webhooks.receivers.generic_json import generate_secret
from correlator.tooling.simulate import log_paths, simulate
from tests.fixtures.elasticsearch import ElasticsearchServer
from tests.fixtures.http_receiver import HttpReceiver
from tests.fixtures.kafka import (
    BrokerAddress,
    WorkerProcess,
    incident_essentials,
    latest_revisions,
    pipeline_env,
    produce,
    read_topic,
    ship_format_messages,
    wait_for,
)

pytestmark = pytest.mark.integration

ROLES = "match,correlate,es-sink,webhooks"
ADDED = 'rootrank_signals_applied_total{outcome="added"}'


def json_diff(want: Any, got: Any) -> str:
    """A unified diff of two JSON values, for assertion messages."""
    import difflib

    def lines(value: Any) -> list[str]:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode().splitlines()

    return "\n".join(difflib.unified_diff(lines(want), lines(got), "offline", "streamed", lineterm="", n=2))


def test_sigkill_mid_failure_gives_one_document_and_one_webhook_per_revision(
    tansu_broker: BrokerAddress, noida_elasticsearch: ElasticsearchServer, http_receiver: HttpReceiver,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    job = "fault-kill9"
    truth = simulate("cuda_oom", world_size=8, hosts=2, seed=11, noise_lines=10, out=tmp_path / "sim")
    first_file, second_file = sorted(log_paths(tmp_path / "sim", truth))
    offline = sorted((incident_essentials(i.to_json_dict()) for i in diagnose_paths([first_file, second_file], job_id=job)),
                     key=lambda i: i["incident_id"])
    assert offline

    secret = generate_secret()
    http_receiver.expect_secret(secret)
    config = tmp_path / "rootrank.yaml"
    config.write_text(yaml.safe_dump({
        "elasticsearch": {"url": noida_elasticsearch.url, "bulk_max_docs": 100, "request_timeout_s": 5.0},
        "webhooks": {
            "receivers": {"hook": {"kind": "generic_json", "url": http_receiver.url("/hook"), "secret": secret}},
            "routes": [{"match": {"job": "fault-*"}, "receivers": ["hook"]}],
            "delivery": {"initial_backoff_s": 0.2, "max_backoff_s": 1, "budget_s": 120},
        },
    }))
    env = pipeline_env(tansu_broker, "rr-fault", tmp_path / "data", CONFIG=str(config), ENGINE__QUIET_WINDOW_S="8")
    assert main(["setup", "--config", str(config), "--bootstrap", str(tansu_broker), "--partitions", "4"]) == 0
    capsys.readouterr()
    workers: list[WorkerProcess] = []

    def start_worker() -> WorkerProcess:
        worker = WorkerProcess(env, tmp_path / f"worker-{len(workers)}.log", ROLES).start()
        workers.append(worker)
        worker.wait_ready(90)
        return worker

    def topic_incidents() -> list[dict[str, Any]]:
        records = read_topic(tansu_broker, "rootrank.incidents", timeout=10, idle_s=0.5)
        return [i for i in (orjson.loads(r.value) for r in records) if i["job_id"] == job]

    es = Elasticsearch(noida_elasticsearch.url, request_timeout=10)

    def documents() -> list[dict[str, Any]]:
        es.indices.refresh(index=incidents_names().alias)
        hits = es.search(index=incidents_names().alias, query={"term": {"rootrank.job_id": job}}, size=1000,
                         source_includes=["rootrank.incident_id", "rootrank.revision"])["hits"]["hits"]
        return [{"_id": h["_id"], "_index": h["_index"], **h["_source"]["rootrank"]} for h in hits]

    started = time.monotonic()
    try:
        worker = start_worker()
        first_messages = ship_format_messages(job, first_file)
        produce(tansu_broker, "rootrank.logs", first_messages, key=b"first")
        wait_for(lambda: worker.metrics().get(ADDED, 0) > 0, 60, what="the first half's signals in the job table")
        time.sleep(4)  # past faust's commit interval: the first half is committed, its state only in the changelog
        assert topic_incidents() == [], "the window closed before the kill: not mid-failure"
        worker.stop(signal.SIGKILL)
        kills = 1

        # The rest of the job's logs arrive while the worker is dead.
        second_messages = ship_format_messages(job, second_file)
        produce(tansu_broker, "rootrank.logs", second_messages, key=b"second")
        worker = start_worker()
        wait_for(topic_incidents, 90, interval=0.5, what="the first incident message")
        worker.stop(signal.SIGKILL)  # again, while the sinks may be writing it
        kills += 1
        worker = start_worker()

        seen: dict[str, Any] = {}

        def settled() -> bool:
            latest = latest_revisions(topic_incidents())
            essentials = sorted((incident_essentials(i) for i in latest.values()), key=lambda i: i["incident_id"])
            docs = {d["_id"]: d["revision"] for d in documents()}
            hooks = {r.webhook_id for r in http_receiver.delivered("/hook")}
            seen.update(topic=essentials, docs=docs, hooks=hooks)
            return essentials == offline and docs == {k: v["revision"] for k, v in latest.items()} and all(
                any(h and h.startswith(f"{k}:{v['revision']}") for h in hooks) for k, v in latest.items())

        try:
            wait_for(settled, 120, interval=1.0, what="the offline incident in the topic, the index and the webhooks")
        except AssertionError as exc:
            logs = "\n".join(w.log_tail(3000) for w in workers[-2:])
            raise AssertionError(f"{exc}\noffline: {offline}\nseen: {seen}\nlogs:\n{logs}") from None
        time.sleep(3)  # any duplicate would arrive now
        recovered_s = time.monotonic() - started

        messages = topic_incidents()
        latest = latest_revisions(messages)
        docs = documents()
        per_id = Counter(d["_id"] for d in docs)
        assert {k: n for k, n in per_id.items() if n != 1} == {}, f"an incident indexed twice: {docs}"
        assert {d["_id"]: d["revision"] for d in docs} == {k: v["revision"] for k, v in latest.items()}
        delivered = [r.webhook_id for r in http_receiver.delivered("/hook")]
        assert len(delivered) == len(set(delivered)), f"a revision was notified twice: {delivered}"
        revisions = {f"{i['incident_id']}:{i['revision']}" for i in messages}
        assert {d.split(":closed")[0] for d in delivered if d} <= revisions
        assert all(r.signature_valid for r in http_receiver.requests)
        version = load_ruleset().version
        assert all(i["rule_set_version"] == version for i in messages)
        for w in workers:
            assert secret not in w.log_path.read_text(errors="replace")

        lines = sum(1 for p in (first_file, second_file) for line in Path(p).read_bytes().splitlines() if line.strip())
        print(f"\nkill -9 x{kills} mid-failure: {lines} lines in {len(first_messages) + len(second_messages)} messages "
              f"sent; incidents expected {len(offline)}, found {len(latest)} (the offline ones) in {len(messages)} "
              f"incident message(s); ES documents {len(docs)} (1 per incident id); webhooks delivered {len(delivered)} "
              f"({sorted(d for d in delivered if d)}), 0 duplicates; settled {recovered_s:.1f} s after the start")
    finally:
        for w in workers:
            w.stop()
        es.close()


# `make test` streams 4 jobs (one per partition) and sends what is left after the join, and the last
# third, at once. `make fuzz` (ROOTRANK_LONG_TESTS=1) streams 8 jobs (two per partition) in messages
# half as large and keeps trickling through both rebalances: lines arrive all along.
LONG_REBALANCE_RUN = bool(os.environ.get("ROOTRANK_LONG_TESTS"))


def test_rebalances_mid_stream_a_worker_joins_then_one_is_killed(tansu_broker: BrokerAddress, tmp_path: Path) -> None:
    """Jobs stream in thirds. The first worker streams the first third alone; a second worker joins
    while the second third trickles in (partitions move to it: the test waits until it has processed
    lines, and the first worker too after the join); then the first worker is SIGKILLed and the last
    third is sent (its partitions move back to the survivor, from the last commit). Every job's
    incident is still the offline one, each revision emitted once."""
    from tests.fixtures.kafka import start_pipeline
    from tests.integration.test_streaming_workers import job_ids_covering_partitions

    raw = 'rootrank_raw_messages_total{outcome="processed"}'
    # lines per message, noise lines per rank log, seconds between messages before the join and after it
    lines_per_message, noise_lines, trickle_s, then_s = (5, 24, 0.5, 0.1) if LONG_REBALANCE_RUN else (10, 12, 0.45, 0.0)
    started = time.monotonic()
    pipeline = start_pipeline(tansu_broker, tmp_path, "rr-rebalance", workers=1)
    try:
        jobs = job_ids_covering_partitions("rebal")
        if LONG_REBALANCE_RUN:
            jobs += job_ids_covering_partitions("rebal-b")
        expected: dict[str, list[dict[str, Any]]] = {}
        thirds: list[list[tuple[bytes, list[bytes]]]] = [[], [], []]
        for index, job in enumerate(jobs):
            out = tmp_path / job
            cls = "cuda_oom" if index % 2 == 0 else "nccl_timeout"
            truth = simulate(cls, world_size=8, hosts=2, seed=40 + index, noise_lines=noise_lines, out=out)
            paths = log_paths(out, truth)
            expected[job] = sorted((incident_essentials(i.to_json_dict()) for i in diagnose_paths(paths, job_id=job)),
                                   key=lambda i: i["incident_id"])
            for path in paths:
                messages = ship_format_messages(job, path, lines_per_message=lines_per_message)
                step = -(-len(messages) // 3)
                for part in range(3):
                    thirds[part].append((f"{job}|{path}".encode(), messages[part * step:(part + 1) * step]))
        sent = sum(len(m) for third in thirds for _, m in third)

        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=str(tansu_broker), acks="all", linger_ms=5)

        def batches(part: int) -> list[tuple[bytes, bytes]]:
            """One third of every stream, in order per stream, the streams interleaved: any stretch of
            it reaches every job's partition, so both workers get lines whenever a stretch is sent."""
            rounds = zip_longest(*[[(key, m) for m in messages] for key, messages in thirds[part]])
            return [item for batch in rounds for item in batch if item is not None]

        def processed(worker: WorkerProcess) -> float:
            return worker.metrics().get(raw, 0)

        first = pipeline.worker
        stream_started = time.monotonic()
        for key, message in batches(0):
            producer.send("rootrank.logs", key=key, value=message)
        producer.flush(30)
        wait_for(lambda: processed(first) > 0, 90, interval=0.2, what="the first worker to process lines")

        # Rebalance 1: a worker joins while the second third trickles in. Trickle until it has processed
        # lines (it owns partitions now), holding back the last third of the trickle until then so lines
        # still arrive after the join; then send the rest at once.
        second = pipeline.add_worker()
        trickle = batches(1)
        hold_from = len(trickle) * 2 // 3
        sent_before_join: int | None = None
        first_at_join = joined_s = 0.0
        for n, (key, message) in enumerate(trickle):
            if sent_before_join is None and (processed(second) > 0 or n >= hold_from):
                wait_for(lambda: processed(second) > 0, 120, interval=0.2, what="the joining worker to process lines")
                sent_before_join, first_at_join = n, processed(first)
                joined_s = time.monotonic() - stream_started
            producer.send("rootrank.logs", key=key, value=message)
            producer.flush(30)
            time.sleep(trickle_s if sent_before_join is None else then_s)
        assert sent_before_join is not None
        # Both sides of the first rebalance are streaming again before the second one.
        wait_for(lambda: processed(first) > first_at_join, 60, interval=0.2,
                 what="the first worker to process lines after the join")

        # Rebalance 2: the first worker dies mid-stream; the last third arrives while the group notices.
        first_raw = processed(first)
        second_before_kill = processed(second)
        first.stop(signal.SIGKILL)
        killed_s = time.monotonic() - stream_started
        for key, message in batches(2):
            producer.send("rootrank.logs", key=key, value=message)
            if then_s:
                producer.flush(30)
                time.sleep(then_s)
        producer.flush(30)

        differences: dict[str, str] = {}

        def all_right(streamed: list[dict[str, Any]]) -> bool:
            differences.clear()
            for job, want in expected.items():
                latest = [i for i in latest_revisions(streamed).values() if i["job_id"] == job]
                got = sorted((incident_essentials(i) for i in latest), key=lambda i: i["incident_id"])
                if got != want:
                    differences[job] = json_diff(want, got)
            return not differences

        try:
            incidents = pipeline.incidents(None, until=all_right, timeout=120)
        except AssertionError as exc:
            raise AssertionError("streamed incidents differ from the offline ones:\n"
                                 + "\n".join(f"{job}:\n{diff}" for job, diff in differences.items())) from exc
        streamed = [i for i in incidents if i["job_id"] in expected]
        right_s = time.monotonic() - stream_started
        seen = [(i["incident_id"], i["revision"]) for i in streamed]
        assert len(seen) == len(set(seen)), f"a revision was emitted twice: {seen}"
        second_raw = processed(second)
        assert second_raw > second_before_kill > 0 and first_raw > first_at_join > 0
        found = len(latest_revisions(streamed))
        want = sum(len(v) for v in expected.values())
        print(f"\nrebalance mid-stream (join, then kill -9){' [long run]' if LONG_REBALANCE_RUN else ''}: {sent} "
              f"messages sent for {len(jobs)} jobs; the joining worker processed lines {joined_s:.1f} s into the "
              f"stream ({sent_before_join} of {len(trickle)} trickled messages sent before); processed "
              f"{first_raw:.0f} by the killed worker (killed at {killed_s:.1f} s) + {second_raw:.0f} by the survivor "
              f"({second_before_kill:.0f} before the kill; re-reads after the kill included); incidents expected "
              f"{want}, found {found}, right {right_s:.1f} s into the stream; 0 duplicates; "
              f"{time.monotonic() - started:.1f} s in all")
    finally:
        pipeline.stop()
        if "producer" in locals():
            producer.close(5)
