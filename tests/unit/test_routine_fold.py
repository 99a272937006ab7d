"""The one fold of routine observations (correlator/diagnosis/routine_fold.py): what every path keeps."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from correlator.diagnosis.models import Signal
from correlator.diagnosis.routine_fold import Peak, fold_peaks, merge_metric_signals

_OBSERVATIONS = st.lists(st.tuples(st.sampled_from("abc"), st.integers(-3, 3)), max_size=40)


@given(_OBSERVATIONS, st.randoms(use_true_random=False))
def test_a_fold_keeps_the_largest_value_its_earliest_place_and_the_smallest_in_any_order(
    observations: list[tuple[str, int]], rng: random.Random
) -> None:
    expected: dict[str, Peak] = {}
    for key in {k for k, _ in observations}:
        values = [(v, at) for at, (k, v) in enumerate(observations) if k == key]
        high = max(v for v, _ in values)
        expected[key] = [high, min(at for v, at in values if v == high), min(v for v, _ in values)]
    shuffled = list(enumerate(observations))
    rng.shuffle(shuffled)
    peaks: dict[str, Peak] = {}
    fold_peaks(peaks, [k for _, (k, _) in shuffled], [float(v) for _, (_, v) in shuffled],
               [float(at) for at, _ in shuffled])
    assert peaks == expected


@given(_OBSERVATIONS, st.integers(0, 40))
def test_folding_two_halves_then_their_peaks_is_folding_the_whole(observations: list[tuple[str, int]], cut: int) -> None:
    """A file's regions fold apart and merge (offline/routine.py): the same as one fold of every line."""
    def fold(part: list[tuple[int, tuple[str, int]]]) -> dict[str, Peak]:
        peaks: dict[str, Peak] = {}
        fold_peaks(peaks, [k for _, (k, _) in part], [float(v) for _, (_, v) in part], [float(at) for at, _ in part])
        return peaks

    lines = list(enumerate(observations))
    whole, first, second = fold(lines), fold(lines[:cut]), fold(lines[cut:])
    fold_peaks(first, list(second), [p[0] for p in second.values()], [p[1] for p in second.values()],
               [p[2] for p in second.values()])
    assert first == whole


def _metric(value: float | str, order: int, **fields: float) -> Signal:
    return Signal(job_id="j", rule_id="grad-norm", kind="match", order=order, rank=3, line=f"grad_norm {value}",
                  fields={"metric": "grad_norm", "grad_norm": value, **fields})


def test_two_metric_signals_merge_into_the_larger_value_with_the_smallest_of_both() -> None:
    kept, new = _metric(5.0, 1, metric_min=0.5), _metric(7.0, 2, metric_min=2.0)
    merged = merge_metric_signals(kept, new)
    assert merged is not None
    signal, won = merged
    assert won and signal.order == 2 and signal.fields["metric_min"] == 0.5
    tie = merge_metric_signals(kept, _metric(5.0, 3))
    assert tie is not None and not tie[1] and tie[0].order == 1, "a tie keeps the signal already kept"
    assert merge_metric_signals(kept, _metric("n/a", 4)) is None
