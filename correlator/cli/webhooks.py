"""`rootrank webhooks add|list|remove`: a job's webhook registrations on a running worker's HTTP API."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

import click

from correlator.cli.settings import config_option

if TYPE_CHECKING:
    from correlator.sinks.webhooks.client import WebhooksClient

F = TypeVar("F", bound=Callable[..., Any])


def worker_api_options(function: F) -> F:
    """The job and how to reach the worker: every action takes them."""
    function = config_option(function)
    function = click.option(
        "--token-file", metavar="FILE",
        help="File holding the API token; when not given: $ROOTRANK_API_TOKEN, the config's "
        "webhooks.api_token, else the token of a running `rootrank up`.",
    )(function)
    function = click.option(
        "--api", metavar="URL",
        help="Worker URL; when not given: $ROOTRANK_API_URL, a running `rootrank up`, "
        "else http://127.0.0.1:<web_port>.",
    )(function)
    return click.option("--job", required=True, help="Job id whose webhooks to change or list.")(function)


def _worker_client(api: str | None, token_file: str | None, config: str | None) -> WebhooksClient:
    import os

    from correlator.cli.settings import load_with_sources
    from correlator.sinks.webhooks.client import WebhooksClient, resolve_token

    loaded = load_with_sources(config)
    settings = loaded.settings
    api = api or os.environ.get("ROOTRANK_API_URL")
    token = settings.webhooks.api_token.get_secret_value() if settings.webhooks.api_token else None
    if api is None and loaded.context is not None:
        api = loaded.context.api_url
    elif loaded.sources.get("webhooks.api_token") == "rootrank up":
        token = None  # the local stack's token is for the local stack only, never sent to another worker
    api = api or f"http://127.0.0.1:{settings.web_port}"
    return WebhooksClient(api, resolve_token(token_file, token))


def _report(exc: Exception) -> int:
    print(f"rootrank webhooks: {exc}", file=sys.stderr)
    return 1


@click.group("webhooks", short_help="Register, list and remove a job's webhooks on a running worker.")
def webhooks() -> None:
    """Register, list and remove a job's webhooks on a running worker.

    Talks to the worker's /jobs/{job_id}/webhooks API (a running `rootrank up` serves it). The token for
    add/remove comes from --token-file, $ROOTRANK_API_TOKEN, the config's webhooks.api_token or a running
    `rootrank up` (never a flag: shell history).

    Exit codes: 0 done; 1 the worker refused or could not be reached; 2 a usage error.
    """


@webhooks.command("add", short_help="Add (or replace) a webhook of the job.")
@worker_api_options
@click.argument("url", metavar="[URL]", required=False)
@click.option("--kind", type=click.Choice(["generic_json", "slack", "pagerduty", "alertmanager"]),
              default="generic_json", help="Receiver the payload is shaped for.")
@click.option("--generate-secret", is_flag=True, help="Sign with a new whsec_ secret, printed once.")
@click.option("--secret-file", metavar="FILE", help="File holding a whsec_... signing secret (generic_json).")
@click.option("--routing-key-file", metavar="FILE",
              help="File holding the PagerDuty routing key (pagerduty).")
@click.option("--min-severity", type=click.Choice(["info", "low", "medium", "high", "critical"]),
              help="Only incidents of this severity or above.")
@click.option("--class", "classes", multiple=True, metavar="GLOB", help="Only these classes (repeat).")
def add(job: str, api: str | None, token_file: str | None, config: str | None, **registration: Any) -> int:
    """Add (or replace) a webhook of the job: POST its incidents to URL (optional for pagerduty)."""
    from correlator.sinks.webhooks.client import ClientError, registration_from_args

    client = _worker_client(api, token_file, config)
    try:
        body, generated = registration_from_args(SimpleNamespace(**registration))
        view = client.add(job, body)["webhook"]
    except (ClientError, OSError) as exc:
        return _report(exc)
    print(f"{view['id']}  {view['kind']}  {view['target']}  (job {job})")
    if generated:
        print(f"signing secret (shown once; give it to the receiver): {generated}")
    return 0


@webhooks.command("list", short_help="List the job's webhooks.")
@worker_api_options
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              help="text: one webhook a line; json: one webhook JSON per line.")
def list_(job: str, api: str | None, token_file: str | None, config: str | None, output_format: str) -> int:
    """List the job's webhooks (targets shown in full only with the API token), each with its delivery
    queue on the worker: ok, retrying or dead (its retries ran out: dead-lettered, its deliveries kept
    and tried again), pending deliveries, the last error and the next retry."""
    import json

    from correlator.sinks.webhooks.client import ClientError

    client = _worker_client(api, token_file, config)
    try:
        registrations = client.list(job)
    except (ClientError, OSError) as exc:
        return _report(exc)
    if output_format == "json":
        for view in registrations:
            print(json.dumps(view, sort_keys=True))
        return 0
    for view in registrations:
        filters = " ".join(
            part for part in (
                f"min_severity={view['min_severity']}" if view["min_severity"] else "",
                f"classes={','.join(view['classes'])}" if view["classes"] else "",
                "signed" if view["signed"] else "",
            ) if part
        )
        print(f"{view['id']}  {view['kind']}  {view['target']}  {filters}".rstrip())
        delivery = view.get("delivery")
        if delivery:
            print(f"    {describe_delivery(delivery)}")
    return 0


def describe_delivery(delivery: dict[str, Any]) -> str:
    """One line on a webhook's delivery queue, as `webhooks list` prints it."""
    state = delivery.get("state") or "ok"
    head = f"dead since {delivery.get('dead_since')}" if state == "dead" else state
    parts = [f"{delivery.get('pending', 0)} pending", f"{delivery.get('delivered', 0)} delivered"]
    if delivery.get("dead_lettered"):
        parts.append(f"{delivery['dead_lettered']} dead-lettered")
    if delivery.get("last_error"):
        parts.append(f"last error: {delivery['last_error']} at {delivery.get('last_error_at')}")
    if delivery.get("next_retry_at"):
        parts.append(f"next retry {delivery['next_retry_at']}")
    return f"{head}: " + "; ".join(parts)


@webhooks.command("remove", short_help="Remove a webhook by URL or id, or all of them.")
@worker_api_options
@click.argument("url", metavar="[URL]", required=False)
@click.option("--id", "registration_id", help="Webhook id (from list).")
@click.option("--all", "everything", is_flag=True, help="Remove every webhook of the job.")
def remove(job: str, api: str | None, token_file: str | None, config: str | None, url: str | None,
           registration_id: str | None, everything: bool) -> int:
    """Remove the job's webhook at URL, or the one with --id, or all of them."""
    if not (url or registration_id or everything):
        raise click.UsageError("give a URL, --id or --all")
    from correlator.sinks.webhooks.client import ClientError

    client = _worker_client(api, token_file, config)
    try:
        removed = client.remove(job, url=url, registration_id=registration_id, everything=everything)
    except (ClientError, OSError) as exc:
        return _report(exc)
    print(f"removed {removed} webhook(s) of job {job}")
    return 0
