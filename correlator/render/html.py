"""The incident picture: one self-contained HTML file (inline CSS and SVG, no script, no network).

A swimlane per rank, grouped by host (plus one lane per host for kernel and launcher lines),
on a skew-corrected time axis. The initiating event is drawn on a marked lane
(`id="initiator-lane"`, the event itself `data-role="initiator"`); the collateral cascade follows
it. Long quiet stretches (the NCCL watchdog's 10 minutes) are cut out of the axis and shown as a
break, so the failure and its consequences are both readable. Beside it: the evidence lines, the
fix and how to verify it.
"""

from __future__ import annotations

import hashlib
import html
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from correlator.diagnosis.models import Incident, Signal

LANE_H = 13
HOST_HEADER_H = 20
LABEL_W = 118
PLOT_W = 760
BREAK_W = 26
AXIS_H = 46
MIN_CLUSTER_W = 150
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


@dataclass
class _Event:
    lane: tuple[str, int | None]  # (host or "", rank or None for the host lane)
    t: float
    raw_t: float | None
    cls: str
    rule: str
    line: str
    role: str  # initiator | cause | collateral | fact
    count: int = 1


def _parse_iso(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


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


# --- time ------------------------------------------------------------------------------------


def _host_offsets(signals: Sequence[Signal]) -> dict[str, float]:
    try:
        from correlator.diagnosis.engine import estimate_host_offsets
    except ImportError:  # the picture still draws, on the hosts' own clocks
        return {}
    return estimate_host_offsets(signals)


def _fill_ranks(signals: Sequence[Signal]) -> list[Signal]:
    """Give lines without a rank the rank their (host, pid) announced in its NCCL init line."""
    mapping: dict[tuple[str, int], int] = {}
    for s in signals:
        if s.kind == "fact" and "comm_rank" in s.fields and s.host and s.pid is not None:
            mapping.setdefault((s.host, s.pid), int(s.fields["comm_rank"]))
    out = []
    for s in signals:
        if s.rank is None and s.host and s.pid is not None and (s.host, s.pid) in mapping:
            s = s.model_copy(update={"rank": mapping[(s.host, s.pid)]})
        out.append(s)
    return out


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


class _Axis:
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

    def breaks(self) -> list[tuple[float, float, float]]:
        """(x of the break, seconds skipped) between consecutive clusters."""
        return [
            (a.x0 + a.width + BREAK_W / 2, b.start - a.end, 0.0)
            for a, b in zip(self.clusters, self.clusters[1:], strict=False)
        ]

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


# --- events ----------------------------------------------------------------------------------


def _same_line(a: str, b: str) -> bool:
    a, b = a.strip(), b.strip()
    return bool(a) and (a == b or a.endswith(b) or b.endswith(a))


def _events(incident: Incident, signals: Sequence[Signal] | None) -> tuple[list[_Event], dict[str, float]]:
    ini = incident.initiator
    events: list[_Event] = []
    offsets: dict[str, float] = {}
    if signals:
        sigs = _fill_ranks(list(signals))
        offsets = _host_offsets(sigs)
        times = _corrected_times(sigs, offsets)
        lo = _parse_iso(incident.window_start)
        hi = _parse_iso(incident.window_end)
        initiator_found = False
        for s in sigs:
            t = times.get(id(s))
            if t is None or not s.class_ or s.kind != "match":
                continue  # facts (init lines, steps, progress) time other lines; they are not events of the story
            if lo is not None and hi is not None and not (lo - 60 <= t <= hi + 60):
                continue
            raw = s.ts or s.received_ts
            is_init = (
                not initiator_found
                and s.rule_id == ini.rule
                and _same_line(s.line, ini.line)
                and (ini.rank is None or s.rank is None or s.rank == ini.rank)
            )
            lane = (s.host or "", s.rank)
            if is_init:
                initiator_found = True
                role = "initiator"
                # Draw it on the initiator's rank lane even when the line itself (a kernel Xid line) had no rank.
                lane = (ini.host or s.host or "", ini.rank if ini.rank is not None else s.rank)
            elif s.class_ == incident.class_:
                role = "cause"
            else:
                role = "collateral"
            events.append(
                _Event(
                    lane=lane,
                    t=t,
                    raw_t=raw.timestamp() if raw else None,
                    cls=s.class_ or "",
                    rule=s.rule_id,
                    line=s.line,
                    role=role,
                )
            )
        if not initiator_found:
            events.append(_initiator_event(incident))
    else:
        events.append(_initiator_event(incident))
        for ev in incident.evidence:
            t = _parse_iso(ev.ts)
            if t is None or (ev.rule == ini.rule and _same_line(ev.line, ini.line)):
                continue
            events.append(_Event((ev.host or "", ev.rank), t, None, ev.rule, ev.rule, ev.line, "collateral"))
    events = [e for e in events if math.isfinite(e.t)]
    return events, offsets


def _initiator_event(incident: Incident) -> _Event:
    ini = incident.initiator
    t = _parse_iso(ini.ts) or _parse_iso(incident.window_start) or 0.0
    return _Event((ini.host or "", ini.rank), t, None, incident.class_, ini.rule, ini.line, "initiator")


def _dedupe(events: list[_Event], axis: _Axis) -> list[_Event]:
    """One marker per lane, class and 2-pixel slot; the count goes into the tooltip."""
    kept: dict[tuple[object, ...], _Event] = {}
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


# --- rendering -------------------------------------------------------------------------------

_CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#e3e6ec; --bg:#fafbfc; --init:#d7191c; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
       color:var(--fg); background:#fff; }
header { padding:14px 22px 10px; border-bottom:1px solid var(--line); background:var(--bg); }
header h1 { margin:0 0 4px; font-size:19px; }
header .meta { color:var(--muted); font-size:13px; }
.badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; font-weight:600;
         color:#fff; background:#6c757d; margin-right:6px; vertical-align:1px; }
.sev-critical { background:#b10e1e; } .sev-high { background:#d9480f; } .sev-medium { background:#e67700; }
.sev-low { background:#2b8a3e; } .sev-info { background:#495057; }
main { display:grid; grid-template-columns:minmax(0, 1fr) 440px; gap:0; }
@media (max-width:1200px) { main { grid-template-columns:1fr; } }
section.timeline { padding:12px 14px 20px 22px; overflow-x:auto; border-right:1px solid var(--line); }
aside { padding:12px 22px 24px 18px; }
h2 { font-size:15px; margin:14px 0 6px; }
h2:first-child { margin-top:2px; }
.legend { display:flex; flex-wrap:wrap; gap:6px 14px; font-size:12px; color:var(--muted); margin:2px 0 8px; }
.legend span i { display:inline-block; width:10px; height:10px; border-radius:50%; margin-right:5px; vertical-align:-1px; }
svg text { font-family:inherit; }
.lane-label { font-size:10px; fill:#4a5263; }
.host-label { font-size:11px; font-weight:600; fill:#1d2330; }
.tick { font-size:10px; fill:#5b6475; }
.break-label { font-size:10px; fill:#5b6475; font-style:italic; }
table { border-collapse:collapse; width:100%; font-size:12.5px; }
th, td { text-align:left; padding:3px 6px; border-bottom:1px solid var(--line); vertical-align:top; }
th { color:var(--muted); font-weight:600; }
dl.kv { display:grid; grid-template-columns:max-content 1fr; gap:2px 12px; margin:0; font-size:13px; }
dl.kv dt { color:var(--muted); } dl.kv dd { margin:0; word-break:break-word; }
pre.line { margin:0; white-space:pre-wrap; word-break:break-all; font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; }
.evidence li { margin:0 0 7px; }
.evidence .who { font-size:11.5px; color:var(--muted); }
.evidence li.initiator pre { color:var(--init); font-weight:600; }
ol { padding-left:20px; margin:4px 0; } ol li { margin-bottom:4px; }
aside code { word-break:break-all; font-size:12px; }
details summary { cursor:pointer; color:var(--muted); font-size:12.5px; margin:2px 0 6px; }
.initiator-box { border-left:4px solid var(--init); background:#fff5f5; padding:8px 10px; border-radius:3px; }
.reason { color:var(--muted); font-size:12.5px; margin-top:6px; }
footer { color:var(--muted); font-size:11.5px; padding:8px 22px 16px; border-top:1px solid var(--line); }
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _lanes(events: Sequence[_Event], incident: Incident) -> list[tuple[str, list[int | None]]]:
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


def _svg(incident: Incident, events: list[_Event], offsets: dict[str, float]) -> str:
    axis = _Axis([e.t for e in events], PLOT_W)
    ranks = {e.lane[1] for e in events if e.lane[1] is not None}
    collapsed = len(ranks) > MAX_RANK_LANES
    if collapsed:
        keep = incident.initiator.rank
        for e in events:
            if e.lane[1] is not None and e.lane[1] != keep and e.role != "initiator":
                e.lane = (e.lane[0], None)
    events = _dedupe(events, axis)
    lanes = _lanes(events, incident)
    # Events recorded without a host but with a rank land on that rank's lane wherever it is drawn.
    rank_host = {r: h for h, rs in lanes for r in rs if r is not None}
    initiator = next(e for e in events if e.role == "initiator")
    ini_host, ini_rank = initiator.lane
    ini_host = ini_host or (rank_host.get(ini_rank, "") if ini_rank is not None else "")
    if ini_rank is not None and ini_rank in rank_host:
        ini_host = rank_host[ini_rank]
    y = AXIS_H
    lane_y: dict[tuple[str, int | None], float] = {}
    parts: list[str] = []
    lane_parts: list[str] = []
    for host, members in lanes:
        clock = ""
        if abs(offsets.get(host, 0.0)) >= 0.005:
            clock = f" (clock {_fmt_rel(offsets[host])} off)"
        parts.append(f'<text class="host-label" x="4" y="{y + 14}">{_esc(host or "unknown host")}{_esc(clock)}</text>')
        parts.append(f'<line x1="0" x2="{LABEL_W + PLOT_W}" y1="{y + 0.5}" y2="{y + 0.5}" stroke="#cfd4dc"/>')
        y += HOST_HEADER_H
        for rank in members:
            key = (host, rank)
            lane_y[key] = y + LANE_H / 2
            is_init_lane = rank == ini_rank and (host == ini_host or rank is not None)
            label = f"rank {rank}" if rank is not None else ("host and its ranks" if collapsed else "host (kernel, launcher)")
            attrs = f'class="lane{" initiator-lane" if is_init_lane else ""}" data-host="{_esc(host)}"'
            attrs += f' data-rank="{rank}"' if rank is not None else ' data-rank="host"'
            if is_init_lane:
                attrs += ' id="initiator-lane"'
            fill = "#fde2e2" if is_init_lane else ("#f4f6f9" if (rank or 0) % 2 == 0 else "#ffffff")
            emphasis = ' font-weight="700" fill="#b10e1e"' if is_init_lane else ""
            lane_parts.append(
                f'<g {attrs}><rect x="0" y="{y}" width="{LABEL_W + PLOT_W}" height="{LANE_H}" fill="{fill}"/>'
                f'<text class="lane-label" x="{14 if rank is not None else 8}" y="{y + LANE_H - 3}"{emphasis}>'
                f"{_esc(label)}</text></g>"
            )
            y += LANE_H
        y += 4
    height = y + 8
    t0 = initiator.t
    # Axis: ticks relative to the initiating event, absolute clock on the first tick of each segment.
    axis_parts: list[str] = [
        f'<text class="tick" x="{LABEL_W}" y="12">time, skew-corrected (UTC); 0 = initiating event at {_esc(_fmt_clock(t0))}</text>'
    ]
    seen_cluster: set[int] = set()
    for x, t in axis.ticks():
        cx = LABEL_W + x
        axis_parts.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{AXIS_H - 8}" y2="{height}" stroke="#eef0f4"/>')
        cluster = next(i for i, c in enumerate(axis.clusters) if c.start - 1e-9 <= t <= c.end + 1e-9)
        label = _fmt_rel(t - t0)
        if cluster not in seen_cluster:
            seen_cluster.add(cluster)
            axis_parts.append(f'<text class="tick" x="{cx:.1f}" y="{AXIS_H - 22}" text-anchor="middle">{_esc(_fmt_clock(t, 1))}</text>')
        axis_parts.append(f'<text class="tick" x="{cx:.1f}" y="{AXIS_H - 11}" text-anchor="middle">{_esc(label)}</text>')
    for bx, skipped, _ in axis.breaks():
        cx = LABEL_W + bx
        axis_parts.append(
            f'<g class="axis-break"><rect x="{cx - BREAK_W / 2 + 3:.1f}" y="{AXIS_H - 8}" width="{BREAK_W - 6}" '
            f'height="{height - AXIS_H + 8}" fill="#ffffff"/>'
            f'<path d="M{cx - 5:.1f},{AXIS_H - 8} l5,6 l-5,6 l5,6" stroke="#9aa3b2" fill="none"/>'
            f'<text class="break-label" x="{cx:.1f}" y="{height - 2}" text-anchor="middle">{_esc(_fmt_rel(skipped)[1:])}</text>'
            f"<title>{_esc(f'{skipped:.1f} s without events, cut from the axis')}</title></g>"
        )
    ini_x = LABEL_W + axis.x(t0)
    axis_parts.append(
        f'<line x1="{ini_x:.1f}" x2="{ini_x:.1f}" y1="{AXIS_H - 6}" y2="{height}" stroke="#d7191c" stroke-dasharray="4 3" stroke-width="1.2"/>'
    )
    marks: list[str] = []
    for e in sorted(events, key=lambda e: e.role == "initiator"):
        host, rank = e.lane
        if rank is not None and rank in rank_host:
            host = rank_host[rank]
        ly = lane_y.get((host, rank))
        if ly is None:
            continue
        cx = LABEL_W + axis.x(e.t)
        who = f"rank {rank}" if rank is not None else "host"
        clock = _fmt_clock(e.t)
        skew = offsets.get(host)
        tip = f"{who} on {host or '?'} at {clock} (skew-corrected"
        tip += f"; host clock {_fmt_rel(skew)} off)" if skew else ")"
        tip += f"\n{e.cls} \u00b7 {e.rule}" + (f" \u00b7 {e.count} lines" if e.count > 1 else "")
        tip += f"\n{e.line[:400]}"
        if e.role == "initiator":
            marks.append(
                f'<g data-role="initiator" class="event initiator" data-class="{_esc(e.cls)}" data-time="{e.t:.6f}">'
                f'<circle cx="{cx:.1f}" cy="{ly:.1f}" r="9" fill="none" stroke="#d7191c" stroke-width="2"/>'
                f'<circle cx="{cx:.1f}" cy="{ly:.1f}" r="5" fill="#d7191c"/>'
                f'<text x="{cx + 12:.1f}" y="{ly + 4:.1f}" font-size="11" font-weight="700" fill="#b10e1e">initiator</text>'
                f"<title>{_esc(tip)}</title></g>"
            )
            continue
        color = _ROLE_COLORS.get(e.role) or _class_color(e.cls)
        r = 3.2 if e.role != "fact" else 2.2
        marks.append(
            f'<circle class="event {e.role}" data-role="{e.role}" data-class="{_esc(e.cls)}" cx="{cx:.1f}" cy="{ly:.1f}" '
            f'r="{r}" fill="{color}" fill-opacity="0.9"><title>{_esc(tip)}</title></circle>'
        )
    body = "".join(lane_parts) + "".join(axis_parts) + "".join(parts) + "".join(marks)
    total_w = LABEL_W + PLOT_W + 40
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="swimlanes" width="100%" viewBox="0 0 {total_w} {height}" '
        f'style="min-width:{total_w * 0.8:.0f}px;max-width:{total_w * 1.3:.0f}px" role="img" '
        f'aria-label="timeline of the incident per rank">{body}</svg>'
    )


def _legend(events: Sequence[_Event]) -> str:
    items = ['<span><i style="background:#d7191c"></i>initiating event</span>']
    if any(e.role == "cause" for e in events):
        items.append('<span><i style="background:#f28e2b"></i>same failure, later</span>')
    for cls in sorted({e.cls for e in events if e.role in ("collateral", "fact")}):
        items.append(f'<span><i style="background:{_class_color(cls)}"></i>{_esc(cls)}</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


def _aside(incident: Incident, offsets: dict[str, float]) -> str:
    ini = incident.initiator
    rows = [
        ("rank", ini.rank),
        ("host", ini.host),
        ("local rank", ini.local_rank),
        ("pid", ini.pid),
        ("GPU", ini.gpu),
        ("time", ini.ts),
        ("rule", ini.rule),
    ]
    kv = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in rows if v is not None)
    out = [
        "<h2>Initiator</h2>",
        f'<div class="initiator-box"><dl class="kv">{kv}</dl><pre class="line" style="margin-top:6px">{_esc(ini.line)}</pre></div>',
        f'<div class="reason">confidence {incident.confidence:.2f}: {_esc(incident.confidence_reason)}</div>',
    ]
    if incident.collateral:
        rows_html = "".join(
            f"<tr><td>{_esc(c.class_)}</td><td>{_esc(_ranges(c.ranks) or '-')}</td>"
            f"<td>{len(c.hosts)}</td><td>{c.count}</td></tr>"
            for c in incident.collateral
        )
        out.append(
            "<h2>Collateral</h2><table><thead><tr><th>class</th><th>ranks</th><th>hosts</th><th>lines</th></tr></thead>"
            f"<tbody>{rows_html}</tbody></table>"
        )
    if incident.fix:
        out.append("<h2>Fix</h2><ol class=\"fix\">" + "".join(f"<li>{_esc(f)}</li>" for f in incident.fix) + "</ol>")
    if incident.verify:
        out.append(
            "<h2>Verify</h2><ol class=\"verify\">" + "".join(f"<li>{_esc(v)}</li>" for v in incident.verify) + "</ol>"
        )
    if incident.evidence:
        items = []
        for ev in incident.evidence:
            is_init = ev.rule == ini.rule and _same_line(ev.line, ini.line)
            who = " \u00b7 ".join(
                str(p) for p in (f"rank {ev.rank}" if ev.rank is not None else None, ev.host, ev.ts, ev.rule) if p
            )
            items.append(
                f'<li class="{"initiator" if is_init else "collateral"}"><div class="who">{_esc(who)}</div>'
                f'<pre class="line">{_esc(ev.line)}</pre></li>'
            )
        shown, rest = items[:EVIDENCE_SHOWN], items[EVIDENCE_SHOWN:]
        block = '<h2>Evidence</h2><ol class="evidence">' + "".join(shown) + "</ol>"
        if rest:
            block += (
                f'<details><summary>{len(rest)} more line{"s" if len(rest) > 1 else ""}</summary>'
                f'<ol class="evidence" start="{len(shown) + 1}">' + "".join(rest) + "</ol></details>"
            )
        out.append(block)
    if incident.references:
        # Plain text, not links: the report is opened offline and must not reach the network.
        out.append(
            "<h2>References</h2><ol>" + "".join(f"<li><code>{_esc(r)}</code></li>" for r in incident.references) + "</ol>"
        )
    if offsets:
        rows_html = "".join(
            f"<tr><td>{_esc(h)}</td><td>{_fmt_rel(o)}</td></tr>" for h, o in sorted(offsets.items())
        )
        out.append(
            "<h2>Clock skew (estimated)</h2><table><thead><tr><th>host</th><th>clock ahead by</th></tr></thead>"
            f"<tbody>{rows_html}</tbody></table>"
        )
    return "".join(out)


def render_incident_html(incident: Incident, signals: list[Signal] | None, *, title: str | None = None) -> str:
    """One self-contained HTML page for `incident`; `signals` (the job's) draw the full cascade.

    Without signals, the timeline shows the initiator and the evidence lines only.
    """
    events, offsets = _events(incident, signals)
    svg = _svg(incident, events, offsets)
    page_title = title or f"rootrank: {incident.title}"
    ws = f" \u00b7 world size {incident.world_size}" if incident.world_size else ""
    window = ""
    if incident.window_start and incident.window_end:
        window = f" \u00b7 window {_esc(incident.window_start)} \u2013 {_esc(incident.window_end)}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        # Self-contained by construction: the page may load nothing and run nothing.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(page_title)}</title><style>{_CSS}</style></head><body>"
        f'<header><h1><span class="badge sev-{_esc(incident.severity)}">{_esc(incident.severity)}</span>'
        f"{_esc(incident.title)}</h1>"
        f'<div class="meta">class <b>{_esc(incident.class_)}</b> \u00b7 job <b>{_esc(incident.job_id)}</b>{ws}{window}'
        f" \u00b7 incident {_esc(incident.incident_id)} rev {incident.revision}</div></header>"
        '<main><section class="timeline"><h2>Timeline per rank, grouped by host</h2>'
        f"{_legend(events)}{svg}</section>"
        f"<aside>{_aside(incident, offsets)}</aside></main>"
        f"<footer>rootrank \u00b7 rule set {_esc(incident.rule_set_version or '-')} \u00b7 times are corrected for "
        "per-host clock skew estimated from shared anchors (NCCL watchdog timeouts of one collective)</footer>"
        "</body></html>\n"
    )
