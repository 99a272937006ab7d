"""Engine bugs found while writing the mechanism tests (issue 27, category 7), each its minimal failing job: a
known one is a strict xfail (the fix makes the test pass, which fails the suite until the mark goes, as the
scale suite's KNOWN_ENGINE_MISSES and the round trip's xfails do); a fixed one stays as the test of its fix."""

from __future__ import annotations

from correlator.diagnosis.engine import Engine
from correlator.diagnosis.signals import SignalExtractor
from tests.unit.engine.conftest import JobBuilder, run
from tests.unit.engine.test_cascade_mechanisms import inferred_restart_job
from tests.unit.engine.test_yielding import BARRIER, BARRIER_RAISED, REACHED, SEGV_REPORT


def _barrier_job(hosts: int, init_lines: bool) -> JobBuilder:
    """8 ranks: rank 6 dies without a line, rank 0's monitoredBarrier names it, rank 6's node's agent reports
    its exit on SIGSEGV 1.7 s later."""
    job = JobBuilder(world=8, hosts=hosts, skew_s=0.0, seed=61)
    if init_lines:
        job.init_lines()
    job.emit(0, 130.0, BARRIER.format(n=6))
    job.emit(0, 130.001, BARRIER_RAISED.format(n=6))
    for r in (1, 2, 3, 4, 5, 7):
        job.emit(r, 130.02 + 0.01 * r, REACHED.format(r=r))
    job.emit(None, 131.7, SEGV_REPORT.format(local=6 % job.per_host, pid=40006), host=job.host_of(6))
    return job


def test_a_hint_naming_a_rank_on_another_node_yields_to_that_ranks_own_failure(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Two nodes: rank 0 (gpu-node-00) names rank 6 (gpu-node-01) in its monitoredBarrier report; rank 6's
    own node reports its SIGSEGV: the hint yields to it, and the hint's writer's host is not rank 6's.
    (Off: a hint's line keeps its writer's host -> straggler_hang, 'rank 6 on gpu-node-00'.)"""
    primary = run(engine, extractor, list(_barrier_job(hosts=2, init_lines=True).shuffled()))[0]
    assert (primary.class_, primary.initiator.rank, primary.initiator.host) == ("process_crash_signal", 6, "gpu-node-01")


def test_a_hint_does_not_tie_its_writers_local_rank_to_the_rank_it_names(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """One node, no NCCL init lines (nothing else ties the pids): the report of local rank 6 must be rank 6.
    (Off: a line naming another rank keeps its writer's local rank and pid -> the report resolves to rank 12
    and the hint does not yield: straggler_hang.)"""
    primary = run(engine, extractor, list(_barrier_job(hosts=1, init_lines=False).shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("process_crash_signal", 6)


def test_the_attempt_after_an_inferred_restart_names_its_own_cause(engine: Engine, extractor: SignalExtractor) -> None:
    """The job of `test_workers_logging_again_after_their_agent_reported_them_failed_is_a_restart`: attempt 1
    ends with rank 9's Xid. (Off: the inferred restart at the report's own time -> the report is attempt 1's
    first consequence, every failure of attempt 1 comes after it: launcher_teardown, no rank.)"""
    primary = run(engine, extractor, list(inferred_restart_job(seed=73).shuffled()))[0]
    assert (primary.attempt, primary.class_, primary.initiator.rank) == (1, "gpu_hardware_error", 9)
