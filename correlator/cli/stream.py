"""`rootrank worker`, `up` and `setup`: run the streaming pipeline and prepare what it runs on."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from correlator.cli.settings import (
    SettingsHelpCommand,
    bootstrap_option,
    config_option,
    es_url_option,
    load_cli_settings,
    loglevel_option,
)


@click.command("worker", cls=SettingsHelpCommand,
               short_help="Run the stream processor (match raw logs, correlate jobs, emit incidents).")
@config_option
@bootstrap_option
@click.option("--role", default="all", help="Roles to run: all, match, correlate, or a comma-separated list.")
@click.option("--web-port", type=int, metavar="PORT",
              help="Serve /metrics, /healthz, /readyz (and /rootrank/metrics, /rootrank/health) on "
              "web_bind:PORT; when not given: off (web_bind: 127.0.0.1, ROOTRANK_WEB_BIND=0.0.0.0 in a pod).")
@loglevel_option
@click.option("--skip-setup", is_flag=True, help="Do not create missing topics at start.")
def worker(config: str | None, bootstrap: str | None, role: str, web_port: int | None, loglevel: str,
           skip_setup: bool) -> int:
    """Run the stream processor (match raw logs, correlate jobs, emit incidents).

    Roles: match (logs -> signals), correlate (signals -> incidents), or all. Each role is its own
    consumer group; run more workers of a role to split its partitions.
    """
    import logging

    from correlator.stream.app import parse_roles
    from correlator.stream.worker import run_worker

    settings = load_cli_settings(config, bootstrap=bootstrap)
    try:
        parse_roles(role)
    except ValueError as exc:
        print(f"rootrank worker: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not skip_setup:
        from kafka.errors import KafkaError

        from correlator.stream.setup_topics import ensure_topics

        try:
            ensure_topics(settings)
        except KafkaError as exc:  # the worker can still run on topics an operator created
            print(f"rootrank worker: topic setup skipped ({exc})", file=sys.stderr)
    return run_worker(settings, role, loglevel=loglevel, web_port=web_port)


def _port(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if not 0 < value < 65536:
        raise click.BadParameter(f"{value} is not a TCP port (1-65535)")
    return value


@click.command("up", cls=SettingsHelpCommand,
               short_help="Run a local stack in the foreground that the other commands find.")
@config_option
@click.option("--broker", type=click.Choice(["noida", "tansu"]), default="noida",
              help="Embedded broker: noida-db (keeps data in --data-dir) or Tansu (in memory).")
@click.option("--kafka-port", type=int, default=9092, callback=_port, help="Port of the embedded Kafka broker.")
@click.option("--es-port", type=int, default=9200, callback=_port,
              help="Port of the embedded search store (noida-db's Elasticsearch API).")
@click.option("--web-port", type=int, default=6066, metavar="PORT", callback=_port,
              help="Port of the worker's HTTP server: the webhooks API, /metrics, /healthz, /readyz.")
@click.option("--data-dir", default=".rootrank-data", metavar="DIR",
              help="Where the embedded services keep data (and the stack's API token).")
@click.option("--role", default="all", help="Worker roles to run: all, or a comma-separated list.")
@click.option("--print-env", is_flag=True,
              help="Print the running stack's settings as shell exports and exit (eval \"$(rootrank up "
              "--print-env)\").")
@loglevel_option
def up(config: str | None, broker: str, kafka_port: int, es_port: int, web_port: int, data_dir: str, role: str,
       print_env: bool, loglevel: str) -> int:
    """Run a local stack in the foreground that the other commands find.

    An embedded Kafka broker, a search store and the worker (every role), on 127.0.0.1 and stable
    ports. Writes with the webhooks API need a token: `up` makes one (kept in DATA_DIR/api-token).
    Once ready, it writes a context file ($ROOTRANK_CONTEXT, else ~/.config/rootrank/context.json:
    Kafka, Elasticsearch and API URLs, the token) that incidents, show, hosts, webhooks, ship and
    setup read when no flag, environment variable or config file says otherwise. Ctrl-C stops it
    all and removes the file. A second `up` while one runs says so and exits 1.

    Exit codes: 0 stopped cleanly; 1 it could not start (a port in use, already running, a
    missing binary) or --print-env found no running stack; 2 a usage error.
    """
    from correlator.tooling.context import read_context

    if print_env:
        context = read_context()
        if context is None:
            print("rootrank up: no rootrank up is running (start one: rootrank up)", file=sys.stderr)
            return 1
        sys.stdout.write(context.exports())
        return 0
    from correlator.tooling.embedded import run_up

    return run_up(load_cli_settings(config), kafka_port=kafka_port, es_port=es_port, web_port=web_port,
                  data_dir=data_dir, broker=broker, roles=role, loglevel=loglevel)


@click.command("setup",
               short_help="Create the Kafka topics, Elasticsearch templates and aliases, Kibana objects.")
@click.option("--kibana", metavar="URL", help="Also import the Kibana saved objects here.")
@click.option("--kibana-objects", metavar="DIR",
              help="Folder of *.ndjson; when not given: deploy/kibana or $ROOTRANK_KIBANA_OBJECTS.")
@click.option("--kibana-space", metavar="SPACE", help="Kibana space; when not given: the default space.")
@click.option("--skip-topics", is_flag=True, help="Do not touch Kafka.")
@click.option("--skip-templates", is_flag=True, help="Do not touch Elasticsearch.")
@es_url_option
@bootstrap_option
@click.option("--partitions", type=int, help="Partitions of new topics; when not given: topics.partitions.")
@config_option
def setup(kibana: str | None, kibana_objects: str | None, kibana_space: str | None, skip_topics: bool,
          skip_templates: bool, es_url: str | None, bootstrap: str | None, partitions: int | None,
          config: str | None) -> int:
    """Create the Kafka topics, Elasticsearch templates and aliases, Kibana objects.

    Idempotent: safe to run on every deploy. Each service is asked first whether anything answers at its
    address (3 s at most); one that does not is said at once ("nothing answers at URL (connection
    refused); is Kibana running?"), its step skipped, and the others still done.

    \b
    Exit codes: 0 done; 1 a step failed (a service not answering, or refusing a step); 2 a usage error.
    """
    from correlator.tooling.probe import probe

    settings = load_cli_settings(config, es_url=es_url, bootstrap=bootstrap, partitions=partitions,
                                 use_context=True)
    failed = False

    def answers(step: str, targets: str, service: str, default_port: int) -> bool:
        problem = probe(targets, service, default_port=default_port)
        if problem is not None:
            print(f"rootrank setup: {step}: {problem}", file=sys.stderr)
        return problem is None

    if not skip_topics and not answers("topics", settings.kafka.bootstrap_servers, "Kafka", 9092):
        skip_topics, failed = True, True
    if not skip_topics:
        from kafka.errors import KafkaError

        from correlator.stream.setup_topics import ensure_topics, format_outcomes

        try:
            print(format_outcomes(ensure_topics(settings)))
        except (KafkaError, OSError) as exc:  # report and go on: the other steps do not need the broker
            print(f"rootrank setup: topics: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed = True
    if not skip_templates and not answers("elasticsearch", settings.elasticsearch.url, "Elasticsearch", 9200):
        skip_templates, failed = True, True
    if not skip_templates:
        from elastic_transport import TransportError
        from elasticsearch import ApiError

        from correlator.sinks.elasticsearch.indices import install_templates

        try:
            for line in install_templates(settings):
                print(line)
        except (ApiError, TransportError) as exc:
            print(f"rootrank setup: elasticsearch {settings.elasticsearch.url}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            failed = True
    kibana_url = kibana or settings.elasticsearch.kibana_url
    if kibana_url and not answers("kibana", kibana_url, "Kibana", 5601):
        return 1
    if kibana_url:
        from correlator.sinks.kibana import (
            KibanaImportError,
            default_objects_dir,
            import_saved_objects,
            load_objects,
        )

        es = settings.elasticsearch
        try:
            objects = load_objects(Path(kibana_objects) if kibana_objects else default_objects_dir(),
                                   es.index_prefix)
            result = import_saved_objects(kibana_url, objects, space=kibana_space, username=es.username,
                                          password=es.password, api_key=es.api_key)
        except KibanaImportError as exc:
            print(f"rootrank setup: kibana: {exc}", file=sys.stderr)
            return 1
        print(result.summary())
        failed = failed or not result.success
    return 1 if failed else 0
