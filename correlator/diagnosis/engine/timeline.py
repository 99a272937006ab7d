"""One clock for the job: per-host offsets from events every host saw at the same true time.

Shared events ("anchors") kept by the state:
- the watchdog timeouts of one collective (`wd:PG:SeqNum`): every waiting rank's timer ran out together;
- one NCCL communicator's init burst (`init:commId`): every rank joins it within a second;
- the launcher's teardown (`teardown`): every agent kills its workers when the group fails;
- the same training step (`step:N`) on every rank of a synchronous job, read from the step lines the state
  keeps (each process's metric peaks and latest progress: `job_anchors`), not from every line that passed:
  which routine lines reach the state depends on how they were batched (a file folded whole by `diagnose`,
  the stream's batches), what it keeps in the end does not.
A host's offset is the median, over anchors, of its time minus the median of all hosts' times for that
anchor. Without anchors, the forwarders' receive stamps give each host's lag; without those, host clocks
are taken as they are. The method is reported with the incident.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from correlator.diagnosis.engine.keys import has_own_time, time_of
from correlator.diagnosis.engine.state import JobState
from correlator.diagnosis.models import Signal

_ANCHOR_KINDS = {"wd": "watchdog timeouts of one collective", "init": "NCCL communicator init bursts",
                 "teardown": "launcher teardowns", "step": "training steps"}


@dataclass
class Clock:
    """Seconds to subtract from each host's timestamps to put it on the common clock, and how that was found."""

    offsets: dict[str, float] = field(default_factory=dict)
    method: str = "host clocks taken as they are (no shared events to align them)"

    def correct(self, t: float | None, host: str | None) -> float | None:
        if t is None:
            return None
        return t - self.offsets.get(host or "", 0.0)

    def spread(self) -> float:
        """The largest correction applied: what a residual error of the alignment is at most."""
        return max((abs(v) for v in self.offsets.values()), default=0.0)


def estimate_clock(anchors: Mapping[str, Mapping[str, float]], receive_lag: Mapping[str, float]) -> Clock:
    deviations: dict[str, list[float]] = defaultdict(list)
    used: dict[str, int] = defaultdict(int)
    for key, per_host in anchors.items():
        if len(per_host) < 2:
            continue
        center = statistics.median(per_host.values())
        spread = max(per_host.values()) - min(per_host.values())
        if spread > 600:  # not one moment: a straggling host, or a second event under the same key
            continue
        used[key.split(":", 1)[0]] += 1
        for host, t in per_host.items():
            deviations[host].append(t - center)
    if deviations:
        offsets = {h: statistics.median(v) for h, v in deviations.items()}
        kinds = ", ".join(f"{_ANCHOR_KINDS.get(k, k)}: {n}" for k, n in sorted(used.items()))
        largest = max(offsets.items(), key=lambda kv: abs(kv[1]))
        return Clock(offsets, f"host clocks aligned on {sum(used.values())} shared event(s) ({kinds}); "
                              f"largest correction {largest[1]:+.1f} s on {largest[0]}")
    if len(receive_lag) >= 2:
        center = statistics.median(receive_lag.values())
        offsets = {h: lag - center for h, lag in receive_lag.items()}
        return Clock(offsets, f"host clocks aligned on the forwarders' receive times ({len(offsets)} hosts)")
    return Clock()


def job_anchors(state: JobState) -> dict[str, dict[str, float]]:
    """The state's anchors, with the training steps of the step lines it keeps (the earliest per host)."""
    anchors = {key: hosts for key, hosts in state.anchors.items() if not key.startswith("step:")}
    steps: dict[str, dict[str, float]] = {}
    for signal in state.signals:
        step = signal.fields.get("step")
        if not isinstance(step, int) or not signal.host or signal.ts is None or not has_own_time(signal):
            continue
        if "metric" not in signal.fields and signal.fields.get("fact") != "progress":
            continue
        hosts = steps.setdefault(f"step:{step}", {})
        t = signal.ts.timestamp()
        hosts[signal.host] = min(hosts.get(signal.host, t), t)
    return {**anchors, **steps}


def estimate_host_offsets(signals: Sequence[Signal]) -> dict[str, float]:
    """Offsets from a list of signals alone (the HTML report's timeline): the same anchors as the engine's."""
    state = JobState(job_id="")
    state.add_all(signals)
    return estimate_clock(job_anchors(state), state.receive_lag).offsets


@dataclass
class Timeline:
    """Corrected times of one diagnosis's individual signals (untimed lines take the time of the closest
    earlier timed line of their file)."""

    clock: Clock
    times: dict[int, float | None]  # id(signal) -> corrected epoch seconds

    def t(self, signal: Signal) -> float | None:
        return self.times.get(id(signal))

    def key(self, signal: Signal) -> tuple[float, int]:
        t = self.t(signal)
        return (t if t is not None else float("inf"), signal.order)


def build_timeline(signals: Sequence[Signal], clock: Clock) -> Timeline:
    times: dict[int, float | None] = {}
    by_file: dict[str | None, list[Signal]] = defaultdict(list)
    for s in signals:
        by_file[s.file].append(s)
    for members in by_file.values():
        members.sort(key=lambda s: s.order)
        last: float | None = None
        pending: list[Signal] = []
        for s in members:
            raw = time_of(s)
            if raw is not None:
                last = clock.correct(raw, s.host)
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
    return Timeline(clock, times)


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")
