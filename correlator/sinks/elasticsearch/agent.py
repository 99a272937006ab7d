"""The Elasticsearch sink worker: rootrank.incidents (and rootrank.signals) -> Elasticsearch.

Why a kafka-python consumer with manual commits and not a faust agent: the guarantee we need is
"an offset is committed only after Elasticsearch acknowledged the document it carries". With faust
an event is acked when the agent iterates past it and a background task commits acked offsets on a
timer, so "commit after ack" depends on how the agent iterates and on faust internals. Here it is
one straight line per batch, in `SinkLoop.process_batch`:

    records = consumer.poll()             # nothing committed yet
    docs    = convert(records)            # undecodable records -> dead-letter list
    writer.write(docs)                    # blocks, retrying with backoff, until every doc is acked
    dead_letter.send_all(...)             # blocks until the broker acked each dead letter
    consumer.commit(offsets after batch)  # the only commit call in this module

so an Elasticsearch outage stops the loop inside `writer.write`; the consumer keeps its group
membership by polling with its partitions paused (nothing is fetched into memory), Kafka keeps the
backlog, and a crash or stop at any point re-delivers from the last commit. Re-delivery is harmless:
`_id` is the incident id (signals: a hash of the line's identity), and incident revisions are
written with external versioning, so the index ends with one document per incident, the newest
revision.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_never

from correlator.config import RetryPolicy
from correlator.diagnosis.models import Incident, Signal
from correlator.sinks.elasticsearch.client import make_client
from correlator.sinks.elasticsearch.documents import incident_to_doc, signal_doc_id, signal_to_doc
from correlator.sinks.elasticsearch.indices import (
    bootstrap_write_index,
    incidents_names,
    index_templates,
    rollover_conditions,
    rollover_if_needed,
    signals_names,
)
from correlator.sinks.elasticsearch.writer import BulkOutcome, BulkWriter, IndexRequest, SinkStopped

if TYPE_CHECKING:
    import faust
    from elasticsearch import Elasticsearch
    from kafka import KafkaConsumer, KafkaProducer

    from correlator.config import Settings

log = logging.getLogger(__name__)

ES_SINK_ROLE = "es-sink"

# Unbounded like the bulk writer's: a record's offset is committed only once its dead letter is safe.
DEAD_LETTER_BACKOFF = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=30.0).backoff()


class PoisonRecord(Exception):
    """A record the sink can never index (not JSON, not an incident): it goes to the dead-letter topic."""


# --- record -> documents ----------------------------------------------------------------------------


def incident_requests(value: bytes | None, alias: str) -> list[IndexRequest]:
    if value is None:
        return []  # a tombstone on the compacted topic: nothing to index
    try:
        incident = Incident.model_validate_json(value)
    except ValidationError as exc:
        raise PoisonRecord(f"not an incident: {_short(exc)}") from exc
    try:
        doc = incident_to_doc(incident)
    except Exception as exc:
        raise PoisonRecord(f"incident_to_doc failed: {type(exc).__name__}: {exc}") from exc
    return [IndexRequest(alias, incident.incident_id, doc, version=incident.revision)]


def signal_requests(value: bytes | None, alias: str, *, matches_only: bool = True) -> list[IndexRequest]:
    """A signals record holds one Signal, or a JSON list of them."""
    if value is None:
        return []
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise PoisonRecord(f"not JSON: {exc}") from exc
    items = data if isinstance(data, list) else [data]
    out = []
    for item in items:
        try:
            signal = Signal.model_validate(item)
        except ValidationError as exc:
            raise PoisonRecord(f"not a signal: {_short(exc)}") from exc
        # Facts (progress, heartbeats) are engine input, not drill-down material.
        if matches_only and signal.kind != "match":
            continue
        out.append(IndexRequest(alias, signal_doc_id(signal), signal_to_doc(signal)))
    return out


def _short(exc: Exception, limit: int = 300) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


# --- dead letters -------------------------------------------------------------------------------------


class DeadLetters:
    """Sends records the sink cannot index to the dead-letter topic, and waits for the broker's ack
    (the offset of a dead-lettered record is committed only once the dead letter is safe)."""

    def __init__(self, producer: KafkaProducer | None, topic: str, stop: threading.Event) -> None:
        self.producer = producer
        self.topic = topic
        self.stop = stop

    @staticmethod
    def envelope(record: Any, reason: str) -> bytes:
        value: bytes | None = record.value
        payload = {
            "stage": ES_SINK_ROLE,
            "reason": reason,
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp_ms": record.timestamp,
            "key_b64": base64.b64encode(record.key).decode() if record.key is not None else None,
            "value_b64": base64.b64encode(value).decode() if value is not None else None,
        }
        return orjson.dumps(payload)

    def send_all(self, letters: Sequence[tuple[Any, str]]) -> None:
        if not letters:
            return
        if self.producer is None:
            for record, reason in letters:
                log.error("dead letter (no producer) %s[%s]@%s: %s", record.topic, record.partition, record.offset, reason)
            return
        from kafka.errors import KafkaError

        producer = self.producer

        def send_and_wait_for_acks() -> None:
            futures = [
                producer.send(self.topic, key=record.key, value=self.envelope(record, reason),
                              headers=[("rootrank-reason", reason[:512].encode())])
                for record, reason in letters
            ]
            for future in futures:
                future.get(timeout=30)

        def sleep_unless_stopped(seconds: float) -> None:
            if self.stop.wait(seconds):
                raise SinkStopped("stopped while dead letters were unacknowledged")

        def log_failure(state: RetryCallState) -> None:
            assert state.outcome is not None
            log.warning("dead-letter send failed (attempt %d): %s", state.attempt_number, state.outcome.exception())

        Retrying(
            retry=retry_if_exception_type(KafkaError),
            wait=DEAD_LETTER_BACKOFF,
            stop=stop_never,
            sleep=sleep_unless_stopped,
            before_sleep=log_failure,
        )(send_and_wait_for_acks)


# --- the loop -----------------------------------------------------------------------------------------


@dataclass
class LoopStats:
    dead_lettered: int = 0


class SinkLoop:
    """Consumes one topic and writes what it reads to Elasticsearch; commits only what was acknowledged."""

    def __init__(
        self,
        name: str,
        consumer: KafkaConsumer,
        client: Elasticsearch,
        convert: Callable[[bytes | None], list[IndexRequest]],
        dead_letters: DeadLetters,
        stop: threading.Event,
        *,
        batch_size: int = 500,
        poll_timeout_s: float = 1.0,
        bootstrap: Callable[[str], None] | None = None,
        refresh: bool | str = False,
        housekeeping: Callable[[], None] | None = None,
        housekeeping_every_s: float = 300.0,
    ) -> None:
        self.name = name
        self.consumer = consumer
        self.convert = convert
        self.dead_letters = dead_letters
        self.stop = stop
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.writer = BulkWriter(client, stop=stop, wait=self._wait_in_group, bootstrap=bootstrap, refresh=refresh)
        self.stats = LoopStats()
        self._housekeeping = housekeeping
        self._housekeeping_every_s = housekeeping_every_s
        self._next_housekeeping = time.monotonic() + housekeeping_every_s

    def _wait_in_group(self, seconds: float) -> None:
        """Wait while Elasticsearch is down without leaving the consumer group: poll with every
        partition paused, which heartbeats and takes part in rebalances but fetches nothing."""
        assigned = self.consumer.assignment()
        if assigned:
            self.consumer.pause(*assigned)
        got = self.consumer.poll(timeout_ms=int(max(0.05, min(seconds, 1.0)) * 1000))
        # A rebalance during this poll may assign a partition that is not paused yet: put back what
        # it returned, so those records are read again once the write went through.
        for tp, recs in got.items():
            if recs:
                self.consumer.seek(tp, recs[0].offset)
                self.consumer.pause(tp)

    def _resume(self) -> None:
        paused = self.consumer.paused()
        if paused:
            self.consumer.resume(*paused)

    def run(self) -> None:
        log.info("%s: started", self.name)
        while not self.stop.is_set():
            try:
                batch = self.consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000), max_records=self.batch_size)
            except Exception:  # a broker hiccup: the client reconnects on the next poll
                log.exception("%s: poll failed", self.name)
                self.stop.wait(1.0)
                continue
            records = [r for recs in batch.values() for r in recs]
            if records:
                try:
                    self.process_batch(records)
                except SinkStopped:
                    break
                except Exception:
                    # A bug or an unexpected failure: nothing of this batch was committed. Rewind to
                    # its first records and try again after a pause; never crash, never skip.
                    log.exception("%s: batch failed; it will be re-read", self.name)
                    self._rewind(records)
                    self.stop.wait(2.0)
            self._maybe_housekeeping()
        log.info("%s: stopped", self.name)

    def _rewind(self, records: Sequence[Any]) -> None:
        from kafka import TopicPartition

        first: dict[TopicPartition, int] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            first[tp] = min(first.get(tp, r.offset), r.offset)
        assigned = self.consumer.assignment()
        for tp, offset in first.items():
            if tp in assigned:
                try:
                    self.consumer.seek(tp, offset)
                except Exception:
                    log.exception("%s: could not rewind %s to %d", self.name, tp, offset)
        self._resume()

    def process_batch(self, records: Sequence[Any]) -> BulkOutcome:
        from kafka import TopicPartition
        from kafka.errors import CommitFailedError, KafkaError
        from kafka.structs import OffsetAndMetadata

        requests: list[IndexRequest] = []
        letters: list[tuple[Any, str]] = []
        for record in records:
            try:
                requests.extend(IndexRequest(req.alias, req.doc_id, req.source, req.version, ref=record)
                                for req in self.convert(record.value))
            except PoisonRecord as exc:
                letters.append((record, str(exc)))
        outcome = self.writer.write(requests)  # returns only once every document is acknowledged
        self._resume()
        letters.extend((req.ref, reason) for req, reason in outcome.rejected)
        self.dead_letters.send_all(letters)
        self.stats.dead_lettered += len(letters)

        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            nxt = r.offset + 1
            if tp not in offsets or offsets[tp].offset < nxt:
                offsets[tp] = OffsetAndMetadata(nxt, "", -1)
        try:
            self.consumer.commit(offsets=offsets)
        except (CommitFailedError, KafkaError) as exc:
            # The group rebalanced while we waited: these partitions may belong to another worker now,
            # which re-reads them from the last commit. The documents are written idempotently.
            log.warning("%s: commit failed after a successful write (%s); the batch will be re-delivered", self.name, exc)
        return outcome

    def _maybe_housekeeping(self) -> None:
        if self._housekeeping is None or time.monotonic() < self._next_housekeeping:
            return
        self._next_housekeeping = time.monotonic() + self._housekeeping_every_s
        try:
            self._housekeeping()
        except Exception as exc:  # rollover is best effort; the next check tries again
            log.warning("%s: housekeeping failed: %s", self.name, exc, exc_info=True)


# --- wiring -------------------------------------------------------------------------------------------


def incidents_group(settings: Settings) -> str:
    """The sink's consumer groups are its own (not the faust app's `<app_id>-es-sink`): the faust app
    of the role runs no agent, and sharing a group id between two kinds of clients invites trouble."""
    from correlator.stream.topics import group_id

    return f"{group_id(settings, ES_SINK_ROLE)}-incidents"


def signals_group(settings: Settings) -> str:
    from correlator.stream.topics import group_id

    return f"{group_id(settings, ES_SINK_ROLE)}-signals"


def _consumer(settings: Settings, topic: str, group: str, batch_size: int) -> KafkaConsumer:
    from kafka import KafkaConsumer

    from correlator.stream.setup_topics import kafka_python_config

    return KafkaConsumer(
        topic,
        group_id=group,
        client_id=f"{group}-{threading.get_ident()}",
        enable_auto_commit=False,  # the loop commits, after Elasticsearch acknowledged
        auto_offset_reset="earliest",  # a new sink indexes every incident the (compacted) topic holds
        max_poll_records=batch_size,
        session_timeout_ms=int(settings.kafka.session_timeout_s * 1000),
        heartbeat_interval_ms=max(1000, int(settings.kafka.session_timeout_s * 1000) // 3),
        **kafka_python_config(settings.kafka),
    )


def _producer(settings: Settings) -> KafkaProducer:
    from kafka import KafkaProducer

    from correlator.stream.setup_topics import kafka_python_config

    return KafkaProducer(acks="all", retries=5, max_request_size=settings.kafka.max_request_bytes,
                         **kafka_python_config(settings.kafka))


def make_bootstrap(client: Elasticsearch, settings: Settings) -> Callable[[str], None]:
    """Re-creates a template and write alias that vanished (a cluster wiped while the sink ran)."""
    prefix = settings.elasticsearch.index_prefix
    by_alias = {incidents_names(prefix).alias: incidents_names(prefix), signals_names(prefix).alias: signals_names(prefix)}
    templates = index_templates(prefix)

    def bootstrap(alias: str) -> None:
        names = by_alias.get(alias)
        if names is None:
            return
        client.indices.put_index_template(name=names.template, **templates[names.template])
        bootstrap_write_index(client, names)

    return bootstrap


def build_loops(
    settings: Settings,
    stop: threading.Event,
    *,
    client: Elasticsearch | None = None,
    refresh: bool | str = False,
    poll_timeout_s: float = 1.0,
) -> list[SinkLoop]:
    es_settings = settings.elasticsearch
    es = client or make_client(es_settings)
    prefix = es_settings.index_prefix
    bootstrap = make_bootstrap(es, settings)
    batch = es_settings.bulk_max_docs
    conditions = rollover_conditions(es_settings)
    dead = DeadLetters(_producer(settings), settings.topics.deadletter, stop)

    def rollover(alias: str) -> Callable[[], None] | None:
        if not es_settings.manage_rollover or not conditions:
            return None

        def check() -> None:
            new = rollover_if_needed(es, alias, conditions)
            if new:
                log.info("rolled %s over to %s", alias, new)

        return check

    def loop(name: str, topic: str, group: str, to_requests: Any, alias: str) -> SinkLoop:
        return SinkLoop(
            name,
            _consumer(settings, topic, group, batch),
            es,
            lambda value: to_requests(value, alias),
            dead,
            stop,
            batch_size=batch,
            poll_timeout_s=poll_timeout_s,
            bootstrap=bootstrap,
            refresh=refresh,
            housekeeping=rollover(alias),
            housekeeping_every_s=es_settings.rollover_check_s,
        )

    loops = [loop("es-sink incidents", settings.topics.incidents, incidents_group(settings), incident_requests,
                  incidents_names(prefix).alias)]
    if es_settings.index_signals:
        loops.append(loop("es-sink signals", settings.topics.signals, signals_group(settings), signal_requests,
                          signals_names(prefix).alias))
    return loops


def install_es_sink(app: faust.App, settings: Settings) -> None:
    """`rootrank worker --role es-sink`: run the sink loops in threads next to the role's faust app,
    started with it and stopped with it (SIGTERM stops the loops between batches; an unacknowledged
    batch is simply not committed). A loop thread that dies makes the worker exit non-zero, so the
    supervisor restarts it from the last commit."""
    import asyncio

    import mode

    stop = threading.Event()

    class ElasticsearchSink(mode.Service):
        loops: list[SinkLoop]
        threads: list[threading.Thread]

        async def on_start(self) -> None:
            self.loops = await asyncio.get_running_loop().run_in_executor(None, build_loops, settings, stop)
            self.threads = [threading.Thread(target=loop.run, name=loop.name, daemon=True) for loop in self.loops]
            for t in self.threads:
                t.start()
            log.info("es-sink: writing %s to %s", ", ".join(loop.name for loop in self.loops),
                     settings.elasticsearch.url)

        @mode.Service.timer(5.0)
        async def _watch(self) -> None:
            dead = [t.name for t in getattr(self, "threads", []) if not t.is_alive()]
            if dead and not stop.is_set():
                log.error("es-sink: %s stopped unexpectedly", ", ".join(dead))
                await app.crash(RuntimeError(f"es-sink thread died: {dead}"))

        async def on_stop(self) -> None:
            stop.set()
            await asyncio.get_running_loop().run_in_executor(None, self._close)

        def _close(self) -> None:
            for t in getattr(self, "threads", []):
                t.join(timeout=30)
            for loop in getattr(self, "loops", []):
                try:
                    loop.consumer.close(autocommit=False)
                except Exception:
                    log.debug("consumer close failed", exc_info=True)
            loops = getattr(self, "loops", [])
            if loops and loops[0].dead_letters.producer is not None:
                loops[0].dead_letters.producer.close(timeout=5)

    # The role's faust app runs no agent and reads no topic (the loops have their own consumers);
    # a faust consumer with nothing to subscribe to crashes, so the app starts its producer only.
    app.producer_only = True
    app.service(ElasticsearchSink)
