"""The webhook sink: rootrank.incidents -> one notification per incident transition per destination.

A thin faust shell around `WebhookDispatcher.handle` (correlator/webhooks/dispatcher.py):

- the agent reads the incidents topic with manual acks: an incident is acked only after every
  destination has it delivered or dead-lettered (dead letters awaited until the broker acked
  them), so faust commits no offset past an incident still being retried. A receiver that is
  down stalls this sink (Kafka keeps the backlog, not memory); a worker stopped or killed
  mid-retry re-reads the incident from the last commit and delivers it then; in a rebalance
  the delivery in flight for a revoked partition is cancelled, unacked, and the partition's
  owner re-reads it from the last commit (with no record lost to faust's buffer clearing:
  see `correlator.stream.compat.hold_fetched_records_across_rebalance_completion`);
- per-incident progress (which destination has which transition) lives in the table
  `webhook-progress` (changelog-backed, partitioned like the incidents topic), so a replay
  after a restart notifies nobody twice;
- per-job registrations live in the global table `webhook-registrations` (every worker reads
  all of it; written from the HTTP API), so they survive restarts;
- the HTTP API `GET/PUT/DELETE /jobs/{job_id}/webhooks` runs on faust's web server
  (logic in correlator/webhooks/api.py: bearer token for writes, inputs validated).

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
from correlator.sinks.webhooks.dispatcher import WebhookDispatcher
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
AGENT_NAME = "webhooks"

NOTIFICATIONS = Counter(
    "rootrank_webhook_notifications_total", "webhook notifications by outcome (delivered, dead_lettered)", ["outcome"]
)
SKIPPED = Counter("rootrank_webhook_incidents_skipped_total", "incident messages that notified nobody", ["reason"])

# Unbounded: the incident's offset is acked only once its dead letter is safe.
DEAD_LETTER_BACKOFF = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=30.0).backoff()


@dataclass
class WebhookSink:
    """What `install_webhook_sink` built; tests and the app reach the parts through it."""

    app: faust.App
    dispatcher: WebhookDispatcher
    api: RegistrationAPI
    registrations: Any  # faust GlobalTable
    progress: Any  # faust Table
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

    async def process(self, value: bytes | None, broker_timestamp: float | None) -> None:
        """One record of the incidents topic, start to end; returns when it may be acked."""
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
        results = await self.dispatcher.handle(incident)
        for result in results:
            NOTIFICATIONS.labels("delivered" if result.delivered else "dead_lettered").inc()
            metrics.count_webhook(result.delivered)
        log.info(
            "incident %s of job %s revision %d (%s): %d notification(s)",
            incident.incident_id, incident.job_id, incident.revision, incident.status, len(results),
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
        # Written while processing an incident: the changelog partition is that incident's partition.
        partitions=topics.partitions,
    )
    echo_safe = EchoSafeStore(registrations)
    registry = Registry(echo_safe)
    api = RegistrationAPI(registry, settings.webhooks.api_token)
    sink = WebhookSink(
        app=app,
        dispatcher=WebhookDispatcher.from_settings(settings.webhooks, registry=registry, progress=progress),
        api=api,
        registrations=registrations,
        progress=progress,
        deadletter_topic=deadletter_topic,
        max_replay_age_s=settings.webhooks.max_replay_age_s,
    )
    sink.dispatcher.dead_letter = sink.dead_letter

    if app.conf.stream_wait_empty:
        log.warning(
            "stream_wait_empty is on: a stop or rebalance waits for webhook retries to end (up to %.0fs); "
            "the webhook sink is idempotent and meant to run with it off",
            settings.webhooks.delivery.budget_s,
        )
    in_flight: dict[str, Any] = {}  # "tp" and "task" of the incident being delivered

    @app.agent(incidents_topic, name=AGENT_NAME)
    async def webhooks(stream: Any) -> None:
        manual = stream.noack()
        try:
            async for event in manual.events():
                task = asyncio.ensure_future(sink.process(event.value, event.message.timestamp))
                in_flight.update(tp=event.message.tp, task=task)
                try:
                    await task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # stopping: the incident stays unacked and is re-read after the restart
                    # Its partition was revoked: the new owner re-reads it from the last commit.
                    log.info("incident delivery stopped: partition %s moved to another worker", event.message.tp)
                    continue
                except Exception:
                    # A bug, not a delivery failure (those are dead-lettered). Stop the worker rather than
                    # skip the incident: it restarts from the last commit, which is before this incident.
                    log.exception("webhook sink failed on an incident; stopping the worker")
                    await app.crash(RuntimeError("webhook sink failed"))
                    raise
                finally:
                    in_flight.clear()
                await manual.ack(event)
        finally:
            await sink.dispatcher.close()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # mode's receiver type (a generic `signal` keyword) cannot be met; faust calls it (sender, ..., signal=...)
    async def abandon_revoked(sender: Any, revoked: Any, *args: Any, **kwargs: Any) -> None:
        # Retrying for a partition this worker no longer owns would only race its new owner. Wait
        # (briefly) for the cancellation to land, so no attempt starts after the partition moved.
        task = in_flight.get("task")
        if task is not None and in_flight.get("tp") in revoked and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=5.0)

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode's receiver type (a generic `signal` keyword) cannot be met; faust calls it (sender, ..., signal=...)
    async def rewind_never_committed(sender: Any, *args: Any, **kwargs: Any) -> None:
        # Fetched records are held until faust has cleared the buffers (correlator.stream.app, for every
        # role): without that, the moved partition's incidents were wiped from this agent's buffer
        # in a rebalance during a receiver outage, and never delivered.
        await _rewind_partitions_never_committed(app, topics.incidents)

    @app.timer(interval=3600.0)  # type: ignore[untyped-decorator]  # faust's decorators carry no types
    async def close_idle_http() -> None:
        # Keep-alive connections to receivers that were notified once are not kept for days.
        if not in_flight:
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
    # Stop and rebalance without waiting for an incident's retries (minutes when a receiver is
    # down): the unacked incident is re-read after the restart or by the partition's new owner,
    # and re-delivering it is harmless (same delivery id; progress table).
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
