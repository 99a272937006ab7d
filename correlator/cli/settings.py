"""What the commands share about settings: the --config and connection options, the flags that override
the loaded settings, and the table of every setting that `worker`, `ship` and `up` print in --help."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from correlator.config import Settings

F = TypeVar("F", bound=Callable[..., Any])


def config_option(function: F) -> F:
    return click.option(
        "--config", metavar="FILE",
        help="YAML settings file; when not given: $ROOTRANK_CONFIG, else the built-in defaults.",
    )(function)


def es_url_option(function: F) -> F:
    return click.option(
        "--es-url", metavar="URL", help="Elasticsearch URL; when not given: the config's elasticsearch.url.",
    )(function)


def bootstrap_option(function: F) -> F:
    return click.option(
        "--bootstrap", metavar="HOST:PORT[,...]",
        help="Kafka bootstrap servers; when not given: the config's kafka.bootstrap_servers.",
    )(function)


def loglevel_option(function: F) -> F:
    return click.option(
        "--loglevel", default="warning", type=click.Choice(["debug", "info", "warning", "error"]),
        help="Least severe log record the worker prints.",
    )(function)


def load_cli_settings(config: str | None, *, es_url: str | None = None, bootstrap: str | None = None,
                      partitions: int | None = None) -> Settings:
    """Config file, then ROOTRANK_* environment, then the command-line flags that were given."""
    from correlator.config import load_settings

    settings = load_settings(config)
    if es_url:
        settings.elasticsearch.url = es_url
    if bootstrap:
        settings.kafka.bootstrap_servers = bootstrap
    if partitions:
        settings.topics.partitions = partitions
    return settings


def settings_table() -> list[tuple[str, str]]:
    """Every setting with its default, its environment variable (nested with __) and its description."""
    from pydantic import BaseModel

    from correlator.config import Settings

    rows: list[tuple[str, str]] = []

    def walk(model: type[BaseModel], prefix: str, env: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name}.", f"{env}{name.upper()}__")
                continue
            default = field.get_default(call_default_factory=True)
            note = f"  {field.description}" if field.description else ""
            rows.append((f"{prefix}{name} = {default!r}", f"[{env}{name.upper()}]{note}"))

    walk(Settings, "", "ROOTRANK_")
    return rows


class SettingsHelpCommand(click.Command):
    """A command whose --help ends with the settings table; built only when help is shown, so that
    starting the command does not pay for importing the settings models."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        with formatter.section("Settings (YAML file via --config or ROOTRANK_CONFIG, or environment)"):
            formatter.write_dl(settings_table())
