"""What `rootrank ship` is told (`ShipOptions`) and what it counts while shipping (`ShipStats`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

# --host-from: where a file's lines get their host when they do not name one themselves.
HOST_FROM = ("dir", "stem", "prefix")
_LOG_SUFFIXES = (".gz", ".log", ".out", ".err", ".txt")


def host_from_path(path: str, rule: str | None) -> str | None:
    """The host `rule` reads from a file's path: `dir`, its folder's name (`logs/node04/rank-37.log` ->
    node04); `stem`, its name without log suffixes (`logs/node04.log`, `node04.err.gz` -> node04);
    `prefix` or None: no host from the path (each line's own prefix, else the machine's name)."""
    pure = PurePath(path)
    if rule == "dir":
        return pure.parent.name or None
    if rule == "stem":
        name = pure.name
        stripped = True
        while stripped:
            stripped = False
            for suffix in _LOG_SUFFIXES:
                if name.lower().endswith(suffix) and len(name) > len(suffix):
                    name, stripped = name[: -len(suffix)], True
        return name or None
    return None


@dataclass
class ShipOptions:
    kafka: dict[str, Any] = field(default_factory=lambda: {"bootstrap_servers": "127.0.0.1:9092"})
    topic: str = "rootrank.logs"
    job_id: str | None = None
    host: str | None = None  # default: this machine's name
    # dir | stem: each file's host from its path (host_from_path); prefix (the default): the lines' own.
    # Whatever the shipper says, a host the line names itself wins (ingest/decoders/events.py).
    host_from: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    attempt: int | None = None  # default: TORCHELASTIC_RESTART_COUNT when set
    labels: dict[str, str] = field(default_factory=dict)
    batch_max_bytes: int = 256 * 1024
    linger_s: float = 0.5
    compression: str = "auto"  # auto | gzip | lz4 | snappy | zstd | none
    idempotence: bool = True
    state_dir: Path = Path(".rootrank-ship")
    spool_max_bytes: int = 1024 * 1024 * 1024
    queue_max_bytes: int = 64 * 1024 * 1024
    drain_timeout_s: float = 30.0
    follow: bool = False
    from_start: bool = False  # ship files from their first line, whatever was shipped to this Kafka before
    tee: bool = False
    poll_s: float = 0.2
    send_timeout_s: float = 30.0
    # Edge matching (--evidence-only): an object with select(key, first_line, texts) -> [(first_line, texts)]
    # and heartbeat(key, final=bool) -> runs (correlator.diagnosis.evidence.EvidenceFilter); None ships every line.
    line_filter: Any = None
    # Called once in the shipping process with (ShipStats, line_filter): e.g. starts a /metrics server.
    on_start: Callable[[Any, Any], None] | None = None
    # Backlog progress on stderr when shipping files (ingest.ship.progress): auto | always | never.
    progress: str = "never"
    progress_interval_s: float = 5.0  # between plain status lines (stderr not a terminal)


@dataclass
class ShipStats:
    lines: int = 0
    messages: int = 0
    acked_messages: int = 0
    acked_lines: int = 0
    spooled_messages: int = 0
    dropped_messages: int = 0
    dropped_lines: int = 0
    pending_messages: int = 0  # still in the spool at exit (sent by the next run)
    spooled_lines: int = 0
    # Files' backlog (their bytes from the starting positions to their sizes when shipping started):
    # bytes acknowledged by Kafka, and bytes in messages dropped because the spool was full (none
    # since files' messages wait for room instead; kept for the display's arithmetic).
    backlog_acked_bytes: int = 0
    backlog_dropped_bytes: int = 0
    # Files' messages that waited for room in the spool (backpressure), and those still waiting when
    # the shipper stopped: not shipped by this run, their saved positions before them (the next run does).
    waited_messages: int = 0
    deferred_messages: int = 0
    deferred_lines: int = 0
