"""Per-destination delivery queues: one broken receiver never delays another destination's notifications.

The webhook worker hands each incident message to `DestinationQueues.accept`, which records, for every
destination that still has to get this transition, a *pending delivery* in a store partitioned like the
incidents topic (the worker's faust table `webhook-pending`, changelog-backed), puts it in that
destination's queue and returns without waiting on any receiver. The incident's offset is committed after
that (faust flushes the table's changelog before it commits offsets), so a restart loses nothing: what was
committed is in the store, what was not is read again.

Each destination (a job's registration, a configured receiver, a label webhook) has:

- its own queue of pending deliveries, oldest first, one per incident (a newer transition of an incident
  replaces an older one still waiting), bounded by `max_pending`: past it a new delivery is dead-lettered
  for good at once, and the store cannot grow without bound behind a dead receiver;
- one delivery in flight at a time, in order, with the delivery policy's retries (`Deliverer`, tenacity);
- a state: `ok`; `retrying` (an attempt failed: the last error and the next retry); `dead` (its retries ran
  out: the delivery goes to the webhooks dead-letter topic with `"kept": true`, stays pending, and the
  destination is tried again every `dead_retry_interval_s` with one attempt, until it answers; then its
  queue drains in order).

A delivery leaves the store when it is delivered, answered with a final error (a 4xx other than 408, 425
and 429: dead-lettered for good), pending longer than `max_age_s` (dead-lettered for good), or its
destination is gone (a registration removed); the progress table then marks the destination done for that
transition, so a replay notifies nobody twice.

Restarts and rebalances: the store is the truth. The owner of an incidents partition queues that
partition's pending deliveries once its tables are recovered (`requeue`); a worker losing a partition drops
them and cancels the one in flight (`drop_partitions`): its new owner delivers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from correlator.diagnosis.models import Incident
from correlator.sinks.webhooks.delivery import Attempt, DeliveryResult
from correlator.sinks.webhooks.dispatcher import (
    Destination,
    PartitionedStore,
    WebhookDispatcher,
    dead_letter_record,
)
from correlator.sinks.webhooks.notification import Notification, transition_marker

log = logging.getLogger("rootrank.webhooks")

STATES = ("ok", "retrying", "dead")

SleepFn = Callable[[float], Awaitable[None]]
ResultFn = Callable[[DeliveryResult], None]
MetricsFn = Callable[[dict[str, int], int], None]


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _outcome(attempt: Attempt) -> str:
    return f"HTTP {attempt.status}" if attempt.status is not None else (attempt.error or "failed")


@dataclass
class DestinationStatus:
    """What `rootrank webhooks list` shows of a destination (times are epoch seconds)."""

    state: str = "ok"
    pending: int = 0
    delivered: int = 0
    dead_lettered: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    next_retry_at: float | None = None
    dead_since: float | None = None
    last_delivered_at: float | None = None

    def view(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pending": self.pending,
            "delivered": self.delivered,
            "dead_lettered": self.dead_lettered,
            "last_error": self.last_error,
            "last_error_at": _iso(self.last_error_at),
            "next_retry_at": _iso(self.next_retry_at),
            "dead_since": _iso(self.dead_since),
            "last_delivered_at": _iso(self.last_delivered_at),
        }


class _Queue:
    def __init__(self, key: str) -> None:
        self.key = key
        self.items: dict[str, int] = {}  # incident id -> its partition, oldest first
        self.status = DestinationStatus()
        self.wake = asyncio.Event()
        self.worker: asyncio.Task[None] | None = None
        self.inflight: tuple[str, int, asyncio.Future[None]] | None = None


class DestinationQueues:
    def __init__(
        self,
        dispatcher: WebhookDispatcher,
        pending: PartitionedStore,
        *,
        dead_retry_interval_s: float = 300.0,
        max_pending: int = 1000,
        max_age_s: float = 86_400.0,
        clock: Callable[[], float] = time.time,
        sleep: SleepFn = asyncio.sleep,
        on_result: ResultFn | None = None,
        on_metrics: MetricsFn | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.pending = pending
        self.dead_retry_interval_s = dead_retry_interval_s
        self.max_pending = max_pending
        self.max_age_s = max_age_s
        self.clock = clock
        self.sleep = sleep
        self.on_result = on_result
        self.on_metrics = on_metrics
        self.queues: dict[str, _Queue] = {}
        self.closed = False

    # -- intake --------------------------------------------------------------------------------

    async def accept(self, incident: Incident, partition: int) -> list[str]:
        """Record this transition as pending for every destination that has not had it, queue it, and
        return their keys. Returns without waiting on any receiver (a dead letter for a destination whose
        queue is full is awaited: the broker's ack)."""
        destinations = self.dispatcher.pending_destinations(incident)
        if not destinations:
            return []
        entry = self.pending.get(incident.incident_id)
        entry = entry if isinstance(entry, dict) else {}
        waiting: dict[str, Any] = dict(entry.get("dest") or {})
        marker = list(transition_marker(incident))
        now = self.clock()
        accepted: list[str] = []
        changed = False
        overflow: list[Destination] = []
        for destination in destinations:
            current = waiting.get(destination.key)
            accepted.append(destination.key)
            if current is not None and tuple(current["m"]) >= tuple(marker):
                continue  # already pending (the message was read again)
            if current is None and len(self._queue(destination.key).items) >= self.max_pending:
                accepted.pop()
                overflow.append(destination)
                continue
            waiting[destination.key] = {"m": marker, "since": current["since"] if current else now}
            changed = True
        if changed:
            # The incident as stored is its newest transition: what every waiting destination gets.
            newest = "incident" not in entry or tuple(marker) >= tuple(entry.get("m") or (0, 0))
            self.pending.put(incident.incident_id, {
                "p": partition,
                "m": marker if newest else entry["m"],
                "incident": incident.to_json_dict() if newest else entry["incident"],
                "dest": waiting,
            }, partition)
        if accepted:
            for key in accepted:
                self._enqueue(self._queue(key), incident.incident_id, partition)
        if overflow:
            notification = Notification.for_incident(incident, self.dispatcher.kibana_base_url)
            for destination in overflow:
                log.error("webhook %s to %s: %d deliveries already waiting; dead-lettered for good",
                          notification.delivery_id, destination.key, self.max_pending)
                result = DeliveryResult(notification.delivery_id, destination.receiver.name,
                                        destination.receiver.display_target(), delivered=False,
                                        reason=f"{self.max_pending} deliveries already waiting for this destination")
                await self._dead_letter(self._queue(destination.key), notification, destination, result, kept=False)
            self.dispatcher.mark(incident, [d.key for d in overflow], partition)
        self._publish_metrics()
        return accepted

    def requeue(self, partitions: Collection[int]) -> int:
        """Queue the stored pending deliveries of `partitions` (after a restart or a rebalance); returns how
        many were queued that were not already."""
        entries = [(key, value) for key, value in self.pending.items()
                   if isinstance(value, dict) and value.get("p") in partitions]
        entries.sort(key=lambda kv: min((d.get("since", 0.0) for d in (kv[1].get("dest") or {}).values()), default=0.0))
        added = 0
        for incident_id, entry in entries:
            for key in entry.get("dest") or {}:
                queue = self._queue(key)
                if incident_id not in queue.items:
                    self._enqueue(queue, incident_id, int(entry["p"]))
                    added += 1
        if added:
            log.info("webhooks: %d pending deliveries queued again (partitions %s)", added, sorted(partitions))
        self._publish_metrics()
        return added

    async def drop_partitions(self, partitions: Collection[int]) -> None:
        """Forget the queued deliveries of `partitions` (moved to another worker) and cancel the one in
        flight: nothing is written for a partition this worker no longer owns."""
        cancelled: list[asyncio.Future[None]] = []
        for queue in self.queues.values():
            for incident_id, partition in list(queue.items.items()):
                if partition in partitions:
                    del queue.items[incident_id]
            if queue.inflight is not None and queue.inflight[1] in partitions and not queue.inflight[2].done():
                queue.inflight[2].cancel()
                cancelled.append(queue.inflight[2])
        if cancelled:
            await asyncio.wait(cancelled, timeout=5.0)
        self._publish_metrics()

    # -- what the API and the metrics show -------------------------------------------------------

    def status(self, key: str) -> dict[str, Any] | None:
        queue = self.queues.get(key)
        if queue is None:
            return None
        queue.status.pending = len(queue.items)
        return queue.status.view()

    def states(self) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        for queue in self.queues.values():
            counts[queue.status.state] = counts.get(queue.status.state, 0) + 1
        return counts

    @property
    def delivering(self) -> bool:
        return any(q.inflight is not None for q in self.queues.values())

    def _publish_metrics(self) -> None:
        if self.on_metrics is not None:
            self.on_metrics(self.states(), sum(len(q.items) for q in self.queues.values()))

    # -- the destinations' workers ---------------------------------------------------------------

    def _queue(self, key: str) -> _Queue:
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = _Queue(key)
        return queue

    def _enqueue(self, queue: _Queue, incident_id: str, partition: int) -> None:
        queue.items.setdefault(incident_id, partition)  # a newer transition keeps the incident's place
        if queue.worker is None or queue.worker.done():
            queue.worker = asyncio.ensure_future(self._run(queue))
        queue.wake.set()

    async def _run(self, queue: _Queue) -> None:
        while not self.closed:
            if not queue.items:
                queue.wake.clear()
                await queue.wake.wait()
                continue
            if queue.status.state == "dead" and queue.status.next_retry_at is not None:
                delay = queue.status.next_retry_at - self.clock()
                if delay > 0:
                    await self.sleep(min(delay, 1.0))  # re-checked: the queue may have been emptied meanwhile
                    continue
            incident_id, partition = next(iter(queue.items.items()))
            task = asyncio.ensure_future(self._deliver_one(queue, incident_id, partition))
            queue.inflight = (incident_id, partition, task)
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # stopping
                log.info("webhook delivery to %s abandoned: partition %d moved to another worker", queue.key, partition)
            except Exception:
                # A bug, not a delivery failure: keep the delivery pending (the store has it) and go on with
                # the others after a pause, rather than spin on it or stop every destination.
                log.exception("webhook delivery of %s to %s failed; it stays pending", incident_id, queue.key)
                if queue.items.pop(incident_id, None) is not None:
                    queue.items[incident_id] = partition
                await self.sleep(1.0)
            finally:
                queue.inflight = None
            self._publish_metrics()

    async def _deliver_one(self, queue: _Queue, incident_id: str, partition: int) -> None:
        entry = self.pending.get(incident_id)
        spec = ((entry or {}).get("dest") or {}).get(queue.key) if isinstance(entry, dict) else None
        if entry is None or spec is None:
            queue.items.pop(incident_id, None)
            return
        incident = Incident.model_validate(entry["incident"])
        if self.dispatcher.done(incident, queue.key):
            self._finish(queue, incident, partition, handled=True)
            return
        destination = self.dispatcher.destination_for(queue.key, incident)
        if destination is None:
            log.info("incident %s: %s is no longer one of its destinations; its pending delivery is dropped",
                     incident_id, queue.key)
            self._finish(queue, incident, partition, handled=False)
            return
        notification = Notification.for_incident(incident, self.dispatcher.kibana_base_url)
        status = queue.status
        if self.clock() - float(spec.get("since", self.clock())) > self.max_age_s:
            result = DeliveryResult(notification.delivery_id, destination.receiver.name,
                                    destination.receiver.display_target(), delivered=False,
                                    reason=f"pending longer than {self.max_age_s:.0f}s ({status.last_error or 'no answer'})")
            await self._dead_letter(queue, notification, destination, result, kept=False)
            self._finish(queue, incident, partition, handled=True)
            return

        def retrying(attempt: Attempt, wait_s: float) -> None:
            now = self.clock()
            if status.state != "dead":
                status.state = "retrying"
            status.last_error, status.last_error_at, status.next_retry_at = _outcome(attempt), now, now + wait_s
            self._publish_metrics()

        probe = status.state == "dead"
        result = await self.dispatcher.deliver_to(notification, destination, on_retry=retrying, single_attempt=probe)
        now = self.clock()
        if result.delivered:
            if probe:
                log.info("webhook destination %s answers again after %.0fs; %d pending deliveries follow",
                         queue.key, now - (status.dead_since or now), len(queue.items) - 1)
            status.state, status.next_retry_at, status.dead_since = "ok", None, None
            status.delivered += 1
            status.last_delivered_at = now
            self._report(result)
            self._finish(queue, incident, partition, handled=True)
            return
        status.last_error = result.reason or (_outcome(result.attempts[-1]) if result.attempts else "failed")
        status.last_error_at = now
        if not result.exhausted:  # a final answer (the receiver is there, and retrying cannot help)
            status.state, status.next_retry_at, status.dead_since = "ok", None, None
            await self._dead_letter(queue, notification, destination, result, kept=False)
            self._finish(queue, incident, partition, handled=True)
            return
        # The retries ran out on failures that may pass: the destination is dead for now; the delivery stays.
        if not probe:
            status.state, status.dead_since = "dead", now
            result.reason = (f"{result.reason}; kept pending, tried again every {self.dead_retry_interval_s:.0f}s "
                             f"for up to {self.max_age_s:.0f}s")
            await self._dead_letter(queue, notification, destination, result, kept=True)
        status.next_retry_at = self.clock() + self.dead_retry_interval_s

    async def _dead_letter(self, queue: _Queue, notification: Notification, destination: Destination,
                           result: DeliveryResult, *, kept: bool) -> None:
        await self.dispatcher.write_dead_letter(dead_letter_record(notification, destination, result, kept=kept))
        result.dead_lettered = True
        queue.status.dead_lettered += 1
        self._report(result)

    def _report(self, result: DeliveryResult) -> None:
        if self.on_result is not None:
            self.on_result(result)

    def _finish(self, queue: _Queue, incident: Incident, partition: int, *, handled: bool) -> None:
        """This destination is done with `incident`'s transition (or, not `handled`, with the incident)."""
        if handled:
            self.dispatcher.mark(incident, [queue.key], partition)
        entry = self.pending.get(incident.incident_id)
        still_waiting = False
        if isinstance(entry, dict):
            waiting = dict(entry.get("dest") or {})
            spec = waiting.get(queue.key)
            if spec is not None and (not handled or tuple(spec["m"]) <= transition_marker(incident)):
                del waiting[queue.key]
            still_waiting = queue.key in waiting  # a newer transition arrived while this one was in flight
            if waiting:
                self.pending.put(incident.incident_id, {**entry, "dest": waiting}, partition)
            else:
                self.pending.delete(incident.incident_id, partition)
        if not still_waiting:
            queue.items.pop(incident.incident_id, None)

    async def close(self) -> None:
        self.closed = True
        workers = [q.worker for q in self.queues.values() if q.worker is not None and not q.worker.done()]
        for worker in workers:
            worker.cancel()
        for worker in workers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await worker

