"""How the engine reads a signal: its time, its place in the total order, who wrote it, the key that makes
its repeats one entry, its process group. Shared by the job state's tables and by the engine that reads
them (timeline, causality, incidents)."""

from __future__ import annotations

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


def process_key(signal: Signal) -> str:
    """Who wrote or is named by a signal, as precisely as it says."""
    if signal.rank is not None:
        return f"r{signal.rank}"
    if signal.host and signal.pid is not None:
        return f"{signal.host}|p{signal.pid}"
    if signal.host and signal.local_rank is not None:
        return f"{signal.host}|l{signal.local_rank}"
    if signal.pid is not None:
        return f"p{signal.pid}"
    return f"f:{signal.file or ''}|{signal.host or ''}"


def who_of_key(key: str) -> tuple[str | None, int | None, int | None, int | None]:
    """(host, rank, local rank, pid) a `process_key` was made of (what it kept of them)."""
    if key.startswith("r") and key[1:].isdigit():
        return None, int(key[1:]), None, None
    if key.startswith("p") and key[1:].isdigit():
        return None, None, None, int(key[1:])
    if key.startswith("f:"):
        host = key.rpartition("|")[2]
        return host or None, None, None, None
    host, _, who = key.rpartition("|")
    if who[1:].isdigit():
        if who.startswith("p"):
            return host or None, None, None, int(who[1:])
        if who.startswith("l"):
            return host or None, None, int(who[1:]), None
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
