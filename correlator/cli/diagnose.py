"""`rootrank diagnose`: name the rank that broke a job, from its log files, with no services."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from correlator.cli.rules import load_ruleset_or_report


def _scan_processes(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a whole number") from None
    if count < 0:
        raise click.BadParameter(f"{count} is negative: give 0 (automatic) or more")
    return count


@click.command("diagnose",
               short_help="Name the rank that broke a job, from its log files (offline, no services).")
@click.argument("paths", metavar="PATH...", nargs=-1, required=True)
@click.option("--format", "output_format", type=click.Choice(["text", "json", "html"]), default="text",
              help="What to print: a text report, the incidents' JSON, "
              "or an HTML picture of the first incident.")
@click.option("--job", help="Job id for the incident; when not given: derived from the file names.")
@click.option("--output", "-o", metavar="FILE",
              help="With --format html: the file to write; when not given: rootrank-incident.html.")
@click.option("--rules", "rules_dir", metavar="DIR",
              help="Rules folder; when not given: the installed library.")
@click.option("--progress", type=click.Choice(["auto", "always", "never"]), default="auto",
              help="Progress bar on stderr (auto: on a terminal, for inputs over 32 MiB).")
@click.option("--jobs", "-j", "scan_processes", default="0", metavar="N", callback=_scan_processes,
              help="Processes scanning a large plain file's 16 MiB chunks at once "
              "(0: one per available CPU, at most 8).")
def diagnose(paths: tuple[str, ...], output_format: str, job: str | None, output: str | None,
             rules_dir: str | None, progress: str, scan_processes: int) -> int:
    """Name the rank that broke a job, from its log files (offline, no services).

    All given paths form one job: files, folders (recursive), .gz, or - for stdin.
    """
    import orjson
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from correlator.offline.diagnose import Diagnoser, DiagnoseStats, InputError, default_jobs, iter_sources
    from correlator.render.text import print_incidents

    err = Console(stderr=True)
    ruleset = load_ruleset_or_report(rules_dir)
    if ruleset is None:
        return 1
    diagnoser = Diagnoser(ruleset, jobs=scan_processes or default_jobs())
    stats = DiagnoseStats()
    sources = list(paths)
    try:
        total = sum(s.size or 0 for s in iter_sources(sources, DiagnoseStats()))
    except InputError as exc:
        print(f"rootrank diagnose: {exc}", file=sys.stderr)
        return 2
    show_progress = progress == "always" or (progress == "auto" and err.is_terminal and total > 32 << 20)
    try:
        if show_progress:
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
    if output_format == "json":
        # failures the job survived are warnings, never "the" incident: they have their own list
        payload = {"incidents": [i.to_json_dict() for i in incidents if not i.recovered],
                   "recovered": [i.to_json_dict() for i in incidents if i.recovered]}
        sys.stdout.buffer.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2) + b"\n")
    elif output_format == "html":
        from correlator.render.html import render_incident_html

        out = Path(output or "rootrank-incident.html")
        if not incidents:
            print("No incident: nothing to draw.", file=sys.stderr)
            return 0
        out.write_text(render_incident_html(incidents[0], signals), encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    else:
        print_incidents(incidents, Console(emoji=False))
    if output_format != "json" and not stats.files and stats.skipped:
        return 2
    return 0
