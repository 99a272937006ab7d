"""`rootrank ship`: send log lines to Kafka from files, stdin or a wrapped command."""

from __future__ import annotations

import glob
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


class ShipCommand(SettingsHelpCommand):
    """`ship [OPTIONS] [FILE|GLOB]... [-- COMMAND ARGS...]`: what follows the first `--` is the command to
    wrap, untouched; everything before it is options and files (so `--file a.log b.log` ships both)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta["ship_command"] = args[at + 1:]
            args = args[:at]
        else:
            ctx.meta["ship_command"] = []
        return super().parse_args(ctx, args)


def expand_inputs(patterns: list[str]) -> list[str]:
    """Files and globs (`*`, `?`, `[...]`, `**`) in the order given, each file once; a glob that matches
    nothing is an error (a typo must not ship nothing and exit 0)."""
    out: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
            if not matches:
                raise click.BadParameter(f"no file matches {pattern!r}", param_hint="FILE")
        else:
            matches = [pattern]
        for match in matches:
            key = str(Path(match).resolve())
            if key not in seen:
                seen.add(key)
                out.append(match)
    return out


PROGRESS_HELP = (
    "With --file: progress through the files' backlog (their bytes from where shipping starts, resuming "
    "after a restart, to their sizes at start) on stderr: bytes acknowledged by Kafka, rate, ETA, lines sent "
    "and spooled; ends with a 'caught up' line (--follow then goes on live). auto: a bar on a terminal, for "
    "backlogs over 32 MiB; always: a bar on a terminal, else a plain status line every --progress-interval "
    "seconds. Never when wrapping a command or reading stdin."
)


@click.command(
    "ship", cls=ShipCommand,
    short_help="Send log lines to Kafka: files (globs too), stdin, or a wrapped command.",
)
@config_option
@bootstrap_option
@click.option("--job", help="Job id; when not given: derived by the worker from labels, paths or the host.")
@click.option("--host", help="Host name of lines that do not name their own; when not given: see --host-from.")
@click.option("--host-from", type=click.Choice(["dir", "stem", "prefix"]), default=None,
              help="Where a file's lines get their host when they name none: dir, the file's folder "
              "(logs/node04/rank-37.log -> node04); stem, its name (logs/node04.log -> node04); prefix (the "
              "default), the lines' own prefixes and the path's conventions, as for `diagnose` (a wrapped command "
              "or stdin: this machine's name). Always: a host the line names itself wins (a syslog or kernel "
              "line's hostname, pdsh's 'host: ', NCCL's host:pid:tid), as it says where the line was written.")
@click.option("--rank", type=int, help="Global rank, when one process writes the stream.")
@click.option("--local-rank", type=int, help="Rank within its host, when one process writes the stream.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", callback=_labels,
              help="Label added to every batch (repeatable).")
@click.option("--file", "-f", "files", multiple=True, metavar="PATH",
              help="A log file or glob to ship (repeatable; more files and globs may follow as arguments).")
@click.option("--follow", is_flag=True, help="Keep following the files (rotation-aware) until interrupted.")
@click.option("--from-start", is_flag=True,
              help="Ship the files from their first line, also what was shipped to this Kafka before.")
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
@click.argument("paths", metavar="[FILE|GLOB]... [-- COMMAND [ARGS]...]", nargs=-1)
@click.pass_context
def ship(click_ctx: click.Context, config: str | None, bootstrap: str | None, job: str | None, host: str | None,
         host_from: str | None, rank: int | None,
         local_rank: int | None, labels: dict[str, str], files: tuple[str, ...], follow: bool, from_start: bool,
         tee: bool,
         topic: str | None, batch_kib: int, linger_ms: int, compression: str, state_dir: str,
         send_timeout: float,
         no_idempotence: bool, spool_max_mib: int, drain_timeout: float, evidence_only: bool, context: int,
         heartbeat_s: float, metrics_port: int | None, metrics_bind: str, progress: str,
         progress_interval: float, paths: tuple[str, ...]) -> int:
    """Send log lines to Kafka: files (globs too), stdin, or a wrapped command.

    \b
    rootrank ship --job J --file rank0.log --follow
    rootrank ship --job J --file 'logs/*/*.log' /var/log/kern.log
    rootrank ship --job J --host-from dir --file 'logs/*/*.log'      (logs/node04/x.log: host node04)
    some_command | rootrank ship --job J
    rootrank ship --job J --rank 3 -- torchrun --nproc-per-node 8 train.py

    Files are the --file values and the arguments before `--`; everything after `--` is the command
    to wrap. No file and no command: stdin. A wrapped command has its stdout/stderr pass through
    unchanged and is never slowed: lines are batched in the background, and spooled to disk while
    Kafka is slow or down. Kafka: --bootstrap, $ROOTRANK_KAFKA__BOOTSTRAP_SERVERS, the config file,
    a running `rootrank up`, else 127.0.0.1:9092 (the compose stack's host port is localhost:29092).

    \b
    Exit codes: the wrapped command's; else 0 shipped (or stopped while waiting for Kafka);
    1 lines of stdin or a command were dropped (spool full); 2 a usage error (a glob matching nothing).
    """
    command: list[str] = click_ctx.meta.get("ship_command", [])
    inputs = expand_inputs([*files, *paths])
    if command and inputs:
        raise click.UsageError("give files or a command after --, not both")
    if host and host_from:
        raise click.UsageError("give --host or --host-from, not both")
    if host_from in ("dir", "stem") and not inputs:
        raise click.UsageError(f"--host-from {host_from} reads the host from each file's path: give files")
    import logging

    from correlator.stream.setup_topics import kafka_python_config
    from ingest.ship.runner import ShipOptions, run_ship

    logging.basicConfig(level=logging.WARNING, format="rootrank ship: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # its reconnect chatter; we report outages once

    settings = load_cli_settings(config, bootstrap=bootstrap, use_context=True)
    options = ShipOptions(
        kafka=kafka_python_config(settings.kafka),
        topic=topic or settings.topics.logs,
        job_id=job,
        host=host,
        host_from=host_from,
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
        from_start=from_start,
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
    return run_ship(options, files=inputs, command=command)
