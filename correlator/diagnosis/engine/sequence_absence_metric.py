"""Rules whose signal depends on other signals: sequences (a load failure after an interrupted save),
absences (a start with no end within a deadline) and metrics (one rank's value far above the others')."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence

from correlator.diagnosis.engine.keys import time_of
from correlator.diagnosis.engine.timeline import Timeline
from correlator.diagnosis.models import Signal
from correlator.diagnosis.rules import Rule


def same_process(a: Signal, b: Signal) -> bool:
    for field in ("rank", "pid", "local_rank"):
        va, vb = getattr(a, field), getattr(b, field)
        if va is not None and vb is not None:
            return bool(va == vb) and (a.host is None or b.host is None or a.host == b.host)
    return a.host is None or b.host is None or a.host == b.host


def resolve_sequence_absence_metric(
    rules: Mapping[str, Rule], window: Sequence[Signal], timeline: Timeline, now_t: float | None,
    earlier: Sequence[Signal] = (),
) -> list[Signal]:
    """The window's signals with sequence, absence and metric rules resolved (they depend on other signals).
    `earlier`: preconditions of sequences from the whole job (a save torn in one attempt fails the load of
    the next)."""
    matches: list[Signal] = []
    markers: dict[tuple[str, str], list[Signal]] = defaultdict(list)
    for s in earlier:
        markers[(s.rule_id, "after")].append(s)
    metric_obs: dict[str, list[Signal]] = defaultdict(list)
    for s in window:
        if s.kind == "fact":
            marker = s.fields.get("marker")
            if isinstance(marker, str) and not (marker == "after" and earlier):
                markers[(s.rule_id, marker)].append(s)
            continue
        rule = rules.get(s.rule_id)
        if rule is not None and rule.metric is not None:
            metric_obs[s.rule_id].append(s)
            continue
        matches.append(s)
    latest = max((t for t in (timeline.t(s) for s in window) if t is not None), default=None)
    clock = now_t if now_t is not None else latest
    kept: list[Signal] = []
    for s in matches:
        rule = rules.get(s.rule_id)
        if rule is None:
            kept.append(s)
            continue
        t = timeline.t(s)
        if rule.sequence is not None:
            seq = rule.sequence
            ok = False
            for m in markers.get((rule.id, "after"), []):
                tm = timeline.t(m)
                if seq.same_process and not same_process(m, s):
                    continue
                before = 0 <= t - tm <= seq.within_s if t is not None and tm is not None else m.order < s.order
                ok = ok or before
            if not ok:
                continue
        if rule.absence is not None:
            ended = any(
                (rule.absence.progress or same_process(m, s)) and timeline.key(m) > timeline.key(s)
                for m in markers.get((rule.id, "end"), [])
            )
            if ended or t is None or clock is None or clock - t < rule.absence.deadline_s:
                continue
        kept.append(s)
    for rule_id, observations in metric_obs.items():
        kept.extend(metric_outliers(rules[rule_id], observations))
    # A sequence whose precondition held is the more specific reading of its line: SIGBUS right
    # after a checkpoint load says more than SIGBUS alone.
    by_sequence = {
        (s.file, s.order) for s in kept if (r := rules.get(s.rule_id)) is not None and r.sequence is not None
    }
    if by_sequence:
        kept = [
            s for s in kept
            if (s.file, s.order) not in by_sequence
            or ((r := rules.get(s.rule_id)) is not None and r.sequence is not None)
        ]
    return kept

def progress_order(signal: Signal) -> tuple[float, float, int]:
    """Where a signal stands in the training: its step when the line gives one, then its time and order."""
    step = signal.fields.get("step")
    t = time_of(signal)
    return (float(step) if isinstance(step, (int, float)) else float("inf"),
            t if t is not None else float("inf"), signal.order)


def metric_outliers(rule: Rule, observations: Sequence[Signal]) -> list[Signal]:
    assert rule.metric is not None
    field = rule.metric.field
    per_rank: dict[object, list[tuple[float, Signal]]] = defaultdict(list)
    non_finite: list[Signal] = []
    for s in observations:
        value = s.fields.get(field)
        if isinstance(value, (int, float)):
            per_rank[s.rank if s.rank is not None else s.host].append((float(value), s))
        elif isinstance(value, str) and value.lower() in ("nan", "inf", "-inf"):
            non_finite.append(s)
    if non_finite:
        # A non-finite value is abnormal by itself; once one rank's goes non-finite, the all-reduce spreads it to
        # every rank at the next step: the first is the one at the lowest step (no clock needed), then in time.
        return [min(non_finite, key=progress_order)]
    if len(per_rank) >= 2:
        peaks = {k: max(v, key=lambda p: p[0]) for k, v in per_rank.items()}
        for key, (value, s) in peaks.items():
            others = [p[0] for k, p in peaks.items() if k != key]
            base = statistics.median(others)
            if base > 0 and value > rule.metric.spike_ratio * base:
                return [s]
        return []
    values = [p for v in per_rank.values() for p in v]
    if len(values) >= rule.metric.min_points:
        ordered = sorted(values, key=lambda p: p[1].order)
        base = statistics.median(v for v, _ in ordered[: max(1, len(ordered) // 2)])
        for value, s in ordered:
            if base > 0 and value > rule.metric.spike_ratio * base:
                return [s]
    return []
