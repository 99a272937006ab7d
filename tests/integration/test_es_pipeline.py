"""End to end: forwarder messages -> Kafka -> `rootrank worker --role match,correlate,es-sink` ->
Elasticsearch -> `rootrank incidents` / `rootrank show`. Real broker (Tansu), real worker process,
noida-db's Elasticsearch API; the failure is a simulated multi-rank job with a known truth."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from elasticsearch import Elasticsearch

from correlator.cli import main
from correlator.sinks.elasticsearch import incidents_names, signals_names
from tests.fixtures.elasticsearch import ElasticsearchServer
from tests.fixtures.kafka import BrokerAddress, env_without_proxies, produce, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_incidents_from_the_streaming_pipeline_are_searchable(
    tansu_broker: BrokerAddress, noida_elasticsearch: ElasticsearchServer, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    sim = tmp_path / "sim"
    assert main(["simulate", "--demo", "--format", "fluentbit", "--world-size", "16", "--hosts", "2",
                 "--out", str(sim)]) == 0
    truth = json.loads((sim / "truth.json").read_text())
    capsys.readouterr()

    config = tmp_path / "rootrank.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": str(tansu_broker), "session_timeout_s": 10.0, "producer_max_batch_size": 1},
        "topics": {"partitions": 2},
        "engine": {"quiet_window_s": 2.0, "tick_interval_s": 0.5},
        "elasticsearch": {"url": noida_elasticsearch.url, "bulk_max_docs": 200},
        "data_dir": str(tmp_path / "data"),
    }))
    assert main(["setup", "--config", str(config)]) == 0
    setup_out = capsys.readouterr().out
    assert "rootrank-incidents" in setup_out and "rootrank.logs" in setup_out

    log = tmp_path / "worker.log"
    env = {k: v for k, v in env_without_proxies().items() if not k.startswith("ROOTRANK_")}
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "correlator.cli", "worker", "--role", "match,correlate,es-sink",
             "--config", str(config), "--loglevel", "info", "--skip-setup"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    es = Elasticsearch(noida_elasticsearch.url, request_timeout=10)
    try:
        lines = (sim / "logs" / "messages.jsonl").read_bytes().splitlines()
        produce(str(tansu_broker), "rootrank.logs", lines)

        def incident_docs() -> list[dict[str, object]]:
            assert worker.poll() is None, f"worker exited: {log.read_text(errors='replace')[-3000:]}"
            es.indices.refresh(index=incidents_names().alias)
            hits = es.search(index=incidents_names().alias, query={"term": {"rootrank.job_id": truth["job_id"]}},
                             size=10)["hits"]["hits"]
            return [h["_source"] for h in hits]

        docs = wait_for(incident_docs, 180, interval=1.0, what="the job's incident in Elasticsearch")
        latency_s = time.monotonic() - started
        found = [(d["rootrank"]["class"], d["rootrank"]["initiator"].get("rank"), d["rootrank"]["initiator"].get("host"),
                  d["rootrank"]["confidence"]) for d in docs]
        primary = docs[0]["rootrank"]
        assert primary["class"] == truth["class"], found
        assert (primary["initiator"]["rank"], primary["initiator"]["host"]) == (
            truth["initiator"]["rank"], truth["initiator"]["host"])

        assert main(["incidents", "--config", str(config), "--job", truth["job_id"]]) == 0
        listed = capsys.readouterr().out
        assert truth["class"] in listed and primary["incident_id"] in listed
        assert main(["incidents", "--config", str(config), "--host", truth["initiator"]["host"],
                     "--class", truth["class"], "fallen off the bus"]) == 0
        assert primary["incident_id"] in capsys.readouterr().out
        assert main(["show", "--config", str(config), primary["incident_id"]]) == 0
        assert "Xid" in capsys.readouterr().out

        # The matched lines are there for drill-down too.
        es.indices.refresh(index=signals_names().alias)
        matched = es.count(index=signals_names().alias,
                           query={"term": {"rootrank.job_id": truth["job_id"]}})["count"]
        assert matched > 0
        print(f"\npipeline -> ES: {len(lines)} forwarder messages, incident {primary['incident_id']} "
              f"({primary['class']}, rank {primary['initiator']['rank']} on {primary['initiator']['host']}) "
              f"searchable {latency_s:.1f} s after the test started; {matched} matched lines indexed")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
        es.close()
    assert worker.returncode == 0, log.read_text(errors="replace")[-3000:]
