"""Prometheus metrics and health probes for workers and `rootrank ship` (issue 9).

Every metric lives here, so the names stay consistent and the agents instrument themselves with
one-line calls (`metrics.count_signals(signals)`). Names follow Prometheus conventions: a
`rootrank_` prefix, base units (seconds, bytes), counters end in `_total`. Label values are
bounded: rule ids and classes come from the loaded rule set and anything else, as well as any
label beyond `MAX_LABEL_VALUES` distinct values, is folded into "other", so a flood of unknown
reasons or a misbehaving producer cannot blow up the scrape.

Probes (faust web, on the worker that serves HTTP):
  /metrics   Prometheus text format (also at /rootrank/metrics)
  /healthz   200 while the process runs its event loop (liveness)
  /readyz    200 only when every role app in the process is connected to the broker, has
             partitions assigned, is not rebalancing, and the rule set is loaded; else 503 with
             the reasons as JSON (readiness).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from correlator.diagnosis.models import SEVERITIES
from correlator.stream.compat import faust_consumer_connected, faust_read_offset

if TYPE_CHECKING:
    from wsgiref.types import StartResponse
    from wsgiref.types import WSGIApplication as WSGIApp

log = logging.getLogger(__name__)

MAX_LABEL_VALUES = 256
OTHER = "other"


class BoundedLabel:
    """Maps raw label values to a bounded set: known values pass, the first `cap` unknown ones
    pass too (reasons are short slugs in practice), the rest become "other"."""

    def __init__(self, known: Iterable[str] = (), cap: int = MAX_LABEL_VALUES) -> None:
        self.known: set[str] = set(known)
        self.cap = cap
        self.lock = threading.Lock()

    def allow(self, values: Iterable[str]) -> None:
        with self.lock:
            self.known.update(values)

    def __call__(self, value: object) -> str:
        text = str(value) if value not in (None, "") else "unknown"
        if text in self.known:
            return text
        with self.lock:
            if len(self.known) < self.cap and len(text) <= 64:
                self.known.add(text)
                return text
        return OTHER


# Rule ids and classes: seeded from the rule set when a worker loads it (`allow_ruleset`), so an
# operator's alert on `rootrank_signals_total{rule_id="cuda_oom_alloc"}` always finds its series.
RULE_IDS = BoundedLabel(cap=1024)
CLASSES = BoundedLabel(cap=512)
SEVERITY_LABELS = BoundedLabel(set(SEVERITIES), cap=8)
REASONS = BoundedLabel(cap=64)

# --- the worker ----------------------------------------------------------------------------------

LINES_IN = Counter("rootrank_ingest_lines_total", "log lines decoded from the logs topic")
BYTES_IN = Counter("rootrank_ingest_bytes_total", "raw bytes read from the logs topic")
DECODE_FAILURES = Counter("rootrank_decode_failures_total", "raw values that could not be decoded, by reason",
                          ["reason"])
DEAD_LETTERS = Counter("rootrank_dead_letters_total", "records sent to a dead-letter topic, by stage and reason",
                       ["stage", "reason"])
SIGNALS = Counter("rootrank_signals_total", "signals extracted (lines that hit a rule, and facts), by rule",
                  ["rule_id", "class"])
INCIDENTS = Counter("rootrank_incidents_total", "incidents emitted (first revision only), by class and severity",
                    ["class", "severity"])
INCIDENT_REVISIONS = Counter("rootrank_incident_revisions_total", "revised incidents emitted (revision > 1)")
CONSUMER_LAG = Gauge("rootrank_consumer_lag_messages", "messages not yet read, per assigned partition",
                     ["group", "topic", "partition"])
BATCH_SCAN_SECONDS = Histogram(
    "rootrank_batch_scan_seconds", "time to decode and scan one batch of raw values (match agent)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
WEBHOOK_DELIVERIES = Counter("rootrank_webhook_deliveries_total", "webhook notifications, by outcome", ["outcome"])
WEBHOOK_DESTINATIONS = Gauge(
    "rootrank_webhook_destinations",
    "webhook destinations this worker has delivered to or queued for, by state: ok, retrying, dead (its retries "
    "ran out: dead-lettered, its deliveries kept pending and tried again every webhooks.dead_retry_interval_s)",
    ["state"],
)
WEBHOOK_PENDING = Gauge("rootrank_webhook_pending_deliveries", "webhook deliveries waiting in this worker's queues")
ES_BULK_SECONDS = Histogram(
    "rootrank_es_bulk_seconds", "latency of one Elasticsearch bulk request",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
ES_BULK_FAILURES = Counter("rootrank_es_bulk_failures_total",
                           "Elasticsearch bulk failures, by reason (request errors, rejected documents)", ["reason"])
READY = Gauge("rootrank_ready", "1 when the worker's /readyz answers 200")
RULES_LOADED = Gauge("rootrank_rules_loaded", "rules in the loaded rule set")


def allow_ruleset(ruleset: Any) -> None:
    """Seed the bounded rule-id and class labels from a loaded rule set."""
    rules = [getattr(r, "rule", r) for r in (getattr(ruleset, "rules", []) or [])]  # LoadedRule -> Rule
    RULE_IDS.allow(str(rule.id) for rule in rules)
    CLASSES.allow(str(rule.class_) for rule in rules)
    CLASSES.allow(str(c) for c in (getattr(ruleset, "classes", None) or {}))
    RULES_LOADED.set(len(rules))


def count_match_batch(raw_bytes: int, lines: int, seconds: float) -> None:
    BYTES_IN.inc(raw_bytes)
    LINES_IN.inc(lines)
    BATCH_SCAN_SECONDS.observe(seconds)


def count_signals(signals: Iterable[Any]) -> None:
    for signal in signals:
        SIGNALS.labels(RULE_IDS(signal.rule_id), CLASSES(signal.class_)).inc()


def count_dead_letters(stage: str, letters: Iterable[dict[str, Any]]) -> None:
    """Dead letters of `stage`; decode failures of the match stage are also decode failures."""
    for letter in letters:
        reason = REASONS(letter.get("reason"))
        DEAD_LETTERS.labels(stage, reason).inc()
        if stage == "match" and reason != "extract_error":
            DECODE_FAILURES.labels(reason).inc()


def count_incident(incident: Any) -> None:
    """One count per incident: its first revision; later revisions count apart."""
    if getattr(incident, "revision", 1) <= 1:
        INCIDENTS.labels(CLASSES(incident.class_), SEVERITY_LABELS(incident.severity)).inc()
    else:
        INCIDENT_REVISIONS.inc()


def count_webhook(delivered: bool) -> None:
    WEBHOOK_DELIVERIES.labels("delivered" if delivered else "dead_lettered").inc()


def set_webhook_queues(states: dict[str, int], pending: int) -> None:
    """The webhook destinations by state (`DestinationQueues.states()`) and their pending deliveries."""
    for state, count in states.items():
        WEBHOOK_DESTINATIONS.labels(state).set(count)
    WEBHOOK_PENDING.set(pending)


def observe_es_bulk(seconds: float | None = None, *, failure: str | None = None, rejected: int = 0) -> None:
    if seconds is not None:
        ES_BULK_SECONDS.observe(seconds)
    if failure is not None:
        ES_BULK_FAILURES.labels(REASONS(failure)).inc()
    if rejected:
        ES_BULK_FAILURES.labels("rejected").inc(rejected)


def scrape() -> bytes:
    return generate_latest(REGISTRY)


# --- faust: /metrics, /healthz, /readyz, consumer lag ---------------------------------------------


def readiness(apps: Sequence[Any], rules_loaded: Callable[[], bool]) -> tuple[bool, dict[str, Any]]:
    """(ready, details): every app connected, with assigned partitions, not rebalancing; rules loaded."""
    details: dict[str, Any] = {"rules_loaded": bool(rules_loaded()), "apps": {}}
    ready = details["rules_loaded"]
    for app in apps:
        reader = getattr(app, "match_reader", None)
        if reader is not None:  # the match role reads through its own consumer (LogBatchReader)
            state = {"connected": bool(app.producer.started) and reader.connected(),
                     "assigned": len(reader.assigned()), "rebalancing": False}
            ready = ready and state["connected"] and state["assigned"] > 0
        else:
            state = {"connected": _connected(app), "assigned": len(_assigned(app)),
                     "rebalancing": bool(app.rebalancing)}
            if len(app.agents) == 0:
                # A role that runs its own Kafka clients (the es-sink's threads) subscribes nothing through
                # faust: there is nothing faust could assign it, so only liveness applies.
                state["agents"] = 0
            else:
                ready = ready and state["connected"] and state["assigned"] > 0 and not state["rebalancing"]
        details["apps"][str(app.conf.id)] = state
    details["ready"] = bool(ready)
    return bool(ready), details


def _assigned(app: Any) -> set[Any]:
    try:
        return set(app.assignor.assigned_actives())
    except Exception:  # noqa: BLE001 - before the first assignment the assignor has nothing
        return set()


def _connected(app: Any) -> bool:
    """The producer runs and the consumer's client holds a live broker connection."""
    try:
        if not app.producer.started:
            return False
        return faust_consumer_connected(app)
    except Exception:  # noqa: BLE001 - not started yet, or another transport: not connected
        return False


def update_consumer_lag(app: Any) -> None:
    """Lag = highwater - (last read offset + 1), per actively assigned partition of `app`."""
    group = str(app.conf.id)
    reader = getattr(app, "match_reader", None)
    if reader is not None:
        for tp, lag in reader.lag().items():
            CONSUMER_LAG.labels(group, tp.topic, str(tp.partition)).set(lag)
        return
    consumer = app.consumer
    for tp in _assigned(app):
        try:
            highwater = consumer.highwater(tp)
        except Exception:  # noqa: BLE001, S112 - no fetch yet for this partition
            continue
        if highwater is None:
            continue
        read = faust_read_offset(app, tp)
        lag = highwater - (read + 1 if read is not None else 0)
        CONSUMER_LAG.labels(group, tp.topic, str(tp.partition)).set(max(0, lag))


def install_probes(web_app: Any, apps: Sequence[Any], pipeline: Any, *, lag_interval_s: float = 5.0) -> None:
    """/metrics, /healthz and /readyz on `web_app` (the app that serves HTTP), readiness over `apps`,
    and a consumer-lag timer on every app."""

    def rules_loaded() -> bool:
        # Pipeline.ruleset is a cached_property: loaded when a role that needs it was built.
        needs = {"match", "correlate"}
        roles = {str(app.conf.id).rsplit("-", 1)[-1] for app in apps}
        if not roles & needs:
            return True
        ruleset = pipeline.__dict__.get("ruleset")
        if ruleset is not None and not RULE_IDS.known:
            allow_ruleset(ruleset)
        return ruleset is not None and len(getattr(ruleset, "rules", [])) > 0

    if pipeline.__dict__.get("ruleset") is not None:
        allow_ruleset(pipeline.ruleset)

    async def metrics_page(web: Any, request: Any) -> Any:
        return web.bytes(scrape(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    async def healthz(web: Any, request: Any) -> Any:
        return web.json({"alive": True})

    async def readyz(web: Any, request: Any) -> Any:
        ready, details = readiness(apps, rules_loaded)
        READY.set(1 if ready else 0)
        return web.json(details, status=200 if ready else 503)

    # faust's web pages (registered by calling its decorator: faust has no type information, and a function
    # under an untyped decorator would lose its own)
    for path, page in (("/metrics", metrics_page), ("/healthz", healthz), ("/readyz", readyz)):
        web_app.page(path)(page)

    for app in apps:
        def lag_timer(app: Any = app) -> Callable[[], Any]:
            async def consumer_lag() -> None:
                update_consumer_lag(app)

            return consumer_lag

        app.timer(lag_interval_s, name="rootrank_consumer_lag")(lag_timer())


# --- rootrank ship ----------------------------------------------------------------------------------


class ShipStatsCollector(Collector):
    """Reads the shipper's own counters (ingest.ship.runner.ShipStats) at scrape time: no hot-path cost."""

    def __init__(self, stats: Any, line_filter: Any = None) -> None:
        self.stats = stats
        self.line_filter = line_filter

    def collect(self) -> Iterable[Any]:
        s = self.stats
        f = self.line_filter
        read = f.lines_read if f is not None else s.lines
        read_bytes = f.bytes_read if f is not None else None
        yield CounterMetricFamily("rootrank_ship_lines_read", "lines read from the inputs", value=read)
        if read_bytes is not None:
            yield CounterMetricFamily("rootrank_ship_bytes_read", "bytes of lines read from the inputs", value=read_bytes)
        yield CounterMetricFamily("rootrank_ship_lines_sent", "lines put into messages for Kafka", value=s.lines)
        yield CounterMetricFamily("rootrank_ship_messages", "messages made", value=s.messages)
        acked = CounterMetricFamily("rootrank_ship_acked", "acknowledged by Kafka", labels=["unit"])
        acked.add_metric(["messages"], s.acked_messages)
        acked.add_metric(["lines"], s.acked_lines)
        yield acked
        yield CounterMetricFamily("rootrank_ship_spooled_messages", "messages that went through the disk spool",
                                  value=s.spooled_messages)
        yield CounterMetricFamily("rootrank_ship_dropped_lines", "lines dropped because the spool was full",
                                  value=s.dropped_lines)
        if f is not None:
            yield CounterMetricFamily("rootrank_ship_evidence_lines", "lines that hit a rule (evidence-only)",
                                      value=f.lines_matched)
            yield CounterMetricFamily("rootrank_ship_heartbeats", "heartbeat messages (evidence-only)",
                                      value=f.heartbeats)
        yield GaugeMetricFamily("rootrank_ship_pending_messages", "messages still in the spool",
                                value=s.pending_messages)
        yield CounterMetricFamily("rootrank_ship_waited_messages",
                                  "files' messages that waited for room in a full spool (backpressure, not loss)",
                                  value=getattr(s, "waited_messages", 0))
        yield CounterMetricFamily("rootrank_ship_backlog_acked_bytes",
                                  "bytes of the files' starting backlog acknowledged by Kafka",
                                  value=getattr(s, "backlog_acked_bytes", 0))


_HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
_METRICS_PATHS = frozenset({"/metrics", "/rootrank/metrics"})


def metrics_wsgi_app(registry: Collector = REGISTRY) -> WSGIApp:
    """prometheus_client's exposition on /metrics (and /rootrank/metrics, like a worker), a liveness
    answer on /healthz and /readyz, 404 elsewhere."""
    exposition = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in _METRICS_PATHS:
            page: Iterable[bytes] = exposition(environ, start_response)  # prometheus_client has no type for it
            return page
        if path in _HEALTH_PATHS:
            status, ctype, body = "200 OK", "application/json", b'{"alive": true}'
        else:
            status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]

    return app


class _QuietRequestHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


def serve_metrics(port: int, *, host: str = "127.0.0.1", registry: Collector = REGISTRY) -> WSGIServer:
    """`metrics_wsgi_app` on a daemon thread, for processes without faust (`rootrank ship --metrics-port`)."""
    server = make_server(host, port, metrics_wsgi_app(registry), ThreadingWSGIServer, handler_class=_QuietRequestHandler)
    threading.Thread(target=server.serve_forever, name="rootrank-metrics", daemon=True).start()
    return server


def ship_metrics_hook(port: int, host: str = "127.0.0.1") -> Callable[[Any, Any], None]:
    """For ShipOptions.on_start: called in the shipping process with its ShipStats (and line filter)."""

    def start(stats: Any, line_filter: Any) -> None:
        # Its own registry: the shipper has none of the worker's series.
        registry = CollectorRegistry()
        registry.register(ShipStatsCollector(stats, line_filter))
        serve_metrics(port, host=host, registry=registry)
        log.debug("ship metrics on http://%s:%d/metrics", host, port)

    return start

