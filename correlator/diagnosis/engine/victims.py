"""Victims: a process whose first failure was a consequence did not start the cascade.

When one rank dies, every peer in a collective with it fails a moment later: gloo's "Connection closed by
peer", NCCL's remote-error and watchdog lines, the launcher's SIGTERM. Many of those peers then fail again
on their own: std::terminate aborts them (SIGABRT, exit -6), their exception handlers raise, their launcher
reports them failed. Those later failures look like causes, and a clock that runs ahead or a buffer flushed
late can put them before the real death. What decides is the order within each process, which no clock
skew changes: a process that logged a consequence (a peer's failure) before a failure of its own was
already a victim when that failure came. Its later failures explain nothing and initiate nothing.

The first consequence of each process is kept by the job's facts (`JobFacts.onsets`, keyed by the process
as its line named it); here both sides are resolved to global ranks, so a launcher's report of a local
rank meets the rank's own lines.
"""

from __future__ import annotations

from collections.abc import Iterable

from correlator.diagnosis.engine.causality import Node
from correlator.diagnosis.engine.facts import JobFacts, Onset
from correlator.diagnosis.engine.identity import IdentityResolver
from correlator.diagnosis.engine.keys import process_key, time_of, who_of_key
from correlator.diagnosis.models import Signal


def first_consequences(facts: JobFacts, resolver: IdentityResolver) -> dict[str, list[tuple[int, Onset]]]:
    """Each process's consequences kept by the facts (its first and its latest), with their attempts, keyed by
    its resolved process key."""
    out: dict[str, list[tuple[int, Onset]]] = {}
    for raw_key, kept in facts.onsets.items():
        node, rank, local, pid = who_of_key(raw_key)
        if rank is None and node is not None:
            rank = resolver.rank_of(node, local, pid)
        key = raw_key if rank is None else f"r{rank}"
        host = node if node is not None and not node.startswith("f:") else None
        for stored in dict.fromkeys(kept):
            onset = facts.onset(stored)
            attempt = facts.attempt_at(onset.t, host, onset.file, onset.order)
            out.setdefault(key, []).append((attempt, onset))
    return out


VICTIM_WINDOW_S = 120.0  # a victim fails again within this long of the consequence it saw (its abort, its exit)


def within_cascade(onset: Onset, later: Signal) -> bool:
    """A victim's own failure follows the consequence it logged within seconds (the watchdog aborts, the
    launcher reports its exit); one long after it is something else (a relaunch no line records). A later
    line's time borrowed from an earlier line is a lower bound, which is enough to say it came long after."""
    t = time_of(later)
    return onset.t is None or t is None or t - onset.t <= VICTIM_WINDOW_S


def victims(candidates: Iterable[Node], onsets: dict[str, list[tuple[int, Onset]]]) -> dict[int, Onset]:
    """The candidates (by id) whose own process logged a consequence before them in the same attempt."""
    out: dict[int, Onset] = {}
    for node in candidates:
        if node.aggregate is not None:
            continue
        mine = Onset.of(node.signal)
        for attempt, onset in onsets.get(process_key(node.signal), ()):
            if attempt == node.attempt and onset.before(mine) and within_cascade(onset, node.signal):
                out[id(node)] = onset
                break
    return out
