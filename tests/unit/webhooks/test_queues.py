"""DestinationQueues: each destination its own queue and retry schedule; dead destinations kept, not dropped.

Real HTTP: a live receiver, and a "dead" one that is a free port nothing listens on (connections refused)
until a receiver is started on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from correlator.config import RetryPolicy
from correlator.sinks.webhooks.api import RegistrationAPI
from correlator.sinks.webhooks.delivery import Deliverer
from correlator.sinks.webhooks.dispatcher import MappingStore, WebhookDispatcher, registration_key
from correlator.sinks.webhooks.queues import DestinationQueues
from correlator.sinks.webhooks.registry import Registration, Registry
from tests.fixtures.http_receiver import HttpReceiver, free_port
from tests.unit.webhooks.incidents import make_incident

PATIENT = RetryPolicy(max_attempts=50, initial_backoff_s=0.4, max_backoff_s=1.0, budget_s=30, timeout_s=2)
SHORT = RetryPolicy(max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.1, budget_s=5, timeout_s=2)


class Setup:
    def __init__(self, policy: RetryPolicy, **queue_options: Any) -> None:
        self.registry = Registry()
        self.progress = MappingStore()
        self.pending = MappingStore()
        self.dispatcher = WebhookDispatcher(registry=self.registry, progress=self.progress, deliverer=Deliverer(policy))
        self.metrics: list[tuple[dict[str, int], int]] = []
        self.queues = self.new_queues(**queue_options)

    def new_queues(self, **options: Any) -> DestinationQueues:
        return DestinationQueues(self.dispatcher, self.pending, on_metrics=lambda s, p: self.metrics.append((s, p)),
                                 **options)

    async def close(self, *others: DestinationQueues) -> None:
        for queues in (self.queues, *others):
            await queues.close()
        await self.dispatcher.close()  # its HTTP session

    def register(self, job_id: str, url: str) -> str:
        registration = Registration(url=url)
        self.registry.upsert(job_id, registration)
        return registration_key(registration.id)


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:  # noqa: ASYNC109 - a poll deadline, not a cancellation scope
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def run(coroutine: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coroutine())


def test_a_dead_receiver_delays_only_its_own_destination(http_receiver: HttpReceiver) -> None:
    """Job A's receiver refuses connections, job B's answers. B is delivered while A is still in its
    first retries (under one queue for all, B would wait until A's 30 s budget ran out)."""
    setup = Setup(PATIENT)
    dead_url = f"http://127.0.0.1:{free_port()}/a"
    key_a = setup.register("job-a", dead_url)
    key_b = setup.register("job-b", http_receiver.url("/b"))

    async def go() -> None:
        started = time.monotonic()
        assert await setup.queues.accept(make_incident("job-a", incident_id="a-1"), 0) == [key_a]
        await until(lambda: (setup.queues.status(key_a) or {}).get("state") == "retrying")
        await setup.queues.accept(make_incident("job-b", incident_id="b-1"), 1)
        await until(lambda: len(http_receiver.delivered("/b")) == 1)
        waited = time.monotonic() - started
        status_a = setup.queues.status(key_a) or {}
        print(f"\nB delivered {waited:.2f}s after A's incident; A {status_a['state']}, last error {status_a['last_error']}")
        assert status_a["state"] == "retrying" and status_a["pending"] == 1
        assert "connect failed" in status_a["last_error"] and status_a["next_retry_at"]
        assert setup.pending.get("b-1") is None and setup.pending.get("a-1") is not None
        assert setup.progress.get("b-1") == {key_b: [1, 0]}
        await setup.close()

    run(go)


def test_a_destination_that_gave_up_is_dead_lettered_kept_and_delivered_when_its_receiver_is_back() -> None:
    port = free_port()
    setup = Setup(SHORT, dead_retry_interval_s=0.5)
    key = setup.register("job-a", f"http://127.0.0.1:{port}/a")
    revived = HttpReceiver(port=port)

    async def go() -> None:
        await setup.queues.accept(make_incident("job-a", incident_id="a-1"), 0)
        await until(lambda: (setup.queues.status(key) or {}).get("state") == "dead")
        status = setup.queues.status(key) or {}
        assert status["pending"] == 1 and status["dead_lettered"] == 1 and status["dead_since"]
        assert "3 attempts failed" in status["last_error"] and status["next_retry_at"]
        [record] = setup.dispatcher.dead_lettered
        assert record["kept"] is True and record["delivery_id"] == "a-1:1" and "kept pending" in record["reason"]
        assert setup.metrics[-1] == ({"ok": 0, "retrying": 0, "dead": 1}, 1)
        # A second incident of the job waits behind the first, in order.
        await setup.queues.accept(make_incident("job-a", incident_id="a-2"), 1)
        await asyncio.sleep(1.2)  # two retries of the dead destination, one attempt each
        assert (setup.queues.status(key) or {})["state"] == "dead"
        revived.start()
        try:
            await until(lambda: len(revived.delivered("/a")) == 2)
        finally:
            revived.stop()
        assert [r.webhook_id for r in revived.requests] == ["a-1:1", "a-2:1"]
        status = setup.queues.status(key) or {}
        assert status["state"] == "ok" and status["pending"] == 0 and status["delivered"] == 2
        assert status["next_retry_at"] is None and status["dead_since"] is None
        assert setup.pending.mapping == {}
        assert len(setup.dispatcher.dead_lettered) == 1  # the destination gave up once; nothing dropped
        await setup.close()

    run(go)


def test_pending_deliveries_survive_a_restart_and_a_newer_revision_replaces_a_waiting_one() -> None:
    port = free_port()
    setup = Setup(PATIENT)
    key = setup.register("job-a", f"http://127.0.0.1:{port}/a")
    revived = HttpReceiver(port=port)

    async def go() -> None:
        await setup.queues.accept(make_incident("job-a", incident_id="a-1"), 3)
        await until(lambda: (setup.queues.status(key) or {}).get("state") == "retrying")
        await setup.queues.accept(make_incident("job-a", incident_id="a-1", revision=2), 3)
        await setup.queues.close()  # the worker stops mid-retry
        assert setup.pending.get("a-1")["dest"][key]["m"] == [2, 0]

        restarted = setup.new_queues()
        assert restarted.requeue({0, 1}) == 0  # another worker's partitions
        assert restarted.requeue({3}) == 1
        revived.start()
        try:
            await until(lambda: len(revived.delivered()) == 1)
            await asyncio.sleep(0.5)
        finally:
            revived.stop()
        assert [r.webhook_id for r in revived.requests] == ["a-1:2"]  # revision 1, superseded, never sent
        assert setup.pending.mapping == {} and setup.progress.get("a-1") == {key: [2, 0]}
        # Read again (a replay): nobody is notified twice.
        assert await restarted.accept(make_incident("job-a", incident_id="a-1", revision=2), 3) == []
        await setup.close(restarted)

    run(go)


def test_a_final_answer_is_dead_lettered_for_good_and_the_queue_goes_on(http_receiver: HttpReceiver) -> None:
    setup = Setup(PATIENT)
    key = setup.register("job-a", http_receiver.url("/a"))
    http_receiver.answer_next(404)

    async def go() -> None:
        await setup.queues.accept(make_incident("job-a", incident_id="a-1"), 0)
        await setup.queues.accept(make_incident("job-a", incident_id="a-2"), 0)
        await until(lambda: len(http_receiver.delivered("/a")) == 1)
        [record] = setup.dispatcher.dead_lettered
        assert record["kept"] is False and record["reason"] == "final answer 404" and record["delivery_id"] == "a-1:1"
        status = setup.queues.status(key) or {}
        assert status["state"] == "ok" and status["last_error"] == "final answer 404" and status["pending"] == 0
        assert setup.pending.mapping == {}
        await setup.close()

    run(go)


def test_a_full_queue_dead_letters_new_deliveries_at_once() -> None:
    setup = Setup(PATIENT, max_pending=2)
    key = setup.register("job-a", f"http://127.0.0.1:{free_port()}/a")

    async def go() -> None:
        for i in range(3):
            await setup.queues.accept(make_incident("job-a", incident_id=f"a-{i}"), 0)
        [record] = setup.dispatcher.dead_lettered
        assert record["delivery_id"] == "a-2:1" and record["kept"] is False
        assert "2 deliveries already waiting" in record["reason"]
        assert (setup.queues.status(key) or {})["pending"] == 2
        assert setup.progress.get("a-2") == {key: [1, 0]} and setup.pending.get("a-2") is None
        await setup.close()

    run(go)


def test_a_revoked_partition_is_dropped_and_its_delivery_in_flight_cancelled() -> None:
    setup = Setup(PATIENT)
    key = setup.register("job-a", f"http://127.0.0.1:{free_port()}/a")

    async def go() -> None:
        await setup.queues.accept(make_incident("job-a", incident_id="a-1"), 5)
        await until(lambda: (setup.queues.status(key) or {}).get("state") == "retrying")
        await setup.queues.drop_partitions({5})
        assert (setup.queues.status(key) or {})["pending"] == 0
        await until(lambda: not setup.queues.delivering, timeout=5)
        assert setup.pending.get("a-1") is not None  # the new owner delivers it from the table
        await setup.close()

    run(go)


def test_the_api_shows_each_webhooks_delivery_state() -> None:
    setup = Setup(SHORT, dead_retry_interval_s=60)
    key = setup.register("job-a", f"http://127.0.0.1:{free_port()}/a")
    api = RegistrationAPI(setup.registry, "token", status_of=setup.queues.status)

    async def go() -> None:
        before = await api.handle("GET", "job-a", {}, {}, None)
        assert before.body["webhooks"][0]["delivery"] is None  # nothing to deliver yet
        await setup.queues.accept(make_incident("job-a", incident_id="a-1"), 0)
        await until(lambda: (setup.queues.status(key) or {}).get("state") == "dead")
        response = await api.handle("GET", "job-a", {}, {}, None)
        [view] = response.body["webhooks"]
        delivery = view["delivery"]
        assert delivery["state"] == "dead" and delivery["pending"] == 1
        assert delivery["last_error"].startswith("3 attempts failed, last: connect failed")
        assert delivery["next_retry_at"].endswith("Z") and delivery["dead_since"].endswith("Z")
        await setup.close()

    run(go)
