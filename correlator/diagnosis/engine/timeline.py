"""One clock for the job: per-host skew estimated from shared anchors, and times for untimed lines."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from correlator.diagnosis.engine.state import _time_of
from correlator.diagnosis.models import Signal


@dataclass
class _Timeline:
    """Skew-corrected times of one window's signals."""

    offsets: dict[str, float]
    times: dict[int, float | None]  # id(signal) -> corrected epoch seconds

    def t(self, signal: Signal) -> float | None:
        return self.times.get(id(signal))

    def key(self, signal: Signal) -> tuple[float, int]:
        t = self.t(signal)
        return (t if t is not None else float("inf"), signal.order)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")


def estimate_host_offsets(signals: Sequence[Signal]) -> dict[str, float]:
    """Seconds to subtract from each host's timestamps to put it on the common clock."""
    deviations: dict[str, list[float]] = defaultdict(list)
    groups: dict[tuple[object, object], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in signals:
        if s.class_ == "nccl_timeout" and s.host and s.ts is not None and "seq" in s.fields:
            groups[(s.fields.get("seq"), s.fields.get("op"))][s.host].append(s.ts.timestamp())
    for per_host in groups.values():
        if len(per_host) < 2:
            continue
        medians = {h: statistics.median(v) for h, v in per_host.items()}
        center = statistics.median(medians.values())
        for host, m in medians.items():
            deviations[host].append(m - center)
    if not deviations:
        # Fall back to the forwarders' receive stamps: event time minus receive time per host.
        lag: dict[str, list[float]] = defaultdict(list)
        for s in signals:
            if s.host and s.ts is not None and s.received_ts is not None:
                lag[s.host].append(s.ts.timestamp() - s.received_ts.timestamp())
        if len(lag) >= 2:
            medians = {h: statistics.median(v) for h, v in lag.items()}
            center = statistics.median(medians.values())
            return {h: m - center for h, m in medians.items()}
        return {}
    return {h: statistics.median(v) for h, v in deviations.items()}


def _timeline(signals: Sequence[Signal]) -> _Timeline:
    offsets = estimate_host_offsets(signals)
    times: dict[int, float | None] = {}
    # Lines without a timestamp take the time of the closest earlier timed line of the same file.
    by_file: dict[str | None, list[Signal]] = defaultdict(list)
    for s in signals:
        by_file[s.file].append(s)
    for members in by_file.values():
        members.sort(key=lambda s: s.order)
        last: float | None = None
        pending: list[Signal] = []
        for s in members:
            raw = _time_of(s)
            if raw is not None:
                last = raw - offsets.get(s.host or "", 0.0)
                times[id(s)] = last
                for p in pending:
                    times[id(p)] = last
                pending = []
            elif last is not None:
                times[id(s)] = last
            else:
                pending.append(s)
        for p in pending:
            times[id(p)] = None
    return _Timeline(offsets, times)
