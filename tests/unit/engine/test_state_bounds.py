"""The job state's per-rule bounds hold whatever order the signals come in: a rule keeps its latest
MAX_MARKERS_PER_RULE markers of each kind, and a rule its earliest matches individually (the rest folded
into its aggregate). Other rules' signals are interleaved, so positions in the state move while the bounds
are checked."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from correlator.diagnosis.engine import JobState
from correlator.diagnosis.engine.keys import sort_key
from correlator.diagnosis.engine.store import _PER_RULE, MAX_MARKERS_PER_RULE
from correlator.diagnosis.models import Signal

T0 = datetime(2026, 3, 14, 9, 0, 0, tzinfo=UTC)


def _marker(rule_id: str, rank: int, at_s: float) -> Signal:
    return Signal(job_id="j", rule_id=rule_id, kind="fact", host=f"node-{rank // 8}", rank=rank,
                  ts=T0 + timedelta(seconds=at_s), line=f"step {int(at_s)}", fields={"marker": "end", "progress": 1})


def _timeout(rank: int, at_s: float) -> Signal:  # folded into an aggregate, never kept
    return Signal(job_id="j", rule_id="nccl-watchdog-timeout", class_="nccl_timeout", role="collateral",
                  severity="high", host=f"node-{rank // 8}", rank=rank, ts=T0 + timedelta(seconds=at_s),
                  line=f"[Rank {rank}] Watchdog caught collective operation timeout")


def test_each_rule_keeps_its_latest_markers_and_no_more() -> None:
    rng = random.Random(5)
    signals = [_marker(rule, rank, rng.uniform(0, 600)) for rule in ("progress-a", "progress-b") for rank in range(200)]
    rng.shuffle(signals)
    state = JobState(job_id="j")
    for signal in signals:
        state.add(signal)
        # interleave other rules' signals so positions move under the index
        state.add(_timeout(rng.randrange(200), rng.uniform(0, 600)))
    for rule in ("progress-a", "progress-b"):
        kept = sorted((s for s in state.signals if s.rule_id == rule), key=sort_key)
        wanted = sorted((s for s in signals if s.rule_id == rule), key=sort_key)[-MAX_MARKERS_PER_RULE:]
        assert kept == wanted


def _error(rank: int, at_s: float) -> Signal:
    return Signal(job_id="j", rule_id="dataloader-worker-killed", class_="dataloader_worker_killed", role="either",
                  severity="high", host=f"node-{rank // 8}", rank=rank, ts=T0 + timedelta(seconds=at_s),
                  line=f"[rank{rank}]: RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.")


def test_a_rule_keeps_its_earliest_matches_individually_and_folds_the_rest() -> None:
    rng = random.Random(6)
    errors = [_error(rank, rng.uniform(0, 60)) for rank in range(100)]
    state = JobState(job_id="j")
    for index, signal in enumerate(errors):
        state.add(signal)
        state.add(_marker("progress-a", index, 1000 + index))  # other rules' signals move positions
    kept = [s for s in state.signals if s.rule_id == "dataloader-worker-killed"]
    limit = _PER_RULE["either"]
    assert sorted(kept, key=sort_key) == sorted(errors, key=sort_key)[:limit]
    assert sum(a.count for a in state.aggregates.values()) == len(errors) - limit


def test_markers_refused_by_a_remembered_floor_are_those_a_full_scan_refuses() -> None:
    """A rule's full set of markers remembers its earliest sort key, so a marker no later is refused without
    a scan. Fed latest first (as diagnose feeds progress lines), in random order, with repeats of the same
    line and with evictions of other rules' signals in between, the state is at every step the one that
    scanning for every marker gives."""
    rng = random.Random(7)
    markers = [_marker(rule, rank, rng.uniform(0, 600)) for rule in ("progress-a", "progress-b") for rank in range(120)]
    latest_first = sorted(markers, key=sort_key, reverse=True)
    shuffled = markers[:]
    rng.shuffle(shuffled)
    repeats = [m.model_copy(update={"ts": m.ts + timedelta(seconds=5)}) for m in rng.sample(markers, 40)]  # type: ignore[operator]
    for feed in (latest_first, shuffled + repeats, latest_first[:60] + shuffled):
        remembered, scanned = JobState(job_id="j"), JobState(job_id="j")
        refused_by_floor = 0
        for index, signal in enumerate(feed):
            floors_before = dict(remembered._lookup.floors)
            remembered.add(signal)
            scanned._forget_floors()  # as if no floor were ever kept: every marker scans
            scanned.add(signal)
            key = (signal.rule_id, "end")
            refused_by_floor += key in floors_before and sort_key(signal) <= floors_before[key]
            if index % 7 == 0:  # matches past their rule's bound are evicted: positions move, floors are forgotten
                for state in (remembered, scanned):
                    state.add(_error(index % 100, float(index)))
            assert remembered.signals == scanned.signals
        assert remembered.repeats == scanned.repeats and remembered.progress == scanned.progress
    assert refused_by_floor > 50
