"""What the commands share about settings: the --config and connection options, the flags that override
the loaded settings, the context of a running `rootrank up`, and where each value came from
(`rootrank config show`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from correlator.config import Settings
    from correlator.tooling.context import StackContext

F = TypeVar("F", bound=Callable[..., Any])

# Settings a running `rootrank up` provides through its context file: setting -> context field.
CONTEXT_FIELDS = {
    "kafka.bootstrap_servers": "broker",
    "elasticsearch.url": "es_url",
    "webhooks.api_token": "token",
}

SETTINGS_EPILOG = ("Every setting (file, environment, defaults) and where its value comes from: "
                   "rootrank config show.")


def config_option(function: F) -> F:
    return click.option(
        "--config", metavar="FILE",
        help="YAML settings file; when not given: $ROOTRANK_CONFIG, else none.",
    )(function)


def es_url_option(function: F) -> F:
    return click.option(
        "--es-url", metavar="URL",
        help="Elasticsearch URL; when not given: $ROOTRANK_ELASTICSEARCH__URL, the config file, "
        "a running `rootrank up`, else http://127.0.0.1:9200.",
    )(function)


def bootstrap_option(function: F) -> F:
    return click.option(
        "--bootstrap", metavar="HOST:PORT[,...]",
        help="Kafka bootstrap servers; when not given: $ROOTRANK_KAFKA__BOOTSTRAP_SERVERS, the config file, "
        "a running `rootrank up`, else 127.0.0.1:9092.",
    )(function)


def loglevel_option(function: F) -> F:
    return click.option(
        "--loglevel", default="warning", type=click.Choice(["debug", "info", "warning", "error"]),
        help="Least severe log record the worker prints.",
    )(function)


def format_option(*choices: str, default: str = "text", what: str = "") -> Callable[[F], F]:
    """The one way every command picks its output: --format CHOICE (with -o FILE where it writes)."""
    def decorate(function: F) -> F:
        return click.option(
            "--format", "output_format", type=click.Choice(list(choices)), default=default,
            help=what or f"Output format: {', '.join(choices)}.",
        )(function)
    return decorate


def config_file_path(config: str | None) -> str | None:
    return config or os.environ.get("ROOTRANK_CONFIG") or None


def _file_data(config: str | None) -> dict[str, Any]:
    import yaml

    path = config_file_path(config)
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            loaded = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise click.UsageError(f"config file {path}: {exc.strerror or exc}") from None
    return loaded if isinstance(loaded, dict) else {}


def _flatten(data: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in data.items():
        if isinstance(value, dict) and value and key != "receivers":
            yield from _flatten(value, f"{prefix}{key}.")
        yield f"{prefix}{key}"


def env_setting_names() -> dict[str, str]:
    """Settings (dotted) given by ROOTRANK_* variables -> the variable."""
    out: dict[str, str] = {}
    for name in os.environ:
        upper = name.upper()
        if upper.startswith("ROOTRANK_") and upper not in ("ROOTRANK_CONFIG", "ROOTRANK_CONTEXT"):
            out[upper.removeprefix("ROOTRANK_").lower().replace("__", ".")] = name
    return out


@dataclass
class LoadedSettings:
    settings: Settings
    sources: dict[str, str]  # dotted setting -> default | file PATH | env NAME | rootrank up | flag
    context: StackContext | None


def load_cli_settings(config: str | None, *, es_url: str | None = None, bootstrap: str | None = None,
                      partitions: int | None = None, use_context: bool = False) -> Settings:
    """Flags, then ROOTRANK_* environment, then the config file, then (use_context) a running
    `rootrank up`, then the defaults: the first that says."""
    return load_with_sources(config, es_url=es_url, bootstrap=bootstrap, partitions=partitions,
                             use_context=use_context).settings


def load_with_sources(config: str | None, *, es_url: str | None = None, bootstrap: str | None = None,
                      partitions: int | None = None, use_context: bool = True) -> LoadedSettings:
    from pydantic import SecretStr

    from correlator.config import load_settings

    try:
        settings = load_settings(config)
    except OSError as exc:
        raise click.UsageError(f"config file {config_file_path(config)}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    path = config_file_path(config)
    sources: dict[str, str] = dict.fromkeys(_flatten(_file_data(config)), f"file {path}")
    sources.update({name: f"env {var}" for name, var in env_setting_names().items()})
    context = None
    if use_context:
        from correlator.tooling.context import read_context

        context = read_context()
    if context is not None:
        for setting, field_name in CONTEXT_FIELDS.items():
            if setting in sources:
                continue
            value = getattr(context, field_name)
            section, _, name = setting.partition(".")
            setattr(getattr(settings, section), name, SecretStr(value) if name == "api_token" else value)
            sources[setting] = "rootrank up"
    for setting, value in (("elasticsearch.url", es_url), ("kafka.bootstrap_servers", bootstrap),
                           ("topics.partitions", partitions)):
        if value:
            section, _, name = setting.partition(".")
            setattr(getattr(settings, section), name, value)
            sources[setting] = "flag"
    return LoadedSettings(settings, sources, context)


def settings_rows(loaded: LoadedSettings) -> list[tuple[str, Any, str, str, str]]:
    """(setting, value, source, environment variable, description) of every setting; secrets masked."""
    from pydantic import BaseModel, SecretStr

    from correlator.config import Settings

    rows: list[tuple[str, Any, str, str, str]] = []

    def walk(model: type[BaseModel], value: Any, prefix: str, env: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            current = getattr(value, name)
            dotted = f"{prefix}{name}"
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, current, f"{dotted}.", f"{env}{name.upper()}__")
                continue
            if isinstance(current, SecretStr) or (current and any(w in name for w in ("password", "api_key"))):
                current = "********"
            source = loaded.sources.get(dotted) or next(
                (s for k, s in loaded.sources.items() if dotted.startswith(k + ".")), "default")
            rows.append((dotted, current, source, f"{env}{name.upper()}", field.description or ""))

    walk(Settings, loaded.settings, "", "ROOTRANK_")
    return rows


class SettingsHelpCommand(click.Command):
    """A command whose settings come from the config file and environment: its --help says where to see them."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        formatter.write_paragraph()
        formatter.write_text(SETTINGS_EPILOG)
