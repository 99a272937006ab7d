"""Exact bodies per receiver kind, as received over HTTP by a real local receiver."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from correlator.config import RetryPolicy
from correlator.diagnosis.models import Incident
from correlator.sinks.webhooks.delivery import Deliverer
from correlator.sinks.webhooks.dispatcher import WebhookDispatcher
from correlator.sinks.webhooks.routes import RouteTable
from tests.fixtures.http_receiver import HttpReceiver, RecordedRequest
from tests.unit.webhooks.incidents import make_incident

KIBANA = "https://kibana.example.com/app/r/s/incident?id={incident_id}"
LINK = "https://kibana.example.com/app/r/s/incident?id=inc-7"
INITIATOR = "rank 1, host gpu-node-02, local rank 3, GPU 3, pid 48211"
FIRST_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB <GPU 3>"
FIX = ["Lower the per-GPU micro-batch size", "Enable activation checkpointing"]


def small_incident(**overrides: Any) -> Incident:
    fields: dict[str, Any] = {
        "incident_id": "inc-7",
        "world_size": 4,
        "initiator_rank": 1,
        "evidence": [],
        "references": [],
        "labels": {"team": "ml", "kubernetes.io/ns": "train"},
    }
    fields.update(overrides)
    return make_incident("job-7", **fields)


def compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def deliver(receiver: HttpReceiver, kind_config: dict[str, Any], incident: Incident) -> RecordedRequest:
    routes = RouteTable.from_config([{"receivers": ["r"]}], {"r": kind_config})

    async def go() -> None:
        dispatcher = WebhookDispatcher(
            routes=routes, deliverer=Deliverer(RetryPolicy(max_attempts=1)), kibana_base_url=KIBANA
        )
        try:
            [result] = await dispatcher.handle(incident)
            assert result.delivered, result
        finally:
            await dispatcher.close()

    before = len(receiver.requests)
    asyncio.run(go())
    requests = receiver.wait_for(before + 1)
    assert len(requests) == before + 1
    request = requests[-1]
    assert request.method == "POST"
    assert request.headers["content-type"] == "application/json"
    return request


def test_generic_json_body_is_the_incident_in_an_envelope(http_receiver: HttpReceiver) -> None:
    incident = small_incident(revision=2)
    got = deliver(http_receiver, {"kind": "generic_json", "url": http_receiver.url("/generic")}, incident)
    expected = {
        "type": "incident.revised",
        "timestamp": "2025-03-01T10:25:40.000000Z",
        "data": {
            "delivery_id": "inc-7:2",
            "transition": "revised",
            "link": LINK,
            "incident": {
                "incident_id": "inc-7",
                "job_id": "job-7",
                "class": "cuda_oom",
                "title": "CUDA out of memory on rank 1",
                "severity": "critical",
                "confidence": 0.93,
                "confidence_reason": "earliest unexplained cause; 255 ranks' timeouts explained by it",
                "initiator": {
                    "rank": 1,
                    "local_rank": 3,
                    "host": "gpu-node-02",
                    "pid": 48211,
                    "gpu": "3",
                    "ts": "2025-03-01T10:15:02.118000Z",
                    "rule": "cuda.oom",
                    "line": FIRST_LINE,
                },
                "collateral": [{"class": "nccl_timeout", "ranks": [0, 2, 3], "hosts": [], "count": 3}],
                "evidence": [],
                "fix": FIX,
                "verify": ["torch.cuda.max_memory_allocated() stays below 90% of the GPU"],
                "references": [],
                "revision": 2,
                "status": "open",
                "window_start": "2025-03-01T10:15:02.118000Z",
                "window_end": "2025-03-01T10:25:40.000000Z",
                "rule_set_version": "rs-1",
                "rule_versions": {"cuda.oom": 1},
                "world_size": 4,
                "labels": {"team": "ml", "kubernetes.io/ns": "train"},
                "attempt": 0,
                "recovered": False,
                "clock": "",
                "dropped": {},
            },
        },
    }
    assert got.body == compact(expected)
    assert got.headers["webhook-id"] == "inc-7:2"
    assert "webhook-signature" not in got.headers  # no secret configured: unsigned, and says so by omission


def test_slack_body_has_initiator_class_collateral_fix_and_link(http_receiver: HttpReceiver) -> None:
    got = deliver(http_receiver, {"kind": "slack", "url": http_receiver.url("/services/T0/B0/xyz")}, small_incident())
    expected = {
        "text": f"CUDA out of memory on rank 1 — {INITIATOR} — job job-7",
        "blocks": [
            {
                "type": "header",
                "text": {"type": "plain_text", "text": ":rotating_light: CUDA out of memory on rank 1", "emoji": True},
            },
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": "*Job*\n`job-7`"},
                    {"type": "mrkdwn", "text": f"*Initiator*\n{INITIATOR}"},
                    {"type": "mrkdwn", "text": "*Class*\n`cuda_oom` (critical, confidence 0.93)"},
                    {"type": "mrkdwn", "text": "*Collateral*\n3 ranks (nccl_timeout 3)"},
                ],
            },
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    # Slack mrkdwn: < and > escaped, or Slack would read "<GPU 3>" as a link.
                    "text": "*First line*\n```torch.OutOfMemoryError: CUDA out of memory. "
                    "Tried to allocate 2.00 GiB &lt;GPU 3&gt;```",
                },
            },
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": "*Fix*\n• Lower the per-GPU micro-batch size\n• Enable activation checkpointing",
                },
            },
            {
                "type": "actions",
                "elements": [{"type": "button", "text": {"type": "plain_text", "text": "Open incident"}, "url": LINK}],
            },
            {"type": "context", "elements": [{"type": "mrkdwn", "text": "opened · incident `inc-7` · revision 1"}]},
        ],
    }
    assert got.body == compact(expected)


def test_slack_close_says_resolved(http_receiver: HttpReceiver) -> None:
    got = deliver(
        http_receiver, {"kind": "slack", "url": http_receiver.url("/s")}, small_incident(revision=3, status="closed")
    )
    body = json.loads(got.body)
    assert body["text"].startswith("[resolved] CUDA out of memory on rank 1")
    assert body["blocks"][0]["text"]["text"] == ":white_check_mark: CUDA out of memory on rank 1"
    assert body["blocks"][-1]["elements"][0]["text"] == "closed · incident `inc-7` · revision 3"
    assert got.headers["webhook-id"] == "inc-7:3:closed"


def test_pagerduty_trigger_then_resolve_with_incident_id_as_dedup_key(http_receiver: HttpReceiver) -> None:
    config = {"kind": "pagerduty", "routing_key": "R0ut1ngKey42", "url": http_receiver.url("/v2/enqueue")}
    got = deliver(http_receiver, config, small_incident())
    expected = {
        "routing_key": "R0ut1ngKey42",
        "event_action": "trigger",
        "dedup_key": "inc-7",
        "payload": {
            "summary": f"CUDA out of memory on rank 1 — {INITIATOR} — job job-7",
            "source": "gpu-node-02",
            "severity": "critical",
            "timestamp": "2025-03-01T10:25:40.000000Z",
            "component": "rank 1",
            "group": "job-7",
            "class": "cuda_oom",
            "custom_details": {
                "job_id": "job-7",
                "incident_id": "inc-7",
                "revision": 1,
                "transition": "opened",
                "initiator": INITIATOR,
                "first_line": FIRST_LINE,
                "rule": "cuda.oom",
                "confidence": 0.93,
                "confidence_reason": "earliest unexplained cause; 255 ranks' timeouts explained by it",
                "collateral_ranks": 3,
                "collateral": [{"class": "nccl_timeout", "ranks": [0, 2, 3], "hosts": [], "count": 3}],
                "fix": FIX,
                "verify": ["torch.cuda.max_memory_allocated() stays below 90% of the GPU"],
                "delivery_id": "inc-7:1",
            },
        },
        "client": "rootrank",
        "client_url": LINK,
        "links": [{"href": LINK, "text": "Incident in Kibana"}],
    }
    assert got.body == compact(expected)

    resolved = deliver(http_receiver, config, small_incident(revision=2, status="closed"))
    assert resolved.body == compact({"routing_key": "R0ut1ngKey42", "event_action": "resolve", "dedup_key": "inc-7"})


def test_alertmanager_v4_firing_then_resolved(http_receiver: HttpReceiver) -> None:
    config = {
        "kind": "alertmanager",
        "url": http_receiver.url("/am"),
        "receiver_name": "ml-oncall",
        "external_url": "https://rootrank.example.com",
        "bearer_token": "am-bearer-secret",
    }
    got = deliver(http_receiver, config, small_incident())
    labels = {
        "alertname": "RootrankIncident",
        "class": "cuda_oom",
        "host": "gpu-node-02",
        "incident_id": "inc-7",
        "job_id": "job-7",
        "kubernetes_io_ns": "train",  # "kubernetes.io/ns" made a valid Prometheus label name
        "rank": "1",
        "severity": "critical",
        "team": "ml",
    }
    annotations = {
        "summary": f"CUDA out of memory on rank 1 — {INITIATOR} — job job-7",
        "description": f"CUDA out of memory on rank 1. Initiator: {INITIATOR}. First line: {FIRST_LINE}",
        "collateral_ranks": "3",
        "confidence": "0.93",
        "fix": "Lower the per-GPU micro-batch size\nEnable activation checkpointing",
        "revision": "1",
        "delivery_id": "inc-7:1",
        "link": LINK,
    }
    expected = {
        "version": "4",
        "groupKey": '{}:{incident_id="inc-7"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "ml-oncall",
        "groupLabels": {"incident_id": "inc-7"},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "https://rootrank.example.com",
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": annotations,
                "startsAt": "2025-03-01T10:15:02.118000Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": LINK,
                "fingerprint": "7988bfcfeef92bb4",
            }
        ],
    }
    assert got.body == compact(expected)
    assert got.headers["authorization"] == "Bearer am-bearer-secret"

    resolved = json.loads(deliver(http_receiver, config, small_incident(revision=2, status="closed")).body)
    assert resolved["status"] == "resolved"
    assert resolved["alerts"][0]["status"] == "resolved"
    assert resolved["alerts"][0]["endsAt"] == "2025-03-01T10:25:40.000000Z"
    assert resolved["alerts"][0]["fingerprint"] == "7988bfcfeef92bb4"  # same alert as the firing one
