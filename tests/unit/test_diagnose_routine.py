"""Routine lines (metric values, progress markers) reach the engine per process: each process's latest
progress line and its largest and smallest metric value, whatever the chunk edges, the scan processes
or the reader (mapped file, or chunks as for stdin and .gz)."""

from __future__ import annotations

from pathlib import Path

import pytest

from correlator.diagnosis.matcher import trailing_numbers
from correlator.diagnosis.models import Signal
from correlator.offline import diagnose
from correlator.offline.diagnose import Diagnoser, DiagnoseStats


@pytest.fixture(scope="module")
def diagnoser() -> Diagnoser:
    return Diagnoser()


def _write(path: Path, prefixed: bool) -> dict[str, tuple[float, float, str]]:
    """A log of 3 processes printing HF Trainer dicts; returns process -> (max, min, last line)."""
    lines: list[str] = []
    expect: dict[str, list[float]] = {}
    last: dict[str, str] = {}
    for step in range(400):
        for rank in range(3):
            norm = 1.0 + ((step * 7 + rank * 3) % 11) / 10
            if rank == 1 and step == 123:
                norm = 42.5  # rank 1's spike
            if rank == 2 and step == 250:
                norm = 0.0625
            who = f"[rank{rank}]:" if prefixed else f"gpu-node-{rank}:{4000 + rank}:{4000 + rank} [0] "
            line = f"{who}{{'loss': {2.0 - step / 400:.4f}, 'grad_norm': {norm}, 'learning_rate': 3e-05, 'epoch': 0.{step}}}"
            lines.append(line)
            expect.setdefault(str(rank), []).append(norm)
            last[str(rank)] = line
        lines.append("INFO some chatter that hits no rule " + "x" * (step % 50))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {k: (max(v), min(v), last[k]) for k, v in expect.items()}


def _who(signal: Signal, prefixed: bool) -> str:
    return str(signal.rank) if prefixed else str((signal.pid or 0) - 4000)


@pytest.mark.parametrize("prefixed", [True, False], ids=["launcher-prefix", "nccl-prefix"])
@pytest.mark.parametrize("reader", ["mapped", "parallel", "chunked"])
def test_each_process_keeps_its_latest_progress_and_its_metric_extremes(
    prefixed: bool, reader: str, diagnoser: Diagnoser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "train.log"
    expect = _write(log, prefixed)
    monkeypatch.setattr(diagnose, "CHUNK_BYTES", 4096)  # the file spans many chunks
    if reader == "chunked":
        sources = diagnose.iter_sources

        def unmapped(raw: list[str], stats: DiagnoseStats):  # type: ignore[no-untyped-def]
            for source in sources(raw, stats):
                source.path = None
                yield source

        monkeypatch.setattr(diagnose, "iter_sources", unmapped)
    diagnoser.jobs = 2 if reader == "parallel" else 1
    try:
        _, signals = diagnoser.diagnose([str(log)], "job")
    finally:
        diagnoser.jobs = 1

    progress: dict[tuple[str, str], list[Signal]] = {}
    metric: dict[str, list[Signal]] = {}
    for s in signals:
        if s.fields.get("marker") == "end":
            progress.setdefault((s.rule_id, _who(s, prefixed)), []).append(s)
        elif "metric" in s.fields:
            metric.setdefault(_who(s, prefixed), []).append(s)
    rules = {rule for rule, _ in progress}
    assert "straggler-step-no-progress" in rules
    for rule in rules:
        for who, (_high, _low, last_line) in expect.items():
            (latest,) = progress[(rule, who)]  # one per rule and process
            assert last_line.endswith(latest.line), (rule, who, latest.line)
    for who, (high, low, _last) in expect.items():
        (peak,) = metric[who]
        assert peak.fields["grad_norm"] == high and peak.fields["metric_min"] == low, (who, peak.fields)


_ODD_VALUES = [
    "{'loss': 2.1, 'grad_norm': 0.8811, 'learning_rate': 2e-05}",
    "{'grad_norm': 12}",
    " iteration     3100/  200000 | lm loss: 2.011E+00 | grad norm: 0.377 | params norm: 227.153 |",
    "| epoch 003 | loss 4.112 | nll_loss 2.61 | gnorm 0.512 | lr 0.0005",
    "step 9 grad_norm=1.5e+03, weight_norm=3E-2;",
    'grad_norm: "7.25"',
    "grad norm:\t65504.0\r",
    "grad_norm=4.5-",  # a sign after the value: not a plain number, read by the regex
    "grad_norm: 1" + "0" * 70 + ".5 (a number longer than the window)",
    "gradient_norm: 3 at the end",
    "grad_norm: 8",  # the value ends the buffer
]


def test_metric_values_read_in_bulk_equal_the_rules_value_regex(diagnoser: Diagnoser) -> None:
    """The bulk reader (the last number before each match's end) gives what the rule's regex gives, or
    gives up (None) and the regex reads the lot."""
    aggregator, matcher = diagnoser.routine, diagnoser.matcher
    buf = "\n".join(f"[rank{i}]:{line}" for i, line in enumerate(_ODD_VALUES)).encode()
    hits = [hit for hit in matcher.scan_split(buf, main=False)[1] if hit[1] < matcher.routine_base + matcher.routine_metrics]
    by_id: dict[int, list[int]] = {}
    for to, rid in hits:
        by_id.setdefault(rid - matcher.routine_base, []).append(to)
    assert len(by_id) >= 3  # grad norm, gnorm and params/weight norm
    read_in_bulk = 0
    for r, ends in by_id.items():
        assert matcher.routine_trailing[r]
        starts = [buf.rfind(b"\n", 0, to - 1) + 1 for to in ends]
        exact = aggregator._values(buf, len(buf), r, starts, ends)
        for one in range(len(ends)):  # each alone, so one odd value does not send the others to the regex
            bulk = trailing_numbers(buf, ends[one : one + 1], starts[one : one + 1])
            if bulk is not None:
                read_in_bulk += 1
                assert bulk == exact[one : one + 1], buf[starts[one] : ends[one]]
        together = trailing_numbers(buf, ends, starts)
        assert together is None or together == exact
    assert read_in_bulk >= 9
    sign = buf.index(b"grad_norm=4.5-")
    assert trailing_numbers(buf, [sign + len("grad_norm=4.5-")], [sign]) is None
    long = buf.index(b"grad_norm: 10")
    assert trailing_numbers(buf, [buf.index(b" (a number", long) + 1], [long]) is None
