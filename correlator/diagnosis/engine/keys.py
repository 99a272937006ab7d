"""How the engine reads a signal: its time, its place in the total order, who wrote it, the key that makes
its repeats one entry, its process group. Shared by the job state's tables and by the engine that reads
them (timeline, causality, incidents)."""

from __future__ import annotations

import re

from correlator.diagnosis.models import Signal
from correlator.diagnosis.signals import TIME_BORROWED


def time_of(signal: Signal) -> float | None:
    ts = signal.ts or signal.received_ts
    return ts.timestamp() if ts is not None else None


def has_own_time(signal: Signal) -> bool:
    """The line carried its time (or a forwarder stamped it); not one borrowed from an earlier line."""
    return time_of(signal) is not None and not signal.fields.get(TIME_BORROWED)


def sort_key(signal: Signal) -> tuple[float, int]:
    t = time_of(signal)
    return (t if t is not None else float("inf"), signal.order)


def sample_key(signal: Signal) -> tuple[float, str, int, str]:
    """The order of an aggregate's sample lines, total and the same offline and streamed: a line's own time
    (not one borrowed from an earlier line offline, nor a forwarder's receive time when streamed), then who
    wrote it and its text."""
    own = signal.ts.timestamp() if signal.ts is not None and not signal.fields.get(TIME_BORROWED) else float("inf")
    return (own, signal.host or "", -1 if signal.rank is None else signal.rank, signal.line)


_LOG_DIR_RUN = re.compile(r"(?:^|/)[^/]+/attempt_\d+/")


def file_node(file: str | None) -> str:
    """The node a file without a host name is the log of: the file itself (one launcher's console), or, for
    torchrun's `--log-dir` tree, the folder above `<run>/attempt_N/` (one node's workers, all its files)."""
    path = file or ""
    m = _LOG_DIR_RUN.search(path)
    return "f:" + (path[: m.start()] if m else path)


def node_of(signal: Signal) -> str:
    """The launcher's node a line belongs to: its host, else its file's node (`file_node`)."""
    return signal.host or file_node(signal.file)


def process_key(signal: Signal) -> str:
    """Who wrote or is named by a signal, as precisely as it says: its global rank, else its node (its host,
    else its file's) and its pid or local rank there, else only where it was written (`a:`, anonymous)."""
    if signal.rank is not None:
        return f"r{signal.rank}"
    if signal.pid is not None:
        return f"{node_of(signal)}|p{signal.pid}"
    if signal.local_rank is not None:
        return f"{node_of(signal)}|l{signal.local_rank}"
    return f"a:{signal.file or ''}|{signal.host or ''}"


def is_anonymous(key: str) -> bool:
    """A process key that names no process (only the file and host a line came from)."""
    return key.startswith("a:")


def who_of_key(key: str) -> tuple[str | None, int | None, int | None, int | None]:
    """(node, rank, local rank, pid) a `process_key` was made of (what it kept of them)."""
    if key.startswith("r") and key[1:].isdigit():
        return None, int(key[1:]), None, None
    if is_anonymous(key):
        return None, None, None, None
    node, _, who = key.rpartition("|")
    if who[1:].isdigit():
        if who.startswith("p"):
            return node, None, None, int(who[1:])
        if who.startswith("l"):
            return node, None, int(who[1:]), None
    return None, None, None, None


def dedupe_key(signal: Signal) -> str:
    marker = signal.fields.get("marker", "")
    return "|".join(
        str(v)
        for v in (signal.rule_id, signal.kind, marker, signal.rank, signal.local_rank, signal.host, signal.pid,
                  signal.gpu, signal.attempt)
    )


def pg_of(signal: Signal) -> str | None:
    pg = signal.fields.get("pg")
    return None if pg is None or pg == "" else str(pg)
