"""The failure model of the engine, one mechanism per test, on jobs built from the libraries' real lines.

Each test names the mechanism it proves; switching that mechanism off makes the test fail (checked when
the mechanism was written, see the note at the end of each docstring).
"""

from __future__ import annotations

from pathlib import Path

import orjson

from correlator.diagnosis.engine import Engine, JobState
from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.rules import default_rules_dir, load_ruleset
from correlator.diagnosis.signals import SignalExtractor
from tests.unit.engine.conftest import JobBuilder, run

OOM = ("[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {d} has a total "
       "capacity of 79.14 GiB of which 1.19 GiB is free. Including non-PyTorch memory, this process has 77.9 GiB "
       "memory in use.")
XID = "NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


def _all_timeouts(job: JobBuilder, at_s: float, seq: int, skip: set[int] = frozenset(), enqueued: int | None = None,
                  pg: int = 0) -> None:
    for r in range(job.world):
        if r in skip:
            continue
        job.watchdog_pg(r, at_s + job.rng.uniform(0, 0.3), pg=pg, pg_rank=r, seq=seq,
                        enqueued=seq if enqueued is None else enqueued, completed=seq - 1)


# --- 1. causality per signal, in time ---------------------------------------------------------------


def test_hardware_error_an_hour_after_the_job_died_is_not_the_initiator(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Explanations need the cause before its consequences: an Xid on another host long after the
    timeouts explains nothing and cannot start them. (Off: Causality.explains without its time window.)"""
    job = JobBuilder(seed=21)
    job.init_lines()
    for r in range(job.world):
        job.pg_init(r, 2.0, pg=0, pg_rank=r, size=job.world)
    _all_timeouts(job, 700.0, seq=4410, skip={50})
    job.teardown(720.0)
    job.emit(None, 720.0 + 3600.0, XID.format(bus="2a", pid=777), host=job.host_of(3))
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.class_ in ("straggler_hang", "nccl_timeout")
    assert primary.initiator.rank == 50
    assert "missing" in primary.confidence_reason


def test_a_line_without_its_own_time_is_not_put_before_the_cause_it_followed(tmp_path: Path) -> None:
    """torch 2.1 writes its watchdog lines without a time. Rank 5 runs out of memory at 09:31 (a timed line);
    the other ranks' timeouts follow ten minutes later, but the last timed line before each of them is a
    training step at 09:30. That borrowed time is only a lower bound: the OOM still explains the timeouts.
    (Off: the timeouts read as 09:30, before the OOM, which is dropped as 'after the cascade'.)"""
    from correlator.offline.diagnose import diagnose_paths

    paths = []
    for rank in range(8):
        lines = [f"[rank{rank}]:2026-03-14 09:30:{10 + rank:02d},100 - INFO - step 120/5000 | loss 2.31"]
        if rank == 5:
            lines.append(f"[rank{rank}]:2026-03-14 09:31:02,517 - ERROR - torch.OutOfMemoryError: CUDA out of memory. "
                         "Tried to allocate 2.00 GiB. GPU 5 has a total capacity of 79.14 GiB of which 1.19 GiB is free.")
        else:
            lines.append(f"[rank{rank}]:[E ProcessGroupNCCL.cpp:475] [Rank {rank}] Watchdog caught collective operation "
                         "timeout: WorkNCCL(SeqNum=5121, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
                         "Timeout(ms)=600000) ran for 600321 milliseconds before timing out.")
        path = tmp_path / f"rank-{rank}.log"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    primary = diagnose_paths(paths, job_id="untimed")[0]
    assert (primary.class_, primary.initiator.rank) == ("cuda_oom", 5)
    assert [c.class_ for c in primary.collateral] == ["nccl_timeout"]


def _custom_engine(tmp_path: Path, rules: dict[str, str]) -> tuple[Engine, SignalExtractor]:
    root = tmp_path / "rules"
    (root / "test").mkdir(parents=True)
    (root / "classes.yaml").write_text((default_rules_dir() / "classes.yaml").read_text())
    for name, body in rules.items():
        (root / "test" / f"{name}.yaml").write_text(body)
    ruleset = load_ruleset(root)
    return Engine(ruleset), SignalExtractor(ruleset, Matcher(ruleset, use_cache=False))


def _rule(rule_id: str, cls: str, pattern: str, explains: str, confidence: float = 0.9, severity: str = "critical") -> str:
    return (
        f"id: {rule_id}\ntitle: test rule {rule_id}\nclass: {cls}\nseverity: {severity}\nrole: cause\n"
        f"confidence: {confidence}\npatterns: ['{pattern}']\nexplains: {explains}\nmechanism: m\nfix: [f]\n"
        "verify: [v]\nreferences: ['https://example.org']\nsource: [{url: 'https://example.org'}]\n"
        f"examples: {{match: ['{pattern} a', '{pattern} b'], no_match: ['nothing', 'else']}}\n"
    )


def test_a_signal_explains_by_its_own_rule_not_by_its_class(tmp_path: Path) -> None:
    """A rule with `explains: []` explains nothing, even when another rule of its class explains the rest: the
    GPU fault stays a cause, of the higher tier. (Off: explanations from the union over the class's rules
    -> the GPU fault is explained away and the weaker OOM line is taken.)"""
    engine, extractor = _custom_engine(tmp_path, {
        "oom-that-explains": _rule("oom-that-explains", "cuda_oom", "OOM WITH CONSEQUENCES", "[gpu_hardware_error]"),
        "oom-that-explains-nothing": _rule("oom-that-explains-nothing", "cuda_oom", "OOM ALONE", "[]", confidence=0.6),
        "xid": _rule("xid", "gpu_hardware_error", "GPU FELL OFF", "[]", confidence=0.95),
    })
    job = JobBuilder(world=8, hosts=2, seed=3)
    job.emit(5, 100.0, "[rank5]: OOM ALONE on this rank")
    job.emit(2, 200.0, "[rank2]: GPU FELL OFF the bus")
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.class_ == "gpu_hardware_error"
    assert primary.initiator.rank == 2


def test_an_info_rule_explains_nothing(tmp_path: Path) -> None:
    """Severity info never explains (a warning-level line cannot be the cause of a failure).
    (Off: Causality.can_explain without the severity check -> the info line explains the fabric error.)"""
    engine, extractor = _custom_engine(tmp_path, {
        "note": _rule("note", "cuda_oom", "JUST A NOTE", "[network_fabric_error]", severity="info"),
        "fabric": _rule("fabric", "network_fabric_error", "LINK DOWN", "[]"),
    })
    job = JobBuilder(world=8, hosts=2, seed=3)
    job.emit(5, 100.0, "[rank5]: JUST A NOTE about memory")
    job.emit(2, 200.0, "[rank2]: LINK DOWN on mlx5_0")
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.class_ == "network_fabric_error"
    assert "explains" not in primary.confidence_reason.split(";")[0] or "nothing" in primary.confidence_reason


def test_a_cause_beyond_the_collective_timeout_does_not_explain_the_timeouts(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """A collective times out at most its Timeout(ms) (plus the teardown) after its cause: an OOM 80
    minutes before 10-minute timeouts did not cause them; the Xid 6 minutes before did.
    (Off: an unbounded horizon -> the earlier OOM wins as the earliest cause.)"""
    job = JobBuilder(seed=8)
    job.init_lines()
    job.emit(11, 100.0, OOM.format(r=11, d=3))
    job.emit(None, 4800.0, XID.format(bus="2a", pid=40000 + 27), host=job.host_of(27))
    _all_timeouts(job, 5160.0, seq=990, skip={27})
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.class_ == "gpu_hardware_error"
    assert primary.initiator.rank == 27


# --- 2. attempts -----------------------------------------------------------------------------------


def test_each_attempt_gets_its_incident_and_the_last_failing_one_is_primary(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """torchelastic's restart splits the job: attempt 0 died of an OOM on rank 3, attempt 1 of an Xid on
    rank 9's GPU; the incident that ended the job is attempt 1's. (Off: no attempts -> one window whose
    earliest cause, the OOM, is primary.)"""
    job = JobBuilder(seed=12)
    job.init_lines()
    job.emit(3, 100.0, OOM.format(r=3, d=3))
    _all_timeouts(job, 700.0, seq=120, skip={3})
    job.teardown(705.0)
    for host in job.hosts:
        job.emit(None, 710.0, "[2026-03-14 09:38:43,000] torch.distributed.elastic.agent.server.api: [WARNING] "
                              "[default] Worker group FAILED. 3/3 attempts left; will restart worker group", host=host)
        job.emit(None, 740.0, "  restart_count=1", host=host)
    job.init_lines(at_s=750.0)
    job.emit(None, 900.0, XID.format(bus="2a", pid=40009), host=job.host_of(9))
    _all_timeouts(job, 1500.0, seq=40, skip={9})
    incidents = run(engine, extractor, list(job.shuffled()))
    assert [(i.attempt, i.class_, i.initiator.rank) for i in incidents[:2]] == [
        (1, "gpu_hardware_error", 9), (0, "cuda_oom", 3)]
    assert incidents[0].incident_id != incidents[1].incident_id


def test_a_relaunch_no_launcher_line_records_is_a_new_attempt(engine: Engine, extractor: SignalExtractor) -> None:
    """Slurm requeues a preempted job 2.5 h later into the same files; no agent logs a restart, but every
    process creates its default process group again. Run 0 was torn down (SIGTERM to every worker); run 1's
    rank 5 runs out of memory and its peers time out. (Off: one attempt -> run 0's teardown and run 1's
    failures are one cascade, and the OOM, coming after collateral it cannot explain, is dropped.)"""
    job = JobBuilder(seed=41)
    for r in range(job.world):
        job.pg_init(r, 2.0, pg=0, pg_rank=r, size=job.world)
    job.teardown(3000.0)
    relaunch = 3000.0 + 9000.0
    for r in range(job.world):
        job.pg_init(r, relaunch + job.rng.uniform(0, 2), pg=0, pg_rank=r, size=job.world)
    job.emit(5, relaunch + 300.0, OOM.format(r=5, d=5))
    _all_timeouts(job, relaunch + 900.0, seq=77, skip={5})
    job.teardown(relaunch + 905.0)
    primary = run(engine, extractor, list(job.events))[0]
    assert (primary.attempt, primary.class_, primary.initiator.rank) == (1, "cuda_oom", 5)



def test_a_restarted_jobs_collateral_splits_by_each_hosts_own_restart_whatever_order_the_hosts_arrive_in(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Host A's agent restarts its workers first; host B's agent still tears its own down (SIGTERM lines)
    before it logs the restart. Each host is split at its own restart line, so B's SIGTERMs are attempt 0's
    collateral whether A's lines reach the state before B's (a file read first offline, a partition read
    first by the stream) or after. (Off: a collateral line is folded by the restarts known when it comes,
    other hosts' included -> with A first, B's SIGTERMs join attempt 1's teardown.)"""
    job = JobBuilder(world=8, hosts=2, skew_s=0.0, seed=5)
    a, b = job.hosts
    job.emit(1, 100.0, OOM.format(r=1, d=1))
    job.emit(None, 110.0, "[2026-03-14 09:28:43,000] torch.distributed.elastic.agent.server.api: [WARNING] "
                          "[default] Worker group FAILED. 3/3 attempts left; will restart worker group", host=a)
    for pid in range(4):
        job.emit(None, 112.0 + pid, f"W0314 09:28:45.000000 1234 torch/distributed/elastic/multiprocessing/api.py:897] "
                                    f"Sending process {40004 + pid} closing signal SIGTERM", host=b)
    for host in (a, b):
        job.emit(None, 120.0, "  restart_count=1", host=host)
    job.emit(6, 300.0, OOM.format(r=6, d=2))
    for pid in range(4):
        job.emit(None, 310.0 + pid, f"W0314 09:32:03.000000 1234 torch/distributed/elastic/multiprocessing/api.py:897] "
                                    f"Sending process {41000 + pid} closing signal SIGTERM", host=a)

    def collateral(events: list) -> list:
        state = JobState(job_id="job-64")
        for event in events:
            state.add_all(extractor.from_events([event], order_base=event.offset))
        return sorted((i.attempt, c.class_, c.count, tuple(c.hosts)) for i in engine.diagnose(state) for c in i.collateral)

    on = {host: [e for e in job.events if e.host == host] for host in (a, b)}
    a_first, b_first = collateral(on[a] + on[b]), collateral(on[b] + on[a])
    assert a_first == b_first
    assert (0, "launcher_teardown", 4, (b,)) in a_first


# --- 3. recovery -----------------------------------------------------------------------------------


def test_a_failure_the_process_survived_is_a_recovered_warning_not_the_primary(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """An OOM that rank 3 caught (a batch-size finder retries) and trained on after: not the cause of the
    hang that came later. (Off: no recovery -> the earlier OOM explains the timeouts and is primary.)"""
    job = JobBuilder(seed=13)
    job.init_lines()
    job.emit(3, 100.0, OOM.format(r=3, d=3))
    for step in range(5):
        job.progress(3, 110.0 + step * 10, step)
    job.emit(None, 300.0, XID.format(bus="2a", pid=40000 + 44), host=job.host_of(44))
    _all_timeouts(job, 900.0, seq=77, skip={44})
    incidents = run(engine, extractor, list(job.shuffled()))
    assert (incidents[0].class_, incidents[0].initiator.rank, incidents[0].recovered) == ("gpu_hardware_error", 44, False)
    recovered = [i for i in incidents if i.recovered]
    assert [(i.class_, i.initiator.rank, i.severity) for i in recovered] == [("cuda_oom", 3, "low")]
    assert "progress" in recovered[0].confidence_reason


def test_training_completed_after_a_failure_makes_it_recovered(engine: Engine, extractor: SignalExtractor) -> None:
    """(Off: completions ignored -> a critical cuda_oom incident for a job that finished.)"""
    job = JobBuilder(world=8, hosts=1, seed=14)
    job.emit(0, 100.0, OOM.format(r=0, d=0))
    job.emit(0, 900.0, "[INFO|trainer.py:2675] 2026-03-14 09:41:53,000 >> Training completed. Do not forget to share "
                       "your model on huggingface.co/models =)")
    incidents = run(engine, extractor, list(job.shuffled()))
    assert [(i.class_, i.recovered, i.severity) for i in incidents] == [("cuda_oom", True, "low")]


# --- 4. collective progress per process group ------------------------------------------------------


def _tp_job(seed: int) -> JobBuilder:
    """64 ranks; the default group (PG 0) and one tensor-parallel group per host (PG 1-8, 8 ranks each: every
    rank creates every group, in the same order, and is a member of its host's)."""
    job = JobBuilder(seed=seed)
    job.init_lines()
    for r in range(job.world):
        job.pg_init(r, 2.0, pg=0, pg_rank=r, size=job.world)
        job.pg_init(r, 2.5, pg=1 + r // job.per_host, pg_rank=r % job.per_host, size=job.per_host)
    return job


def test_the_stuck_rank_is_named_from_the_group_that_timed_out_not_by_mixing_groups(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Rank 21 hangs inside host 2's tensor-parallel group: its 7 peers report a timeout in PG 3 first,
    without it. Later the whole data-parallel group times out, where counters differ for another reason
    (rank 40's last enqueued work is behind). Counters of different groups are never compared.
    (Off: one group for all -> rank 40, the lowest enqueued counter of the mix, is blamed.)"""
    job = _tp_job(seed=31)
    for r in range(16, 24):
        if r != 21:
            job.watchdog_pg(r, 700.0 + job.rng.uniform(0, 0.2), pg=3, pg_rank=r % 8, seq=5120, enqueued=5121,
                            completed=5119, op="_ALLGATHER_BASE")
    for r in range(job.world):
        if r not in range(16, 24):
            job.watchdog_pg(r, 1300.0 + job.rng.uniform(0, 0.2), pg=0, pg_rank=r, seq=880,
                            enqueued=870 if r == 40 else 881, completed=879)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.class_ == "straggler_hang"
    assert primary.initiator.rank == 21
    assert "process group 3" in primary.confidence_reason


def test_a_hang_in_one_of_128_tensor_parallel_groups_names_the_member_missing_from_its_reports(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """1,024 ranks, a tensor-parallel group of 8 per host (129 groups). Rank 805 hangs inside host 100's
    group: its 7 peers report there first, as torch 2.5 writes it (the watchdog line names only the rank in
    the group, `[Rank 5]`; the next line adds the group), then the other ranks time out in the default
    group. (Off: `[Rank 5]` taken for the global rank -> the reports land on ranks 0-7; or a bound of 64
    groups -> host 100's group is never tracked; either way no suspect.)"""
    job = JobBuilder(world=1024, hosts=128, seed=35)
    for r in range(job.world):
        job.pg_init(r, 2.0, pg=0, pg_rank=r, size=job.world)
        job.pg_init(r, 2.5, pg=1 + r // job.per_host, pg_rank=r % job.per_host, size=job.per_host)
    stuck, pg = 805, 1 + 805 // 8
    for r in range(800, 808):
        if r == stuck:
            continue
        at_s, work = 700.0 + job.rng.uniform(0, 0.2), ("WorkNCCL(SeqNum=6255, OpType=_ALLGATHER_BASE, NumelIn=3211264, "
                                                       "NumelOut=3211264, Timeout(ms)=600000) ran for 600083 milliseconds")
        job.emit(r, at_s, f"[rank{r}]:[E314 09:37:00.000000000 ProcessGroupNCCL.cpp:607] [Rank {r % 8}] Watchdog "
                          f"caught collective operation timeout: {work} before timing out.")
        job.emit(r, at_s + 0.001, f"[rank{r}]:[F314 09:37:00.000000000 ProcessGroupNCCL.cpp:1509] [PG ID 1 PG GUID "
                                  f"{pg}(undefined) Rank {r % 8}] Process group watchdog thread terminated with exception: "
                                  f"[Rank {r % 8}] Watchdog caught collective operation timeout: {work} before timing out.")
    for r in range(job.world):
        if r not in range(800, 808):
            job.watchdog_pg(r, 702.0 + job.rng.uniform(0, 0.2), pg=0, pg_rank=r, seq=880, enqueued=881, completed=879)
    primary = run(engine, extractor, list(job.events))[0]  # in order: every group is created before the hang
    assert (primary.class_, primary.initiator.rank) == ("straggler_hang", stuck)
    assert f"process group {pg}" in primary.confidence_reason


def test_the_rank_whose_enqueued_counter_lags_is_the_straggler(engine: Engine, extractor: SignalExtractor) -> None:
    """Every rank's collective 612 timed out; the others had enqueued up to 614 behind it, rank 9 only 612:
    it is the one that fell behind. Last completed is 611 everywhere (nobody completes a hung collective).
    (Off: comparing last completed -> no suspect.)"""
    job = _tp_job(seed=32)
    for r in range(job.world):
        job.watchdog_pg(r, 700.0 + job.rng.uniform(0, 0.2), pg=0, pg_rank=r, seq=612,
                        enqueued=612 if r == 9 else 614, completed=611)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("straggler_hang", 9)


def test_a_different_collective_at_one_seqnum_is_a_mismatch_naming_the_odd_rank(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Rank 6 issued an all-gather where its 63 peers issued an all-reduce at SeqNum 301.
    (Off: no OpType/Numel comparison -> a plain timeout with no initiator.)"""
    job = _tp_job(seed=33)
    for r in range(job.world):
        op = "ALLGATHER" if r == 6 else "ALLREDUCE"
        job.watchdog_pg(r, 700.0 + job.rng.uniform(0, 0.2), pg=0, pg_rank=r, seq=301, enqueued=301, completed=300,
                        op=op, numel=4096 if r == 6 else 1048576)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("collective_mismatch", 6)
    assert "ALLGATHER" in primary.confidence_reason


# --- 5. identity from launchers, as evidence ---------------------------------------------------------


def test_a_failure_line_that_names_nobody_takes_who_from_the_launchers_report(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """(Off: reports unused -> the initiator names no process.)"""
    job = JobBuilder(world=8, hosts=1, seed=15)
    host = job.hosts[0]
    job.emit(None, 100.0, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a "
                          "total capacity of 79.14 GiB of which 3.19 MiB is free.", host=host)
    job.emit(None, 101.0, "E0314 09:28:34.000000 1234 torch/distributed/elastic/multiprocessing/api.py:869] failed "
                          "(exitcode: 1) local_rank: 3 (pid: 40003) of binary: /usr/bin/python3", host=host)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.class_ == "cuda_oom"
    assert (primary.initiator.local_rank, primary.initiator.pid) == (3, 40003)
    assert "launcher" in primary.confidence_reason


def test_the_launchers_first_observed_failure_never_outranks_a_cause_line(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """torchelastic's Root Cause is the first exit it saw: rank 2, a victim. Rank 5's OOM line names
    itself and wins. (Off: reports override identity -> rank 2.)"""
    job = JobBuilder(world=8, hosts=1, seed=16)
    host = job.hosts[0]
    job.emit(5, 100.0, OOM.format(r=5, d=5))
    job.emit(None, 160.0, "E0314 09:28:34.000000 1234 torch/distributed/elastic/multiprocessing/api.py:869] failed "
                          "(exitcode: 1) local_rank: 2 (pid: 40002) of binary: /usr/bin/python3", host=host)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("cuda_oom", 5)
    assert (primary.initiator.local_rank, primary.initiator.pid) == (5, 40005)


def test_a_kernel_line_maps_to_the_rank_through_the_gpu_bus_id_of_that_hosts_nccl_init(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """(Off: no bus id table -> the Xid names a host and a GPU but no rank.)"""
    job = JobBuilder(seed=17)
    job.init_lines()
    bus = job.bus_id(5)  # rank 45 is local rank 5 on its host
    job.emit(None, 100.0, f"NVRM: Xid (PCI:0000:{bus[:-3]}:00): 79, GPU has fallen off the bus.", host=job.host_of(45))
    _all_timeouts(job, 700.0, seq=51, skip={45})
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("gpu_hardware_error", 45)


# --- 7. bounded state that never loses the cause -------------------------------------------------------


def test_a_4096_rank_cascade_keeps_its_cause_arriving_last_in_a_bounded_state(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Every rank logs three watchdog lines and a teardown; rank 1234's OOM arrives last. The state stays
    under 2 MB and the collateral still counts every rank. (Off: collateral kept line by line -> the
    state outgrows the bound and the summary loses ranks.)"""
    job = JobBuilder(world=4096, hosts=512, seed=18)
    for r in range(job.world):
        if r == 1234:
            continue
        job.watchdog_pg(r, 700.0 + job.rng.uniform(0, 1), pg=0, pg_rank=r, seq=88, enqueued=88, completed=87)
        job.emit(r, 700.5, f"[rank{r}]:[E314 09:37:01.000000000 ProcessGroupNCCL.cpp:681] [PG ID 0 PG GUID 0(default_pg) "
                           f"Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
                           "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
    job.teardown(705.0)
    job.emit(1234, 100.0, OOM.format(r=1234, d=2))
    state = JobState(job_id="job-4096")
    for start in range(0, len(job.events), 997):
        state.add_all(extractor.from_events(job.events[start:start + 997], order_base=start))
    size = len(orjson.dumps(state.model_dump(mode="json", by_alias=True)))
    assert size <= 2_000_000, size
    primary = engine.diagnose(state)[0]
    assert (primary.class_, primary.initiator.rank) == ("cuda_oom", 1234)
    timeouts = [c for c in primary.collateral if c.class_ == "nccl_timeout"]
    assert len(timeouts[0].ranks) == 4095


def test_the_cascade_reads_the_same_whatever_order_its_lines_arrive_in(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """A hang with only watchdog lines, its lines arriving in every possible order (a stream after a
    rebalance, a file read offline): the incident is the same, down to the line that stands for the
    cascade. (Off: the aggregate keeps its first lines by arrival -> an order whose earliest line comes
    second names a later line.)"""
    from itertools import permutations

    job = JobBuilder(world=4, hosts=1, skew_s=0.0, seed=23)
    for rank, at_s in ((0, 700.6), (1, 700.1), (2, 700.4), (3, 700.9)):
        job.watchdog_pg(rank, at_s, pg=0, pg_rank=rank, seq=412, enqueued=412, completed=411)

    def essentials(events: list) -> list:
        state = JobState(job_id="job-64")
        for event in events:
            state.add_all(extractor.from_events([event], order_base=event.offset))
        return [orjson.loads(orjson.dumps(i.to_json_dict())) for i in engine.diagnose(state)]

    by_rank = [job.events[i:i + 2] for i in range(0, len(job.events), 2)]
    readings = {orjson.dumps(essentials([e for rank in order for e in rank])) for order in permutations(by_rank)}
    assert len(readings) == 1
    (incident,) = orjson.loads(readings.pop())
    assert "Rank 1]" in incident["initiator"]["line"]


# --- 8. stable incident identity ---------------------------------------------------------------------


def test_a_late_line_with_an_earlier_timestamp_does_not_renumber_the_incidents(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Two failures hours apart are two incidents; a line that arrives late, with a timestamp before both,
    opens a third one before them: the first two keep their ids. (Off: ids by window position.)"""
    job = JobBuilder(world=8, hosts=1, seed=19)
    job.emit(1, 10_000.0, OOM.format(r=1, d=1))
    job.emit(2, 30_000.0, XID.format(bus="2a", pid=40002), host=job.hosts[0])
    before = {(i.class_, i.initiator.rank): i.incident_id for i in run(engine, extractor, list(job.events))}
    job.emit(6, 100.0, "[rank6]: RuntimeError: CUDA error: an illegal memory access was encountered")
    after = {(i.class_, i.initiator.rank): i.incident_id for i in run(engine, extractor, list(job.events))}
    assert len(after) == 3
    assert all(after[key] == before[key] for key in before)


# --- 9. skew without watchdog anchors ------------------------------------------------------------------


def test_host_clocks_are_aligned_on_the_nccl_init_burst_when_no_watchdog_line_is_there(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Two ranks on two hosts fail the same way 1.5 s apart; the later one's host clock runs 4 s behind, so
    its line carries the earlier timestamp. The communicator's init burst aligns the clocks.
    (Off: no init anchors -> the lagging clock's rank is taken for the first.)"""
    job = JobBuilder(world=16, hosts=2, skew_s=0.0, seed=20)
    job.skew[job.hosts[1]] = -4.0
    job.init_lines()
    job.emit(2, 100.0, OOM.format(r=2, d=2))
    job.emit(12, 101.5, OOM.format(r=12, d=4))
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.initiator.rank == 2
    assert "NCCL communicator init" in primary.clock


