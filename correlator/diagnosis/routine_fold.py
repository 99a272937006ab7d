"""How routine observations fold per process: a metric's peak, a progress marker's latest line.

A healthy job prints a metric value (loss, grad norm) and a progress line every step on every rank. The
engine judges a metric by each process's largest value (a spike on one rank) and keeps its smallest
beside it (`metric_min`, for the evidence); of progress it needs each process's latest line. Every path
that sees these lines folds them with the same rule, defined here once:

- a batch's lines (`SignalExtractor.from_texts`, the match role and `rootrank ship` batches);
- a region of a file and the regions of one file (`offline/routine.py`, `rootrank diagnose`);
- the chunks of one file as signals (`offline/diagnose.py`) and a job's signals (`JobState`).

The rule, per key: the largest value, where it was (the earliest place on a tie, so the result does not
depend on the order the observations come in), and the smallest value. A progress marker is the same fold
with its line's position as the value: the latest line wins.
"""

from __future__ import annotations

from collections.abc import Hashable, MutableMapping, Sequence
from typing import TypeVar

from correlator.diagnosis.models import Signal

K = TypeVar("K", bound=Hashable)

# [largest value, where it was, smallest value]; a list, updated in place by the fold (one per process:
# no new object per observation on the bulk paths, which fold millions of lines of a large log).
Peak = list[float]


def fold_peaks(peaks: MutableMapping[K, Peak], keys: Sequence[K], highs: Sequence[float], ats: Sequence[float],
               lows: Sequence[float] | None = None) -> None:
    """Fold observations into `peaks`: for each key its value (`highs`), where it was (`ats`) and, when the
    observation is itself a fold (another region's peak), its smallest value (`lows`, else the value)."""
    for key, high, at, low in zip(keys, highs, ats, highs if lows is None else lows, strict=True):
        current = peaks.get(key)
        if current is None:
            peaks[key] = [high, at, low]
            continue
        if high > current[0] or (high == current[0] and at < current[1]):
            current[0], current[1] = high, at
        if low < current[2]:
            current[2] = low


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def metric_of(signal: Signal) -> tuple[float, float] | None:
    """A metric signal's value and its smallest value (`metric_min`, else the value itself); None when its
    value is not a number."""
    value = _number(signal.fields.get(str(signal.fields["metric"])))
    if value is None:
        return None
    low = _number(signal.fields.get("metric_min", value))
    return value, value if low is None else low


def merge_metric_signals(kept: Signal, new: Signal) -> tuple[Signal, bool] | None:
    """Two signals of one metric rule and process as one, by `fold_peaks`: the signal of the larger value
    (`kept` on a tie), with the smallest value of both in `metric_min`; and whether `new` won. None when
    either value is not a number (nothing to compare)."""
    old, incoming = metric_of(kept), metric_of(new)
    if old is None or incoming is None:
        return None
    peaks: dict[int, Peak] = {0: [old[0], 0.0, old[1]]}
    fold_peaks(peaks, (0,), (incoming[0],), (1.0,), (incoming[1],))
    _high, at, low = peaks[0]
    winner = new if at == 1.0 else kept
    if winner.fields.get("metric_min") != low:
        winner = winner.model_copy(update={"fields": {**winner.fields, "metric_min": low}})
    return winner, at == 1.0
