"""A job's state is stored whole in the correlate role's faust Table (changelog-backed): a restarted or
rebalanced worker reads back what an earlier version wrote. `data/job_state_stored.json` was written by
`JobState.model_dump(mode="json", by_alias=True)` before state.py was split into facts.py and store.py (two
simulated jobs of 32 ranks: a grad-norm spike after a restart, a hang in a tensor-parallel group, plus
streaming bookkeeping); moving code between the modules must not change what it reads back."""

from __future__ import annotations

import json
from pathlib import Path

from correlator.diagnosis.engine import JobState

STORED = Path(__file__).parent / "data" / "job_state_stored.json"


def test_a_stored_state_reads_back_field_for_field() -> None:
    """Fields may be added (a stored state reads back with their defaults), never renamed or removed."""
    stored = json.loads(STORED.read_text())
    assert set(stored) <= set(JobState.model_fields), "a field renamed or removed: stored states lose it"
    state = JobState.model_validate(stored)
    dumped = state.model_dump(mode="json", by_alias=True)
    assert {name: dumped[name] for name in stored} == stored
    added = set(JobState.model_fields) - set(stored)
    fresh = JobState(job_id="fresh").model_dump(mode="json", by_alias=True)
    assert {name: dumped[name] for name in added} == {name: fresh[name] for name in added}, "new fields: defaults"
    assert all(stored[name] for name in ("signals", "repeats", "aggregates", "groups", "identity", "restarts",
                                         "progress", "anchors", "emitted")), "the sample exercises every table"


def test_a_restored_state_knows_the_signals_it_holds() -> None:
    """Its key index is built from the signals read back: a line it holds again is a repeat, not a second entry."""
    state = JobState.model_validate(json.loads(STORED.read_text()))
    kept = len(state.signals)
    for signal in state.signals[:: max(1, kept // 10)]:
        before = state.count(signal)
        state.add(signal)
        assert state.count(signal) == before + 1
    assert len(state.signals) == kept
