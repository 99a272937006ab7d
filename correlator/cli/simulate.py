"""`rootrank simulate`: write the logs of a simulated failing multi-rank job, with the truth beside them."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import click


def _iso_time(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    """An ISO 8601 time; one without a zone is UTC."""
    if not value:
        return None
    from datetime import UTC

    try:
        start = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time") from None
    return start if start.tzinfo else start.replace(tzinfo=UTC)


@click.command("simulate",
               short_help="Write the logs of a simulated failing multi-rank job, with the truth beside them.")
@click.option("--class", "failure_class", metavar="SLUG",
              help="Failure class to simulate; when not given: gpu_hardware_error.")
@click.option("--demo", is_flag=True, help="Use the bundled demo scenario's wording; rank 37 initiates.")
@click.option("--world-size", type=int, default=64, help="Ranks in the job.")
@click.option("--hosts", type=int, default=8, help="Hosts the ranks are spread over.")
@click.option("--seed", type=int, default=0,
              help="Seed of every random choice, so that a run can be repeated.")
@click.option("--skew-max-s", type=float, default=3.0,
              help="Per-host clock skew, drawn from +-this many seconds.")
@click.option("--format", "log_format",
              type=click.Choice(["plain", "fluentbit", "vector", "filebeat", "rsyslog"]),
              default="plain", help="Plain per-host log files, or the messages of this forwarder.")
@click.option("--layout", type=click.Choice(["hosts", "single", "logdir"]), default="hosts",
              help="Plain logs: a file per host, the whole job in one file, or torchrun's --log-dir tree per host.")
@click.option("--noise-lines", type=int, default=24,
              help="Training-chatter lines per rank before the failure.")
@click.option("--late-lines", type=int, default=0, help="Timestamped lines that arrive 5-60 s late.")
@click.option("--initiator-rank", type=int, help="The failing rank; when not given: drawn from the seed.")
@click.option("--out", default="simulated", metavar="DIR", help="Folder to write (logs/ and truth.json).")
@click.option("--start", callback=_iso_time, metavar="TIME",
              help="Job start time, ISO 8601; when not given: the job ends just now (found by `incidents --since 1h`).")
@click.option("--list-classes", is_flag=True, help="Print the class slugs and exit.")
def simulate(failure_class: str | None, demo: bool, world_size: int, hosts: int, seed: int, skew_max_s: float,
             log_format: str, layout: str, noise_lines: int, late_lines: int, initiator_rank: int | None, out: str,
             start: datetime | None, list_classes: bool) -> int:
    """Write the logs of a simulated failing multi-rank job, with the truth beside them.

    One log file per host (plain), or one file of forwarder messages, plus truth.json.
    --demo: 64 ranks on 8 hosts, the GPU of rank 37 falls off the bus (Xid 79).
    """
    from correlator.tooling.simulate import SimulateError, classes
    from correlator.tooling.simulate import simulate as write_simulated_job

    if list_classes:
        for slug in classes():
            print(slug)
        return 0
    if demo and initiator_rank is None:
        initiator_rank = 37 if world_size > 37 else None
    try:
        truth = write_simulated_job(
            failure_class or "gpu_hardware_error", world_size=world_size, hosts=hosts, seed=seed,
            skew_max_s=skew_max_s, fmt=log_format, noise_lines=noise_lines, late_lines=late_lines,
            out=Path(out),
            initiator_rank=initiator_rank, demo=demo, start=start, layout=layout,
        )
    except SimulateError as exc:
        print(f"rootrank simulate: {exc}", file=sys.stderr)
        return 2
    who = ("every rank" if truth.initiator.all else "no visible rank" if truth.initiator.unknown
           else f"the launcher on {truth.initiator.host}" if truth.initiator.host_only
           else f"rank {truth.initiator.rank} on {truth.initiator.host}")
    print(f"{truth.class_} ({truth.story}): {who} initiates; {truth.world_size} ranks on {len(truth.hosts)} hosts; "
          f"wrote {len(truth.files)} log file(s) and truth.json to {out}; "
          f"diagnose with: rootrank diagnose {Path(out) / truth.job_id}")
    return 0
