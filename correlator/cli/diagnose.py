"""`rootrank diagnose`: name the rank that broke a job, from its log files, with no services."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from correlator.cli.rules import load_ruleset_or_report
from correlator.diagnosis.models import SEVERITIES, SEVERITY_RANK, Incident, Signal

EXIT_CODES = """\b
Exit codes (the same for every --format):
  0  it ran (an incident found or not; without --fail-on)
  1  --fail-on SEVERITY: an incident (not a recovered failure) at or above it was found
  2  a usage error, a broken rule set, or input it could not read at all"""


def _scan_processes(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a whole number") from None
    if count < 0:
        raise click.BadParameter(f"{count} is negative: give 0 (automatic) or more")
    return count


@click.command("diagnose", epilog=EXIT_CODES,
               short_help="Name the rank that broke a job, from its log files (offline, no services).")
@click.argument("paths", metavar="PATH...", nargs=-1, required=True)
@click.option("--format", "output_format", type=click.Choice(["text", "json", "html"]), default="text",
              help="text: the report; json: {\"incidents\": [...], \"recovered\": [...]}; "
              "html: the picture of the first incident (one self-contained file).")
@click.option("--output", "-o", metavar="FILE", help="Write the output to FILE; when not given: stdout.")
@click.option("--fail-on", type=click.Choice(SEVERITIES), metavar="SEVERITY",
              help="Exit 1 when an incident of this severity or above was found (info, low, medium, high, "
              "critical), for CI and scripts; failures the job survived never count.")
@click.option("--job", help="Job id for the incident; when not given: derived from the file names.")
@click.option("--rules", "rules_dir", metavar="DIR",
              help="Rules folder; when not given: the installed library.")
@click.option("--progress", type=click.Choice(["auto", "always", "never"]), default="auto",
              help="Progress bar on stderr (auto: on a terminal, for inputs over 32 MiB).")
@click.option("--jobs", "-j", "scan_processes", default="0", metavar="N", callback=_scan_processes,
              help="Processes scanning a large plain file's 16 MiB chunks at once "
              "(0: one per available CPU, at most 8).")
def diagnose(paths: tuple[str, ...], output_format: str, output: str | None, fail_on: str | None,
             job: str | None, rules_dir: str | None, progress: str, scan_processes: int) -> int:
    """Name the rank that broke a job, from its log files (offline, no services).

    All given paths form one job: files, folders (recursive), .gz, or - for stdin.
    """
    import gc

    from correlator.cli import AS_PROGRAM, EXIT_AT_ONCE

    meta = click.get_current_context().meta
    meta[EXIT_AT_ONCE] = True
    # Start-up builds the engine's modules, the rule set and the matcher: many objects, no garbage worth
    # a collection, and collections during it were about a sixth of a one-line diagnosis. In the program
    # they live until it ends, so later collections need not walk them either (freeze).
    collecting = gc.isenabled()
    gc.disable()
    try:
        from correlator.offline.diagnose import (
            Diagnoser,
            DiagnoseStats,
            InputError,
            default_jobs,
            iter_sources,
        )

        ruleset = load_ruleset_or_report(rules_dir)
        if ruleset is None:
            return 2
        diagnoser = Diagnoser(ruleset, jobs=scan_processes or default_jobs())
        if meta.get(AS_PROGRAM):
            gc.freeze()
    finally:
        if collecting:
            gc.enable()
    stats = DiagnoseStats()
    sources = list(paths)
    try:
        total = sum(s.size or 0 for s in iter_sources(sources, DiagnoseStats()))
    except InputError as exc:
        print(f"rootrank diagnose: {exc}", file=sys.stderr)
        return 2
    show_progress = progress == "always" or (progress == "auto" and sys.stderr.isatty() and total > 32 << 20)
    try:
        if show_progress:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            err = Console(stderr=True)
            with Progress(
                "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn(), console=err, transient=progress != "always",
            ) as bar:
                task = bar.add_task("scanning", total=total or None)
                incidents, signals = diagnoser.diagnose(
                    sources, job, stats=stats, progress=lambda n: bar.advance(task, n)
                )
        else:
            incidents, signals = diagnoser.diagnose(sources, job, stats=stats)
    except InputError as exc:
        print(f"rootrank diagnose: {exc}", file=sys.stderr)
        return 2
    for skipped in stats.skipped:
        print(f"skipped: {skipped}", file=sys.stderr)
    if stats.decode_errors:
        print(f"skipped {stats.decode_errors} undecodable JSON line(s)", file=sys.stderr)
    if not stats.files and stats.skipped:
        print("rootrank diagnose: no input could be read", file=sys.stderr)
        return 2
    empty = stats.bytes == 0
    if empty:
        print(f"rootrank diagnose: the input has no lines ({stats.files} file(s), 0 bytes): nothing to diagnose",
              file=sys.stderr)
    failed = [i for i in incidents if not i.recovered]
    try:
        _write(output_format, output, incidents, signals, empty)
    except OSError as exc:
        print(f"rootrank diagnose: -o {output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if fail_on is not None:
        floor = SEVERITY_RANK[fail_on]
        if any(SEVERITY_RANK[i.severity] >= floor for i in failed):
            return 1
    return 0


def _write(output_format: str, output: str | None, incidents: list[Incident], signals: list[Signal], empty: bool) -> None:
    """The report in its format, to FILE or stdout."""
    import io

    if output_format == "json":
        # failures the job survived are warnings, never "the" incident: they have their own list
        from correlator.render.json_report import report_json

        data = report_json(incidents)
    elif output_format == "html":
        if incidents:
            from correlator.render.html import render_incident_html

            data = render_incident_html(incidents[0], signals).encode("utf-8")
        else:
            # A page that says so: a CI job publishing the picture, or someone opening it, sees why it is empty.
            from correlator.render.html import render_no_incident_html

            verdict = ("The input has no lines: nothing to diagnose." if empty
                       else "No incident: no failure signature in these logs.")
            data = render_no_incident_html(verdict).encode("utf-8")
    else:
        if output is None and not incidents:
            if not empty:  # as print_incidents says it, without loading the renderer (most of a clean run's start-up)
                click.echo(click.style("No incident:", fg="green") + " no failure signature in these logs.")
            return
        from rich.console import Console

        from correlator.render.text import print_incidents

        if output is None:
            print_incidents(incidents, Console(emoji=False))
            return
        buffer = io.StringIO()
        print_incidents(incidents, Console(file=buffer, emoji=False, width=100, color_system=None))
        data = buffer.getvalue().encode("utf-8")
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        Path(output).write_bytes(data)
        print(f"wrote {output}", file=sys.stderr)
