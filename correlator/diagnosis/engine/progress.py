"""Collective progress, per process group: who the others waited for, and who issued a different collective.

ProcessGroupNCCL counts the collectives of each process group (`SeqNum`). When a collective hangs, every
rank that joined it waits and its watchdog reports the failing work with the group's counters: the last
work it *enqueued* and the last that *completed*. Nobody completes the hung collective, so "last
completed" is the same on every rank; the stuck rank is the one whose *enqueued* counter lags (it never
reached the collective), or the one member missing from the group's reports. Counters of different groups
count different collectives and are never compared. The same SeqNum with a different OpType or element
count on one rank is a collective mismatch, and that rank is named.
"""

from __future__ import annotations

from dataclasses import dataclass

from correlator.diagnosis.engine.facts import GroupProgress

_DEFAULT_GROUPS = ("0", "default_pg")
UNKNOWN_GROUP = "0"  # watchdog lines of older releases name no group: they are the default group's


@dataclass(frozen=True)
class Suspect:
    rank: int
    reason: str
    strong: bool
    pg: str
    mismatch: bool = False


def _pg_name(pg: str) -> str:
    return "the default process group" if pg in _DEFAULT_GROUPS else f"process group {pg}"


def mismatch_suspect(groups: dict[str, GroupProgress]) -> Suspect | None:
    """A rank that issued a different collective (op or element count) at a SeqNum the others share."""
    for pg, group in sorted(groups.items(), key=lambda kv: kv[1].first_ts or float("inf")):
        by_seq: dict[str, dict[str, list[int]]] = {}
        for shape, ranks in group.collectives.items():
            seq, _, rest = shape.partition("|")
            by_seq.setdefault(seq, {})[rest] = list(ranks)
        for seq, shapes in sorted(by_seq.items(), key=lambda kv: int(kv[0])):
            if len(shapes) < 2:
                continue
            ordered = sorted(shapes.items(), key=lambda kv: len(kv[1]))
            odd_shape, odd_ranks = ordered[0]
            common_shape, common_ranks = ordered[-1]
            if len(odd_ranks) == 1 and len(common_ranks) >= 2:
                return Suspect(
                    odd_ranks[0],
                    f"rank {odd_ranks[0]} issued {_describe(odd_shape)} as collective {seq} of {_pg_name(pg)} while "
                    f"{len(common_ranks)} other rank(s) issued {_describe(common_shape)}",
                    True,
                    pg,
                    mismatch=True,
                )
    return None


def _describe(shape: str) -> str:
    op, numel_in, numel_out = ([*shape.split("|"), "", "", ""])[:3]
    numel = f" (NumelIn={numel_in}, NumelOut={numel_out})" if numel_in or numel_out else ""
    return f"{op}{numel}"


def hang_suspect(groups: dict[str, GroupProgress], world_size: int | None) -> Suspect | None:
    """The rank the timed-out group waited for, from the group that reported first."""
    reported = [g for g in groups.values() if g.reporters]
    for group in sorted(reported, key=lambda g: g.first_ts or float("inf")):
        lag = _enqueued_lag(group)
        if lag is not None:
            return lag
        missing = _missing_member(group, world_size)
        if missing is not None:
            return missing
    return None


def _enqueued_lag(group: GroupProgress) -> Suspect | None:
    per_rank = group.enqueued.per_rank()
    if len(per_rank) < 2:
        return None
    low, high = min(per_rank.values()), max(per_rank.values())
    if low == high:
        return None
    laggards = sorted(r for r, v in per_rank.items() if v == low)
    if len(laggards) != 1 and len(laggards) * 4 > len(per_rank):
        return None  # not one straggler: the group is split, or two jobs' counters mixed
    rank = laggards[0]
    return Suspect(
        rank,
        f"rank {rank} last enqueued collective {low} of {_pg_name(group.pg)} while the other "
        f"{len(per_rank) - len(laggards)} reporting rank(s) enqueued up to {high}: it never reached the collective "
        "the others waited in",
        True,
        group.pg,
    )


def _missing_member(group: GroupProgress, world_size: int | None) -> Suspect | None:
    reporters = set(group.reporters)
    if len(reporters) < 2:
        return None
    size = group.size or (world_size if group.pg in _DEFAULT_GROUPS else None)
    if size is None:
        return None
    if group.pg in _DEFAULT_GROUPS:
        expected = set(range(size))
        how = "world size from the launch lines" if world_size else "group size from its init line"
    else:
        members = set(group.members)
        if len(members) != size:
            return None  # the group's members are not all known: who is missing cannot be said
        expected = members
        how = "members from the group's own lines"
    missing = sorted(expected - reporters)
    if len(missing) != 1:
        return None
    rank = missing[0]
    return Suspect(
        rank,
        f"rank {rank} is the only member of {_pg_name(group.pg)} ({size} ranks, {how}) missing from its timeout reports",
        True,
        group.pg,
    )


def missing_reporter(reporters: set[int], known: set[int], world_size: int | None, at_least: int = 2) -> Suspect | None:
    """The one rank of the job that did not report a timeout or a peer's failure while every other did: the
    others waited for it. The job's ranks are the world size when a line gave it, else every rank some line
    named (a launcher's failure summary lists the rank it tore down; c10d's prefixes name the writer)."""
    if len(reporters) < at_least:
        return None
    expected = set(range(world_size)) if world_size else known | reporters
    missing = sorted(expected - reporters)
    if len(missing) != 1:
        return None
    rank = missing[0]
    how = (f"world size {world_size}" if world_size else
           f"the {len(expected)} ranks the job's lines name")
    return Suspect(
        rank,
        f"rank {rank} is the only one of {how} that reported no timeout or peer failure: the others waited for it",
        world_size is not None or rank in known,
        UNKNOWN_GROUP,
    )


def inferred_missing(reporters: set[int]) -> Suspect | None:
    """With no size known: the one gap in an otherwise contiguous run of reporting ranks (weak evidence)."""
    if len(reporters) < 4:
        return None
    gaps = sorted(set(range(max(reporters) + 1)) - reporters)
    if len(gaps) != 1:
        return None
    return Suspect(
        gaps[0],
        f"rank {gaps[0]} is the only rank missing from the timeout reports (world size inferred from the highest rank)",
        False,
        UNKNOWN_GROUP,
    )
