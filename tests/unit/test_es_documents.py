"""Incident/signal documents against the index templates, and the shipped template files."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from correlator.diagnosis.models import Incident, Initiator
from correlator.sinks.elasticsearch.documents import (
    doc_to_incident,
    incident_to_doc,
    signal_doc_id,
    signal_to_doc,
)
from correlator.sinks.elasticsearch.indices import (
    incidents_template,
    index_templates,
    mapped_fields,
    signals_template,
)
from correlator.sinks.elasticsearch.search import parse_since
from correlator.sinks.elasticsearch.writer import BulkWriter, IndexRequest
from tests.integration.es_support import make_incident, make_signal

TEMPLATES = Path(__file__).resolve().parents[2] / "deploy" / "elasticsearch"


def _leaf_paths(doc: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in doc.items():
        path = f"{prefix}{key}"
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, dict):
                out.add(path)
                out |= _leaf_paths(item, f"{path}.")
            elif item is not None:
                out.add(path)
    return out


def _unmapped(doc: dict[str, Any], template: dict[str, Any]) -> set[str]:
    fields = mapped_fields(template)
    disabled = {p for p, spec in _object_specs(template).items() if spec.get("enabled") is False}
    return {p for p in _leaf_paths(doc)
            if p not in fields and not p.startswith("labels.") and not any(p.startswith(d + ".") for d in disabled)}


def _object_specs(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}

    def walk(props: dict[str, Any], prefix: str) -> None:
        for name, spec in props.items():
            out[prefix + name] = spec
            if "properties" in spec:
                walk(spec["properties"], f"{prefix}{name}.")

    walk(template["template"]["mappings"]["properties"], "")
    return out


def test_shipped_template_files_are_the_templates_setup_installs() -> None:
    for name, body in index_templates().items():
        shipped = json.loads((TEMPLATES / f"{name}.index-template.json").read_text(encoding="utf-8"))
        assert shipped == body, (f"deploy/elasticsearch/{name} is stale: "
                                 "python -m correlator.sinks.elasticsearch.indices deploy/elasticsearch")


INCIDENT_VARIANTS = [
    make_incident(1),
    make_incident(2, cls="gpu_hardware_error", gpu=None, status="closed", revision=4),
    make_incident(3, collateral_hosts=()),
    Incident.model_validate({  # the least an incident can hold
        "incident_id": "bare", "job_id": "j", "class": "straggler_hang", "title": "t", "severity": "info",
        "confidence": 0.1, "confidence_reason": "r", "initiator": {"rule": "absence", "line": ""},
    }),
]


@pytest.mark.parametrize("incident", INCIDENT_VARIANTS, ids=lambda i: i.incident_id)
def test_every_incident_field_is_mapped_and_the_document_round_trips(incident: Incident) -> None:
    doc = incident_to_doc(incident)
    assert _unmapped(doc, incidents_template()) == set()
    assert doc_to_incident(json.loads(json.dumps(doc))) == incident


def test_every_signal_field_is_mapped_and_ids_are_deterministic() -> None:
    for n in range(3):
        doc = signal_to_doc(make_signal(n))
        assert _unmapped(doc, signals_template()) == set()
    assert signal_doc_id(make_signal(1)) == signal_doc_id(make_signal(1)) != signal_doc_id(make_signal(2))


def test_timestamp_falls_back_from_an_unparseable_initiator_time() -> None:
    base = make_incident(1)
    odd = base.model_copy(update={"initiator": base.initiator.model_copy(update={"ts": "Dec 6 18:44:12"})})
    assert incident_to_doc(odd)["@timestamp"] == "2025-03-01T12:01:00Z"  # window_start
    bare = INCIDENT_VARIANTS[-1]
    stamp = datetime.fromisoformat(incident_to_doc(bare)["@timestamp"])
    assert abs(stamp - datetime.now(UTC)) < timedelta(minutes=1)


def test_ecs_labels_are_flat_keywords_with_the_job_id() -> None:
    doc = incident_to_doc(make_incident(1, job="job-x"))
    assert doc["labels"] == {"team": "llm", "training_kubeflow_org_job-name": "job-x", "job_id": "job-x"}
    assert doc["rootrank"]["labels"]["training.kubeflow.org/job-name"] == "job-x"  # exact copy for `show`


def test_hardware_like_and_host_gpu_for_repeat_offenders() -> None:
    hw = incident_to_doc(make_incident(1, cls="gpu_hardware_error", host="n1", gpu="7"))["rootrank"]
    oom = incident_to_doc(make_incident(1, cls="cuda_oom", host="n1", gpu=None))["rootrank"]
    assert (hw["hardware_like"], hw["initiator"]["host_gpu"], hw["category"]) == (True, "n1/7", "hardware")
    assert (oom["hardware_like"], oom["initiator"]["host_gpu"]) == (False, None)


def test_a_batch_keeps_only_the_newest_revision_of_each_incident() -> None:
    reqs = [IndexRequest("a", "x", {"r": 2}, version=2), IndexRequest("a", "x", {"r": 1}, version=1),
            IndexRequest("a", "y", {"r": 1}, version=1), IndexRequest("a", "x", {"r": 3}, version=2)]
    kept = {r.doc_id: r.source for r in BulkWriter._dedupe(reqs)}
    assert kept == {"x": {"r": 3}, "y": {"r": 1}}


def test_parse_since() -> None:
    now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    assert parse_since("30m", now) == now - timedelta(minutes=30)
    assert parse_since("2d", now) == now - timedelta(days=2)
    assert parse_since("1w", now) == now - timedelta(days=7)
    assert parse_since("2025-02-01", now) == datetime(2025, 2, 1, tzinfo=UTC)
    assert parse_since("2025-02-01T10:00:00Z", now) == datetime(2025, 2, 1, 10, tzinfo=UTC)
    with pytest.raises(ValueError, match="--since"):
        parse_since("last tuesday", now)


def test_initiator_without_identity_still_indexes() -> None:
    incident = make_incident(1).model_copy(update={"initiator": Initiator(rule="r", line="l")})
    doc = incident_to_doc(incident)
    assert "host" not in doc and "process" not in doc
    assert doc["rule"]["version"] is None
