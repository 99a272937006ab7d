"""What the engine keeps about one job between batches: deduplicated signals and repeat counts."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from correlator.diagnosis.models import Signal

MAX_SIGNALS_PER_JOB = 4000


def _dedupe_key(signal: Signal) -> str:
    marker = signal.fields.get("marker", "")
    return "|".join(
        str(v)
        for v in (signal.rule_id, signal.kind, marker, signal.rank, signal.local_rank, signal.host, signal.pid, signal.gpu)
    )


def _time_of(signal: Signal) -> float | None:
    ts = signal.ts or signal.received_ts
    return ts.timestamp() if ts is not None else None


def _sort_key(signal: Signal) -> tuple[float, int]:
    t = _time_of(signal)
    return (t if t is not None else float("inf"), signal.order)


class JobState(BaseModel):
    """Everything the engine keeps about one job; serializable for a faust Table (changelog-backed).

    Repeats of the same rule on the same process collapse into one signal (the earliest) and a count,
    so a job that prints the same error a million times costs one entry.
    """

    model_config = ConfigDict(extra="ignore")

    job_id: str
    signals: list[Signal] = Field(default_factory=list)
    repeats: dict[str, int] = Field(default_factory=dict)
    dropped: int = 0
    last_update: float | None = None
    # Streaming bookkeeping: what was emitted, so a restart or a replay does not emit twice.
    emitted: dict[str, str] = Field(default_factory=dict)
    revisions: dict[str, int] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    _index: dict[str, int] | None = PrivateAttr(default=None)

    def add(self, signal: Signal, now: float | None = None) -> bool:
        """Add one signal; True when the state changed in a way that can change the diagnosis.

        Repeats collapse per (rule, process): a failure keeps its earliest line, a progress marker
        ("end") its latest, a metric observation its largest value (with the smallest in `metric_min`).
        """
        if now is not None:
            self.last_update = now
        key = _dedupe_key(signal)
        index = self._key_index()
        position = index.get(key)
        if position is None:
            if len(self.signals) >= MAX_SIGNALS_PER_JOB:
                self.dropped += 1
                return False
            index[key] = len(self.signals)
            self.signals.append(signal)
            return True
        self.repeats[key] = self.repeats.get(key, 0) + 1
        existing = self.signals[position]
        metric = signal.fields.get("metric")
        if isinstance(metric, str):
            new, old = signal.fields.get(metric), existing.fields.get(metric)
            low = existing.fields.get("metric_min", old)
            if isinstance(new, (int, float)) and isinstance(old, (int, float)):
                low = min(new, low) if isinstance(low, (int, float)) else new
                winner = signal if new > old else existing
                self.signals[position] = winner.model_copy(update={"fields": {**winner.fields, "metric_min": low}})
                return winner is signal
            return False
        later_wins = signal.fields.get("marker") == "end"
        if (_sort_key(signal) > _sort_key(existing)) if later_wins else (_sort_key(signal) < _sort_key(existing)):
            self.signals[position] = signal
            return True
        return False

    def _key_index(self) -> dict[str, int]:
        if self._index is None or len(self._index) != len(self.signals):
            self._index = {_dedupe_key(s): i for i, s in enumerate(self.signals)}
        return self._index

    def add_all(self, signals: Iterable[Signal], now: float | None = None) -> None:
        for signal in signals:
            self.add(signal, now)

    def count(self, signal: Signal) -> int:
        return 1 + self.repeats.get(_dedupe_key(signal), 0)
