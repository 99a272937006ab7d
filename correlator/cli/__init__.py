"""`rootrank` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from correlator.diagnosis.rules import RuleError, load_ruleset


def _cmd_rules_validate(args: argparse.Namespace) -> int:
    try:
        rs = load_ruleset(Path(args.dir) if args.dir else None)
    except RuleError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    print(f"{len(rs.rules)} rules valid (rule set {rs.version}); {len(rs.classes)} classes")
    return 0


def _cmd_rules_schema(_args: argparse.Namespace) -> int:
    import json

    from correlator.diagnosis.rules import rule_json_schema

    print(json.dumps(rule_json_schema(), indent=2))
    return 0


def _cmd_rules_test(args: argparse.Namespace) -> int:
    from correlator.diagnosis.matcher import Matcher
    from correlator.tooling.ruletest import run_data_file, run_examples

    try:
        rs = load_ruleset(Path(args.dir) if args.dir else None)
    except RuleError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    matcher = Matcher(rs)
    checked, failures = run_examples(rs, matcher)
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"{checked} examples in {len(rs.rules)} rules: {checked - len(failures)} passed, {len(failures)} failed")
    if args.data:
        for rule_id, count in sorted(run_data_file(rs, Path(args.data), matcher).items(), key=lambda kv: -kv[1]):
            if count:
                print(f"{count:8d}  {rule_id}")
    return 1 if failures else 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    import orjson
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from correlator.offline.diagnose import Diagnoser, DiagnoseStats, InputError, default_jobs, iter_sources
    from correlator.render.text import print_incidents

    err = Console(stderr=True)
    try:
        ruleset = load_ruleset(Path(args.rules) if args.rules else None)
    except RuleError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    diagnoser = Diagnoser(ruleset, jobs=args.jobs or default_jobs())
    stats = DiagnoseStats()
    try:
        total = sum(s.size or 0 for s in iter_sources(args.paths, DiagnoseStats()))
    except InputError as exc:
        print(f"rootrank diagnose: {exc}", file=sys.stderr)
        return 2
    show_progress = args.progress == "always" or (args.progress == "auto" and err.is_terminal and total > 32 << 20)
    try:
        if show_progress:
            with Progress(
                "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn(), console=err, transient=args.progress != "always",
            ) as bar:
                task = bar.add_task("scanning", total=total or None)
                incidents, signals = diagnoser.diagnose(
                    args.paths, args.job, stats=stats, progress=lambda n: bar.advance(task, n)
                )
        else:
            incidents, signals = diagnoser.diagnose(args.paths, args.job, stats=stats)
    except InputError as exc:
        print(f"rootrank diagnose: {exc}", file=sys.stderr)
        return 2
    for skipped in stats.skipped:
        print(f"skipped: {skipped}", file=sys.stderr)
    if stats.decode_errors:
        print(f"skipped {stats.decode_errors} undecodable JSON line(s)", file=sys.stderr)
    if args.format == "json":
        payload = {"incidents": [i.to_json_dict() for i in incidents]}
        sys.stdout.buffer.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2) + b"\n")
    elif args.format == "html":
        from correlator.render.html import render_incident_html

        out = Path(args.output or "rootrank-incident.html")
        if not incidents:
            print("No incident: nothing to draw.", file=sys.stderr)
            return 0
        out.write_text(render_incident_html(incidents[0], signals), encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    else:
        print_incidents(incidents, Console(emoji=False))
    if args.format != "json" and not stats.files and stats.skipped:
        return 2
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from correlator.tooling.simulate import SimulateError, simulate

    if args.list_classes:
        for slug in load_ruleset().classes:
            print(slug)
        return 0
    from datetime import UTC, datetime

    demo = args.demo
    cls = args.cls or "gpu_hardware_error"
    start = None
    if args.start:
        try:
            start = datetime.fromisoformat(args.start)
        except ValueError:
            print(f"rootrank simulate: --start {args.start!r} is not an ISO 8601 time", file=sys.stderr)
            return 2
        if start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
    rank = args.initiator_rank
    if demo and rank is None:
        rank = 37 if args.world_size > 37 else None
    try:
        truth = simulate(
            cls, world_size=args.world_size, hosts=args.hosts, seed=args.seed, skew_max_s=args.skew_max_s,
            fmt=args.format, noise_lines=args.noise_lines, late_lines=args.late_lines, out=Path(args.out),
            initiator_rank=rank, demo=demo, start=start,
        )
    except (SimulateError, RuleError) as exc:
        print(f"rootrank simulate: {exc}", file=sys.stderr)
        return 2
    who = "every rank" if truth.initiator.all else f"rank {truth.initiator.rank} on {truth.initiator.host}"
    print(f"{truth.class_}: {who} initiates; {truth.world_size} ranks on {len(truth.hosts)} hosts; "
          f"wrote {len(truth.files)} log file(s) and truth.json to {args.out}; "
          f"diagnose with: rootrank diagnose {Path(args.out) / truth.job_id}")
    return 0


def _search_settings(args: argparse.Namespace) -> Any:
    from correlator.config import load_settings

    settings = load_settings(getattr(args, "config", None))
    if getattr(args, "es_url", None):
        settings.elasticsearch.url = args.es_url
    if getattr(args, "bootstrap", None):
        settings.kafka.bootstrap_servers = args.bootstrap
    if getattr(args, "partitions", None):
        settings.topics.partitions = args.partitions
    return settings


def _cmd_hosts(args: argparse.Namespace) -> int:
    import orjson
    from elastic_transport import TransportError
    from elasticsearch import ApiError

    from correlator.sinks.elasticsearch.fleet import (
        find_offenders,
        format_offenders,
        new_crossings,
        offender_dict,
        post_drain_list,
        remember_reported,
    )
    from correlator.sinks.elasticsearch.search import parse_since
    from correlator.sinks.elasticsearch.store import incidents_names, make_client

    settings = _search_settings(args)
    try:
        since = None if args.since in (None, "", "all") else parse_since(args.since)
    except ValueError as exc:
        print(f"rootrank hosts: {exc}", file=sys.stderr)
        return 2
    classes = [c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None
    client = make_client(settings.elasticsearch)
    try:
        offenders = find_offenders(client, incidents_names(settings.elasticsearch.index_prefix).alias,
                                   since=since, min_jobs=max(1, args.min_jobs), classes=classes)
    except (ApiError, TransportError) as exc:
        print(f"rootrank hosts: {settings.elasticsearch.url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        for o in offenders:
            sys.stdout.buffer.write(orjson.dumps(offender_dict(o)) + b"\n")
    elif offenders:
        print(format_offenders(offenders))
    if args.notify_url:
        fresh = new_crossings(offenders, Path(args.notify_state))
        if fresh:
            try:
                post_drain_list(args.notify_url, fresh, min_jobs=args.min_jobs, token=args.notify_token)
            except OSError as exc:
                print(f"rootrank hosts: --notify-url: {exc}", file=sys.stderr)
                return 1
            remember_reported(fresh, Path(args.notify_state))
            print(f"rootrank hosts: reported {len(fresh)} new host(s) to the drain webhook", file=sys.stderr)
    return 0


def _cmd_incidents(args: argparse.Namespace) -> int:
    import orjson
    from elastic_transport import TransportError
    from elasticsearch import ApiError

    from correlator.sinks.elasticsearch.search import (
        IncidentFilter,
        format_incident_rows,
        parse_since,
        search_incidents,
    )
    from correlator.sinks.elasticsearch.store import incidents_names, make_client

    settings = _search_settings(args)
    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as exc:
        print(f"rootrank incidents: {exc}", file=sys.stderr)
        return 2
    query = " ".join(args.query) if args.query else None
    flt = IncidentFilter(job=args.job, class_=args.cls, host=args.host, since=since, text=query, size=args.limit)
    client = make_client(settings.elasticsearch)
    try:
        hits = search_incidents(client, incidents_names(settings.elasticsearch.index_prefix).alias, flt)
    except (ApiError, TransportError) as exc:
        print(f"rootrank incidents: {settings.elasticsearch.url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        for h in hits:
            sys.stdout.buffer.write(orjson.dumps(h.incident.to_json_dict()) + b"\n")
    elif hits:
        print(format_incident_rows(hits))
    else:
        print("no incident matches", file=sys.stderr)
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    import orjson
    from elastic_transport import TransportError
    from elasticsearch import ApiError
    from rich.console import Console

    from correlator.sinks.elasticsearch.search import AmbiguousId, get_incident, print_incident_detail
    from correlator.sinks.elasticsearch.store import incidents_names, make_client

    settings = _search_settings(args)
    client = make_client(settings.elasticsearch)
    try:
        hit = get_incident(client, incidents_names(settings.elasticsearch.index_prefix).alias, args.id)
    except AmbiguousId as exc:
        print(f"rootrank show: {exc}", file=sys.stderr)
        return 2
    except (ApiError, TransportError) as exc:
        print(f"rootrank show: {settings.elasticsearch.url}: {exc}", file=sys.stderr)
        return 1
    if hit is None:
        print(f"rootrank show: no incident {args.id!r}", file=sys.stderr)
        return 1
    if args.html:
        from correlator.render.html import render_incident_html

        # The picture from the incident's own evidence lines (the search store keeps no raw lines).
        Path(args.html).write_text(render_incident_html(hit.incident, None), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    elif args.json:
        sys.stdout.buffer.write(orjson.dumps(hit.incident.to_json_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print_incident_detail(hit, Console(emoji=False))
    return 0


def _cmd_setup(args: argparse.Namespace) -> int:
    """Topics, index templates + write aliases, Kibana saved objects. Each step is idempotent."""
    settings = _search_settings(args)
    failed = False
    if not args.skip_topics:
        from kafka.errors import KafkaError

        from correlator.stream.setup_topics import ensure_topics, format_outcomes

        try:
            print(format_outcomes(ensure_topics(settings)))
        except (KafkaError, OSError) as exc:  # report and go on: the other steps do not need the broker
            print(f"rootrank setup: topics: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed = True
    if not args.skip_templates:
        from elastic_transport import TransportError
        from elasticsearch import ApiError

        from correlator.sinks.elasticsearch.store import install_templates

        try:
            for line in install_templates(settings):
                print(line)
        except (ApiError, TransportError) as exc:
            print(f"rootrank setup: elasticsearch {settings.elasticsearch.url}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            failed = True
    kibana = args.kibana or settings.elasticsearch.kibana_url
    if kibana:
        from correlator.sinks.kibana import (
            KibanaImportError,
            default_objects_dir,
            import_saved_objects,
            load_objects,
        )

        es = settings.elasticsearch
        try:
            objects = load_objects(Path(args.kibana_objects) if args.kibana_objects else default_objects_dir(),
                                   es.index_prefix)
            result = import_saved_objects(kibana, objects, space=args.kibana_space, username=es.username,
                                          password=es.password, api_key=es.api_key)
        except KibanaImportError as exc:
            print(f"rootrank setup: kibana: {exc}", file=sys.stderr)
            return 1
        print(result.summary())
        failed = failed or not result.success
    return 1 if failed else 0


# --- streaming pipeline: setup, worker, ship, up ------------------------------------------------


def _settings_from(args: argparse.Namespace) -> Settings:
    """Config file, then ROOTRANK_* environment, then the command-line flags that were given."""
    from correlator.config import load_settings

    settings = load_settings(getattr(args, "config", None))
    bootstrap = getattr(args, "bootstrap", None)
    if bootstrap:
        settings.kafka.bootstrap_servers = bootstrap
    partitions = getattr(args, "partitions", None)
    if partitions:
        settings.topics.partitions = partitions
    return settings


def _settings_epilog() -> str:
    """Every setting with its default and environment variable (nested with __), for --help."""
    from pydantic import BaseModel

    from correlator.config import Settings

    rows: list[str] = []

    def walk(model: type[BaseModel], prefix: str, env: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name}.", f"{env}{name.upper()}__")
                continue
            default = field.get_default(call_default_factory=True)
            note = f"  {field.description}" if field.description else ""
            rows.append(f"  {prefix}{name} = {default!r}  [{env}{name.upper()}]{note}")

    walk(Settings, "", "ROOTRANK_")
    return "settings (YAML file via --config or ROOTRANK_CONFIG, or environment):\n" + "\n".join(rows)


def _add_connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=argparse.SUPPRESS,
                        help="YAML settings file (default: $ROOTRANK_CONFIG, else built-in defaults)")
    parser.add_argument("--bootstrap", default=argparse.SUPPRESS,
                        help="Kafka bootstrap servers host:port[,...] (default: kafka.bootstrap_servers)")


def _cmd_worker(args: argparse.Namespace) -> int:
    import logging

    from correlator.stream.app import parse_roles
    from correlator.stream.worker import run_worker

    settings = _settings_from(args)
    try:
        parse_roles(args.role)
    except ValueError as exc:
        print(f"rootrank worker: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.skip_setup:
        from kafka.errors import KafkaError

        from correlator.stream.setup_topics import ensure_topics

        try:
            ensure_topics(settings)
        except KafkaError as exc:  # the worker can still run on topics an operator created
            print(f"rootrank worker: topic setup skipped ({exc})", file=sys.stderr)
    return run_worker(settings, args.role, loglevel=args.loglevel, web_port=args.web_port)


def _cmd_ship(args: argparse.Namespace) -> int:
    import logging

    from ingest.ship.runner import ShipOptions, run_ship

    logging.basicConfig(level=logging.WARNING, format="rootrank ship: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # its reconnect chatter; we report outages once

    settings = _settings_from(args)
    from correlator.stream.setup_topics import kafka_python_config

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    labels: dict[str, str] = {}
    for item in args.label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"rootrank ship: --label wants KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        labels[key] = value
    if args.progress_interval <= 0:
        print("rootrank ship: --progress-interval wants a positive number of seconds", file=sys.stderr)
        return 2
    options = ShipOptions(
        kafka=kafka_python_config(settings.kafka),
        topic=args.topic or settings.topics.logs,
        job_id=args.job,
        host=args.host,
        rank=args.rank,
        local_rank=args.local_rank,
        labels=labels,
        batch_max_bytes=args.batch_kib * 1024,
        linger_s=args.linger_ms / 1000.0,
        compression=args.compression,
        state_dir=Path(args.state_dir),
        spool_max_bytes=args.spool_max_mib * 1024 * 1024,
        drain_timeout_s=args.drain_timeout,
        follow=args.follow,
        tee=args.tee,
        idempotence=not args.no_idempotence,
        send_timeout_s=args.send_timeout,
        progress=args.progress,
        progress_interval_s=args.progress_interval,
    )
    _add_fleet_ship_options(options, args, settings)
    return run_ship(options, files=args.file or [], command=command)


def _add_fleet_ship_options(options: Any, args: argparse.Namespace, settings: Any) -> None:
    """--evidence-only (matcher in the shipper) and --metrics-port (issue 9)."""
    if args.evidence_only:
        from correlator.diagnosis.evidence import EvidenceFilter
        from correlator.diagnosis.matcher import Matcher
        from correlator.diagnosis.rules import load_ruleset

        rules_dir = settings.engine.rules_dir
        options.line_filter = EvidenceFilter(Matcher(load_ruleset(Path(rules_dir) if rules_dir else None)),
                                             context=args.context, heartbeat_s=args.heartbeat_s)
    if args.metrics_port is not None:
        from correlator.stream.metrics import ship_metrics_hook

        options.on_start = ship_metrics_hook(args.metrics_port, args.metrics_bind)


def _cmd_up(args: argparse.Namespace) -> int:
    from correlator.tooling.embedded import run_up

    return run_up(_settings_from(args), kafka_port=args.kafka_port, data_dir=args.data_dir, broker=args.broker,
                  roles=args.role, web_port=args.web_port, loglevel=args.loglevel)


def _add_streaming_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    fmt = argparse.RawDescriptionHelpFormatter

    class _Formatter(argparse.ArgumentDefaultsHelpFormatter, fmt):
        pass

    # `rootrank setup` (topics, templates, Kibana objects) is defined with the search commands;
    # it creates the topics with correlator.stream.setup_topics.ensure_topics.
    worker = sub.add_parser(
        "worker", help="run the stream processor (match raw logs, correlate jobs, emit incidents)",
        description="Roles: match (logs -> signals), correlate (signals -> incidents), or all. Each role is its "
        "own consumer group; run more workers of a role to split its partitions.",
        formatter_class=_Formatter, epilog=_settings_epilog(),
    )
    _add_connection_args(worker)
    worker.add_argument("--role", default="all", help="all, match, correlate, or a comma-separated list")
    worker.add_argument("--web-port", type=int, default=None,
                        help="serve /metrics, /healthz, /readyz (and /rootrank/metrics, /rootrank/health) on "
                        "web_bind:PORT (default: off; web_bind: 127.0.0.1, ROOTRANK_WEB_BIND=0.0.0.0 in a pod)")
    worker.add_argument("--loglevel", default="warning", choices=["debug", "info", "warning", "error"])
    worker.add_argument("--skip-setup", action="store_true", help="do not create missing topics at start")
    worker.set_defaults(func=_cmd_worker)

    ship = sub.add_parser(
        "ship", help="send log lines to Kafka: follow files, read stdin, or wrap a command",
        description="rootrank ship --job J --file rank0.log --follow\n"
        "some_command | rootrank ship --job J\n"
        "rootrank ship --job J --rank 3 -- torchrun --nproc-per-node 8 train.py\n\n"
        "A wrapped command's stdout/stderr pass through unchanged and it is never slowed: lines are "
        "batched in the background, and spooled to disk while Kafka is slow or down.",
        formatter_class=_Formatter, epilog=_settings_epilog(),
    )
    _add_connection_args(ship)
    ship.add_argument("--job", help="job id (default: derived by the worker from labels, paths or the host)")
    ship.add_argument("--host", default=None, help="host name to tag lines with (default: this machine's)")
    ship.add_argument("--rank", type=int, default=None, help="global rank, when one process writes the stream")
    ship.add_argument("--local-rank", type=int, default=None)
    ship.add_argument("--label", action="append", metavar="KEY=VALUE", help="label added to every batch (repeatable)")
    ship.add_argument("--file", "-f", action="append", metavar="PATH", help="a log file to ship (repeatable)")
    ship.add_argument("--follow", action="store_true",
                      help="keep following the files (rotation-aware) until interrupted")
    ship.add_argument("--tee", action="store_true", help="with stdin: also copy the input to stdout")
    ship.add_argument("--topic", default=None, help="topic to send to (default: topics.logs)")
    ship.add_argument("--batch-kib", type=int, default=256, help="max size of one message")
    ship.add_argument("--linger-ms", type=int, default=500, help="max time a line waits for its batch")
    ship.add_argument("--compression", default="auto", choices=["auto", "gzip", "lz4", "snappy", "zstd", "none"],
                      help="message compression (auto: lz4 when installed, else gzip)")
    ship.add_argument("--state-dir", default=".rootrank-ship", help="positions of followed files and the spool")
    ship.add_argument("--send-timeout", type=float, default=30.0,
                      help="seconds the producer keeps retrying a message before it goes to the disk spool")
    ship.add_argument("--no-idempotence", action="store_true",
                      help="plain (non-idempotent) producer, for brokers without idempotence support")
    ship.add_argument("--spool-max-mib", type=int, default=1024, help="disk spool bound while Kafka is down")
    ship.add_argument("--drain-timeout", type=float, default=30.0,
                      help="seconds to keep sending after the input ends (the rest stays spooled)")
    ship.add_argument("--evidence-only", action="store_true",
                      help="match in the shipper; send only lines that hit a rule, with --context lines around "
                      "them, plus a periodic per-stream heartbeat (identity, latest progress)")
    ship.add_argument("--context", type=int, default=5, help="with --evidence-only: lines before and after a hit")
    ship.add_argument("--heartbeat-s", type=float, default=30.0, help="with --evidence-only: heartbeat period")
    ship.add_argument("--metrics-port", type=int, default=None,
                      help="serve Prometheus /metrics and /healthz on this port (default: off)")
    ship.add_argument("--metrics-bind", default="127.0.0.1", help="address for --metrics-port (0.0.0.0 in a pod)")
    ship.add_argument("--progress", choices=["auto", "always", "never"], default="auto",
                      help="with --file: progress through the files' backlog (their bytes from where shipping "
                      "starts, resuming after a restart, to their sizes at start) on stderr: bytes acknowledged by "
                      "Kafka, rate, ETA, lines sent and spooled; ends with a 'caught up' line (--follow then goes "
                      "on live). auto: a bar on a terminal, for backlogs over 32 MiB; always: a bar on a terminal, "
                      "else a plain status line every --progress-interval seconds. Never when wrapping a command "
                      "or reading stdin")
    ship.add_argument("--progress-interval", type=float, default=5.0, metavar="SECONDS",
                      help="seconds between the plain status lines of --progress always (stderr not a terminal)")
    ship.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...: wrap this command")
    ship.set_defaults(func=_cmd_ship)

    up = sub.add_parser(
        "up", help="run the local stack in the foreground: an embedded Kafka broker and the worker",
        formatter_class=_Formatter, epilog=_settings_epilog(),
    )
    up.add_argument("--config", default=argparse.SUPPRESS, help="YAML settings file")
    up.add_argument("--broker", choices=["noida", "tansu"], default="noida",
                    help="embedded broker: noida-db (keeps data in --data-dir) or Tansu (in memory)")
    up.add_argument("--kafka-port", type=int, default=9092)
    up.add_argument("--data-dir", default=".rootrank-data", help="where the embedded services keep data")
    up.add_argument("--role", default="all", help="worker roles to run")
    up.add_argument("--web-port", type=int, default=6066, help="worker metrics/health port (0: off)")
    up.add_argument("--loglevel", default="warning", choices=["debug", "info", "warning", "error"])
    up.set_defaults(func=_cmd_up)


# --- webhooks: per-job registrations on the worker's HTTP API -----------------------------------


def _cmd_webhooks(args: argparse.Namespace) -> int:
    import os

    from correlator.config import load_settings
    from correlator.sinks.webhooks.client import (
        ClientError,
        WebhooksClient,
        registration_from_args,
        resolve_token,
    )

    settings = load_settings(args.config)
    configured = settings.webhooks.api_token.get_secret_value() if settings.webhooks.api_token else None
    api = args.api or os.environ.get("ROOTRANK_API_URL") or f"http://127.0.0.1:{settings.web_port}"
    client = WebhooksClient(api, resolve_token(args.token_file, configured))
    try:
        if args.webhooks_command == "add":
            body, generated = registration_from_args(args)
            view = client.add(args.job, body)["webhook"]
            print(f"{view['id']}  {view['kind']}  {view['target']}  (job {args.job})")
            if generated:
                print(f"signing secret (shown once; give it to the receiver): {generated}")
        elif args.webhooks_command == "list":
            for view in client.list(args.job):
                filters = " ".join(
                    part for part in (
                        f"min_severity={view['min_severity']}" if view["min_severity"] else "",
                        f"classes={','.join(view['classes'])}" if view["classes"] else "",
                        "signed" if view["signed"] else "",
                    ) if part
                )
                print(f"{view['id']}  {view['kind']}  {view['target']}  {filters}".rstrip())
        elif args.webhooks_command == "remove":
            if not (args.url or args.id or args.all):
                print("rootrank webhooks remove: give a URL, --id or --all", file=sys.stderr)
                return 2
            removed = client.remove(args.job, url=args.url, registration_id=args.id, everything=args.all)
            print(f"removed {removed} webhook(s) of job {args.job}")
        else:
            print("rootrank webhooks: choose add, list or remove", file=sys.stderr)
            return 2
    except (ClientError, OSError) as exc:
        print(f"rootrank webhooks: {exc}", file=sys.stderr)
        return 1
    return 0


def _add_webhooks_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    webhooks = sub.add_parser(
        "webhooks", help="register, list and remove a job's webhooks on a running worker",
        description="Talks to the worker's /jobs/{job_id}/webhooks API. The token for add/remove comes from "
        "$ROOTRANK_API_TOKEN, --token-file or the config's webhooks.api_token (never a flag: shell history).",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--job", required=True, help="job id")
    common.add_argument("--api", help="worker URL (default: $ROOTRANK_API_URL, else http://127.0.0.1:<web_port>)")
    common.add_argument("--token-file", help="file holding the API token")
    common.add_argument("--config", help="YAML config file; when not given: $ROOTRANK_CONFIG")
    actions = webhooks.add_subparsers(dest="webhooks_command", metavar="ACTION")
    add = actions.add_parser("add", parents=[common], help="add (or replace) a webhook of the job")
    add.add_argument("url", nargs="?", metavar="URL", help="where to POST (optional for pagerduty)")
    add.add_argument("--kind", default="generic_json", choices=["generic_json", "slack", "pagerduty", "alertmanager"])
    add.add_argument("--generate-secret", action="store_true", help="sign with a new whsec_ secret, printed once")
    add.add_argument("--secret-file", help="file holding a whsec_... signing secret (generic_json)")
    add.add_argument("--routing-key-file", help="file holding the PagerDuty routing key (pagerduty)")
    add.add_argument("--min-severity", choices=["info", "low", "medium", "high", "critical"])
    add.add_argument("--class", dest="classes", action="append", metavar="GLOB", help="only these classes (repeat)")
    actions.add_parser("list", parents=[common], help="list the job's webhooks")
    remove = actions.add_parser("remove", parents=[common], help="remove a webhook by URL or id, or all of them")
    remove.add_argument("url", nargs="?", metavar="URL")
    remove.add_argument("--id", help="webhook id (from list)")
    remove.add_argument("--all", action="store_true", help="remove every webhook of the job")
    webhooks.set_defaults(func=_cmd_webhooks)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: give 0 (automatic) or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rootrank",
        description="Find which rank broke a distributed training job, and why.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    diagnose = sub.add_parser(
        "diagnose",
        help="name the rank that broke a job, from its log files (offline, no services)",
        description="All given paths form one job: files, folders (recursive), .gz, or - for stdin.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    diagnose.add_argument("paths", nargs="+", metavar="PATH")
    diagnose.add_argument("--format", choices=["text", "json", "html"], default="text")
    diagnose.add_argument("--job", help="job id for the incident (default: from the file names)")
    diagnose.add_argument("--output", "-o", help="with --format html: the file to write")
    diagnose.add_argument("--rules", help="rules folder (default: the installed library)")
    diagnose.add_argument(
        "--progress", choices=["auto", "always", "never"], default="auto",
        help="progress bar on stderr (auto: on a terminal, for inputs over 32 MiB)",
    )
    diagnose.add_argument(
        "--jobs", "-j", type=_count, default=0, metavar="N",
        help="processes scanning a large plain file's 16 MiB chunks at once (0: one per available CPU, at most 8)",
    )
    diagnose.set_defaults(func=_cmd_diagnose)
    simulate = sub.add_parser(
        "simulate",
        help="write the logs of a simulated failing multi-rank job, with the truth beside them",
        description="One log file per host (plain), or one file of forwarder messages, plus truth.json. "
        "--demo: 64 ranks on 8 hosts, the GPU of rank 37 falls off the bus (Xid 79).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    simulate.add_argument("--class", dest="cls", metavar="SLUG", help="failure class (default: gpu_hardware_error)")
    simulate.add_argument("--demo", action="store_true", help="the bundled demo scenario's wording; rank 37 initiates")
    simulate.add_argument("--world-size", type=int, default=64)
    simulate.add_argument("--hosts", type=int, default=8)
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--skew-max-s", type=float, default=3.0, help="per-host clock skew drawn from +-this")
    simulate.add_argument("--format", choices=["plain", "fluentbit", "vector", "filebeat", "rsyslog"], default="plain")
    simulate.add_argument("--noise-lines", type=int, default=24, help="training-chatter lines per rank before the failure")
    simulate.add_argument("--late-lines", type=int, default=0, help="timestamped lines that arrive 5-60 s late")
    simulate.add_argument("--initiator-rank", type=int, help="the failing rank (default: drawn from the seed)")
    simulate.add_argument("--out", default="simulated", help="folder to write (logs/ and truth.json)")
    simulate.add_argument("--start", help="job start time, ISO 8601 (default: 18:30 UTC yesterday)")
    simulate.add_argument("--list-classes", action="store_true", help="print the class slugs and exit")
    simulate.set_defaults(func=_cmd_simulate)
    incidents = sub.add_parser(
        "incidents", help="list incidents from Elasticsearch, newest first",
        description="Filters combine (AND). QUERY is free text over title, lines, fix, ids "
        "(simple_query_string syntax: words, \"phrases\", -exclude, prefix*).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    incidents.add_argument("query", nargs="*", metavar="QUERY")
    incidents.add_argument("--job", help="job id")
    incidents.add_argument("--class", dest="cls", metavar="SLUG", help="failure class")
    incidents.add_argument("--host", help="initiating host, or a host with collateral failures")
    incidents.add_argument("--since", help="30m, 6h, 7d, 2w, or an ISO date/time")
    incidents.add_argument("--limit", type=int, default=50)
    incidents.add_argument("--json", action="store_true", help="one incident JSON per line")
    incidents.add_argument("--es-url", help="Elasticsearch URL; when not given: the config's elasticsearch.url")
    incidents.add_argument("--config", help="YAML config file; when not given: $ROOTRANK_CONFIG")
    incidents.set_defaults(func=_cmd_incidents)
    hosts = sub.add_parser(
        "hosts", help="repeat offenders: hosts (and GPUs) that initiated hardware-like incidents in several jobs",
        description="Hosts that initiated incidents of hardware-like classes (GPU hardware errors, network "
        "fabric, ECC, shm, silent data corruption) in at least --min distinct jobs. With --notify-url, hosts "
        "that crossed the threshold since the last run are POSTed there once (a drain list for the scheduler).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    hosts.add_argument("--since", default="30d", help="30m, 6h, 7d, 2w, an ISO date/time, or 'all'")
    hosts.add_argument("--min", dest="min_jobs", type=int, default=3, help="distinct jobs a host must have broken")
    hosts.add_argument("--classes", help="comma-separated classes (default: the hardware-like ones)")
    hosts.add_argument("--json", action="store_true", help="one host JSON per line")
    hosts.add_argument("--notify-url", help="POST hosts that newly crossed the threshold to this URL")
    hosts.add_argument("--notify-token", help="bearer token for --notify-url")
    hosts.add_argument("--notify-state", default=".rootrank-hosts-notified.json",
                       help="file remembering which hosts were already reported")
    hosts.add_argument("--es-url", help="Elasticsearch URL; when not given: the config's elasticsearch.url")
    hosts.add_argument("--config", help="YAML config file; when not given: $ROOTRANK_CONFIG")
    hosts.set_defaults(func=_cmd_hosts)
    show = sub.add_parser("show", help="print one incident with its evidence, fix and verification",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    show.add_argument("id", metavar="ID", help="incident id (a unique prefix is enough)")
    show.add_argument("--json", action="store_true", help="the incident JSON")
    show.add_argument("--html", metavar="FILE", help="write the incident picture (self-contained HTML) to FILE")
    show.add_argument("--es-url", help="Elasticsearch URL; when not given: the config's elasticsearch.url")
    show.add_argument("--config", help="YAML config file; when not given: $ROOTRANK_CONFIG")
    show.set_defaults(func=_cmd_show)
    if "setup" not in sub.choices:
        setup = sub.add_parser(
            "setup", help="create the Kafka topics, Elasticsearch templates and aliases, Kibana objects",
            description="Idempotent: safe to run on every deploy.",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        setup.add_argument("--kibana", metavar="URL", help="also import the Kibana saved objects here")
        setup.add_argument("--kibana-objects", metavar="DIR", help="folder of *.ndjson; when not given: deploy/kibana or $ROOTRANK_KIBANA_OBJECTS")
        setup.add_argument("--kibana-space", metavar="SPACE", help="Kibana space; when not given: the default space")
        setup.add_argument("--skip-topics", action="store_true", help="do not touch Kafka")
        setup.add_argument("--skip-templates", action="store_true", help="do not touch Elasticsearch")
        setup.add_argument("--es-url", help="Elasticsearch URL; when not given: the config's elasticsearch.url")
        setup.add_argument("--bootstrap", help="Kafka bootstrap servers; when not given: the config's kafka.bootstrap_servers")
        setup.add_argument("--partitions", type=int, help="partitions of new topics; when not given: topics.partitions")
        setup.add_argument("--config", help="YAML config file; when not given: $ROOTRANK_CONFIG")
        setup.set_defaults(func=_cmd_setup)
    rules = sub.add_parser("rules", help="validate and test the signature library")
    rules_sub = rules.add_subparsers(dest="rules_command", metavar="ACTION")
    validate = rules_sub.add_parser("validate", help="check every rule file; problems print as file:line: what")
    validate.add_argument("dir", nargs="?", help="rules folder (default: the installed library)")
    validate.set_defaults(func=_cmd_rules_validate)
    schema = rules_sub.add_parser("schema", help="print the rule file JSON Schema (for editors and CI)")
    schema.set_defaults(func=_cmd_rules_schema)
    test = rules_sub.add_parser("test", help="run every rule's match/no_match examples")
    test.add_argument("dir", nargs="?", help="rules folder (default: the installed library)")
    test.add_argument("--data", help="also count hits per rule over this log file")
    test.set_defaults(func=_cmd_rules_test)
    _add_streaming_parsers(sub)
    _add_webhooks_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
