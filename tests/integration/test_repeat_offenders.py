"""`rootrank hosts` against noida-db's Elasticsearch API: a host that broke three jobs with
hardware-like failures is a repeat offender, a host that broke one job is not (however many incidents
that job made), and the drain webhook hears about each crossing once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from elasticsearch import Elasticsearch

from correlator.cli import main
from correlator.config import Settings
from correlator.sinks.elasticsearch.documents import incident_to_doc
from correlator.sinks.elasticsearch.indices import incidents_names, install_templates
from correlator.sinks.elasticsearch.writer import BulkWriter, IndexRequest
from tests.fixtures.http_receiver import HttpReceiver
from tests.integration.es_support import make_incident

pytestmark = pytest.mark.integration

ALIAS = incidents_names().alias


def test_three_jobs_make_a_repeat_offender_one_job_does_not(elasticsearch_url: str, http_receiver: HttpReceiver,
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    es = Elasticsearch(elasticsearch_url, request_timeout=10)
    try:
        install_templates(Settings(elasticsearch={"url": elasticsearch_url}), es)
        incidents = [
            make_incident(1, job="train-a", cls="gpu_hardware_error", host="node-bad", gpu="3"),
            make_incident(2, job="train-b", cls="gpu_hardware_error", host="node-bad", gpu="3"),
            make_incident(3, job="train-c", cls="network_fabric_error", host="node-bad", gpu=None),
            # One job, restarted three times on the same node: three incidents, one job.
            make_incident(4, job="train-d", cls="gpu_hardware_error", host="node-once"),
            make_incident(5, job="train-d", cls="gpu_hardware_error", host="node-once", minutes=30),
            make_incident(6, job="train-d", cls="gpu_hardware_error", host="node-once", minutes=60),
            # Three jobs, but running out of memory is the job's fault, not the machine's.
            make_incident(7, job="train-e", cls="cuda_oom", host="node-oom"),
            make_incident(8, job="train-f", cls="cuda_oom", host="node-oom"),
            make_incident(9, job="train-g", cls="cuda_oom", host="node-oom"),
        ]
        outcome = BulkWriter(es).write([IndexRequest(ALIAS, i.incident_id, incident_to_doc(i), version=i.revision)
                                        for i in incidents])
        assert outcome.rejected == []
        es.indices.refresh(index=ALIAS)
    finally:
        es.close()

    url = ["--es-url", elasticsearch_url, "--since", "all"]
    assert main(["hosts", *url, "--min", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["host"], r["jobs"], r["count"]) for r in rows] == [("node-bad", 3, 3)]
    assert rows[0]["gpus"] == {"3": 2}
    assert rows[0]["classes"] == {"gpu_hardware_error": 2, "network_fabric_error": 1}
    assert sorted(rows[0]["incident_ids"]) == ["inc-train-a-0001", "inc-train-b-0002", "inc-train-c-0003"]

    # The table; and node-once becomes an offender only when one job is enough.
    assert main(["hosts", *url, "--min", "1"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["HOST", "JOBS", "INCIDENTS"]
    assert [line.split()[0] for line in table[1:]] == ["node-bad", "node-once"]
    assert main(["hosts", *url, "--min", "3", "--classes", "cuda_oom", "--json"]) == 0
    assert [json.loads(line)["host"] for line in capsys.readouterr().out.splitlines()] == ["node-oom"]
    assert main(["hosts", "--es-url", elasticsearch_url, "--since", "1h", "--json"]) == 0  # the incidents are older
    assert capsys.readouterr().out == ""
    # As text, no repeat offender is said, not left blank (switched off: empty output).
    assert main(["hosts", "--es-url", elasticsearch_url, "--since", "1h", "--min", "2"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("no host failed in 2 or more jobs since ") and said.rstrip().endswith("UTC (1h ago)"), said
    assert main(["hosts", *url, "--min", "4"]) == 0
    assert capsys.readouterr().out == "no host failed in 4 or more jobs (all incidents searched)\n"

    # Drain webhook: the crossing is announced once, not on every run.
    state = tmp_path / "notified.json"
    notify = ["--notify-url", http_receiver.url("/drain"), "--notify-state", str(state), "--json"]
    assert main(["hosts", *url, "--min", "3", *notify]) == 0
    assert main(["hosts", *url, "--min", "3", *notify]) == 0
    [request] = http_receiver.wait_for(1)
    body = json.loads(request.body)
    assert body["event"] == "rootrank.hosts.repeat_offenders" and body["threshold_jobs"] == 3
    assert [h["host"] for h in body["hosts"]] == ["node-bad"]
    assert len(http_receiver.delivered("/drain")) == 1
