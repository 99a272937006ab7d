"""The faust apps of the streaming pipeline, one per role.

Each role is its own faust app and consumer group (`<app_id>-match`, `<app_id>-correlate`), so a
role scales with its own topic's partitions and rebalances on its own. `rootrank worker --role all`
runs both apps in one process.

Broker quirks are handled only through configuration (see KafkaSettings): production code speaks
plain Kafka. Processing is at-least-once (no idempotent producer, no transactions); duplicates are
made harmless downstream by deterministic ids and by the correlator's replay filter.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import faust
from faust.app import BootStrategy

from correlator.config import Settings
from correlator.stream.agents.correlate import JobCorrelator, make_close_timer, make_correlate_agent
from correlator.stream.agents.match import MatchProcessor
from correlator.stream.agents.match_batches import LogBatchReader
from correlator.stream.compat import hold_fetched_records_across_rebalance_completion, use_fetch_max_wait
from correlator.stream.topics import CORRELATE_ROLE, JOBS_TABLE, MATCH_ROLE, ROLES, group_id

log = logging.getLogger(__name__)


RoleBuilder = Callable[["faust.App", Settings, "Pipeline"], None]
PluginBuilder = Callable[["faust.App", Settings], object]

# Roles that live in other modules, imported only when a worker runs them:
# role -> "module:function", where function(app, settings) installs the role's agents, tables and
# timers on the role's own app (consumer group `<app_id>-<role>`). A module that is not importable
# is skipped, and its role is not part of `all`.
ROLE_MODULES: dict[str, str] = {
    "webhooks": "correlator.sinks.webhooks.agent:install_webhook_sink",
    "es-sink": "correlator.sinks.elasticsearch.agent:install_es_sink",
}


def _plugin_builder(role: str) -> RoleBuilder | None:
    target = ROLE_MODULES.get(role)
    if target is None:
        return None
    module_name, _, func_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        log.debug("role %s: module %s not available", role, module_name)
        return None
    install: PluginBuilder = getattr(module, func_name)

    def builder(app: faust.App, settings: Settings, pipeline: Pipeline) -> None:
        install(app, settings)

    return builder


def available_roles() -> list[str]:
    """Pipeline order: the core roles first, then the plugin roles whose module is installed."""
    return [*ROLES, *(r for r in ROLE_MODULES if r not in ROLES and _plugin_builder(r) is not None)]


def parse_roles(text: str) -> list[str]:
    """`all`, one role, or a comma-separated list; in pipeline order."""
    known = available_roles()
    wanted = {part.strip() for part in text.split(",") if part.strip()}
    if not wanted or "all" in wanted:
        return known
    unknown = wanted - set(known)
    if unknown:
        raise ValueError(f"unknown role(s) {', '.join(sorted(unknown))}; choose from all, {', '.join(known)}")
    return [role for role in known if role in wanted]


def _broker_urls(settings: Settings) -> list[str]:
    return [f"kafka://{host.strip()}" for host in settings.kafka.bootstrap_servers.split(",") if host.strip()]


def _credentials(settings: Settings) -> Any:
    kafka = settings.kafka
    ssl_context = None
    if kafka.security_protocol.upper() in ("SSL", "SASL_SSL"):
        import ssl

        ssl_context = ssl.create_default_context(cafile=kafka.ssl_cafile)
    if kafka.sasl_mechanism:
        from faust.auth import SASLCredentials

        return SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password,
            mechanism=kafka.sasl_mechanism,
            ssl_context=ssl_context,
        )
    if ssl_context is not None:
        from faust.auth import SSLCredentials

        return SSLCredentials(ssl_context)
    return None


class ConsumerlessBoot(BootStrategy):
    """The match role's app starts no faust consumer: LogBatchReader owns the role's consumer."""

    enable_kafka_consumer = False


class MatchApp(faust.App):
    BootStrategy = ConsumerlessBoot


def faust_settings(settings: Settings, role: str, *, web_port: int | None) -> dict[str, Any]:
    kafka = settings.kafka
    conf: dict[str, Any] = {
        "broker": _broker_urls(settings),
        "store": "memory://",
        "processing_guarantee": "at_least_once",
        "autodiscover": False,
        # No leader-election topic: nothing here runs only on the leader.
        "topic_disable_leader": True,
        "topic_partitions": settings.topics.partitions,
        "topic_replication_factor": settings.topics.replication_factor,
        "consumer_auto_offset_reset": "earliest",
        "broker_session_timeout": kafka.session_timeout_s,
        "broker_heartbeat_interval": max(0.5, min(3.0, kafka.session_timeout_s / 6)),
        "broker_rebalance_timeout": max(kafka.session_timeout_s * 2, 20.0),
        "consumer_max_fetch_size": kafka.consumer_max_fetch_bytes,
        "producer_acks": -1,
        "producer_max_batch_size": kafka.producer_max_batch_size,
        "producer_linger": kafka.producer_linger_ms / 1000.0,
        "producer_max_request_size": kafka.max_request_bytes,
        "datadir": str(Path(settings.data_dir) / "faust" / role),
        "web_enabled": web_port is not None,
        "web_port": web_port or settings.web_port,
        "web_bind": settings.web_bind,
        "web_host": "127.0.0.1",
        "worker_redirect_stdouts": False,
    }
    if role == "webhooks":
        # Stop and rebalance without waiting out an incident's delivery retries (minutes while a
        # receiver is down): the unacked incident is re-read by the next owner and re-delivering it is
        # harmless (same delivery id, progress table).
        conf["stream_wait_empty"] = False
    credentials = _credentials(settings)
    if credentials is not None:
        conf["broker_credentials"] = credentials
    return conf


@dataclass
class Pipeline:
    """What the agents need, built once per process and only when a role asks for it
    (the hyperscan database is compiled once, and only by a worker that matches)."""

    settings: Settings

    @cached_property
    def ruleset(self) -> Any:
        from correlator.diagnosis.rules import load_ruleset

        rules_dir = self.settings.engine.rules_dir
        return load_ruleset(Path(rules_dir) if rules_dir else None)

    @cached_property
    def matcher(self) -> Any:
        from correlator.diagnosis.matcher import Matcher

        return Matcher(self.ruleset)

    @cached_property
    def extractor(self) -> Any:
        from correlator.diagnosis.signals import SignalExtractor

        return SignalExtractor(self.ruleset, self.matcher)

    @cached_property
    def engine(self) -> Any:
        from correlator.diagnosis.engine import Engine

        return Engine(self.ruleset)


def _build_match(app: faust.App, settings: Settings, pipeline: Pipeline) -> None:
    engine = settings.engine
    processor = MatchProcessor(
        pipeline.extractor,
        max_value_bytes=engine.max_value_bytes,
        invalid_utf8=engine.invalid_utf8,
        job_path_regex=engine.job_path_regex,
        # base64 grows by 4/3; leave room for the rest of the record.
        deadletter_max_raw_bytes=max(1024, settings.kafka.max_request_bytes * 3 // 4 - 65536),
    )
    _install_rules_reload(app, settings, pipeline, lambda live: setattr(processor, "extractor", live.extractor))
    reader = LogBatchReader(app, settings, processor, group=group_id(settings, MATCH_ROLE),
                            max_records=engine.match_max_records, beacon=app.beacon)
    app.match_reader = reader  # type: ignore[attr-defined]  # the metrics page and /readyz ask it

    @app.task  # type: ignore[untyped-decorator]  # faust's decorators carry no types
    async def start_match_reader() -> None:
        await app.add_runtime_dependency(reader)


def _build_correlate(app: faust.App, settings: Settings, pipeline: Pipeline) -> None:
    topics, engine = settings.topics, settings.engine
    raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
    signals = app.topic(topics.signals, internal=False, **raw)
    table = app.Table(
        JOBS_TABLE,
        default=None,
        partitions=topics.partitions,
        # Raw key bytes = the signals topic's key bytes, so the key-derived changelog partition is
        # the job's signals partition; values are JSON dicts (kept as dicts in memory).
        key_type=bytes,
        # The changelog partition follows the key rather than the event being processed, because
        # one batch mixes partitions.
        use_partitioner=True,
    )
    correlator = JobCorrelator(pipeline.engine, quiet_window_s=engine.quiet_window_s)
    _install_rules_reload(app, settings, pipeline, lambda live: setattr(correlator, "engine", live.engine))
    make_correlate_agent(
        app,
        signals,
        app.topic(topics.incidents, internal=False, **raw),
        table,
        correlator,
        batch_size=engine.batch_size,
        batch_within_s=engine.batch_within_s,
    )
    make_close_timer(
        app,
        lambda: list(table.data.items()),
        signals,
        quiet_window_s=engine.quiet_window_s,
        interval_s=engine.tick_interval_s,
        signals_topic=topics.signals,
    )


def _install_rules_reload(app: faust.App, settings: Settings, pipeline: Pipeline, repoint: Any) -> None:
    """Hot reload of the rules (correlator/rules_reload.py): `repoint(live_rules)` re-points this
    role's agent at a new rule set; one reloader (file poll + SIGHUP) per process."""
    from correlator.stream.rules_reload import pipeline_reloader

    reloader = pipeline_reloader(pipeline)
    reloader.subscribe(repoint)
    reloader.install(app, settings.engine.rules_reload_s)


_CORE_BUILDERS: dict[str, RoleBuilder] = {MATCH_ROLE: _build_match, CORRELATE_ROLE: _build_correlate}


def build_app(settings: Settings, role: str, *, pipeline: Pipeline | None = None,
              web_port: int | None = None, **overrides: Any) -> faust.App:
    """One role's faust app (its own consumer group) with the role's agents, tables and timers."""
    builder = _CORE_BUILDERS.get(role) or _plugin_builder(role)
    if builder is None:
        raise ValueError(f"unknown role {role!r}")
    conf = faust_settings(settings, role, web_port=web_port)
    conf.update(overrides)
    Path(conf["datadir"]).mkdir(parents=True, exist_ok=True)
    app = (MatchApp if role == MATCH_ROLE else faust.App)(group_id(settings, role), **conf)
    use_fetch_max_wait(app, settings.kafka.consumer_fetch_max_wait_ms)
    hold_fetched_records_across_rebalance_completion(app)
    builder(app, settings, pipeline or Pipeline(settings))
    if web_port is not None:
        _add_metrics_page(app)
    return app


def _add_metrics_page(app: faust.App) -> None:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    @app.page("/rootrank/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/rootrank/health")
    async def health(web: Any, request: Any) -> Any:
        return web.json({"app": app.conf.id, "ok": True})


def build_apps(settings: Settings, roles: list[str], *, web_port: int | None = None,
               **overrides: Any) -> list[faust.App]:
    """The apps for `roles`; only the first serves HTTP (metrics, health), on `web_port`."""
    pipeline = Pipeline(settings)
    apps = [
        build_app(settings, role, pipeline=pipeline, web_port=web_port if i == 0 else None, **overrides)
        for i, role in enumerate(roles)
    ]
    if web_port is not None and apps:
        _serve_pages_of_every_role(apps)
        _install_fleet_probes(apps, pipeline)
    return apps


def _serve_pages_of_every_role(apps: list[faust.App]) -> None:
    """Only the first app runs a web server: the pages the other roles registered (the webhooks API)
    are served by it too, so `worker --role all --web-port N` answers /jobs/{job_id}/webhooks."""
    served = apps[0].web.views
    for app in apps[1:]:
        for path, view in list(app.web.views.items()):
            if path not in served:
                apps[0].web.add_view(type(view))


def _install_fleet_probes(apps: list[faust.App], pipeline: Pipeline) -> None:
    """/metrics, /healthz, /readyz on the app that serves HTTP; consumer lag on all (correlator/metrics.py)."""
    from correlator.stream.metrics import install_probes

    install_probes(apps[0], apps, pipeline)
