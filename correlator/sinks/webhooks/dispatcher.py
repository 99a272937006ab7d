"""One incident message in, one notification per destination per transition out.

Destinations: the configured routes' receivers, the job's registrations, and (only when
`allow_label_webhooks` is on) a URL the job's own log labels name. A destination that has
handled a transition of an incident (delivered or dead-lettered) is marked in the progress
store, so a replayed or re-published message - after a restart, a rebalance, a duplicate
publish by the correlator - notifies nobody twice, and an older revision arriving late is
not sent after a newer one.

`handle` delivers one incident to all its destinations and returns when each is done (library
use, tests). The worker does not wait on receivers: `correlator.sinks.webhooks.queues` gives
every destination its own queue and retry schedule and uses the parts below
(`pending_destinations`, `destination_for`, `deliver_to`, `mark`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from correlator.diagnosis.models import Incident
from correlator.sinks.webhooks.delivery import Deliverer, DeliveryResult, RetryFn
from correlator.sinks.webhooks.notification import (
    PRIVATE_LABEL_PREFIX,
    Notification,
    redact_url,
    transition_marker,
)
from correlator.sinks.webhooks.receivers import Receiver, build_receiver
from correlator.sinks.webhooks.receivers.base import short_hash
from correlator.sinks.webhooks.registry import Registry
from correlator.sinks.webhooks.routes import RouteTable

if TYPE_CHECKING:
    from correlator.config import WebhookSettings

log = logging.getLogger("rootrank.webhooks")

LABEL_WEBHOOK_URL = PRIVATE_LABEL_PREFIX
LABEL_WEBHOOK_KIND = PRIVATE_LABEL_PREFIX + ".kind"
LABEL_WEBHOOK_KINDS = ("generic_json", "slack", "alertmanager")

DeadLetterFn = Callable[[dict[str, Any]], Awaitable[None]]


@runtime_checkable
class PartitionedStore(Protocol):
    """A key-value store whose writes name the partition they belong to: a faust table written outside its
    stream (the worker's destination queues) must say which changelog partition a key lives in."""

    def get(self, key: str) -> Any: ...

    def put(self, key: str, value: Any, partition: int | None) -> None: ...

    def delete(self, key: str, partition: int | None) -> None: ...

    def items(self) -> Iterable[tuple[str, Any]]: ...


class MappingStore:
    """A plain mapping as a PartitionedStore (library use, tests): the partition is not needed."""

    def __init__(self, mapping: MutableMapping[str, Any] | None = None) -> None:
        self.mapping: MutableMapping[str, Any] = mapping if mapping is not None else {}

    def get(self, key: str) -> Any:
        return self.mapping.get(key)

    def put(self, key: str, value: Any, partition: int | None) -> None:
        self.mapping[key] = value

    def delete(self, key: str, partition: int | None) -> None:
        self.mapping.pop(key, None)

    def items(self) -> Iterable[tuple[str, Any]]:
        return list(self.mapping.items())


def registration_key(registration_id: str) -> str:
    """The destination key of a job's registration (progress and pending deliveries are kept under it)."""
    return f"job:{registration_id}"


@dataclass(frozen=True)
class Destination:
    key: str  # stable: progress is recorded under it
    receiver: Receiver[Any]


class WebhookDispatcher:
    def __init__(
        self,
        *,
        routes: RouteTable | None = None,
        registry: Registry | None = None,
        deliverer: Deliverer | None = None,
        dead_letter: DeadLetterFn | None = None,
        progress: MutableMapping[str, Any] | PartitionedStore | None = None,
        kibana_base_url: str | None = None,
        allow_label_webhooks: bool = False,
    ) -> None:
        self.routes = routes or RouteTable([], {})
        self.registry = registry or Registry()
        self.deliverer = deliverer or Deliverer()
        self.dead_letter = dead_letter
        # incident_id -> {destination key: [revision, closed]}: a faust Table in the worker.
        self.progress: PartitionedStore = (
            progress if isinstance(progress, PartitionedStore) else MappingStore(progress)
        )
        self.kibana_base_url = kibana_base_url
        self.allow_label_webhooks = allow_label_webhooks
        self.dead_lettered: list[dict[str, Any]] = []

    @classmethod
    def from_settings(
        cls,
        settings: WebhookSettings,
        *,
        registry: Registry | None = None,
        progress: MutableMapping[str, Any] | PartitionedStore | None = None,
        dead_letter: DeadLetterFn | None = None,
        deliverer: Deliverer | None = None,
    ) -> WebhookDispatcher:
        """Routes and receivers validated up front: a bad config stops the worker at start, with `where: what`."""
        return cls(
            routes=RouteTable.from_config(settings.routes, settings.receivers),
            registry=registry,
            deliverer=deliverer or Deliverer(settings.delivery),
            dead_letter=dead_letter,
            progress=progress,
            kibana_base_url=settings.kibana_base_url,
            allow_label_webhooks=settings.allow_label_webhooks,
        )

    def destinations(self, incident: Incident) -> list[Destination]:
        found: dict[str, Destination] = {}
        for receiver in self.routes.receivers_for(incident):
            found.setdefault(f"cfg:{receiver.name}", Destination(f"cfg:{receiver.name}", receiver))
        for registration in self.registry.for_job(incident.job_id):
            if registration.wants(incident):
                key = registration_key(registration.id)
                found.setdefault(key, Destination(key, registration.receiver(f"job {incident.job_id} webhook {registration.id}")))
        if self.allow_label_webhooks:
            label_destination = self._label_destination(incident)
            if label_destination is not None:
                found.setdefault(label_destination.key, label_destination)
        return list(found.values())

    def _label_destination(self, incident: Incident) -> Destination | None:
        url = incident.labels.get(LABEL_WEBHOOK_URL)
        if not url:
            return None
        kind = incident.labels.get(LABEL_WEBHOOK_KIND, "generic_json")
        if kind not in LABEL_WEBHOOK_KINDS:
            log.warning("job %s: label webhook kind %r is not allowed; ignored", incident.job_id, kind)
            return None
        try:
            receiver = build_receiver(f"job {incident.job_id} label webhook", {"kind": kind, "url": url})
        except ValueError as exc:
            log.warning("job %s: label webhook %s ignored: %s", incident.job_id, redact_url(url), exc)
            return None
        return Destination(f"label:{short_hash(kind + url, 12)}", receiver)

    def done(self, incident: Incident, key: str) -> bool:
        """Has destination `key` handled this transition of the incident (or a later one)?"""
        marks = self.progress.get(incident.incident_id) or {}
        mark = marks.get(key)
        return mark is not None and tuple(mark) >= transition_marker(incident)

    def mark(self, incident: Incident, keys: list[str], partition: int | None = None) -> None:
        """Record that `keys` handled this transition (in the incident's partition of the progress table)."""
        if not keys:
            return
        marks = dict(self.progress.get(incident.incident_id) or {})
        for key in keys:
            current = marks.get(key)
            if current is None or tuple(current) < transition_marker(incident):
                marks[key] = list(transition_marker(incident))
        # A new value (not the old one mutated), so a faust table writes its changelog.
        self.progress.put(incident.incident_id, marks, partition)

    def pending_destinations(self, incident: Incident) -> list[Destination]:
        """The destinations this transition still has to reach."""
        return [d for d in self.destinations(incident) if not self.done(incident, d.key)]

    def destination_for(self, key: str, incident: Incident) -> Destination | None:
        """Destination `key` as it is now (a registration removed since: None)."""
        for destination in self.destinations(incident):
            if destination.key == key:
                return destination
        return None

    async def handle(self, incident: Incident) -> list[DeliveryResult]:
        """Deliver this transition to every destination that has not had it yet.

        Returns once each destination is delivered or dead-lettered; raises only if the
        dead-letter write itself fails (then nothing is marked, and the caller must not commit).
        """
        notification = Notification.for_incident(incident, self.kibana_base_url)
        pending = self.pending_destinations(incident)
        if not pending:
            return []
        results = await asyncio.gather(*(self._deliver(notification, d) for d in pending), return_exceptions=True)
        handled = [d.key for d, r in zip(pending, results, strict=True) if isinstance(r, DeliveryResult)]
        self.mark(incident, handled)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if isinstance(r, DeliveryResult)]

    async def deliver_to(self, notification: Notification, destination: Destination, *,
                         on_retry: RetryFn | None = None, single_attempt: bool = False) -> DeliveryResult:
        """One notification to one destination, with the delivery policy's retries; nothing dead-lettered."""
        receiver = destination.receiver
        request = receiver.render(notification)
        return await self.deliverer.deliver(
            request, notification.delivery_id, receiver.name, receiver.display_target(),
            on_retry=on_retry, single_attempt=single_attempt,
        )

    async def write_dead_letter(self, record: dict[str, Any]) -> None:
        if self.dead_letter is not None:
            await self.dead_letter(record)
        else:
            self.dead_lettered.append(record)  # no topic (library use, tests): keep it visible

    async def _deliver(self, notification: Notification, destination: Destination) -> DeliveryResult:
        result = await self.deliver_to(notification, destination)
        if not result.delivered:
            await self.write_dead_letter(dead_letter_record(notification, destination, result))
            result.dead_lettered = True
        return result

    async def close(self) -> None:
        await self.deliverer.close()


def dead_letter_record(notification: Notification, destination: Destination, result: DeliveryResult,
                       *, kept: bool = False) -> dict[str, Any]:
    """What an operator needs to replay the delivery by hand; no body (it may hold a routing key).

    `kept`: the delivery stays pending and is tried again (its destination gave up for now);
    otherwise it is dropped for good."""
    inc = notification.incident
    return {
        "kept": kept,
        "delivery_id": notification.delivery_id,
        "incident_id": inc.incident_id,
        "job_id": inc.job_id,
        "revision": inc.revision,
        "transition": notification.transition,
        "destination": destination.key,
        "receiver": destination.receiver.name,
        "kind": destination.receiver.kind,
        "target": destination.receiver.display_target(),
        "reason": result.reason,
        "attempts": [{"status": a.status, "error": a.error, "elapsed_s": round(a.elapsed_s, 3)} for a in result.attempts],
        "elapsed_s": round(result.elapsed_s, 3),
        "incident": inc.to_json_dict(),
    }
