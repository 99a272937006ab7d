"""The acceptance scenarios of the foundation issue, against the real rule library."""

from __future__ import annotations

import pytest

from correlator.diagnosis.engine import Engine
from correlator.diagnosis.signals import SignalExtractor
from tests.unit.engine.conftest import JobBuilder, run


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rank37_cuda_oom_is_initiator_among_63_watchdog_timeouts(
    engine: Engine, extractor: SignalExtractor, seed: int
) -> None:
    job = JobBuilder(seed=seed)
    job.init_lines()
    job.emit(37, 100.0, "[rank37]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                        "GPU 5 has a total capacity of 79.14 GiB of which 1.19 GiB is free.")
    for r in range(64):
        if r != 37:
            # Timeouts fire 600 s after the collective; skew is up to +-3 s, so some hosts' lines
            # carry timestamps earlier than others' but all are far after the OOM.
            job.watchdog(r, 700.0 + job.rng.uniform(0, 0.2), seq=1580, completed=1579)
    job.teardown(705.0)
    incidents = run(engine, extractor, list(job.shuffled()))
    assert incidents, "a failed job must give an incident"
    primary = incidents[0]
    assert primary.class_ == "cuda_oom"
    assert primary.initiator.rank == 37
    assert primary.initiator.host == job.host_of(37)
    timeouts = [c for c in primary.collateral if c.class_ == "nccl_timeout"]
    assert len(timeouts) == 1, "63 identical timeouts collapse into one collateral entry"
    assert timeouts[0].ranks == [r for r in range(64) if r != 37]
    assert any(c.class_ == "launcher_teardown" for c in primary.collateral)
    assert primary.fix and primary.verify


def test_xid_on_rank37_host_beats_timeouts_even_when_its_clock_is_behind(
    engine: Engine, extractor: SignalExtractor
) -> None:
    job = JobBuilder(seed=11)
    host37 = job.host_of(37)
    job.skew[host37] = -3.0  # rank 37's host clock runs 3 s behind
    for h in job.hosts:
        if h != host37:
            job.skew[h] = 3.0
    job.init_lines()
    job.emit(None, 99.0, "kernel: NVRM: Xid (PCI:0000:4b:00): 79, pid=40037, GPU has fallen off the bus.", host=host37)
    job.emit(37, 99.5, "[rank37]: RuntimeError: CUDA error: unspecified launch failure")
    for r in range(64):
        if r != 37:
            job.watchdog(r, 98.0 + 0.5 + job.rng.uniform(0, 0.1) + 600, seq=212, completed=211)
    incidents = run(engine, extractor, list(job.shuffled()))
    primary = incidents[0]
    assert primary.class_ == "gpu_hardware_error"
    assert primary.initiator.host == host37


def test_hang_without_error_line_names_the_lagging_rank(engine: Engine, extractor: SignalExtractor) -> None:
    job = JobBuilder(seed=5)
    job.init_lines()
    for r in range(64):
        # Rank 21 is stuck before collective 4486: it completed 4484, everyone else 4485.
        completed = 4484 if r == 21 else 4485
        job.watchdog(r, 700.0 + job.rng.uniform(0, 1), seq=completed + 1, completed=completed)
    incidents = run(engine, extractor, list(job.shuffled()))
    primary = incidents[0]
    assert primary.initiator.rank == 21
    assert primary.class_ in ("straggler_hang", "nccl_timeout")
    assert "21" in primary.confidence_reason


def test_hang_where_one_rank_never_reports_names_the_missing_rank(
    engine: Engine, extractor: SignalExtractor
) -> None:
    job = JobBuilder(seed=9)
    job.init_lines()
    for r in range(64):
        if r != 50:
            job.watchdog(r, 700.0 + job.rng.uniform(0, 1), seq=77, completed=76)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.initiator.rank == 50
    assert primary.class_ == "straggler_hang"


def test_checkpoint_truncated_on_save_then_failing_on_load(engine: Engine, extractor: SignalExtractor) -> None:
    job = JobBuilder(world=8, hosts=2, seed=3)
    job.emit(0, 10.0, "[rank0]: Saving checkpoint to /ckpt/step_4000/model.pt")
    job.emit(0, 11.0, "[rank0]: OSError: [Errno 28] No space left on device")
    for r in range(8):
        job.emit(r, 500.0 + r * 0.1, f"[rank{r}]: _pickle.UnpicklingError: pickle data was truncated")
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.class_ in ("disk_full", "checkpoint_torn_write", "partial_checkpoint_save", "torch_save_failed")
    assert primary.initiator.rank == 0
    loads = [c for c in primary.collateral
             if c.class_ in ("unpickling_truncated", "torch_load_failed", "partial_checkpoint_save")]
    assert loads and len(loads[0].ranks) >= 7


def test_only_timeouts_without_lag_report_no_initiator(engine: Engine, extractor: SignalExtractor) -> None:
    job = JobBuilder(world=8, hosts=1, seed=4)
    for r in range(8):
        job.watchdog(r, 700.0, seq=808, completed=807)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.class_ == "nccl_timeout"
    assert primary.initiator.rank is None
    assert primary.confidence < 0.5


def test_incident_id_is_deterministic_and_independent_of_arrival_order(
    engine: Engine, extractor: SignalExtractor
) -> None:
    job = JobBuilder(seed=2)
    job.emit(37, 100.0, "[rank37]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    for r in range(64):
        if r != 37:
            job.watchdog(r, 700.0, seq=9, completed=8)
    a = run(engine, extractor, list(job.shuffled()))[0]
    b = run(engine, extractor, list(reversed(job.events)))[0]
    assert a.incident_id == b.incident_id
    assert (a.class_, a.initiator, a.collateral) == (b.class_, b.initiator, b.collateral)


def test_no_signal_no_incident(engine: Engine, extractor: SignalExtractor) -> None:
    job = JobBuilder(world=8, hosts=1)
    for r in range(8):
        job.emit(r, float(r), f"[rank{r}]: step 100 loss 2.31 lr 3e-4 grad_norm 1.02")
    assert run(engine, extractor, job.events) == []
