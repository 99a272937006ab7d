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
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from elasticsearch import Elasticsearch

from correlator.cli import main
from correlator.diagnose import diagnose_paths
from correlator.rules import load_ruleset
from correlator.simulate import log_paths, simulate
from correlator.sinks.elasticsearch import incidents_names
from correlator.webhooks.receivers.generic_json import generate_secret
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


@pytest.mark.skipif(not os.environ.get("ROOTRANK_LONG_TESTS"), reason="long run (about 90 s): `make fuzz` runs it")
def test_long_run_rebalances_mid_stream_a_worker_joins_then_one_is_killed(tansu_broker: BrokerAddress, tmp_path: Path) -> None:
    """Jobs stream in thirds: a second worker joins after the first third (partitions move to it),
    the first worker is SIGKILLed after the second (its partitions move back to the survivor, from
    the last commit). Every job's incident is still the offline one, each revision emitted once."""
    from tests.fixtures.kafka import start_pipeline
    from tests.integration.test_streaming_workers import job_ids_covering_partitions

    raw = 'rootrank_raw_messages_total{outcome="processed"}'
    pipeline = start_pipeline(tansu_broker, tmp_path, "rr-rebalance", workers=1)
    try:
        jobs = job_ids_covering_partitions("rebal")
        expected: dict[str, list[dict[str, Any]]] = {}
        thirds: list[list[tuple[bytes, list[bytes]]]] = [[], [], []]
        for index, (job, cls) in enumerate(zip(jobs, ["cuda_oom", "nccl_timeout", "cuda_oom", "nccl_timeout"])):
            out = tmp_path / job
            truth = simulate(cls, world_size=8, hosts=2, seed=40 + index, noise_lines=12, out=out)
            paths = log_paths(out, truth)
            expected[job] = sorted((incident_essentials(i.to_json_dict()) for i in diagnose_paths(paths, job_id=job)),
                                   key=lambda i: i["incident_id"])
            for path in paths:
                messages = ship_format_messages(job, path, lines_per_message=10)
                step = -(-len(messages) // 3)
                for part in range(3):
                    thirds[part].append((f"{job}|{path}".encode(), messages[part * step:(part + 1) * step]))
        sent = sum(len(m) for third in thirds for _, m in third)
        started = time.monotonic()

        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=str(tansu_broker), acks="all", linger_ms=5)

        def send(part: int, spread_s: float = 0.0) -> None:
            """One third of every stream, in order per stream; spread over `spread_s` seconds."""
            batches = [(key, m) for key, messages in thirds[part] for m in messages]
            for n, (key, message) in enumerate(batches):
                producer.send("rootrank.logs", key=key, value=message)
                if spread_s and n % 10 == 9:
                    producer.flush(30)
                    time.sleep(spread_s * 10 / len(batches))
            producer.flush(30)

        first = pipeline.worker
        send(0)
        second = pipeline.add_worker()  # rebalance 1: a worker joins while the second third trickles in
        second.wait_ready()  # serving; its group join (the rebalance) happens during the trickle
        send(1, spread_s=12.0)
        time.sleep(3)
        second_before_kill = second.metrics().get(raw, 0)
        first_raw = first.metrics().get(raw, 0)
        first.stop(signal.SIGKILL)  # rebalance 2: a worker dies mid-stream
        send(2)

        def all_right(streamed: list[dict[str, Any]]) -> bool:
            for job, want in expected.items():
                latest = [i for i in latest_revisions(streamed).values() if i["job_id"] == job]
                if sorted((incident_essentials(i) for i in latest), key=lambda i: i["incident_id"]) != want:
                    return False
            return True

        streamed = [i for i in pipeline.incidents(None, until=all_right, timeout=120) if i["job_id"] in expected]
        elapsed = time.monotonic() - started
        seen = [(i["incident_id"], i["revision"]) for i in streamed]
        assert len(seen) == len(set(seen)), f"a revision was emitted twice: {seen}"
        second_raw = second.metrics().get(raw, 0)
        assert second_raw > 0 and first_raw > 0
        found = len(latest_revisions(streamed))
        want = sum(len(v) for v in expected.values())
        print(f"\nrebalance mid-stream (join, then kill -9): {sent} messages sent for {len(jobs)} jobs; processed "
              f"{first_raw:.0f} by the killed worker + {second_raw:.0f} by the survivor ({second_before_kill:.0f} "
              f"before the kill; re-reads after the kill included); incidents expected {want}, found {found}, right "
              f"after {elapsed:.1f} s; 0 duplicates")
    finally:
        pipeline.stop()
        if "producer" in locals():
            producer.close(5)

