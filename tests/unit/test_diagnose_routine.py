"""Routine lines (metric values, progress markers) reach the engine per process: each process's latest
progress line and its largest and smallest metric value, whatever the chunk edges, the scan processes
or the reader (mapped file, or chunks as for stdin and .gz)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
