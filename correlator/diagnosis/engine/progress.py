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

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

from correlator.diagnosis.engine.facts import GroupProgress, UnnamedCollective
from correlator.diagnosis.engine.rankset import RankSet

_DEFAULT_GROUPS = ("0", "default_pg")
UNKNOWN_GROUP = "0"  # watchdog lines of older releases name no group: they are the default group's


@dataclass(frozen=True)
class Suspect:
    rank: int
    reason: str
    strong: bool
    pg: str
    mismatch: bool = False


UNNAMED_PREFIX = "?"  # a group inferred from its members' reports, not named by any line


def _pg_name(pg: str) -> str:
    if pg.startswith(UNNAMED_PREFIX):
        return f"the process group (no line names it) of {pg[len(UNNAMED_PREFIX):]}"
    return "the default process group" if pg in _DEFAULT_GROUPS else f"process group {pg}"


def unnamed_groups(unnamed: dict[str, UnnamedCollective], attempt: int) -> dict[str, GroupProgress]:
    """The groups behind watchdog reports that name no group, one per group that failed the collective.

    A line gives its writer's global rank (`[rank485]:`) and its rank within the group (`[Rank 1]`). The
    groups torch and Megatron build are arithmetic: tensor-parallel groups consecutive ranks, data- and
    pipeline-parallel ones every k-th rank. So the reports of one collective split, under one stride, into
    runs that share a base (global = base + stride x rank within the group); each run is one group, and its
    members are base + stride x i for i up to the highest rank within it that reported. (A member above that
    one cannot be seen.)"""
    out: dict[str, GroupProgress] = {}
    for key, collective in unnamed.items():
        seen_attempt, _, shape = key.partition(":")
        if seen_attempt != str(attempt) or len(collective.reports) < 2:
            continue
        pairs = [(within, rank) for rank, (within, _t, _host) in collective.reports.items()]
        stride = _stride(pairs)
        if stride is None:
            continue
        runs: dict[int, list[int]] = {}
        for within, rank in pairs:
            runs.setdefault(rank - stride * within, []).append(rank)
        seq, op = ([*shape.split("|"), ""])[:2]
        for base, ranks in runs.items():
            if len(ranks) < 2 or base < 0:
                continue
            highest = max(collective.reports[r][0] for r in ranks)
            pg = f"{UNNAMED_PREFIX}collective {seq} ({op}) of ranks {base}+{stride}i"
            group = out[pg] = GroupProgress(
                pg=pg,
                size=highest + 1,
                members=RankSet(base + stride * i for i in range(highest + 1)),
                reporters=RankSet(ranks),
                timeout_ms=collective.timeout_ms,
            )
            for r in ranks:
                _within, t, host = collective.reports[r]
                if t is not None:
                    group.note_report(t, host)
    return out


def _stride(pairs: list[tuple[int, int]]) -> int | None:
    """The step between consecutive members that puts the reports in the fewest groups (the smallest step on
    a tie); None when no two reports fit any step."""
    sample = pairs[:64]
    strides = {
        (g2 - g1) // (w2 - w1)
        for (w1, g1), (w2, g2) in combinations(sample, 2)
        if w1 != w2 and (g2 - g1) % (w2 - w1) == 0 and (g2 - g1) // (w2 - w1) > 0
    }
    if not strides:
        return None
    return min(strides, key=lambda s: (len({g - s * w for w, g in pairs}), s))


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


def with_unnamed(groups: dict[str, GroupProgress], unnamed: dict[str, GroupProgress]) -> dict[str, GroupProgress]:
    """The named groups and the groups seen only in lines that leave the group's name out. An unnamed group
    whose reporters a named group holds is that group (torch prints a watchdog line without the group, then
    again with it). When both saw the same reporters, the members inferred from the ranks' stride complete
    the named group's, which are often only the ranks that reported; a few lines of a larger group say too
    little of it to add members."""
    out = dict(groups)
    for key, group in unnamed.items():
        covering = [k for k, g in groups.items() if group.reporters.bits & ~g.reporters.bits == 0]
        if not covering:
            out[key] = group
        for k in covering:
            named = out[k]
            if group.reporters == named.reporters and (named.size is None or len(named.members) < named.size):
                members = RankSet(bits=named.members.bits | group.members.bits)
                out[k] = named.model_copy(update={"members": members, "size": named.size or len(members)})
    return out


def hang_suspect(
    groups: dict[str, GroupProgress],
    world_size: int | None,
    correct: Callable[[float | None, str | None], float | None] = lambda t, _host: t,
) -> Suspect | None:
    """The rank the timed-out group waited for, from the group that reported first (on the common clock:
    `correct` puts a host's time on it)."""
    reported = [g for g in groups.values() if g.reporters]

    def first_report(group: GroupProgress) -> float:
        times = [c for host, t in group.first_by_host.items() if (c := correct(t, host or None)) is not None]
        if not times and group.first_ts is not None:
            times = [group.first_ts]
        return min(times, default=float("inf"))

    for group in sorted(reported, key=first_report):
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
        how = ("members from its reporters' ranks within it and in the job" if group.pg.startswith(UNNAMED_PREFIX)
               else "members from the group's own lines")
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
