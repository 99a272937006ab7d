"""WebhookDispatcher.handle: who gets what, once per transition, and nothing secret in logs."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from correlator.config import RetryPolicy
from correlator.diagnosis.models import Incident
from correlator.sinks.webhooks.api import RegistrationAPI
from correlator.sinks.webhooks.delivery import Deliverer, DeliveryResult
from correlator.sinks.webhooks.dispatcher import WebhookDispatcher
from correlator.sinks.webhooks.receivers.generic_json import generate_secret
from correlator.sinks.webhooks.registry import Registration, Registry
from correlator.sinks.webhooks.routes import RouteTable
from tests.fixtures.http_receiver import HttpReceiver
from tests.unit.webhooks.incidents import make_incident

FAST = RetryPolicy(max_attempts=5, initial_backoff_s=0.02, max_backoff_s=0.1, budget_s=10, timeout_s=2)


def run_all(dispatcher: WebhookDispatcher, incidents: list[Incident]) -> list[DeliveryResult]:
    async def go() -> list[DeliveryResult]:
        results: list[DeliveryResult] = []
        try:
            for incident in incidents:
                results.extend(await dispatcher.handle(incident))
        finally:
            await dispatcher.close()
        return results

    return asyncio.run(go())


def new_dispatcher(registry: Registry | None = None, progress: dict[str, Any] | None = None, **kw: Any) -> WebhookDispatcher:
    return WebhookDispatcher(
        registry=registry, progress=progress, deliverer=Deliverer(FAST), **kw
    )


def test_job_a_webhook_never_receives_job_b_incidents(http_receiver: HttpReceiver) -> None:
    registry = Registry()
    registry.upsert("job-a", Registration(url=http_receiver.url("/a")))
    registry.upsert("job-b", Registration(url=http_receiver.url("/b")))
    incidents = [
        make_incident("job-a", incident_id="a-1"),
        make_incident("job-b", incident_id="b-1"),
        make_incident("job-b", incident_id="b-2"),
        make_incident("job-c", incident_id="c-1"),  # nobody registered
        make_incident("job-a", incident_id="a-1", revision=2),
    ]
    run_all(new_dispatcher(registry), incidents)
    got_a = [r.webhook_id for r in http_receiver.requests if r.path == "/a"]
    got_b = [r.webhook_id for r in http_receiver.requests if r.path == "/b"]
    assert got_a == ["a-1:1", "a-1:2"]
    assert got_b == ["b-1:1", "b-2:1"]
    assert len(http_receiver.requests) == 4


def test_256_rank_failure_is_one_notification_per_transition(http_receiver: HttpReceiver) -> None:
    """Re-published and replayed messages, and a late older revision, notify nobody again."""
    registry = Registry()
    registry.upsert("llm-pretrain-7", Registration(url=http_receiver.url("/job")))
    routes = RouteTable.from_config([{"receivers": ["team"]}], {"team": {"kind": "slack", "url": http_receiver.url("/team")}})
    opened = make_incident(world_size=256)
    assert sum(len(c.ranks) for c in opened.collateral) == 255
    revised = make_incident(world_size=256, revision=2, initiator_rank=12)
    closed = make_incident(world_size=256, revision=2, initiator_rank=12, status="closed")
    stream = [opened] * 5 + [revised, opened, revised, closed, revised, closed, opened]
    run_all(new_dispatcher(registry, routes=routes), stream)
    for path in ("/job", "/team"):
        ids = [r.webhook_id for r in http_receiver.requests if r.path == path]
        assert ids == [
            "inc-llm-pretrain-7-0001:1",
            "inc-llm-pretrain-7-0001:2",
            "inc-llm-pretrain-7-0001:2:closed",
        ], path


def test_progress_survives_a_restart_and_partial_failures_are_not_resent(http_receiver: HttpReceiver) -> None:
    """Progress lives in a table (here a dict handed to the next dispatcher, as the changelog would)."""
    registry = Registry()
    registry.upsert("job-a", Registration(url=http_receiver.url("/ok")))
    registry.upsert("job-a", Registration(kind="slack", url=http_receiver.url("/gone")))
    progress: dict[str, Any] = {}
    http_receiver.answer_next(410)  # whichever goes first gets the 410; a 410 is final
    first = run_all(new_dispatcher(registry, progress), [make_incident("job-a", incident_id="a-1")])
    assert sorted(r.delivered for r in first) == [False, True]
    assert len(http_receiver.requests) == 2

    after_restart = new_dispatcher(registry, progress)
    assert run_all(after_restart, [make_incident("job-a", incident_id="a-1")]) == []
    assert len(http_receiver.requests) == 2
    assert after_restart.dead_lettered == []


def test_registration_filters(http_receiver: HttpReceiver) -> None:
    registry = Registry()
    registry.upsert("job-a", Registration(url=http_receiver.url("/crit"), min_severity="critical"))
    registry.upsert("job-a", Registration(url=http_receiver.url("/nccl"), classes=["nccl_*"]))
    run_all(
        new_dispatcher(registry),
        [
            make_incident("job-a", incident_id="x", severity="high", class_="nccl_timeout"),
            make_incident("job-a", incident_id="y", severity="critical", class_="cuda_oom"),
        ],
    )
    assert [(r.path, r.webhook_id) for r in http_receiver.requests] == [("/nccl", "x:1"), ("/crit", "y:1")]


def test_label_webhooks_are_off_by_default(http_receiver: HttpReceiver) -> None:
    labelled = make_incident("job-a", labels={"rootrank.webhook": http_receiver.url("/label")})
    run_all(new_dispatcher(), [labelled])
    assert http_receiver.requests == []
    run_all(new_dispatcher(allow_label_webhooks=True), [labelled])
    assert [r.path for r in http_receiver.requests] == ["/label"]
    # The job's webhook URL is used, not forwarded inside the notification.
    assert b"/label" not in http_receiver.requests[0].body
    assert json.loads(http_receiver.requests[0].body)["data"]["incident"]["labels"] == {}
    bad = make_incident("job-a", incident_id="z", labels={"rootrank.webhook": "file:///etc/passwd"})
    assert run_all(new_dispatcher(allow_label_webhooks=True), [bad]) == []


def test_secrets_and_tokens_never_reach_logs_or_dead_letters(
    http_receiver: HttpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = generate_secret()
    api_token = "api-token-Zq81xw"
    routing_key = "PdKey0123456789abcdef"
    slack_path = "/services/T000/B000/XoXoSlackSecretPath"
    api = RegistrationAPI(Registry(), api_token)
    auth = {"Authorization": f"Bearer {api_token}", "Content-Type": "application/json"}

    async def register() -> list[int]:
        statuses = []
        for body in (
            {"url": http_receiver.url("/g"), "secret": secret},
            {"kind": "slack", "url": http_receiver.url(slack_path)},
            {"kind": "pagerduty", "url": http_receiver.url("/pd"), "routing_key": routing_key},
            {"url": http_receiver.url("/g2"), "secret": "whsec_broken!"},  # refused: must not echo it
        ):
            response = await api.handle("PUT", "job-a", auth, {}, json.dumps(body).encode())
            statuses.append(response.status)
            assert "whsec_broken" not in repr(response.body)
        wrong = await api.handle("PUT", "job-a", {**auth, "Authorization": "Bearer wrong-" + api_token}, {}, b"{}")
        return [*statuses, wrong.status]

    assert asyncio.run(register()) == [201, 201, 201, 422, 401]
    http_receiver.fail_next(3, status=503)
    http_receiver.throttle_next(1, retry_after="0")
    http_receiver.answer_next(400)  # someone gets a final failure -> dead letter
    dispatcher = new_dispatcher(api.registry)
    results = run_all(dispatcher, [make_incident("job-a"), make_incident("job-a", status="closed", revision=2)])
    assert any(r.dead_lettered for r in results) and any(r.delivered for r in results)

    secret_values = [secret, secret.removeprefix("whsec_"), api_token, routing_key, "XoXoSlackSecretPath", "whsec_broken"]
    logged = caplog.text
    assert "delivered" in logged and "not delivered" in logged  # the logs did talk about these deliveries
    for value in secret_values:
        assert value not in logged
        assert value not in repr(dispatcher.dead_lettered)
    # What one destination receives carries no other destination's credentials.
    for request in http_receiver.requests:
        if request.path != "/pd":
            assert routing_key.encode() not in request.body
        assert secret.encode() not in request.body and b"XoXoSlackSecretPath" not in request.body
