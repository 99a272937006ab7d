"""`rootrank` command line: the root group, one module per command group beside it.

Each command imports what it needs (faust, Kafka, Elasticsearch, hyperscan, the rule set) inside its
function, so that `rootrank diagnose` and `--help` do not pay for the streaming stack.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator, MutableMapping
from typing import NoReturn

import click

# name -> "module:attribute", in the order `rootrank --help` lists them. A command's module is imported
# when the command runs (or --help lists it), so `rootrank diagnose` does not import the others.
COMMANDS = {
    "diagnose": "correlator.cli.diagnose:diagnose",
    "serve": "correlator.cli.serve:serve",
    "simulate": "correlator.cli.simulate:simulate",
    "incidents": "correlator.cli.search:incidents",
    "hosts": "correlator.cli.search:hosts",
    "show": "correlator.cli.search:show",
    "setup": "correlator.cli.stream:setup",
    "rules": "correlator.cli.rules:rules",
    "worker": "correlator.cli.stream:worker",
    "ship": "correlator.cli.ship:ship",
    "replay": "correlator.cli.replay:replay",
    "up": "correlator.cli.stream:up",
    "webhooks": "correlator.cli.webhooks:webhooks",
    "config": "correlator.cli.config:config_group",
}


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's commands, each imported from its module the first time it is asked for."""

    def __init__(self, where: dict[str, str]) -> None:
        self._where = dict(where)
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            module, _, attribute = self._where[name].partition(":")  # KeyError: no such command
            command = self._loaded[name] = getattr(importlib.import_module(module), attribute)
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._where.setdefault(name, "")
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._where[name]
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


class OrderedGroup(click.Group):
    """A group whose --help lists its commands in the order they were added, not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        package = version("rootrank")
    except PackageNotFoundError:
        package = "unknown"
    try:
        from correlator.diagnosis.rules import load_ruleset

        ruleset = load_ruleset()
        rules_text = f"rule set {ruleset.version} ({len(ruleset.rules)} rules)"
    except Exception as exc:  # noqa: BLE001 - the version must print even with a broken library
        rules_text = f"rule set not loadable: {exc}"
    click.echo(f"rootrank {package}, {rules_text}")
    ctx.exit(0)


@click.group(
    "rootrank", cls=OrderedGroup,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True, "max_content_width": 110},
    epilog="Exit codes: 0 the command ran; 1 it ran and found what it reports as a failure (diagnose "
    "--fail-on, a service that did not answer); 2 a usage error or input it could not read; 130 interrupted.",
)
@click.option("--version", "-V", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version and the rule set's version, and exit.")
def rootrank() -> None:
    """Find which rank broke a distributed training job, and why."""


rootrank.commands = LazyCommands(COMMANDS)


# In the context's `meta`: set by `main` when it runs as the program (not called by a test or a library);
# set by a command that has flushed and closed what it wrote by the time it returns.
AS_PROGRAM = "rootrank.as_program"
EXIT_AT_ONCE = "rootrank.exit_at_once"


def _exit_at_once(code: int) -> NoReturn:
    """End the process without the interpreter's teardown, which frees every module and object one by one:
    for a one-line `diagnose` that was about a sixth of its wall time."""
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass  # a reader that went away, or a stream already closed: nothing more can reach it
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run one command; its return value is the exit code (2 for a usage error, 130 when interrupted).
    Run as the program (no `argv`), a command that asks for it ends the process here (`EXIT_AT_ONCE`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        with rootrank.make_context("rootrank", args) as ctx:
            ctx.meta[AS_PROGRAM] = argv is None
            code = int(rootrank.invoke(ctx) or 0)
        if argv is None and ctx.meta.get(EXIT_AT_ONCE):
            _exit_at_once(code)
        return code
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.format_message())
        return 2
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
