"""The webhook sink: rootrank.incidents -> one notification per incident transition per destination.

A thin faust shell around the dispatcher (correlator/sinks/webhooks/dispatcher.py) and the
per-destination queues (correlator/sinks/webhooks/queues.py):

- the agent reads the incidents topic with manual acks. For each incident it records, for every
  destination that still has to get this transition, a pending delivery in the table
  `webhook-pending` (changelog-backed, partitioned like the incidents topic: the delivery lives in
  the incident's own partition), queues it on that destination, and acks: faust flushes the
  table's changelog before it commits the offset, so a committed incident always has its
  pending deliveries stored. Nothing waits on a receiver here: a dead receiver delays only its
  own queue (its retries, then every `dead_retry_interval_s`), never another destination's;
- each destination delivers its queue in order, one at a time, with the delivery policy's
  retries; when they run out the delivery is written to the webhooks dead-letter topic (`kept`)
  and stays pending (`rootrank webhooks list` shows the state, last error and next retry; the
  metric `rootrank_webhook_destinations{state="dead"}` counts such destinations);
- a worker stopped or killed re-reads what it did not commit and re-queues what the table holds
  once it is recovered; in a rebalance the deliveries of a revoked partition are dropped (the one
  in flight cancelled) and its new owner queues them from its copy of the table (with no record
  lost to faust's buffer clearing: see
  `correlator.stream.compat.hold_fetched_records_across_rebalance_completion`);
- per-incident progress (which destination has which transition) lives in the table
  `webhook-progress` (changelog-backed, partitioned like the incidents topic), so a replay
  after a restart notifies nobody twice;
- per-job registrations live in the global table `webhook-registrations` (every worker reads
  all of it; written from the HTTP API), so they survive restarts;
- the HTTP API `GET/PUT/DELETE /jobs/{job_id}/webhooks` runs on faust's web server
  (logic in correlator/sinks/webhooks/api.py: bearer token for writes, inputs validated).

Run alone: `python -m correlator.sinks.webhooks.agent [--web-port N]` (config: ROOTRANK_CONFIG
and ROOTRANK_* variables), or install it into another app with `install_webhook_sink`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import Counter
from pydantic import ValidationError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never

from correlator.config import RetryPolicy
from correlator.diagnosis.models import Incident
from correlator.sinks.webhooks.api import MAX_BODY_BYTES, RegistrationAPI
from correlator.sinks.webhooks.delivery import DeliveryResult
from correlator.sinks.webhooks.dispatcher import WebhookDispatcher
from correlator.sinks.webhooks.queues import DestinationQueues
from correlator.sinks.webhooks.receivers import safe_errors
from correlator.sinks.webhooks.registry import EchoSafeStore, Registry
from correlator.stream import metrics
from correlator.stream.compat import (
    faust_committed_offset,
    faust_producer_partitions_for,
    hold_fetched_records_across_rebalance_completion,
)

if TYPE_CHECKING:
    import faust

    from correlator.config import Settings

log = logging.getLogger("rootrank.webhooks.sink")

WEBHOOKS_ROLE = "webhooks"
REGISTRATIONS_TABLE = "webhook-registrations"
PROGRESS_TABLE = "webhook-progress"
PENDING_TABLE = "webhook-pending"
AGENT_NAME = "webhooks"

NOTIFICATIONS = Counter(
    "rootrank_webhook_notifications_total", "webhook notifications by outcome (delivered, dead_lettered)", ["outcome"]
)
SKIPPED = Counter("rootrank_webhook_incidents_skipped_total", "incident messages that notified nobody", ["reason"])

# Unbounded: the incident's offset is acked only once its dead letter is safe.
DEAD_LETTER_BACKOFF = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=30.0).backoff()


class FaustTableStore:
    """A faust table written with the partition named (`PartitionedStore`): the destination queues write
    outside the stream, where faust cannot tell the partition from the current event. The value goes to
    the table's local store and to its changelog partition, as a write inside the stream would."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def get(self, key: str) -> Any:
        return self.table.data.get(key)

    def put(self, key: str, value: Any, partition: int | None) -> None:
        self.table.data[key] = value
        self.table.send_changelog(partition, key, value)

    def delete(self, key: str, partition: int | None) -> None:
        self.table.data.pop(key, None)
        self.table.send_changelog(partition, key, None, value_serializer="raw")

    def items(self) -> list[tuple[str, Any]]:
        return list(self.table.data.items())


def _count(result: DeliveryResult) -> None:
    NOTIFICATIONS.labels("delivered" if result.delivered else "dead_lettered").inc()
    metrics.count_webhook(result.delivered)


@dataclass
class WebhookSink:
    """What `install_webhook_sink` built; tests and the app reach the parts through it."""

    app: faust.App
    dispatcher: WebhookDispatcher
    queues: DestinationQueues
    api: RegistrationAPI
    registrations: Any  # faust GlobalTable
    progress: Any  # faust Table
    pending: Any  # faust Table
    deadletter_topic: Any
    max_replay_age_s: float | None

    async def dead_letter(self, record: dict[str, Any]) -> None:
        """Publish and wait for the broker's ack; a broker outage blocks here (nothing is committed meanwhile)."""
        value = orjson.dumps(record)
        key = str(record.get("incident_id") or "").encode("utf-8") or None

        async def send_and_wait_for_ack() -> None:
            future = await self.deadletter_topic.send(key=key, value=value)
            await future

        def log_failure(state: RetryCallState) -> None:
            assert state.outcome is not None
            log.error("webhook dead letter not written (%s); retrying in %.1fs",
                      state.outcome.exception().__class__.__name__, state.upcoming_sleep)

        await AsyncRetrying(
            # Any producer failure: retry, never drop. A cancellation is no Exception and ends it.
            retry=retry_if_exception_type(Exception),
            wait=DEAD_LETTER_BACKOFF,
            stop=stop_never,
            before_sleep=log_failure,
        )(send_and_wait_for_ack)

    async def process(self, value: bytes | None, broker_timestamp: float | None, partition: int = 0) -> None:
        """One record of the incidents topic: its deliveries recorded and queued; returns when it may be acked
        (without waiting on any receiver)."""
        if value is None:
            SKIPPED.labels("tombstone").inc()
            return
        try:
            incident = Incident.model_validate_json(value)
        except ValidationError as exc:
            SKIPPED.labels("not_an_incident").inc()
            reason = "not an incident: " + "; ".join(safe_errors(exc)[:5])
            log.error("incidents record dead-lettered: %s", reason)
            await self.dead_letter({"reason": reason, "raw_b64": base64.b64encode(value[:65536]).decode("ascii")})
            return
        if (
            self.max_replay_age_s is not None
            and broker_timestamp is not None
            and time.time() - broker_timestamp > self.max_replay_age_s
        ):
            SKIPPED.labels("too_old").inc()
            log.info("incident %s revision %d older than the replay age: not notified", incident.incident_id, incident.revision)
            return
        queued = await self.queues.accept(incident, partition)
        log.info(
            "incident %s of job %s revision %d (%s): %d notification(s) queued",
            incident.incident_id, incident.job_id, incident.revision, incident.status, len(queued),
        )


async def _read_bounded(request: Any, limit: int) -> bytes | None:
    """The request body, or None when it is larger than `limit` (read no further than limit + 1)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(limit + 1 - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None


async def _rewind_partitions_never_committed(app: faust.App, topic: str) -> None:
    """Seek the partitions of `topic` that this group never committed to their first offset.

    Measured with faust-streaming 0.15.3: records fetched while the tables recover are dropped
    (the stream partitions are paused) yet the fetch position has moved past them, and faust's
    seek-to-committed has nothing to seek to when the group never committed. The incidents
    published before this group's first commit were then skipped - a worker killed before it
    acked its first incident lost that incident. This runs after recovery, before the streams
    resume (faust sends on_rebalance_complete right before its own seek).
    """
    consumer = app.consumer
    partitions = sorted(tp for tp in consumer.assignment() if tp.topic == topic)
    if not partitions:
        return
    for tp in partitions:
        committed = await faust_committed_offset(app, tp)
        if committed is None or committed < 0:
            earliest = (await consumer.earliest_offsets(tp))[tp]
            await consumer.seek(tp, earliest)
            log.info("%s[%d]: never committed by this group; reading from offset %d", tp.topic, tp.partition, earliest)


def install_webhook_sink(app: faust.App, settings: Settings, *, web_app: faust.App | None = None) -> WebhookSink:
    """Add the webhook agent, its two tables and its HTTP API to `app` (the API to `web_app` if given)."""
    import faust

    topics = settings.topics
    echo_safe: EchoSafeStore | None = None

    async def _on_registration_event(event: Any) -> None:
        if echo_safe is not None:
            echo_safe.on_changelog(event.key, event.value)

    incidents_topic = app.topic(topics.incidents, internal=False, key_serializer="raw", value_serializer="raw")
    deadletter_topic = app.topic(
        topics.webhooks_deadletter, internal=False, key_serializer="raw", value_serializer="raw"
    )
    registrations = app.GlobalTable(
        REGISTRATIONS_TABLE,
        default=None,
        key_type=str,
        # One partition and the partitioner: written from web requests (outside any stream), and
        # faust's advice for global tables shared by several workers; every worker keeps reading
        # the whole changelog, so a registration made through one worker reaches all of them.
        partitions=1,
        use_partitioner=True,
        recovery_buffer_size=1,
        synchronize_all_active_partitions=True,
        on_changelog_event=_on_registration_event,
    )
    progress = app.Table(
        PROGRESS_TABLE,
        default=None,
        key_type=str,
        # Written with the incident's partition (FaustTableStore): co-partitioned with the incidents topic.
        partitions=topics.partitions,
    )
    pending = app.Table(
        PENDING_TABLE,
        default=None,
        key_type=str,
        # incident_id -> {p, m, incident, dest: {destination key: {m, since}}}, in the incident's partition.
        partitions=topics.partitions,
    )
    echo_safe = EchoSafeStore(registrations)
    registry = Registry(echo_safe)
    webhook_settings = settings.webhooks
    dispatcher = WebhookDispatcher.from_settings(webhook_settings, registry=registry, progress=FaustTableStore(progress))
    queues = DestinationQueues(
        dispatcher,
        FaustTableStore(pending),
        dead_retry_interval_s=webhook_settings.dead_retry_interval_s,
        max_pending=webhook_settings.max_pending_per_destination,
        max_age_s=webhook_settings.max_pending_age_s,
        on_result=_count,
        on_metrics=metrics.set_webhook_queues,
    )
    api = RegistrationAPI(registry, webhook_settings.api_token, status_of=queues.status)
    sink = WebhookSink(
        app=app,
        dispatcher=dispatcher,
        queues=queues,
        api=api,
        registrations=registrations,
        progress=progress,
        pending=pending,
        deadletter_topic=deadletter_topic,
        max_replay_age_s=webhook_settings.max_replay_age_s,
    )
    dispatcher.dead_letter = sink.dead_letter

    if app.conf.stream_wait_empty:
        log.warning(
            "stream_wait_empty is on: a stop or rebalance waits for the stream's buffer; "
            "the webhook sink is idempotent and meant to run with it off",
        )

    def incident_partitions(tps: Any) -> set[int]:
        return {tp.partition for tp in tps if tp.topic == topics.incidents}

    @app.agent(incidents_topic, name=AGENT_NAME)
    async def webhooks(stream: Any) -> None:
        manual = stream.noack()
        try:
            async for event in manual.events():
                message = event.message
                try:
                    await sink.process(event.value, message.timestamp, message.partition)
                except asyncio.CancelledError:
                    raise  # stopping: the incident stays unacked and is read again after the restart
                except Exception:
                    # A bug, not a delivery failure (those are dead-lettered). Stop the worker rather than
                    # skip the incident: it restarts from the last commit, which is before this incident.
                    log.exception("webhook sink failed on an incident; stopping the worker")
                    await app.crash(RuntimeError("webhook sink failed"))
                    raise
                await manual.ack(event)
        finally:
            await sink.queues.close()
            await sink.dispatcher.close()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # mode's receiver type (a generic `signal` keyword) cannot be met; faust calls it (sender, ..., signal=...)
    async def abandon_revoked(sender: Any, revoked: Any, *args: Any, **kwargs: Any) -> None:
        # Delivering for a partition this worker no longer owns would only race its new owner, which
        # queues the partition's pending deliveries from its copy of the table. Wait (briefly) for the
        # cancellation to land, so no attempt starts after the partition moved.
        await sink.queues.drop_partitions(incident_partitions(revoked))

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode's receiver type (a generic `signal` keyword) cannot be met; faust calls it (sender, ..., signal=...)
    async def rewind_never_committed(sender: Any, *args: Any, **kwargs: Any) -> None:
        # Fetched records are held until faust has cleared the buffers (correlator.stream.app, for every
        # role): without that, the moved partition's incidents were wiped from this agent's buffer
        # in a rebalance during a receiver outage, and never delivered.
        await _rewind_partitions_never_committed(app, topics.incidents)
        # The tables are recovered by now: queue the pending deliveries of the partitions this worker owns.
        sink.queues.requeue(incident_partitions(app.consumer.assignment()))

    @app.timer(interval=3600.0)  # type: ignore[untyped-decorator]  # faust's decorators carry no types
    async def close_idle_http() -> None:
        # Keep-alive connections to receivers that were notified once are not kept for days.
        if not sink.queues.delivering:
            await sink.dispatcher.deliverer.close()

    host = web_app or app

    class JobWebhooks(faust.web.View):
        async def get(self, request: Any, job_id: str) -> Any:
            return await self._serve(request, job_id)

        async def put(self, request: Any, job_id: str) -> Any:
            return await self._serve(request, job_id)

        async def delete(self, request: Any, job_id: str) -> Any:
            return await self._serve(request, job_id)

        async def _serve(self, request: Any, job_id: str) -> Any:
            if not app.tables.recovery.completed.is_set():  # type: ignore[attr-defined]  # not in faust's TableManager type
                # Before the registrations table is recovered a GET would answer "none" and a write
                # could not be sent: say so instead.
                return self.json({"error": "starting: tables are being recovered"}, status=503,
                                 headers={"Retry-After": "2"})
            body: bytes | None = None
            if request.method == "PUT":
                declared = request.headers.get("Content-Length")
                if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
                    return self.json({"error": f"body larger than {MAX_BODY_BYTES} bytes"}, status=413)
                body = await _read_bounded(request, MAX_BODY_BYTES)
                if body is None:
                    return self.json({"error": f"body larger than {MAX_BODY_BYTES} bytes"}, status=413)
            writing = request.method in ("PUT", "DELETE")
            if writing:
                await _load_changelog_metadata()
            response = await api.handle(request.method, job_id, request.headers, request.query, body)
            if writing and response.status < 300:
                # The table write is buffered: answer only once the broker has the changelog record,
                # so an acknowledged registration survives a crash right after the answer.
                await app.producer.flush()
            return self.json(response.body, status=response.status, headers=response.headers or None)

    async def _load_changelog_metadata() -> None:
        # The table picks the changelog partition synchronously from the producer's metadata,
        # which holds only topics it has sent to: fetch it first.
        await faust_producer_partitions_for(app, registrations.changelog_topic.get_topic_name())

    host.page("/jobs/{job_id}/webhooks")(JobWebhooks)

    @app.task  # type: ignore[untyped-decorator]  # faust's decorators carry no types
    async def announce() -> None:
        routes = len(sink.dispatcher.routes.routes)
        receivers = ", ".join(f"{r.name}={r.display_target()}" for r in sink.dispatcher.routes.receivers.values())
        log.info("webhook sink: %d routes, receivers: %s", routes, receivers or "none")

    _ = (webhooks, close_idle_http, announce)
    return sink


def build_webhooks_app(settings: Settings, *, web_port: int | None, **overrides: Any) -> faust.App:
    """The webhook sink as its own faust app and consumer group (`<app_id>-webhooks`)."""
    import faust

    from correlator.stream.app import faust_settings
    from correlator.stream.topics import group_id

    conf = faust_settings(settings, WEBHOOKS_ROLE, web_port=web_port)
    # Stop and rebalance without waiting for the stream's buffer: an unacked incident is re-read after
    # the restart or by the partition's new owner, and re-queuing it is harmless (pending and progress
    # tables; the same delivery id).
    conf["stream_wait_empty"] = False
    conf.update(overrides)
    Path(conf["datadir"]).parent.mkdir(parents=True, exist_ok=True)  # faust creates only the last level
    app = faust.App(group_id(settings, WEBHOOKS_ROLE), **conf)
    hold_fetched_records_across_rebalance_completion(app)
    install_webhook_sink(app, settings)
    return app


def main(argv: list[str] | None = None) -> int:
    import faust

    from correlator.config import load_settings

    parser = argparse.ArgumentParser(prog="python -m correlator.sinks.webhooks.agent")
    parser.add_argument("--config", help="YAML config (default: ROOTRANK_CONFIG)")
    parser.add_argument("--web-port", type=int, help="HTTP API port (default: the config's web_port)")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    settings = load_settings(args.config)
    app = build_webhooks_app(settings, web_port=args.web_port or settings.web_port)
    try:
        asyncio.get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())
    worker = faust.Worker(app, loglevel=args.loglevel, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1


if __name__ == "__main__":
    sys.exit(main())
