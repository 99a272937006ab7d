"""Retries, backoff, Retry-After and the budget, against a real local HTTP receiver."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from tenacity import RetryCallState

from correlator.config import RetryPolicy
from correlator.sinks.webhooks.delivery import Deliverer, DeliveryResult, parse_retry_after
from correlator.sinks.webhooks.dispatcher import WebhookDispatcher
from correlator.sinks.webhooks.receivers.generic_json import generate_secret
from correlator.sinks.webhooks.routes import RouteTable
from tests.fixtures.http_receiver import HttpReceiver
from tests.unit.webhooks.incidents import make_incident

FAST = RetryPolicy(max_attempts=20, initial_backoff_s=0.05, max_backoff_s=0.4, budget_s=30, timeout_s=2)


def dispatch(receiver_config: dict[str, object], policy: RetryPolicy,
             **incident: object) -> tuple[list[DeliveryResult], WebhookDispatcher]:
    routes = RouteTable.from_config([{"receivers": ["hook"]}], {"hook": receiver_config})
    dispatcher = WebhookDispatcher(routes=routes, deliverer=Deliverer(policy))

    async def go() -> list[DeliveryResult]:
        try:
            return await dispatcher.handle(make_incident(**incident))  # type: ignore[arg-type]
        finally:
            await dispatcher.close()

    return asyncio.run(go()), dispatcher


def test_500_twice_then_200_is_delivered_once_with_one_delivery_id(http_receiver: HttpReceiver) -> None:
    secret = generate_secret()
    http_receiver.expect_secret(secret)
    http_receiver.fail_next(2, status=500)
    started = time.monotonic()
    [result], _ = dispatch({"kind": "generic_json", "url": http_receiver.url(), "secret": secret}, FAST)
    elapsed = time.monotonic() - started
    print(f"\n500,500,200: delivered after {len(result.attempts)} attempts in {elapsed:.2f}s")

    assert result.delivered and result.statuses == [500, 500, 200]
    requests = http_receiver.requests
    assert [r.status for r in requests] == [500, 500, 200]
    assert len(http_receiver.delivered()) == 1
    assert {r.webhook_id for r in requests} == {"inc-llm-pretrain-7-0001:1"}
    assert len({r.body for r in requests}) == 1  # the same bytes on every try
    assert all(r.signature_valid for r in requests)  # each retry re-signed with a fresh timestamp, still valid
    gaps = [b.received_at - a.received_at for a, b in itertools.pairwise(requests)]
    assert gaps[0] >= 0.025 and gaps[1] >= 0.05  # backed off (jittered: at least half the ceiling)


def test_429_retry_after_is_honoured(http_receiver: HttpReceiver) -> None:
    http_receiver.throttle_next(1, retry_after="2")
    [result], _ = dispatch({"kind": "slack", "url": http_receiver.url("/services/x")}, FAST)
    requests = http_receiver.requests
    gap = requests[1].received_at - requests[0].received_at
    print(f"\n429 Retry-After: 2 -> next attempt after {gap:.2f}s (backoff alone would be <= 0.05s)")
    assert result.delivered and result.statuses == [429, 200]
    assert gap >= 1.95


def test_retry_after_beyond_the_allowed_wait_dead_letters_at_once(http_receiver: HttpReceiver) -> None:
    http_receiver.throttle_next(1, retry_after="3600")
    patient = FAST.model_copy(update={"max_retry_after_s": 60})
    [result], dispatcher = dispatch({"kind": "slack", "url": http_receiver.url()}, patient)
    assert not result.delivered and result.dead_lettered
    assert "Retry-After 3600s" in (result.reason or "")
    assert len(http_receiver.requests) == 1
    assert dispatcher.dead_lettered[0]["reason"] == result.reason


def test_retry_after_http_date() -> None:
    now = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(later, now=now.timestamp()) == pytest.approx(90)
    assert parse_retry_after("7") == 7
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_a_final_4xx_is_dead_lettered_without_retrying(http_receiver: HttpReceiver) -> None:
    http_receiver.answer_next(404)
    routing_key = "PdRoutingKeyNeverLogged1"
    [result], dispatcher = dispatch(
        {"kind": "pagerduty", "url": http_receiver.url("/v2/enqueue"), "routing_key": routing_key}, FAST
    )
    assert not result.delivered and result.statuses == [404] and result.reason == "final answer 404"
    [record] = dispatcher.dead_lettered
    assert record["delivery_id"] == "inc-llm-pretrain-7-0001:1"
    assert record["incident"]["incident_id"] == "inc-llm-pretrain-7-0001"
    assert routing_key not in repr(record)
    assert "/v2/enqueue" not in repr(record)


def test_budget_spent_on_a_dead_receiver_goes_to_the_dead_letter(http_receiver: HttpReceiver) -> None:
    url = http_receiver.url("/services/T/B/secretpath")
    http_receiver.go_down()
    policy = RetryPolicy(max_attempts=100, initial_backoff_s=0.1, max_backoff_s=0.2, budget_s=1.0, timeout_s=1)
    started = time.monotonic()
    [result], dispatcher = dispatch({"kind": "slack", "url": url}, policy)
    elapsed = time.monotonic() - started
    print(f"\nreceiver down, budget 1s: dead-lettered after {len(result.attempts)} attempts in {elapsed:.2f}s")
    assert not result.delivered and result.dead_lettered
    assert "budget 1s spent" in (result.reason or "")
    assert all(a.status is None and a.error and "connect" in a.error for a in result.attempts)
    assert 0.5 < elapsed < 3
    assert "secretpath" not in repr(dispatcher.dead_lettered)


def test_receiver_down_then_up_is_delivered_afterwards(http_receiver: HttpReceiver) -> None:
    url = http_receiver.url()
    http_receiver.go_down()
    revive = threading.Timer(2.0, http_receiver.come_up)
    revive.start()
    try:
        [result], _ = dispatch({"kind": "generic_json", "url": url}, FAST)
    finally:
        revive.join()
    print(f"\ndown 2s: delivered on attempt {len(result.attempts)} after {result.elapsed_s:.2f}s")
    assert result.delivered and result.statuses[-1] == 200
    assert all(s is None for s in result.statuses[:-1]) and len(result.statuses) >= 3
    assert len(http_receiver.delivered()) == 1


def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    backoff = RetryPolicy(initial_backoff_s=1, max_backoff_s=16).backoff()
    for attempt in range(1, 9):
        ceiling = min(16, 2 ** (attempt - 1))
        after = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        after.attempt_number = attempt
        waits = [backoff(after) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert max(waits) - min(waits) > ceiling / 4  # jittered, not a fixed schedule
