"""The incident's timeline, laid out: which events go on which lane, where on a time axis with breaks.

Events are placed on skew-corrected time; lines without a rank take the rank their (host, pid) announced
in its NCCL init line, and lines without a host the host other lines name for their rank (an NCCL init
line, any line with both) or for their file (when the file's lines name one host only). Long quiet
stretches (the NCCL watchdog's 10 minutes) are cut out of the axis and shown as a break, so the failure
and its consequences are both readable. Logs whose times could not be read are laid out in line order,
not piled on one instant. No markup here: `html` draws it.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from correlator.diagnosis.engine import estimate_host_offsets
from correlator.diagnosis.models import Incident, Signal

BREAK_W = 26
MIN_CLUSTER_W = 150
NOTED_SKEW_S = 0.05  # a host clock off by this much or more is noted on the picture

Lane = tuple[str, int | None]  # (host or "", rank or None for the host's kernel and launcher lines)


@dataclass
class TimelineEvent:
    lane: Lane
    t: float  # skew-corrected epoch seconds
    cls: str
    rule: str
    line: str
    role: str  # initiator | cause | collateral
    count: int = 1
    logged: float | None = None  # the time as logged (before the skew correction)


@dataclass
class Story:
    """What the picture draws: its events, the host clock offsets, and how it was laid out."""

    events: list[TimelineEvent]
    offsets: dict[str, float]
    line_order: bool = False  # no usable times: events in line order, the axis counts lines
    reordered: bool = False  # the skew correction put some events in another order than their logged times

    def clock_note(self) -> str | None:
        """The hosts whose clocks the picture corrected noticeably, largest first: "node04's clock ran 0.8 s
        ahead; shown corrected." None when no host's was."""
        hosts = {e.lane[0] for e in self.events}
        off = sorted(((h, o) for h, o in self.offsets.items() if h in hosts and abs(o) >= NOTED_SKEW_S),
                     key=lambda ho: (-abs(ho[1]), ho[0]))
        if not off:
            return None
        clauses = [f"{h}'s clock ran {_seconds(abs(o))} {'ahead' if o > 0 else 'behind'}" for h, o in off[:5]]
        if len(off) > 5:
            clauses.append(f"{len(off) - 5} more hosts' clocks were off too")
        note = "; ".join(clauses) + "; shown corrected."
        if self.reordered:
            note += " Corrected, some lines are drawn in another order than their logged times."
        return note


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 0.1 else f"{value:.2f} s"


def parse_iso(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def same_line(a: str, b: str) -> bool:
    a, b = a.strip(), b.strip()
    return bool(a) and (a == b or a.endswith(b) or b.endswith(a))


# --- time ------------------------------------------------------------------------------------


def _fill_ranks(signals: Sequence[Signal]) -> list[Signal]:
    """Give lines without a rank the rank their (host, pid) announced in its NCCL init line."""
    mapping: dict[tuple[str, int], int] = {}
    for s in signals:
        if s.kind == "fact" and "comm_rank" in s.fields and s.host and s.pid is not None:
            mapping.setdefault((s.host, s.pid), int(s.fields["comm_rank"]))
    return [s.model_copy(update={"rank": mapping[(s.host, s.pid)]})
            if s.rank is None and s.host and s.pid is not None and (s.host, s.pid) in mapping else s
            for s in signals]


def _known_hosts(signals: Sequence[Signal]) -> tuple[dict[int, str], dict[str, str]]:
    """The host of each rank, and of each file, as other lines tell them: an NCCL init line's host for its
    communicator rank, any line naming both a rank and a host; a file whose lines name one host only."""
    by_rank: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    by_file: dict[str, set[str]] = defaultdict(set)
    for s in signals:
        if not s.host:
            continue
        if s.file:
            by_file[s.file].add(s.host)
        rank = s.rank
        if rank is None and s.kind == "fact" and "comm_rank" in s.fields:
            rank = int(s.fields["comm_rank"])
        if rank is not None:
            by_rank[rank][s.host] += 1
    ranks = {r: max(hosts, key=lambda h: (hosts[h], h)) for r, hosts in by_rank.items()}
    files = {f: next(iter(hosts)) for f, hosts in by_file.items() if len(hosts) == 1}
    return ranks, files


def _corrected_times(signals: Sequence[Signal], offsets: dict[str, float]) -> dict[int, float | None]:
    """Skew-corrected epoch seconds; an untimed line takes the time of the previous timed one of its file."""
    times: dict[int, float | None] = {}
    by_file: dict[str | None, list[Signal]] = defaultdict(list)
    for s in signals:
        by_file[s.file].append(s)
    for members in by_file.values():
        members.sort(key=lambda s: s.order)
        last: float | None = None
        for s in members:
            ts = s.ts or s.received_ts
            if ts is not None:
                last = ts.timestamp() - offsets.get(s.host or "", 0.0)
            times[id(s)] = last
    return times


@dataclass
class _Cluster:
    start: float
    end: float
    x0: float = 0.0
    width: float = 0.0

    def x(self, t: float) -> float:
        span = self.end - self.start
        return self.x0 + (self.width * (t - self.start) / span if span > 0 else self.width / 2)


class Axis:
    """Piecewise-linear time axis: busy stretches get the width, quiet gaps collapse to a break."""

    def __init__(self, times: Sequence[float], width: float) -> None:
        ts = sorted(times)
        span = ts[-1] - ts[0] if ts else 0.0
        gap_limit = max(5.0, 0.08 * span)
        clusters: list[_Cluster] = []
        for t in ts:
            if clusters and t - clusters[-1].end <= gap_limit:
                clusters[-1].end = t
            else:
                clusters.append(_Cluster(t, t))
        for c in clusters:
            pad = max(0.25, 0.06 * (c.end - c.start))
            c.start -= pad
            c.end += pad
        self.clusters = clusters
        usable = width - BREAK_W * max(0, len(clusters) - 1)
        spans = [c.end - c.start for c in clusters]
        total = sum(spans) or 1.0
        min_w = min(MIN_CLUSTER_W, usable / max(1, len(clusters)))
        widths = [max(min_w, usable * s / total) for s in spans]
        scale = usable / sum(widths)
        x = 0.0
        for c, w in zip(clusters, widths, strict=True):
            c.x0, c.width = x, w * scale
            x += c.width + BREAK_W
        self.width = width

    def x(self, t: float) -> float:
        for i, c in enumerate(self.clusters):
            if t <= c.end or i == len(self.clusters) - 1:
                return max(c.x0, min(c.x0 + c.width, c.x(t))) if t >= c.start or i == 0 else c.x0
        return self.width

    def breaks(self) -> list[tuple[float, float]]:
        """(x of the break, seconds skipped) between consecutive clusters."""
        pairs = zip(self.clusters, self.clusters[1:], strict=False)
        return [(a.x0 + a.width + BREAK_W / 2, b.start - a.end) for a, b in pairs]

    def ticks(self) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        for c in self.clusters:
            span = c.end - c.start
            n = max(2, int(c.width // 95))
            raw = span / n if span > 0 else 1.0
            mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
            step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
            t = math.ceil(c.start / step) * step
            while t <= c.end:
                out.append((c.x(t), t))
                t += step
        return out

    def cluster_of(self, t: float) -> int:
        return next(i for i, c in enumerate(self.clusters) if c.start - 1e-9 <= t <= c.end + 1e-9)


# --- events ----------------------------------------------------------------------------------


def incident_events(incident: Incident, signals: Sequence[Signal] | None) -> Story:
    """The events of the story (the job's matched lines, or the incident's own evidence) and the host offsets."""
    ini = incident.initiator
    events: list[TimelineEvent] = []
    offsets: dict[str, float] = {}
    line_order = False
    if signals:
        sigs = _fill_ranks(list(signals))
        offsets = estimate_host_offsets(sigs)
        host_of_rank, host_of_file = _known_hosts(sigs)
        matches = [s for s in sigs if s.class_ and s.kind == "match"]
        times = _corrected_times(sigs, offsets)
        # No usable times (none parsed, or all one instant): lay the lines out in their order instead.
        line_order = len(matches) > 1 and len({times.get(id(s)) for s in matches} - {None}) < 2
        if line_order:
            ordered = sorted(matches, key=lambda s: (s.order, s.file or ""))
            times = {id(s): float(n) for n, s in enumerate(ordered)}
        lo = parse_iso(incident.window_start)
        hi = parse_iso(incident.window_end)
        initiator_found = False
        for s in matches:
            t = times.get(id(s))
            if t is None:
                continue  # facts (init lines, steps, progress) time other lines; they are not events of the story
            if not line_order and lo is not None and hi is not None and not (lo - 60 <= t <= hi + 60):
                continue
            is_init = (
                not initiator_found
                and s.rule_id == ini.rule
                and same_line(s.line, ini.line)
                and (ini.rank is None or s.rank is None or s.rank == ini.rank)
            )
            host = s.host or (host_of_rank.get(s.rank) if s.rank is not None else None) or host_of_file.get(s.file or "")
            lane = (host or "", s.rank)
            if is_init:
                initiator_found = True
                role = "initiator"
                # Draw it on the initiator's rank lane even when the line itself (a kernel Xid line) had no rank.
                rank = ini.rank if ini.rank is not None else s.rank
                lane = (ini.host or host or (host_of_rank.get(rank, "") if rank is not None else ""), rank)
            elif s.class_ == incident.class_:
                role = "cause"
            else:
                role = "collateral"
            logged = None if line_order else _logged(s)
            events.append(TimelineEvent(lane=lane, t=t, cls=s.class_ or "", rule=s.rule_id, line=s.line, role=role,
                                        logged=logged))
        if not initiator_found:
            event = _initiator_event(incident)
            if line_order:
                event.t = -1.0  # before the lines: it was not among them
            elif event.lane[0] == "" and event.lane[1] is not None:
                event.lane = (host_of_rank.get(event.lane[1], ""), event.lane[1])
            events.append(event)
    else:
        events.append(_initiator_event(incident))
        for ev in incident.evidence:
            t = parse_iso(ev.ts)
            if t is None or (ev.rule == ini.rule and same_line(ev.line, ini.line)):
                continue
            events.append(TimelineEvent((ev.host or "", ev.rank), t, ev.rule, ev.rule, ev.line, "collateral"))
    events = [e for e in events if math.isfinite(e.t)]
    return Story(events, offsets, line_order=line_order, reordered=_reordered(events))


def _logged(signal: Signal) -> float | None:
    ts = signal.ts or signal.received_ts
    return ts.timestamp() if ts is not None else None


def _reordered(events: Sequence[TimelineEvent]) -> bool:
    """Did the correction put two events in another order than their logged times?"""
    timed = sorted((e for e in events if e.logged is not None), key=lambda e: (e.logged or 0.0, e.t))
    return any(b.t < a.t - 1e-6 for a, b in itertools.pairwise(timed))


def _initiator_event(incident: Incident) -> TimelineEvent:
    ini = incident.initiator
    t = parse_iso(ini.ts) or parse_iso(incident.window_start) or 0.0
    return TimelineEvent((ini.host or "", ini.rank), t, incident.class_, ini.rule, ini.line, "initiator")


def collapse_ranks(events: Sequence[TimelineEvent], keep_rank: int | None) -> None:
    """Put every rank's events on its host's lane, except the initiator's (the event and its rank's lane)."""
    for e in events:
        if e.lane[1] is not None and e.lane[1] != keep_rank and e.role != "initiator":
            e.lane = (e.lane[0], None)


def dedupe(events: list[TimelineEvent], axis: Axis) -> list[TimelineEvent]:
    """One marker per lane, class and 2-pixel slot; the count goes into the tooltip."""
    kept: dict[tuple[object, ...], TimelineEvent] = {}
    for e in events:
        if e.role == "initiator":
            kept[("initiator", id(e))] = e
            continue
        key = (e.lane, e.cls, e.role, round(axis.x(e.t) / 2))
        if key in kept:
            kept[key].count += 1
        else:
            kept[key] = e
    return list(kept.values())


def lanes_by_host(events: Sequence[TimelineEvent], incident: Incident) -> list[tuple[str, list[int | None]]]:
    """Hosts in rank order, each with its host lane (None) first when used, then its ranks."""
    host_of_rank: dict[int, str] = {}
    for e in events:
        host, rank = e.lane
        if rank is not None and host:
            host_of_rank.setdefault(rank, host)
    ranks_by_host: dict[str, set[int]] = defaultdict(set)
    host_lane: set[str] = set()
    for e in events:
        host, rank = e.lane
        if rank is None:
            host_lane.add(host)
        else:
            ranks_by_host[host or host_of_rank.get(rank, "")].add(rank)
    ini = incident.initiator
    if ini.rank is not None:
        ranks_by_host[ini.host or host_of_rank.get(ini.rank, "")].add(ini.rank)
    hosts = set(ranks_by_host) | host_lane
    order = sorted(hosts, key=lambda h: (min(ranks_by_host[h]) if ranks_by_host.get(h) else 10**9, h))
    out: list[tuple[str, list[int | None]]] = []
    for host in order:
        lanes: list[int | None] = [None] if host in host_lane else []
        lanes.extend(sorted(ranks_by_host.get(host, set())))
        out.append((host, lanes))
    return out
