"""Hangs read from the groups that timed out, one mechanism per test: a survived failure told by a collective
the process entered after it (`JobFacts`: a watchdog's "ran for N milliseconds"), the group behind watchdog
lines that name none (`progress.unnamed_groups`), and the first group to report chosen on the common clock
(`progress.hang_suspect`'s `correct`). Every job is 32 ranks on 4 hosts of 8, tensor-parallel groups of 4
consecutive ranks and data-parallel groups of every 4th rank, in torch's own watchdog wordings."""

from __future__ import annotations

from correlator.diagnosis.engine import Engine
from correlator.diagnosis.signals import SignalExtractor
from tests.unit.engine.conftest import JobBuilder, run

TP_WORK = "WorkNCCL(SeqNum=7001, OpType=ALLREDUCE, NumelIn=16777216, NumelOut=16777216, Timeout(ms)=600000)"
DP_WORK = "WorkNCCL(SeqNum=1750, OpType=_REDUCE_SCATTER_BASE, NumelIn=67108864, NumelOut=4194304, Timeout(ms)=600000)"
OOM = ("[rank{r}]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU {d} has a total "
       "capacity of 79.14 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process has 78.8 GiB "
       "memory in use.")


def _watchdog_22(job: JobBuilder, rank: int, at_s: float, within: int, work: str) -> None:
    """torch 2.2's watchdog line: the writer's rank within the group (`[Rank 1]`), no group named."""
    job.emit(rank, at_s, f"[rank{rank}]:[E ProcessGroupNCCL.cpp:523] [Rank {within}] Watchdog caught collective "
                         f"operation timeout: {work} ran for 600043 milliseconds before timing out.")


def test_a_failure_the_process_outlived_into_a_later_collective_is_survived(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Rank 5 runs out of memory during an evaluation batch at 150 s, catches it and goes on; it prints no
    progress line after. At 200 s every rank enters an all-reduce that rank 11 never joins; 600 s later every
    rank but 11 reports the timeout, each "ran for 600043 milliseconds": rank 5 was in that collective, 50 s
    after its OOM. The OOM is a survived warning; the hang is rank 11's. (Off: the watchdog's enqueue time not
    read as the process going on -> the OOM, unexplained, is the initiator.)"""
    job = JobBuilder(world=32, hosts=4, skew_s=0.0, seed=81)
    job.init_lines()
    job.emit(5, 150.0, OOM.format(r=5, d=5))
    for r in range(job.world):
        if r != 11:
            job.emit(r, 800.0 + job.rng.uniform(0, 0.3),
                     f"[rank{r}]:[E ProcessGroupNCCL.cpp:523] [Rank {r}] Watchdog caught collective operation "
                     f"timeout: {DP_WORK.replace('1750', '212')} ran for 600043 milliseconds before timing out.")
    incidents = run(engine, extractor, list(job.shuffled()))
    assert (incidents[0].class_, incidents[0].initiator.rank) == ("straggler_hang", 11)
    [oom] = [i for i in incidents if i.class_ == "cuda_oom"]
    assert oom.recovered and "entered a collective" in oom.confidence_reason


def test_a_hang_in_a_group_no_line_names_is_read_from_its_members_ranks_within_it(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """torch 2.2 (no `[PG ...]` prefix): rank 13 hangs inside its tensor-parallel group {12..15}; its peers
    report collective 7001 there, `[Rank 0]`, `[Rank 2]`, `[Rank 3]`, at 700 s; the other ranks time out in
    their data-parallel groups at 702 s (`[Rank r // 4]`). Rank 30's output is lost, so two ranks of the job
    reported nothing. The peers' pairs (rank within the group, global rank) fit one group, 12 + i, whose member
    1 did not report. (Off: lines whose group rank differs from the global rank dropped, as before -> no
    suspect: the job's silent ranks are 13 and 30.)"""
    job = JobBuilder(world=32, hosts=4, skew_s=0.0, seed=82)
    job.init_lines()
    for r in (12, 14, 15):
        _watchdog_22(job, r, 700.0 + job.rng.uniform(0, 0.05), r - 12, TP_WORK)
    for r in range(job.world):
        if r not in (12, 13, 14, 15, 30):
            _watchdog_22(job, r, 702.0 + job.rng.uniform(0, 0.5), r // 4, DP_WORK)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("straggler_hang", 13)
    assert "no line names it" in primary.confidence_reason


def test_the_group_that_reported_first_is_chosen_on_the_common_clock(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """torch 2.6 (groups named, sizes from their init lines): rank 13 hangs in tensor-parallel group 4
    {12..15}, whose other members report at 700 s; every other rank times out in its data-parallel group
    (20-23) at 702 s, rank 0 first at 701.5 s. Rank 12, stuck in group 4, is the one member missing from
    data-parallel group 20's reports. Host 1 (ranks 8-15) runs 6 s ahead: on its own clock group 4 reported
    at 706 s, after group 20. Aligned on the data-parallel timeouts every host saw, group 4 reported first
    and its missing member, 13, is the one the others waited for. (Off: groups ordered by their hosts' own
    clocks -> group 20 first, and rank 12 is named.)"""
    job = JobBuilder(world=32, hosts=4, skew_s=0.0, seed=83)
    job.skew = {host: (6.0 if i == 1 else 0.0) for i, host in enumerate(job.hosts)}
    job.init_lines()
    for r in range(job.world):
        job.pg_init(r, 2.0, pg=0, pg_rank=r, size=job.world)
        job.pg_init(r, 2.5, pg=1 + r // 4, pg_rank=r % 4, size=4)
        job.pg_init(r, 2.7, pg=20 + r % 4, pg_rank=r // 4, size=8)
    for r in (12, 14, 15):
        job.watchdog_pg(r, 700.0 + job.rng.uniform(0, 0.05), pg=4, pg_rank=r - 12, seq=7001, enqueued=7002,
                        completed=7000, numel=16777216)
    for r in range(job.world):
        if r not in (12, 13, 14, 15):
            at_s = 701.5 if r == 0 else 702.0 + job.rng.uniform(0, 0.5)
            job.watchdog_pg(r, at_s, pg=20 + r % 4, pg_rank=r // 4, seq=1750, enqueued=1751, completed=1749,
                            op="_REDUCE_SCATTER_BASE", numel=67108864)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("straggler_hang", 13)
    assert "process group 4" in primary.confidence_reason


def test_a_victims_own_failure_is_not_the_class_of_a_consequences_only_incident(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """A hang nobody's lines name the culprit of: rank 6's watchdog fires first (700 s) and tears its
    communicator down, logging an InfiniBand completion error as it goes (a victim's line, after the
    consequence its process logged); its peers then see the connection to it close (700.6 s) and time out.
    The incident shows what the peers saw, not the teardown's fabric error. (Off: victims not set aside when
    choosing the class shown -> network_fabric_error, the most confident line nothing explains.)"""
    job = JobBuilder(world=32, hosts=4, skew_s=0.0, seed=84)
    job.init_lines()
    job.emit(6, 700.0, f"[rank6]:[E ProcessGroupNCCL.cpp:523] [Rank 6] Watchdog caught collective operation "
                       f"timeout: {DP_WORK} ran for 600043 milliseconds before timing out.")
    job.emit(6, 700.3, "gpu-node-00:40006:41230 [6] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion "
                       "from peer 10.0.0.3<50036> with error 12, opcode 0, len 0, vendor err 129 (Recv)")
    for r in range(job.world):
        if r != 6:
            host = job.host_of(r)
            job.emit(r, 700.6 + job.rng.uniform(0, 0.3), f"{host}:{40000 + r}:{41000 + r} [{r % 8}] misc/socket.cc:49 "
                                                         "NCCL WARN socketProgress: Connection closed by remote peer "
                                                         "gpu-node-00<39811>")
            job.emit(r, 701.5 + job.rng.uniform(0, 0.3),
                     f"[rank{r}]:[E ProcessGroupNCCL.cpp:523] [Rank {r}] Watchdog caught collective operation "
                     f"timeout: {DP_WORK} ran for 600043 milliseconds before timing out.")
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.class_ in ("nccl_timeout", "nccl_error")


def test_a_named_group_whose_members_only_its_unnamed_lines_tell_is_completed_from_them(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """torch 2.4 prints the watchdog line with the rank within the group only (`[Rank 2]`), then the watchdog
    thread's exit naming the group (`[PG ID 3 PG GUID 3(undefined) Rank 2]`). Rank 9 hangs in data-parallel
    group 3 ({1, 5, ..., 29}, no init line of it in the log); its 7 peers report there and nobody else does.
    The named group knows only its reporters; the same reporters' pairs (rank within, global rank) say the
    group is 1 + 4i with 8 members, so the one missing is rank 9. (Off: the unnamed lines' members not added
    to the named group they are -> no suspect.)"""
    job = JobBuilder(world=32, hosts=4, skew_s=0.0, seed=83)
    job.init_lines()
    for r in range(1, 32, 4):
        if r == 9:
            continue
        at_s, within = 700.0 + job.rng.uniform(0, 0.2), (r - 1) // 4
        job.emit(r, at_s, f"[rank{r}]:[E1204 10:11:40.000000000 ProcessGroupNCCL.cpp:616] [Rank {within}] Watchdog "
                          f"caught collective operation timeout: {DP_WORK} ran for 600061 milliseconds before timing out.")
        job.emit(r, at_s + 0.001, f"[rank{r}]:[E1204 10:11:40.000000000 ProcessGroupNCCL.cpp:1537] [PG ID 3 PG GUID "
                                  f"3(undefined) Rank {within}] Process group watchdog thread terminated with exception: "
                                  f"[Rank {within}] Watchdog caught collective operation timeout: {DP_WORK} ran for "
                                  "600061 milliseconds before timing out.")
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("straggler_hang", 9)
    assert "process group 3" in primary.confidence_reason
