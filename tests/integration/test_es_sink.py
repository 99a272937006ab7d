"""The Elasticsearch side of the sink against noida-db's Elasticsearch API: templates, idempotent
bulk writes, revisions across rollovers, search helpers and the `incidents` / `show` commands."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from elasticsearch import Elasticsearch

from correlator.cli import main
from correlator.config import Settings
from correlator.sinks.elasticsearch.documents import (
    doc_to_incident,
    incident_to_doc,
    signal_doc_id,
    signal_to_doc,
)
from correlator.sinks.elasticsearch.indices import incidents_names, install_templates, signals_names
from correlator.sinks.elasticsearch.search import IncidentFilter, repeat_offenders, search_incidents
from correlator.sinks.elasticsearch.writer import BulkWriter, IndexRequest
from tests.integration.es_support import make_incident, make_signal

pytestmark = pytest.mark.integration

ALIAS = incidents_names().alias


@pytest.fixture
def es(elasticsearch_url: str) -> Iterator[Elasticsearch]:
    client = Elasticsearch(elasticsearch_url, request_timeout=10)
    install_templates(Settings(elasticsearch={"url": elasticsearch_url}), client)
    yield client
    client.close()


def _write_incidents(es: Elasticsearch, incidents: list[Any]) -> None:
    outcome = BulkWriter(es).write(
        [IndexRequest(ALIAS, i.incident_id, incident_to_doc(i), version=i.revision) for i in incidents]
    )
    assert outcome.rejected == []
    es.indices.refresh(index=ALIAS)


def _docs_per_id(es: Elasticsearch) -> dict[str, int]:
    resp = es.search(index=ALIAS, size=1000, query={"match_all": {}}, source=["rootrank.incident_id"])
    counts: dict[str, int] = {}
    for h in resp["hits"]["hits"]:
        counts[h["_id"]] = counts.get(h["_id"], 0) + 1
    return counts


def test_install_templates_is_idempotent_and_bootstraps_write_aliases(elasticsearch_url: str) -> None:
    client = Elasticsearch(elasticsearch_url)
    settings = Settings(elasticsearch={"url": elasticsearch_url})
    first = install_templates(settings, client)
    second = install_templates(settings, client)
    assert any("(created)" in line for line in first)
    assert not any("(created)" in line for line in second)
    for names in (incidents_names(), signals_names()):
        aliases = client.indices.get_alias(name=names.alias)
        assert list(aliases) == [names.first_index]
        assert aliases[names.first_index]["aliases"][names.alias]["is_write_index"] is True
        mapping = client.indices.get_mapping(index=names.first_index)[names.first_index]["mappings"]
        assert mapping["dynamic"] == "strict"
    client.close()


def test_incident_document_round_trips_and_carries_ecs_fields(es: Elasticsearch) -> None:
    incident = make_incident(1, cls="gpu_hardware_error", host="node-07", gpu="3")
    _write_incidents(es, [incident])
    source = es.get(index=ALIAS, id=incident.incident_id)["_source"]
    assert doc_to_incident(source) == incident
    assert source["event"]["kind"] == "alert" and source["event"]["severity"] == 99
    assert source["host"]["name"] == "node-07"
    assert source["error"]["message"] == incident.initiator.line
    assert source["labels"]["job_id"] == "job-a"
    assert source["rule"]["id"] == "gpu-xid-79" and source["rule"]["version"] == "2"
    assert source["rootrank"]["initiator"]["host_gpu"] == "node-07/3"
    assert source["rootrank"]["hardware_like"] is True
    assert source["rootrank"]["category"] == "hardware"
    assert source["@timestamp"] == "2025-03-01T12:01:00Z"


def test_search_by_job_class_host_and_free_text(es: Elasticsearch) -> None:
    _write_incidents(es, [
        make_incident(1, job="job-a", cls="cuda_oom", host="node-01"),
        make_incident(2, job="job-a", cls="disk_full", host="node-02", collateral_hosts=("node-09",)),
        make_incident(3, job="job-b", cls="gpu_hardware_error", host="node-07"),
        make_incident(4, job="job-c", cls="network_fabric_error", host="node-08"),
    ])

    def ids(**kw: Any) -> list[str]:
        return [h.incident.incident_id for h in search_incidents(es, ALIAS, IncidentFilter(**kw))]

    assert ids(job="job-a") == ["inc-job-a-0002", "inc-job-a-0001"]  # newest first
    assert ids(class_="gpu_hardware_error") == ["inc-job-b-0003"]
    assert ids(host="node-08") == ["inc-job-c-0004"]
    assert ids(host="node-09") == ["inc-job-a-0002"]  # a host with collateral failures counts too
    assert ids(text="fallen off the bus") == ["inc-job-b-0003"]
    assert ids(text="space left") == ["inc-job-a-0002"]
    assert ids(job="job-a", text="memory") == ["inc-job-a-0001"]
    assert ids(job="nope") == []


def test_same_incidents_twice_leave_one_document_each(es: Elasticsearch) -> None:
    incidents = [make_incident(n) for n in range(20)]
    _write_incidents(es, incidents)
    _write_incidents(es, incidents)  # a replay after a crash, say
    _write_incidents(es, incidents[:5] + incidents[:5])  # duplicates inside one bulk
    counts = _docs_per_id(es)
    assert len(counts) == 20 and set(counts.values()) == {1}
    assert es.count(index=ALIAS)["count"] == 20


def test_revision_overwrites_and_an_older_revision_never_wins_across_rollovers(es: Elasticsearch) -> None:
    _write_incidents(es, [make_incident(1, revision=1)])
    rolled = es.indices.rollover(alias=ALIAS)
    assert rolled["rolled_over"]
    _write_incidents(es, [make_incident(1, revision=3, status="closed")])  # lands in the older index
    _write_incidents(es, [make_incident(1, revision=2)])  # late re-delivery of an older revision: ignored
    _write_incidents(es, [make_incident(2, revision=1)])  # a new incident goes to the new index
    hits = es.search(index=ALIAS, query={"match_all": {}}, size=10)["hits"]["hits"]
    by_id = {h["_id"]: h for h in hits}
    assert len(hits) == 2
    assert by_id["inc-job-a-0001"]["_index"] == incidents_names().first_index
    assert by_id["inc-job-a-0001"]["_source"]["rootrank"]["revision"] == 3
    assert by_id["inc-job-a-0001"]["_source"]["event"]["type"] == ["error", "end"]
    assert by_id["inc-job-a-0002"]["_index"] == rolled["new_index"]


def test_a_document_the_mapping_rejects_is_returned_not_retried(es: Elasticsearch) -> None:
    good = make_incident(1)
    bad_doc = {**incident_to_doc(make_incident(2)), "unexpected_field": 1}  # `dynamic: strict`
    outcome = BulkWriter(es).write([
        IndexRequest(ALIAS, good.incident_id, incident_to_doc(good), version=1),
        IndexRequest(ALIAS, "inc-job-a-0002", bad_doc, version=1, ref="record-2"),
    ])
    assert outcome.written == 1 and outcome.attempts == 1
    assert [(r.ref, "strict_dynamic_mapping" in reason) for r, reason in outcome.rejected] == [("record-2", True)]


def test_signals_are_indexed_once_with_deterministic_ids(es: Elasticsearch) -> None:
    alias = signals_names().alias
    signals = [make_signal(n) for n in range(10)]
    requests = [IndexRequest(alias, signal_doc_id(s), signal_to_doc(s)) for s in signals]
    assert len({r.doc_id for r in requests}) == 10
    BulkWriter(es).write(requests)
    BulkWriter(es).write(requests)
    es.indices.refresh(index=alias)
    assert es.count(index=alias)["count"] == 10
    hit = es.search(index=alias, query={"term": {"rootrank.rank": 4}})["hits"]["hits"][0]["_source"]
    assert hit["host"]["name"] == "node-01" and hit["log"]["file"]["path"] == "/logs/job-a/rank4.log"
    assert hit["@timestamp"] == "2025-03-01T12:00:04Z"


def test_repeat_offender_needs_several_jobs_broken_by_the_same_host(es: Elasticsearch) -> None:
    _write_incidents(es, [
        make_incident(1, job="job-1", cls="gpu_hardware_error", host="node-bad", gpu="2"),
        make_incident(2, job="job-2", cls="gpu_hardware_error", host="node-bad", gpu="2"),
        make_incident(3, job="job-3", cls="network_fabric_error", host="node-bad", gpu=None),
        make_incident(4, job="job-4", cls="gpu_hardware_error", host="node-once"),
        make_incident(5, job="job-5", cls="cuda_oom", host="node-oom"),  # not hardware-like
        make_incident(6, job="job-6", cls="cuda_oom", host="node-oom"),
        make_incident(7, job="job-7", cls="cuda_oom", host="node-oom"),
    ])
    offenders = repeat_offenders(es, ALIAS, min_incidents=3)
    assert [(o.host, o.count, o.jobs) for o in offenders] == [("node-bad", 3, 3)]
    assert offenders[0].gpus == {"2": 2}
    assert offenders[0].classes == {"gpu_hardware_error": 2, "network_fabric_error": 1}


def test_cli_incidents_and_show(es: Elasticsearch, elasticsearch_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _write_incidents(es, [
        make_incident(1, job="job-a", cls="cuda_oom", host="node-01"),
        make_incident(2, job="job-b", cls="gpu_hardware_error", host="node-07"),
    ])
    url = ["--es-url", elasticsearch_url]
    assert main(["incidents", *url, "--job", "job-b"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["TIME", "INCIDENT", "JOB"]
    assert len(out) == 2 and "inc-job-b-0002" in out[1] and "rank 11 node-07/gpu5" in out[1]

    assert main(["incidents", *url, "--host", "node-01", "--json"]) == 0
    assert [json.loads(line)["incident_id"] for line in capsys.readouterr().out.splitlines()] == ["inc-job-a-0001"]
    assert main(["incidents", *url, "--class", "cuda_oom", "--since", "2025-03-01T12:00", "out", "of", "memory"]) == 0
    assert "inc-job-a-0001" in capsys.readouterr().out
    assert main(["incidents", *url, "--since", "1h"]) == 0  # the test incidents are older
    assert capsys.readouterr().out == ""
    assert main(["incidents", *url, "--since", "yesterday-ish"]) == 2

    assert main(["show", *url, "inc-job-b-0002"]) == 0
    shown = capsys.readouterr().out
    for expected in ("gpu_hardware_error", "Xid", "nccl-watchdog-timeout", "Drain the node", "Verify", "node-07"):
        assert expected in shown
    assert main(["show", *url, "--json", "inc-job-b"]) == 0  # a unique prefix
    assert json.loads(capsys.readouterr().out)["incident_id"] == "inc-job-b-0002"
    assert main(["show", *url, "inc-job-"]) == 2  # ambiguous
    assert main(["show", *url, "nothing-like-it"]) == 1


def test_cli_show_html_writes_the_incident_picture(es: Elasticsearch, elasticsearch_url: str, tmp_path: Path) -> None:
    _write_incidents(es, [make_incident(3, job="job-c", cls="gpu_hardware_error", host="node-07")])
    out = tmp_path / "incident.html"
    assert main(["show", "--es-url", elasticsearch_url, "--html", str(out), "inc-job-c-0003"]) == 0
    html = out.read_text()
    assert 'id="initiator-lane"' in html and "gpu_hardware_error" in html and "node-07" in html
