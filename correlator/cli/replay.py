"""`rootrank replay`: a job's lines, read again from the logs topic, diagnosed offline with today's rules."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import click

from correlator.cli.diagnose import EXIT_CODES, _write
from correlator.cli.rules import load_ruleset_or_report
from correlator.diagnosis.models import SEVERITIES, SEVERITY_RANK


def _since(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    """`2h`, `30m`, `1d` ago, or an ISO 8601 time (UTC when it names no zone)."""
    if not value:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[-1:] in units and value[:-1].replace(".", "", 1).isdigit():
        return datetime.now(UTC) - timedelta(seconds=float(value[:-1]) * units[value[-1]])
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give a duration (30m, 2h, 1d) or an ISO 8601 time") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@click.command("replay", epilog=EXIT_CODES,
               short_help="Diagnose a job again from its lines in Kafka (after a rule change).")
@click.option("--job", required=True, help="The job to replay (its lines' job id, as the worker reads it).")
@click.option("--config", "-c", metavar="FILE", help="Config file; when not given: $ROOTRANK_CONFIG.")
@click.option("--bootstrap", help="Kafka bootstrap servers; when not given: the settings, or a running `rootrank up`.")
@click.option("--since", callback=_since, metavar="WHEN",
              help="Read the topic from this time (30m, 2h, 1d ago, or ISO 8601); when not given: from its start.")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "html"]), default="text",
              help="As `rootrank diagnose --format`.")
@click.option("--output", "-o", metavar="FILE", help="Write the output to FILE; when not given: stdout.")
@click.option("--fail-on", type=click.Choice(SEVERITIES), metavar="SEVERITY",
              help="Exit 1 when an incident of this severity or above was found.")
@click.option("--rules", "rules_dir", metavar="DIR",
              help="Rules folder; when not given: the installed library (or the settings' rules_dir).")
def replay(job: str, config: str | None, bootstrap: str | None, since: datetime | None, output_format: str,
           output: str | None, fail_on: str | None, rules_dir: str | None) -> int:
    """Diagnose a job again from the lines the logs topic holds, with today's rules.

    Reads the logs topic from its start (or --since) to its end, decodes every value as the worker does,
    keeps the job's lines and runs the engine on them as `rootrank diagnose` does: the report, JSON and
    incident ids are those of `diagnose` on the same lines, so they can be compared with the stored
    incidents (`rootrank incidents --job J`) after a rule change.
    """
    from correlator.cli.settings import load_cli_settings
    from correlator.stream.replay import ReplayStats, replay_job

    settings = load_cli_settings(config, bootstrap=bootstrap, use_context=True)
    ruleset = load_ruleset_or_report(rules_dir or settings.engine.rules_dir)
    if ruleset is None:
        return 2
    show = sys.stderr.isatty()

    def progress(stats: ReplayStats) -> None:
        if show:
            print(f"\rrootrank replay: {stats.values} messages read, {stats.lines} lines decoded", end="", file=sys.stderr)

    try:
        incidents, signals, stats = replay_job(settings, job, ruleset, since=since, progress=progress)
    except Exception as exc:  # noqa: BLE001 - Kafka unreachable, no such topic: said, exit 2
        print(f"rootrank replay: cannot read {settings.topics.logs} at {settings.kafka.bootstrap_servers}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if show:
        print(file=sys.stderr)
    print(f"rootrank replay: {stats.values} messages read from {settings.topics.logs} ({stats.partitions} "
          f"partitions) in {stats.seconds:.1f} s; {stats.lines} lines decoded, {len(signals)} signals of job {job}"
          + (f", {stats.dead_letters} undecodable values" if stats.dead_letters else ""), file=sys.stderr)
    if not signals:
        print(f"rootrank replay: no line of job {job} in {settings.topics.logs}"
              + (" since then" if since else " (its retention may have removed them)"), file=sys.stderr)
    try:
        _write(output_format, output, incidents, signals, not signals)
    except OSError as exc:
        print(f"rootrank replay: -o {output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if fail_on is not None:
        floor = SEVERITY_RANK[fail_on]
        if any(SEVERITY_RANK[i.severity] >= floor for i in incidents if not i.recovered):
            return 1
    return 0
