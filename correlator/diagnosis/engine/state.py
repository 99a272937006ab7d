"""What the engine keeps about one job between batches, in a size that does not grow with its lines.

`JobState` is one pydantic model, stored whole in the correlate role's faust Table (changelog-backed):
its fields, their names and their JSON are what a restarted worker reads back, so they do not change
when code moves between the modules that hold its parts:
- `facts.py` (`JobFacts`): collective progress per process group, identity, restarts and attempts,
  completions and each process's latest progress line, the anchors that align host clocks;
- `store.py` (`SignalStore`): causes kept individually, collateral as aggregates, markers and metric
  peaks, each within its bound, and what a bound dropped;
- here: the job's id, the streaming bookkeeping, and `add`, which gives each signal to both.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ConfigDict, Field

from correlator.diagnosis.engine.store import SignalStore
from correlator.diagnosis.models import Signal


class JobState(SignalStore):
    """Everything the engine keeps about one job; serializable for a faust Table (changelog-backed)."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    last_update: float | None = None
    # Streaming bookkeeping: what was emitted, so a restart or a replay does not emit twice.
    emitted: dict[str, str] = Field(default_factory=dict)
    revisions: dict[str, int] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)

    def add(self, signal: Signal, now: float | None = None) -> bool:
        """Add one signal; True when the state changed in a way that can change the diagnosis."""
        if now is not None:
            self.last_update = now
        self.note_clock(signal)
        facts_changed = self.note_facts(signal)
        return self.keep(signal) or facts_changed

    def add_all(self, signals: Iterable[Signal], now: float | None = None) -> None:
        for signal in signals:
            self.add(signal, now)
