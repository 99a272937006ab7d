"""The incident picture: one self-contained HTML file (inline CSS and SVG, no script, no network).

A swimlane per rank, grouped by host (plus one lane per host for kernel and launcher lines),
on a skew-corrected time axis (`timeline`). The initiating event is drawn on a marked lane
(`id="initiator-lane"`, the event itself `data-role="initiator"`); the collateral cascade follows
it. Beside it: the evidence lines, the fix and how to verify it. The markup is in the jinja2
templates of `templates/`; this module computes what they draw.
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jinja2
from markupsafe import Markup

from correlator.diagnosis.models import Incident, Signal
from correlator.render.timeline import (
    BREAK_W,
    Axis,
    Story,
    TimelineEvent,
    collapse_ranks,
    dedupe,
    incident_events,
    lanes_by_host,
    same_line,
)

LANE_H = 13
HOST_HEADER_H = 20
LABEL_W = 118
PLOT_W = 760
AXIS_H = 46
EVIDENCE_SHOWN = 5
MAX_RANK_LANES = 256  # beyond this, each host's ranks share the host's lane (the initiator keeps its own)

_ROLE_COLORS = {"initiator": "#d7191c", "cause": "#f28e2b"}
_PALETTE = ("#4e79a7", "#76b7b2", "#b07aa1", "#9c755f", "#59a14f", "#edc948", "#bab0ac", "#ff9da7", "#86bcb6")
_FIXED_CLASS_COLORS = {
    "nccl_timeout": "#4e79a7",
    "launcher_teardown": "#b07aa1",
    "nccl_error": "#76b7b2",
    "python_exception": "#9c755f",
}


def _escape_like_html_module(value: Any) -> Any:
    # Markup passes through; everything else is escaped by `html.escape` (quotes as &#x27;), as the
    # report always was, so documents and the tests' expectations keep their bytes.
    if hasattr(value, "__html__"):
        return value
    return Markup(html.escape(str(value), quote=True))


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("correlator.render", "templates"),
    autoescape=True,
    finalize=_escape_like_html_module,
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,
)


def _fmt_clock(t: float, digits: int = 3) -> str:
    d = datetime.fromtimestamp(t, UTC)
    frac = f"{d.microsecond / 1e6:.{digits}f}"[1:] if digits else ""
    return d.strftime("%H:%M:%S") + frac


def _fmt_rel(dt: float) -> str:
    sign = "+" if dt >= 0 else "\u2212"
    a = abs(dt)
    if a >= 60:
        return f"{sign}{int(a // 60)}m{a % 60:04.1f}s"
    if a >= 10:
        return f"{sign}{a:.1f}s"
    return f"{sign}{a:.2f}s"


def _class_color(cls: str) -> str:
    if cls in _FIXED_CLASS_COLORS:
        return _FIXED_CLASS_COLORS[cls]
    digest = int(hashlib.sha1(cls.encode()).hexdigest(), 16)
    return _PALETTE[digest % len(_PALETTE)]


def _ranges(values: Iterable[int]) -> str:
    """[0,1,2,3,5,7,8] -> '0-3, 5, 7-8'."""
    nums = sorted(set(values))
    out: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(out)


# --- what the swimlane SVG draws ---------------------------------------------------------------


@dataclass
class _HostHeader:
    y: int
    label: str


@dataclass
class _LaneRow:
    host: str
    rank: int | None
    y: int
    label: str
    is_initiator: bool
    fill: str


@dataclass
class _Tick:
    x: float
    clock: str | None  # the absolute time, on the first tick of each stretch of the axis
    relative: str


@dataclass
class _Break:
    x: float
    skipped: str
    title: str


@dataclass
class _Mark:
    role: str
    cls: str
    t: float
    x: float
    y: float
    color: str
    tip: str


def _tooltip(e: TimelineEvent, host: str, rank: int | None, offsets: dict[str, float], line_order: bool) -> str:
    who = f"rank {rank}" if rank is not None else "host"
    if line_order:
        tip = f"{who} on {host or '?'}, line {int(e.t) + 1} in line order (no time read)"
    else:
        skew = offsets.get(host)
        tip = f"{who} on {host or '?'} at {_fmt_clock(e.t)} (skew-corrected"
        tip += f"; host clock {_fmt_rel(skew)} off)" if skew else ")"
    tip += f"\n{e.cls} \u00b7 {e.rule}" + (f" \u00b7 {e.count} lines" if e.count > 1 else "")
    return tip + f"\n{e.line[:400]}"


def _swimlanes(incident: Incident, story: Story) -> dict[str, Any]:
    """The template context of the SVG: lanes, axis and markers, in page coordinates."""
    events, offsets, line_order = story.events, story.offsets, story.line_order
    axis = Axis([e.t for e in events], PLOT_W)
    ranks = {e.lane[1] for e in events if e.lane[1] is not None}
    collapsed = len(ranks) > MAX_RANK_LANES
    if collapsed:
        collapse_ranks(events, incident.initiator.rank)
    events = dedupe(events, axis)
    lanes = lanes_by_host(events, incident)
    # Events recorded without a host but with a rank land on that rank's lane wherever it is drawn.
    rank_host = {r: h for h, rs in lanes for r in rs if r is not None}
    initiator = next(e for e in events if e.role == "initiator")
    ini_host, ini_rank = initiator.lane
    ini_host = ini_host or (rank_host.get(ini_rank, "") if ini_rank is not None else "")
    if ini_rank is not None and ini_rank in rank_host:
        ini_host = rank_host[ini_rank]
    y = AXIS_H
    lane_y: dict[tuple[str, int | None], float] = {}
    headers: list[_HostHeader] = []
    rows: list[_LaneRow] = []
    for host, members in lanes:
        clock = ""
        if abs(offsets.get(host, 0.0)) >= 0.005:
            clock = f" (clock {_fmt_rel(offsets[host])} off)"
        headers.append(_HostHeader(y, (host or "unknown host") + clock))
        y += HOST_HEADER_H
        for rank in members:
            lane_y[(host, rank)] = y + LANE_H / 2
            is_init_lane = rank == ini_rank and (host == ini_host or rank is not None)
            label = f"rank {rank}" if rank is not None else ("host and its ranks" if collapsed else "host (kernel, launcher)")
            fill = "#fde2e2" if is_init_lane else ("#f4f6f9" if (rank or 0) % 2 == 0 else "#ffffff")
            rows.append(_LaneRow(host, rank, y, label, is_init_lane, fill))
            y += LANE_H
        y += 4
    height = y + 8
    t0 = initiator.t
    # Ticks relative to the initiating event, the absolute clock on the first tick of each stretch.
    ticks: list[_Tick] = []
    seen_cluster: set[int] = set()
    for x, t in axis.ticks():
        if line_order:  # the axis counts lines, not seconds
            if t == int(t):
                ticks.append(_Tick(LABEL_W + x, None, f"line {int(t) + 1}"))
            continue
        cluster = axis.cluster_of(t)
        tick_clock: str | None = None
        if cluster not in seen_cluster:
            seen_cluster.add(cluster)
            tick_clock = _fmt_clock(t, 1)
        ticks.append(_Tick(LABEL_W + x, tick_clock, _fmt_rel(t - t0)))
    breaks = [
        _Break(LABEL_W + bx, _fmt_rel(skipped)[1:], f"{skipped:.1f} s without events, cut from the axis")
        for bx, skipped in axis.breaks()
    ] if not line_order else []
    marks: list[_Mark] = []
    for e in sorted(events, key=lambda e: e.role == "initiator"):
        host, rank = e.lane
        if rank is not None and rank in rank_host:
            host = rank_host[rank]
        ly = lane_y.get((host, rank))
        if ly is None:
            continue
        color = _ROLE_COLORS.get(e.role) or _class_color(e.cls)
        marks.append(_Mark(e.role, e.cls, e.t, LABEL_W + axis.x(e.t), ly, color,
                           _tooltip(e, host, rank, offsets, line_order)))
    return {
        "headers": headers,
        "rows": rows,
        "ticks": ticks,
        "breaks": breaks,
        "marks": marks,
        "height": height,
        "initiator_x": LABEL_W + axis.x(t0),
        "axis_title": ("line order (no time could be read from these lines)" if line_order
                       else f"time, skew-corrected (UTC); 0 = initiating event at {_fmt_clock(t0)}"),
        "label_w": LABEL_W,
        "plot_w": PLOT_W,
        "lane_h": LANE_H,
        "axis_h": AXIS_H,
        "break_w": BREAK_W,
        "total_w": LABEL_W + PLOT_W + 40,
    }


def _legend(events: Sequence[TimelineEvent]) -> list[tuple[str, str]]:
    """(color, label) per legend entry."""
    items = [("#d7191c", "initiating event")]
    if any(e.role == "cause" for e in events):
        items.append(("#f28e2b", "same failure, later"))
    items.extend((_class_color(cls), cls) for cls in sorted({e.cls for e in events if e.role == "collateral"}))
    return items


def _evidence(incident: Incident, where: Sequence[str | None]) -> list[dict[str, Any]]:
    ini = incident.initiator
    out = []
    for n, ev in enumerate(incident.evidence):
        who = " \u00b7 ".join(
            str(p) for p in (f"rank {ev.rank}" if ev.rank is not None else None, ev.host, ev.ts, ev.rule) if p
        )
        is_init = ev.rule == ini.rule and same_line(ev.line, ini.line)
        out.append({"initiator": is_init, "who": who, "line": ev.line, "where": where[n] if n < len(where) else None})
    return out


@dataclass
class OtherIncident:
    """Another incident of the same logs, listed beside the picture (`href`: a link to its own picture)."""

    label: str  # e.g. "also failed", "survived"
    incident: Incident
    href: str | None = None


def render_incident_html(incident: Incident, signals: list[Signal] | None, *, title: str | None = None,
                         evidence_where: Sequence[str | None] = (), others: Sequence[OtherIncident] = ()) -> str:
    """One self-contained HTML page for `incident`; `signals` (the job's) draw the full cascade.

    Without signals, the timeline shows the initiator and the evidence lines only. `evidence_where`: per
    evidence line, where it is (`file:line`), shown beside it; `others`: the other incidents of the logs.
    """
    story = incident_events(incident, signals)
    events, offsets = story.events, story.offsets
    legend = _legend(events)
    notes = []
    if story.line_order:
        notes.append("The times of these lines could not be read: they are laid out in the order they were "
                     "logged, not on a time axis.")
    clock_note = None if story.line_order else story.clock_note()
    if clock_note:
        notes.append(clock_note)
    svg = _swimlanes(incident, story)
    ini = incident.initiator
    initiator_rows = [
        ("rank", ini.rank),
        ("host", ini.host),
        ("local rank", ini.local_rank),
        ("pid", ini.pid),
        ("GPU", ini.gpu),
        ("time", ini.ts),
        ("rule", ini.rule),
    ]
    evidence = _evidence(incident, evidence_where)
    return _TEMPLATES.get_template("incident.html.j2").render(
        incident=incident,
        page_title=title or f"rootrank: {incident.title}",
        legend=legend,
        notes=notes,
        svg=svg,
        initiator_rows=[(k, v) for k, v in initiator_rows if v is not None],
        collateral=[(c.class_, _ranges(c.ranks) or "-", len(c.hosts), c.count) for c in incident.collateral],
        evidence_shown=evidence[:EVIDENCE_SHOWN],
        evidence_more=evidence[EVIDENCE_SHOWN:],
        clock_skew=[(h, _fmt_rel(o)) for h, o in sorted(offsets.items())],
        others=[(o.label, o.incident, _who(o.incident), o.href) for o in others],
    )


def render_no_incident_html(verdict: str, *, job_id: str | None = None, details: Sequence[str] = (),
                            rule_set_version: str | None = None) -> str:
    """The page for logs that hold no incident: it says so (`verdict`, e.g. "no failure signature in these
    logs"), rather than no page at all."""
    return _TEMPLATES.get_template("no_incident.html.j2").render(
        page_title="rootrank: no incident", verdict=verdict, job_id=job_id, details=list(details),
        rule_set_version=rule_set_version,
    )


def _who(incident: Incident) -> str:
    ini = incident.initiator
    parts = (f"rank {ini.rank}" if ini.rank is not None else None, ini.host)
    return ", ".join(p for p in parts if p) or "no rank named"
