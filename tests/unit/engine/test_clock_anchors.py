"""The clock-skew correction, one kind of shared event per test (engine/timeline.py, anchors kept by facts.py).

Every test is the same race: two ranks on two hosts run out of memory on the same oversized batch, 1.5 s
apart. The one that failed first is on a host whose clock runs 4 s ahead, so its line carries the later
timestamp; read as the clocks say, the second rank looks first. Each job holds exactly one kind of event that
every host saw at one true moment, so only that kind can put the two lines in their true order; switching it
off (its `_anchor` call in facts.py skipped, or the receive-lag fallback in `estimate_clock`) names the second
rank. `estimate_clock` returning `Clock()` fails every test here.
"""

from __future__ import annotations

from correlator.diagnosis.engine import Engine
from correlator.diagnosis.signals import SignalExtractor
from tests.unit.engine.conftest import JobBuilder, run

OOM = ("[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU {d} has a total "
       "capacity of 79.14 GiB of which 2.87 GiB is free. Including non-PyTorch memory, this process has 76.26 GiB "
       "memory in use. Of the allocated memory 71.02 GiB is allocated by PyTorch, and 3.71 GiB is reserved by "
       "PyTorch but unallocated.")
FIRST, SECOND = 2, 12  # rank 2 on gpu-node-00 (4 s ahead) fails first, rank 12 on gpu-node-01 1.5 s later


def _race(seed: int) -> JobBuilder:
    """16 ranks on 2 hosts; gpu-node-00's clock 4 s ahead of gpu-node-01's. Rank 2 runs out of memory at
    100.0 s, rank 12 at 101.5 s (true time): rank 2's line reads 104.0 s."""
    job = JobBuilder(world=16, hosts=2, skew_s=0.0, seed=seed)
    job.skew[job.hosts[0]] = 4.0
    return job


def _fail(job: JobBuilder) -> None:
    job.emit(FIRST, 100.0, OOM.format(r=FIRST, d=FIRST % job.per_host))
    job.emit(SECOND, 101.5, OOM.format(r=SECOND, d=SECOND % job.per_host))


def test_the_watchdog_timeouts_of_one_collective_align_the_clocks(engine: Engine, extractor: SignalExtractor) -> None:
    """The 14 survivors wait in allreduce 4410 of the default group; their watchdogs fire together 600 s later
    (`wd:0:4410`, the only shared event of the job): the offset of each host is read off them, and rank 2's
    OOM, the first on the common clock, explains the timeouts. (Off: the `wd:PG:Seq` anchor not recorded ->
    host clocks taken as they are -> rank 12, whose line carries the earlier timestamp, is named.)"""
    job = _race(seed=51)
    _fail(job)
    for r in range(job.world):
        if r not in (FIRST, SECOND):
            job.watchdog_pg(r, 700.0 + job.rng.uniform(0, 0.3), pg=0, pg_rank=r, seq=4410, enqueued=4410,
                            completed=4409)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("cuda_oom", FIRST)
    assert "watchdog timeouts" in primary.clock


def test_the_launchers_teardown_aligns_the_clocks(engine: Engine, extractor: SignalExtractor) -> None:
    """No watchdog line, no NCCL init line, no training step: the job's only shared event is the failure of
    the worker group, when every torchelastic agent sends its workers SIGTERM within half a second (the
    `teardown` anchor). (Off: the `teardown` anchor not recorded -> no alignment -> rank 12 is named.)"""
    job = _race(seed=52)
    _fail(job)
    job.teardown(130.0)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("cuda_oom", FIRST)
    assert "launcher teardowns" in primary.clock


def test_the_same_training_step_on_every_rank_aligns_the_clocks(engine: Engine, extractor: SignalExtractor) -> None:
    """A synchronous data-parallel job: every rank prints the same global gradient norm at the same step,
    within a few hundredths of a second of the others (the `step:N` anchor, from the metric line the engine
    keeps per process). No other shared event. (Off: the `step:N` anchor not recorded -> rank 12 is named.)"""
    job = _race(seed=53)
    for k in range(6):
        norm = 0.92 + 0.03 * k
        for r in range(job.world):
            job.emit(r, 40.0 + 1.21 * k + job.rng.uniform(0, 0.05),
                     f"[rank{r}]: step {3120 + k}/20000 | loss {2.41 - 0.01 * k:.4f} | lr 2.95e-04 | grad_norm {norm:.3f}"
                     " | 1.21 s/it")
    _fail(job)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("cuda_oom", FIRST)
    assert "training steps" in primary.clock


def test_the_forwarders_receive_times_align_the_clocks_when_no_event_is_shared(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Streamed through a forwarder that stamps each line as it reads it (NTP-synced, a fifth of a second
    behind the writer): no event is shared by the hosts, but each host's smallest line-time-minus-receive-time
    is its clock's offset (the 'heartbeat' of issue 27: the receive-lag fallback of `estimate_clock`).
    (Off: the receive-lag fallback skipped -> host clocks taken as they are -> rank 12 is named.)"""
    job = _race(seed=54)
    job.forwarder_delay_s = 0.2
    _fail(job)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("cuda_oom", FIRST)
    assert "receive times" in primary.clock


def test_every_kind_of_shared_event_together_aligns_the_clocks(engine: Engine, extractor: SignalExtractor) -> None:
    """The whole job, as torchrun runs it: NCCL's init burst, training steps, the race, the survivors'
    watchdog timeouts, the agents' teardown. Any one kind switched off, the others still align the clocks;
    this test is for the correction as a whole. (Off: `estimate_clock` returning `Clock()` -> rank 12.)"""
    job = _race(seed=55)
    job.init_lines()
    for k in range(4):
        for r in range(job.world):
            job.emit(r, 30.0 + 1.2 * k + job.rng.uniform(0, 0.05),
                     f"[rank{r}]: step {800 + k}/20000 | loss 2.3{k} | lr 1e-04 | grad_norm 1.1{k}")
    _fail(job)
    for r in range(job.world):
        if r not in (FIRST, SECOND):
            job.watchdog_pg(r, 700.0 + job.rng.uniform(0, 0.3), pg=0, pg_rank=r, seq=812, enqueued=812, completed=811)
    job.teardown(705.0)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("cuda_oom", FIRST)
