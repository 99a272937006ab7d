"""End to end: forwarder messages -> Kafka -> `rootrank worker --role match,correlate,es-sink` ->
Elasticsearch -> `rootrank incidents` / `rootrank show`. Real broker (Tansu), real worker process,
noida-db's Elasticsearch API; the failure is a simulated multi-rank job with a known truth."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from elasticsearch import Elasticsearch

from correlator.cli import main
from correlator.diagnosis.models import Incident
from correlator.sinks.elasticsearch.documents import doc_to_incident
from correlator.sinks.elasticsearch.indices import incidents_names, signals_names
from correlator.tooling.embedded import stop_process
from tests.fixtures.elasticsearch import ElasticsearchServer
from tests.fixtures.kafka import BrokerAddress, env_without_proxies, produce, read_topic, wait_for

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
        lines = [line for name in truth["files"] for line in (sim / name).read_bytes().splitlines() if line.strip()]
        produce(str(tansu_broker), "rootrank.logs", lines)

        def emitted() -> dict[str, Incident]:
            """The newest revision of every incident the correlator wrote to the incidents topic."""
            assert worker.poll() is None, f"worker exited: {log.read_text(errors='replace')[-3000:]}"
            latest: dict[str, Incident] = {}
            for record in read_topic(str(tansu_broker), "rootrank.incidents", timeout=5, idle_s=0.5):
                incident = Incident.model_validate_json(record.value)
                if incident.revision >= latest.get(incident.incident_id, incident).revision:
                    latest[incident.incident_id] = incident
            return latest

        def indexed() -> dict[str, Incident]:
            es.indices.refresh(index=incidents_names().alias)
            hits = es.search(index=incidents_names().alias, query={"match_all": {}}, size=1000)["hits"]["hits"]
            return {h["_id"]: doc_to_incident(h["_source"]) for h in hits}

        wait_for(lambda: [i for i in indexed().values() if i.job_id == truth["job_id"]], 180, interval=1.0,
                 what="the job's incident in Elasticsearch")
        latency_s = time.monotonic() - started
        # Quiet for a few seconds: no revision in flight, then the index must equal the topic.
        try:
            wait_for(lambda: emitted() == indexed(), 60, interval=2.0, what="the index to hold what the topic holds")
        except AssertionError:
            topic, index = emitted(), indexed()
            diff = {k: (topic.get(k), index.get(k)) for k in set(topic) | set(index) if topic.get(k) != index.get(k)}
            raise AssertionError(f"topic and index differ: {diff}") from None
        incidents = {k: i for k, i in indexed().items() if i.job_id == truth["job_id"]}
        primary = max(incidents.values(), key=lambda i: (i.confidence, i.revision))

        assert main(["incidents", "--config", str(config), "--job", truth["job_id"]]) == 0
        listed = capsys.readouterr().out
        assert all(i in listed for i in incidents)
        host = primary.initiator.host or ""
        assert main(["incidents", "--config", str(config), "--host", host, "--class", primary.class_,
                     primary.initiator.line.split(":")[0]]) == 0
        assert primary.incident_id in capsys.readouterr().out
        assert main(["show", "--config", str(config), primary.incident_id]) == 0
        assert primary.initiator.line[:40] in capsys.readouterr().out

        # The matched lines are there for drill-down too.
        es.indices.refresh(index=signals_names().alias)
        matched = es.count(index=signals_names().alias,
                           query={"term": {"rootrank.job_id": truth["job_id"]}})["count"]
        assert matched > 0
        ini = primary.initiator
        print(f"\npipeline -> ES: {len(lines)} forwarder messages; {len(indexed())} incident(s) indexed, equal to the "
              f"incidents topic; primary {primary.class_} rank {ini.rank} on {ini.host} (truth: {truth['class']} rank "
              f"{truth['initiator']['rank']} on {truth['initiator']['host']}); first searchable {latency_s:.1f} s "
              f"after the test started; {matched} matched lines indexed")
    finally:
        stop_process(worker, timeout=60)
        es.close()
    assert worker.returncode == 0, log.read_text(errors="replace")[-3000:]
