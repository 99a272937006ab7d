"""`rootrank config show`: every setting, its value and where that value came from."""

from __future__ import annotations

import sys

import click

from correlator.cli.settings import config_option, format_option, load_with_sources, settings_rows


@click.group("config", short_help="Show the settings the commands run with, and where each comes from.")
def config_group() -> None:
    """Show the settings the commands run with, and where each comes from.

    A setting comes from, first that says: a command's flag, its ROOTRANK_<SECTION>__<NAME> environment
    variable, the YAML file of --config or $ROOTRANK_CONFIG, a running `rootrank up` (its context file:
    Kafka, Elasticsearch, API token), else its default.
    """


@config_group.command("show", short_help="Print every setting with its value, source and variable.")
@config_option
@format_option("text", "json", what="text: one setting a line; json: one object with every setting.")
@click.option("--all", "show_all", is_flag=True, help="Also print each setting's description.")
def show(config: str | None, output_format: str, show_all: bool) -> int:
    """Print every setting with its value, where the value came from, and its environment variable.

    Secrets (passwords, keys, the API token) are printed as ********.
    """
    import orjson

    loaded = load_with_sources(config)
    rows = settings_rows(loaded)
    if output_format == "json":
        payload = {name: {"value": value, "source": source, "env": env} for name, value, source, env, _ in rows}
        sys.stdout.buffer.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2, default=str) + b"\n")
        return 0
    width = max(len(f"{name} = {value!r}") for name, value, *_ in rows)
    for name, value, source, env, description in rows:
        print(f"{f'{name} = {value!r}':{width}s}  {source:<14s}  {env}")
        if show_all and description:
            print(f"    {description}")
    if loaded.context is not None:
        print(f"\n(rootrank up is running: pid {loaded.context.pid}, API {loaded.context.api_url})")
    return 0
