"""`rootrank ship`: send log lines to Kafka from files, stdin or a wrapped command."""

from __future__ import annotations

from pathlib import Path

import click

from correlator.cli.settings import SettingsHelpCommand, bootstrap_option, config_option, load_cli_settings


def _labels(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"wants KEY=VALUE, got {item!r}")
        labels[key] = value
    return labels


def _positive_seconds(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if value <= 0:
        raise click.BadParameter("wants a positive number of seconds")
    return value


PROGRESS_HELP = (
    "With --file: progress through the files' backlog (their bytes from where shipping starts, resuming "
    "after a restart, to their sizes at start) on stderr: bytes acknowledged by Kafka, rate, ETA, lines sent "
    "and spooled; ends with a 'caught up' line (--follow then goes on live). auto: a bar on a terminal, for "
    "backlogs over 32 MiB; always: a bar on a terminal, else a plain status line every --progress-interval "
    "seconds. Never when wrapping a command or reading stdin."
)


@click.command(
    "ship", cls=SettingsHelpCommand, context_settings={"allow_interspersed_args": False},
    short_help="Send log lines to Kafka: follow files, read stdin, or wrap a command.",
)
@config_option
@bootstrap_option
@click.option("--job", help="Job id; when not given: derived by the worker from labels, paths or the host.")
@click.option("--host", help="Host name to tag lines with; when not given: this machine's.")
@click.option("--rank", type=int, help="Global rank, when one process writes the stream.")
@click.option("--local-rank", type=int, help="Rank within its host, when one process writes the stream.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", callback=_labels,
              help="Label added to every batch (repeatable).")
@click.option("--file", "-f", "files", multiple=True, metavar="PATH", help="A log file to ship (repeatable).")
@click.option("--follow", is_flag=True, help="Keep following the files (rotation-aware) until interrupted.")
@click.option("--tee", is_flag=True, help="With stdin: also copy the input to stdout.")
@click.option("--topic", help="Topic to send to; when not given: topics.logs.")
@click.option("--batch-kib", type=int, default=256, help="Largest size of one message, in KiB.")
@click.option("--linger-ms", type=int, default=500, help="Longest time a line waits for its batch, in ms.")
@click.option("--compression",
              type=click.Choice(["auto", "gzip", "lz4", "snappy", "zstd", "none"]), default="auto",
              help="Message compression (auto: lz4 when installed, else gzip).")
@click.option("--state-dir", default=".rootrank-ship", metavar="DIR",
              help="Where the positions of followed files and the spool are kept.")
@click.option("--send-timeout", type=float, default=30.0,
              help="Seconds the producer keeps retrying a message before it goes to the disk spool.")
@click.option("--no-idempotence", is_flag=True,
              help="Use a plain (non-idempotent) producer, for brokers without idempotence support.")
@click.option("--spool-max-mib", type=int, default=1024, help="Disk spool bound while Kafka is down, in MiB.")
@click.option("--drain-timeout", type=float, default=30.0,
              help="Seconds to keep sending after the input ends (the rest stays spooled).")
@click.option("--evidence-only", is_flag=True,
              help="Match in the shipper; send only lines that hit a rule, with --context lines around them, "
              "plus a periodic per-stream heartbeat (identity, latest progress).")
@click.option("--context", type=int, default=5, help="With --evidence-only: lines before and after a hit.")
@click.option("--heartbeat-s", type=float, default=30.0,
              help="With --evidence-only: heartbeat period in seconds.")
@click.option("--metrics-port", type=int, metavar="PORT",
              help="Serve Prometheus /metrics and /healthz on this port; when not given: off.")
@click.option("--metrics-bind", default="127.0.0.1", help="Address for --metrics-port (0.0.0.0 in a pod).")
@click.option("--progress", type=click.Choice(["auto", "always", "never"]), default="auto",
              help=PROGRESS_HELP)
@click.option("--progress-interval", type=float, default=5.0, metavar="SECONDS", callback=_positive_seconds,
              help="Seconds between the plain status lines of --progress always (stderr not a terminal).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ship(config: str | None, bootstrap: str | None, job: str | None, host: str | None, rank: int | None,
         local_rank: int | None, labels: dict[str, str], files: tuple[str, ...], follow: bool, tee: bool,
         topic: str | None, batch_kib: int, linger_ms: int, compression: str, state_dir: str,
         send_timeout: float,
         no_idempotence: bool, spool_max_mib: int, drain_timeout: float, evidence_only: bool, context: int,
         heartbeat_s: float, metrics_port: int | None, metrics_bind: str, progress: str,
         progress_interval: float, command: tuple[str, ...]) -> int:
    """Send log lines to Kafka: follow files, read stdin, or wrap a command.

    \b
    rootrank ship --job J --file rank0.log --follow
    some_command | rootrank ship --job J
    rootrank ship --job J --rank 3 -- torchrun --nproc-per-node 8 train.py

    A wrapped command (-- COMMAND ARGS...) has its stdout/stderr pass through unchanged and is never
    slowed: lines are batched in the background, and spooled to disk while Kafka is slow or down.
    """
    import logging

    from correlator.stream.setup_topics import kafka_python_config
    from ingest.ship.runner import ShipOptions, run_ship

    logging.basicConfig(level=logging.WARNING, format="rootrank ship: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # its reconnect chatter; we report outages once

    settings = load_cli_settings(config, bootstrap=bootstrap)
    options = ShipOptions(
        kafka=kafka_python_config(settings.kafka),
        topic=topic or settings.topics.logs,
        job_id=job,
        host=host,
        rank=rank,
        local_rank=local_rank,
        labels=labels,
        batch_max_bytes=batch_kib * 1024,
        linger_s=linger_ms / 1000.0,
        compression=compression,
        state_dir=Path(state_dir),
        spool_max_bytes=spool_max_mib * 1024 * 1024,
        drain_timeout_s=drain_timeout,
        follow=follow,
        tee=tee,
        idempotence=not no_idempotence,
        send_timeout_s=send_timeout,
        progress=progress,
        progress_interval_s=progress_interval,
    )
    if evidence_only:
        from correlator.diagnosis.evidence import EvidenceFilter
        from correlator.diagnosis.matcher import Matcher
        from correlator.diagnosis.rules import load_ruleset

        rules_dir = settings.engine.rules_dir
        options.line_filter = EvidenceFilter(Matcher(load_ruleset(Path(rules_dir) if rules_dir else None)),
                                             context=context, heartbeat_s=heartbeat_s)
    if metrics_port is not None:
        from correlator.stream.metrics import ship_metrics_hook

        options.on_start = ship_metrics_hook(metrics_port, metrics_bind)
    return run_ship(options, files=list(files), command=list(command))
