"""`rootrank incidents`, `show` and `hosts`: read the incidents the workers indexed in Elasticsearch."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from correlator.cli.settings import config_option, es_url_option, load_cli_settings

SINCE_HELP = "30m, 6h, 7d, 2w, or an ISO date/time"


@click.command("incidents", short_help="List incidents from Elasticsearch, newest first.")
@click.argument("query", metavar="[QUERY]...", nargs=-1)
@click.option("--job", help="Only the incidents of this job id.")
@click.option("--class", "failure_class", metavar="SLUG", help="Only incidents of this failure class.")
@click.option("--host", help="Only incidents this host initiated or has collateral failures in.")
@click.option("--since", metavar="WHEN", help=f"Only incidents since then: {SINCE_HELP}.")
@click.option("--limit", type=int, default=50, help="Most incidents to list.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              help="text: one row per incident; json: one incident JSON per line.")
@click.option("--json", "as_json", is_flag=True, hidden=True, help="The same as --format json.")
@es_url_option
@config_option
def incidents(query: tuple[str, ...], job: str | None, failure_class: str | None, host: str | None,
              since: str | None, limit: int, output_format: str, as_json: bool, es_url: str | None,
              config: str | None) -> int:
    """List incidents from Elasticsearch, newest first.

    Filters combine (AND). QUERY is free text over title, lines, fix, ids
    (simple_query_string syntax: words, "phrases", -exclude, prefix*). Elasticsearch: --es-url,
    $ROOTRANK_ELASTICSEARCH__URL, the config file, a running `rootrank up`, else 127.0.0.1:9200.

    Exit codes: 0 it searched (matches or none); 1 Elasticsearch failed; 2 a usage error.
    """
    as_json = as_json or output_format == "json"
    import orjson
    from elastic_transport import TransportError
    from elasticsearch import ApiError

    from correlator.sinks.elasticsearch.client import make_client
    from correlator.sinks.elasticsearch.indices import incidents_names
    from correlator.sinks.elasticsearch.search import (
        IncidentFilter,
        format_incident_rows,
        parse_since,
        search_incidents,
    )

    settings = load_cli_settings(config, es_url=es_url, use_context=True)
    try:
        since_time = parse_since(since) if since else None
    except ValueError as exc:
        print(f"rootrank incidents: {exc}", file=sys.stderr)
        return 2
    text = " ".join(query) if query else None
    flt = IncidentFilter(job=job, class_=failure_class, host=host, since=since_time, text=text, size=limit)
    client = make_client(settings.elasticsearch)
    try:
        hits = search_incidents(client, incidents_names(settings.elasticsearch.index_prefix).alias, flt)
    except (ApiError, TransportError) as exc:
        print(f"rootrank incidents: {settings.elasticsearch.url}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        for h in hits:
            sys.stdout.buffer.write(orjson.dumps(h.incident.to_json_dict()) + b"\n")
    elif hits:
        print(format_incident_rows(hits))
    else:
        print("no incident matches", file=sys.stderr)
    return 0


@click.command("show", short_help="Print one incident with its evidence, fix and verification.")
@click.argument("incident_id", metavar="ID")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "html"]), default="text",
              help="text: the same report as diagnose, in full; json: the incident; html: its picture "
              "(one self-contained file).")
@click.option("--output", "-o", metavar="FILE", help="Write the output to FILE; when not given: stdout.")
@click.option("--json", "as_json", is_flag=True, hidden=True, help="The same as --format json.")
@click.option("--html", metavar="FILE", hidden=True, help="The same as --format html -o FILE.")
@es_url_option
@config_option
def show(incident_id: str, output_format: str, output: str | None, as_json: bool, html: str | None,
         es_url: str | None, config: str | None) -> int:
    """Print one incident with its evidence, fix and verification.

    ID is the incident id; a unique prefix of it is enough.

    Exit codes: 0 printed; 1 no such incident, or Elasticsearch failed; 2 a usage error (an
    ambiguous prefix).
    """
    import io

    import orjson
    from elastic_transport import TransportError
    from elasticsearch import ApiError
    from rich.console import Console

    from correlator.render.text import print_incidents
    from correlator.sinks.elasticsearch.client import make_client
    from correlator.sinks.elasticsearch.indices import incidents_names
    from correlator.sinks.elasticsearch.search import AmbiguousId, get_incident

    if html:
        output_format, output = "html", html
    elif as_json:
        output_format = "json"
    settings = load_cli_settings(config, es_url=es_url, use_context=True)
    client = make_client(settings.elasticsearch)
    try:
        hit = get_incident(client, incidents_names(settings.elasticsearch.index_prefix).alias, incident_id)
    except AmbiguousId as exc:
        print(f"rootrank show: {exc}", file=sys.stderr)
        return 2
    except (ApiError, TransportError) as exc:
        print(f"rootrank show: {settings.elasticsearch.url}: {exc}", file=sys.stderr)
        return 1
    if hit is None:
        print(f"rootrank show: no incident {incident_id!r}", file=sys.stderr)
        return 1
    if output_format == "html":
        from correlator.render.html import render_incident_html

        # The picture from the incident's own evidence lines (the search store keeps no raw lines).
        data = render_incident_html(hit.incident, None).encode("utf-8")
    elif output_format == "json":
        data = orjson.dumps(hit.incident.to_json_dict(), option=orjson.OPT_INDENT_2) + b"\n"
    elif output is None:
        print_incidents([hit.incident], Console(emoji=False), detail=True)
        return 0
    else:
        buffer = io.StringIO()
        print_incidents([hit.incident], Console(file=buffer, emoji=False, width=100, color_system=None), detail=True)
        data = buffer.getvalue().encode("utf-8")
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        try:
            Path(output).write_bytes(data)
        except OSError as exc:
            print(f"rootrank show: -o {output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {output}", file=sys.stderr)
    return 0


@click.command("hosts",
               short_help="Repeat offenders: hosts (and GPUs) that initiated hardware-like incidents "
               "in several jobs.")
@click.option("--since", default="30d", metavar="WHEN",
              help=f"Count incidents since then: {SINCE_HELP}, or 'all'.")
@click.option("--min", "min_jobs", type=int, default=3, help="Distinct jobs a host must have broken.")
@click.option("--classes", metavar="SLUG,...",
              help="Comma-separated failure classes; when not given: the hardware-like ones.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              help="text: one row per host; json: one host JSON per line.")
@click.option("--json", "as_json", is_flag=True, hidden=True, help="The same as --format json.")
@click.option("--notify-url", metavar="URL",
              help="POST the hosts that newly crossed the threshold to this URL.")
@click.option("--notify-token", metavar="TOKEN", help="Bearer token for --notify-url.")
@click.option("--notify-state", default=".rootrank-hosts-notified.json", metavar="FILE",
              help="File remembering which hosts were already reported.")
@es_url_option
@config_option
def hosts(since: str, min_jobs: int, classes: str | None, output_format: str, as_json: bool,
          notify_url: str | None, notify_token: str | None, notify_state: str, es_url: str | None,
          config: str | None) -> int:
    """Repeat offenders: hosts (and GPUs) that initiated hardware-like incidents in several jobs.

    Hosts that initiated incidents of hardware-like classes (GPU hardware errors, network fabric, ECC, shm,
    silent data corruption) in at least --min distinct jobs. With --notify-url, hosts that crossed the
    threshold since the last run are POSTed there once (a drain list for the scheduler). When none did, it
    says so ("no host failed in 3 or more jobs since ...").

    Exit codes: 0 it searched; 1 Elasticsearch or the --notify-url failed; 2 a usage error.
    """
    as_json = as_json or output_format == "json"
    import orjson
    from elastic_transport import TransportError
    from elasticsearch import ApiError

    from correlator.sinks.elasticsearch.client import make_client
    from correlator.sinks.elasticsearch.fleet import (
        find_offenders,
        format_offenders,
        new_crossings,
        no_offenders,
        offender_dict,
        post_drain_list,
        remember_reported,
    )
    from correlator.sinks.elasticsearch.indices import incidents_names
    from correlator.sinks.elasticsearch.search import parse_since

    settings = load_cli_settings(config, es_url=es_url, use_context=True)
    try:
        since_time = None if since in ("", "all") else parse_since(since)
    except ValueError as exc:
        print(f"rootrank hosts: {exc}", file=sys.stderr)
        return 2
    class_list = [c.strip() for c in classes.split(",") if c.strip()] if classes else None
    client = make_client(settings.elasticsearch)
    try:
        offenders = find_offenders(client, incidents_names(settings.elasticsearch.index_prefix).alias,
                                   since=since_time, min_jobs=max(1, min_jobs), classes=class_list)
    except (ApiError, TransportError) as exc:
        print(f"rootrank hosts: {settings.elasticsearch.url}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        for o in offenders:
            sys.stdout.buffer.write(orjson.dumps(offender_dict(o)) + b"\n")
    elif offenders:
        print(format_offenders(offenders))
    else:
        print(no_offenders(max(1, min_jobs), since_time, since))
    if notify_url:
        fresh = new_crossings(offenders, Path(notify_state))
        if fresh:
            try:
                post_drain_list(notify_url, fresh, min_jobs=min_jobs, token=notify_token)
            except OSError as exc:
                print(f"rootrank hosts: --notify-url: {exc}", file=sys.stderr)
                return 1
            remember_reported(fresh, Path(notify_state))
            print(f"rootrank hosts: reported {len(fresh)} new host(s) to the drain webhook", file=sys.stderr)
    return 0
