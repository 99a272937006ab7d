"""Mechanisms of engine v3 around the cascade, one per test, each the only way to the right answer in its job:
victims counted per attempt (`victims.victims`), late deaths (`Causality.lateness`, `LATE_DEATH_S`), restarts
inferred from torchelastic's worker-failed report followed by the node's workers logging again
(`JobFacts._note_worker_failure` / `_note_node_progress`), the one rank that reported nothing
(`progress.missing_reporter`), accusations voting (`core.most_accused`), recovery read under resolved
process keys (`core.resolved_progress`), victims (`victims.victims`), silent corruption never recovered
(`Engine.silent`) and a borrowed time read as a lower bound (`keys.has_own_time`)."""

from __future__ import annotations

from pathlib import Path

from correlator.diagnosis.engine import Engine
from correlator.diagnosis.signals import SignalExtractor
from tests.unit.engine.conftest import JobBuilder, run

API = "torch/distributed/elastic/multiprocessing/api.py"
OOM = ("[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {d} has a total "
       "capacity of 79.14 GiB of which 1.19 GiB is free. Including non-PyTorch memory, this process has 77.9 GiB "
       "memory in use.")
CLOSED = ("[rank{r}]: RuntimeError: [/opt/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
          "peer [10.0.0.{h}]:{port}")


def _closed(job: JobBuilder, at_s: float, ranks: list[int]) -> None:
    """Each rank's gloo connection to a dead peer drops: its traceback ends in `Connection closed by peer`."""
    for r in ranks:
        job.emit(r, at_s + job.rng.uniform(0, 0.3), CLOSED.format(r=r, h=1 + r // job.per_host, port=23000 + r))


def _report(job: JobBuilder, at_s: float, host: int, local: int, code: int) -> None:
    """The node's torchelastic agent reports a worker's exit (glog, its own line)."""
    rank = host * job.per_host + local
    job.emit(None, at_s, f"E0314 09:28:34.000000 1234 {API}:874] failed (exitcode: {code}) local_rank: {local} "
                         f"(pid: {40000 + rank}) of binary: /usr/bin/python3", host=job.hosts[host])


def test_a_death_reported_after_its_peers_errors_still_explains_them(engine: Engine, extractor: SignalExtractor) -> None:
    """Rank 5 segfaults and writes nothing; within a second its ring neighbours, ranks 4 and 6, raise gloo's
    `Connection closed by peer` (the other ranks block until their agents stop them). Its node's agent polls
    its workers every 30 s (`--monitor-interval 30`) and reports the exit on SIGSEGV 24 s after the
    neighbours' errors: a death its consequences saw first still explains them, up to `LATE_DEATH_S` late.
    (Off: `Causality.lateness` without the late-death allowance -> the report, later than collateral it can no
    longer explain, is dropped as after the cascade; only consequences remain, and no rank is named.)"""
    job = JobBuilder(world=8, hosts=2, skew_s=0.0, seed=71)
    _closed(job, 100.3, [4, 6])
    _report(job, 124.5, host=1, local=1, code=-11)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("process_crash_signal", 5)


def test_a_consequence_seen_before_a_restart_does_not_make_the_next_attempts_failure_a_victims(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Attempt 0: rank 3 runs out of memory, rank 5 (among others) sees the connection close. torchelastic
    restarts the worker group (restart_count=1). Attempt 1, a minute later: rank 5 itself runs out of memory.
    Its consequence of attempt 0 is under the victim window (2 minutes) but in another attempt: rank 5 is no
    victim in attempt 1, its OOM is that attempt's cause. (Off: victims not per attempt -> rank 5's OOM is
    taken for a victim's and attempt 1 shows only consequences.)"""
    job = JobBuilder(world=8, hosts=2, skew_s=0.0, seed=72)
    job.emit(3, 100.0, OOM.format(r=3, d=3))
    _closed(job, 100.4, [r for r in range(job.world) if r != 3])
    for host in job.hosts:
        job.emit(None, 104.0, "[2026-03-14 09:28:37,000] torch.distributed.elastic.agent.server.api: [WARNING] "
                              "[default] Worker group FAILED. 3/3 attempts left; will restart worker group", host=host)
        job.emit(None, 112.0, "  restart_count=1", host=host)
    job.emit(5, 160.0, OOM.format(r=5, d=1))
    _closed(job, 160.4, [r for r in range(job.world) if r != 5])
    incidents = run(engine, extractor, list(job.shuffled()))
    assert [(i.attempt, i.class_, i.initiator.rank) for i in incidents[:2]] == [(1, "cuda_oom", 5), (0, "cuda_oom", 3)]


def inferred_restart_job(seed: int) -> JobBuilder:
    """16 ranks, torch >= 2.2 (the restart of a worker group is an INFO line, hidden at the default level): rank
    3 runs out of memory at 100 s, its peers' connections close, its node's agent reports the worker failed
    (`failed (exitcode: 1) local_rank: 3`); from 130 s every rank trains again (attempt 1) until rank 9's GPU
    falls off the bus at 200 s."""
    job = JobBuilder(world=16, hosts=2, skew_s=0.0, seed=seed)
    job.init_lines()
    for step in range(3):
        for r in range(job.world):
            job.progress(r, 60.0 + 10 * step, step)
    job.emit(3, 100.0, OOM.format(r=3, d=3))
    _closed(job, 100.4, [r for r in range(job.world) if r != 3])
    _report(job, 101.0, host=0, local=3, code=1)
    job.init_lines(at_s=125.0)
    for step in range(3, 6):
        for r in range(job.world):
            job.progress(r, 100.0 + 10 * step, step)
    job.emit(None, 200.0, f"NVRM: Xid (PCI:0000:{job.bus_id(1)[:-3]}:00): 79, pid=40009, name=python, GPU has fallen off "
                          "the bus.", host=job.host_of(9))
    _closed(job, 200.6, [r for r in range(job.world) if r != 9])
    return job


def test_workers_logging_again_after_their_agent_reported_them_failed_is_a_restart(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """All the logs show of the restart is the agent's report that rank 3's worker failed, then the same node's
    workers training again. That is a restart: rank 3's OOM ended attempt 0, it was not survived (rank 3's
    steps after it are attempt 1's), so it is attempt 0's failure, not a recovered warning. (Off: no restart
    inferred from the report and the progress after it -> one attempt, in which rank 3 trained on after its
    OOM: a recovered warning.)"""
    incidents = run(engine, extractor, list(inferred_restart_job(seed=73).shuffled()))
    ooms = [(i.attempt, i.initiator.rank, i.recovered) for i in incidents if i.class_ == "cuda_oom"]
    assert ooms == [(0, 3, False)]


def test_the_one_rank_that_reported_no_peer_failure_is_the_suspect(engine: Engine, extractor: SignalExtractor) -> None:
    """A gloo (CPU) job of 8 ranks, `world size 8` in its launch line. Rank 6 stops answering (a deadlock in
    its data pipeline, no line of its own); after gloo's 30-minute timeout the 7 others raise `Timed out
    waiting 1800000ms for recv operation to complete`, naming no collective counters and no peer. The one
    rank of the world that did not report is the one they waited for. (Off: `missing_reporter` -> no
    suspect: the incident names no rank.)"""
    job = JobBuilder(world=8, hosts=2, skew_s=0.0, seed=74)
    for r in range(job.world):
        job.emit(r, 1.0, f"[rank{r}]: world size 8, 20000 steps, batch 8 per rank")
    for r in range(job.world):
        if r != 6:
            job.emit(r, 1900.0 + job.rng.uniform(0, 0.5),
                     f"[rank{r}]: RuntimeError: [/opt/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                     "Timed out waiting 1800000ms for recv operation to complete")
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert primary.initiator.rank == 6


FINGERPRINT = ("[rank{r}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {r} is running collective: "
               "CollectiveFingerPrint(SequenceNumber=39, OpType=ALLREDUCE, TensorShape=[{n}], TensorDtypes=Long, "
               "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)), but Rank {other} is running "
               "collective: CollectiveFingerPrint(SequenceNumber=39, OpType=ALLREDUCE, TensorShape=[{m}], TensorDtypes=Long, "
               "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)).Collectives differ in the following "
               "aspects: \t Tensor Tensor shapes: {n}vs {m}")


def test_the_rank_most_peers_accuse_of_a_mismatched_collective_is_named(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL, 4 ranks: rank 2 all-reduces a tensor of 4 elements where its peers
    all-reduce 3. Each rank compares its fingerprint with one peer's: ranks 0, 1 and 3 name rank 2, and rank 2
    (whose check ran first) names rank 0. The rank most reporters accuse is the odd one out. (Off:
    `most_accused` -> the earliest accusation names rank 0.)"""
    job = JobBuilder(world=4, hosts=2, skew_s=0.0, seed=75)
    job.emit(2, 300.0, FINGERPRINT.format(r=2, other=0, n=4, m=3))
    for r in (0, 1, 3):
        job.emit(r, 300.05 + 0.01 * r, FINGERPRINT.format(r=r, other=2, n=3, m=4))
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("collective_mismatch", 2)


def test_progress_named_only_by_a_local_rank_is_the_ranks_own_when_the_tables_resolve_it(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """torchrun --tee: rank 3's training loop catches an OOM (its traceback carries c10d's `[rank3]:`), halves
    the micro-batch and trains on; its progress lines carry only the launcher's `[default3]:` (local rank 3 on
    gpu-node-00, which its traceback's prefixes tie to rank 3). Ten minutes later rank 12's GPU falls off the
    bus and the others time out. Rank 3's later progress, read under the key the engine gives rank 3, makes
    its OOM a recovered warning. (Off: progress read under the keys it was stored with -> rank 3 never went
    on, and its OOM explains the timeouts.)"""
    job = JobBuilder(world=16, hosts=2, skew_s=0.0, seed=76)
    job.init_lines()
    job.emit(3, 100.0, OOM.format(r=3, d=3))
    for step in range(5):
        job.emit_as(job.hosts[0], 110.0 + 10 * step, f"2026-03-14 09:28:{43 + 10 * step:02d},118 - INFO - train - step "
                    f"{1201 + step}/20000 | loss 2.18{step} | grad_norm 1.0{step} | lr 3.00e-04", local_rank=3)
    job.emit(None, 700.0, "NVRM: Xid (PCI:0000:2a:00): 79, pid=40012, name=python, GPU has fallen off the bus.",
             host=job.host_of(12))
    for r in range(job.world):
        if r != 12:
            job.watchdog(r, 1300.0 + job.rng.uniform(0, 0.3), seq=4410, completed=4409)
    incidents = run(engine, extractor, list(job.shuffled()))
    assert (incidents[0].class_, incidents[0].initiator.rank) == ("gpu_hardware_error", 12)
    assert [(i.class_, i.initiator.rank) for i in incidents if i.recovered] == [("cuda_oom", 3)]


def test_a_process_that_saw_a_peer_fail_first_initiates_nothing_after(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """The kernel's OOM killer takes rank 3 (no line of its own); its ring neighbours ranks 2 and 4 see the
    connection close, and a second later rank 4 segfaults in NCCL's abort (`Fatal Python error: Segmentation
    fault`). Rank 3's node's agent polls every 30 s: its report of the SIGKILL comes 20 s after rank 4's
    crash. Both deaths are of the top tier and rank 4's comes first, but rank 4 had logged its peer's failure
    before its own: a victim, it initiates nothing. (Off: `victims` -> rank 4's segfault, the earliest death
    that explains the errors, is named.)"""
    job = JobBuilder(world=8, hosts=2, skew_s=0.0, seed=77)
    _closed(job, 100.3, [2, 4])
    job.emit(4, 101.2, "[rank4]: Fatal Python error: Segmentation fault")
    _report(job, 121.0, host=0, local=3, code=-9)
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("host_oom_kill", 3)


def test_silent_data_corruption_is_not_recovered_by_training_going_on(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """Rank 7's gradient norm jumps 40-fold at one step while its peers' stay at 1.0, and training goes on:
    silent corruption is survived by definition (the job goes on, on wrong numbers), so rank 7's later steps
    do not make it a recovered warning. (Off: `Engine.silent` empty -> the spike is 'recovered', low severity.)"""
    job = JobBuilder(world=8, hosts=1, skew_s=0.0, seed=78)
    for step in range(12):
        for r in range(job.world):
            norm = 41.7 if (r == 7 and step == 8) else 1.0 + 0.01 * step
            job.emit(r, 100.0 + 1.2 * step + 0.01 * r,
                     f"[rank{r}]: step {3100 + step}/20000 | loss {2.41 - 0.001 * step:.4f} | lr 2.95e-04 | "
                     f"grad_norm {norm:.3f}")
    # In file order, as diagnose reads it: shuffled, the lines that reach the progress table can all be older
    # than the spike (the extractor keeps each process's extremes of a metric), and then rank 7 'never went on'
    # whether its class is silent or not.
    incidents = run(engine, extractor, list(job.events))
    assert [(i.class_, i.initiator.rank, i.recovered) for i in incidents if i.class_.startswith("sdc")] == [
        ("sdc_grad_norm_spike", 7, False)]


def test_a_borrowed_time_minutes_before_the_cause_does_not_put_its_line_before_it(tmp_path: Path) -> None:
    """torch 2.1 writes its watchdog lines without a time; this job logs a step line every 500 steps (about four
    minutes). Rank 5 runs out of memory at 09:31:02, four minutes after its file's last step line; the others
    time out ten minutes later, and the last timed line above each timeout is a step line at 09:27. That
    borrowed time is only a lower bound: the OOM still explains the timeouts, though they 'read' four minutes
    before it, far beyond what a late death may lag. (Off: a borrowed time taken as the line's own
    (`keys.has_own_time` ignoring `time_borrowed`) -> the timeouts come before the OOM, which is dropped as
    after the cascade.)"""
    from correlator.offline.diagnose import diagnose_paths

    paths = []
    for rank in range(8):
        lines = [f"[rank{rank}]:2026-03-14 09:27:{10 + rank:02d},100 - INFO - step 2000/5000 | loss 2.31"]
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


def test_a_consequence_long_before_a_processs_own_failure_does_not_make_it_a_victims(
    engine: Engine, extractor: SignalExtractor
) -> None:
    """An NCCL job with a gloo group for its object collectives: rank 3 runs out of memory and its peers, rank 5
    among them, see their gloo connections close. Slurm requeues the job into the same files; nothing records
    the relaunch (no launcher line, no process-group init line at the default log level). Three hours later
    rank 5 itself runs out of memory; ranks 1, 2 and 6 time out in NCCL's allreduce before the job's time
    limit stops the rest. A victim fails again within seconds or minutes of the consequence it saw (its abort,
    its exit), not hours later: rank 5's OOM is the cause of the second cascade. (Off: a consequence counting
    against every later failure of its process (`victims.within_cascade` without `VICTIM_WINDOW_S`) -> rank
    5's OOM is taken for a victim's and the second cascade names no rank.)"""
    job = JobBuilder(world=8, hosts=2, skew_s=0.0, seed=79)
    job.emit(3, 100.0, OOM.format(r=3, d=3))
    _closed(job, 100.4, [r for r in range(job.world) if r != 3])
    job.emit(5, 10900.0, OOM.format(r=5, d=1))
    for r in (1, 2, 6):
        job.watchdog(r, 11500.0 + job.rng.uniform(0, 0.3), seq=212, completed=211)
    incidents = run(engine, extractor, list(job.shuffled()))
    assert sorted((i.class_, i.initiator.rank) for i in incidents) == [("cuda_oom", 3), ("cuda_oom", 5)]
