"""Who failed, when the failing line names only a local rank or a pid on its node: the identity tables
(`facts._note_who`: ties from lines that name two of rank, local rank and pid; `identity.IdentityResolver`:
a node's base rank, the one free block, the natural-name-order guess, the single launcher), the corroboration
of a line by the next one of its class (`identity.corroborated`), and `srun -l` labels read as nodes
(`ingest.prefixes.sniff_srun_labels`, used by diagnose per file), a launcher report's pid tied to a local
rank (`JobFacts.local_of`). One branch per test, each the only way to the right rank in its job.

Most jobs here are torchrun's (`--tee 3`), diagnosed from the files as written: the workers' python-logging
lines carry only the launcher's `[defaultN]:` prefix, their tracebacks also c10d's `[rankN]:`; the agent's own
glog lines name a local rank and a pid. One worker is killed by the kernel's OOM killer and leaves no line:
its agent's `failed (exitcode: -9) local_rank: L (pid: P)` is the only line about it, its peers raise gloo's
`Connection closed by peer` (victims) and their agents report them. No failure summary names the dead rank
(torchrun was itself killed by the scheduler before printing it), so no launcher report says who it was.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from correlator.offline.diagnose import Diagnoser

T0 = datetime(2026, 3, 14, 9, 30, 0, tzinfo=UTC)
PER_NODE = 4


@pytest.fixture(scope="module")
def diagnoser() -> Diagnoser:
    return Diagnoser()


def _py_time(at_s: float) -> str:
    t = T0 + timedelta(seconds=at_s)
    return f"{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}"


def _glog_time(at_s: float) -> str:
    t = T0 + timedelta(seconds=at_s)
    return f"{t:%m%d %H:%M:%S}.{t.microsecond:06d}"


def _pid(node: int, local: int) -> int:
    return 4400 + 10 * node + local


def torchrun_node(node: int, *, killed: int | None = None, tied: dict[int, int] | None = None,
                  agent_pid: int = 1400, nccl_base: int | None = None) -> str:
    """One node's torchrun output (4 workers). `killed`: the local rank the OOM killer takes at 60 s. `tied`:
    local rank -> global rank of the workers whose traceback (with c10d's `[rankN]:`) reaches the file: they
    raise on the dead peer's closed gloo connection. The others are stopped by their agent before they print.
    `nccl_base`: an NCCL job instead, whose workers (ranks nccl_base...) print ProcessGroupNCCL's options at
    start-up (`[defaultL]:[rankR]:`, every worker tied) and report the dead peer from their watchdog."""
    tied = tied or {}
    lines = []
    if nccl_base is not None:
        for local in range(PER_NODE):
            rank = nccl_base + local
            lines.append(f"[default{local}]:[rank{rank}]:[I314 09:29:02.{114000000 + 1000 * local} ProcessGroupNCCL.cpp:919] "
                         f"[PG ID 0 PG GUID 0 Rank {rank}] ProcessGroupNCCL initialization options: size: 8, global rank: "
                         f"{rank}, TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0, SPLIT_FROM: 0, SPLIT_COLOR: 0, PG Name: 0")
    lines += [f"[default{local}]:{_py_time(at_s + 0.01 * local)} - INFO - train - step {1199 + step}/20000 "
              f"| loss {2.1840 - 0.001 * step:.4f} | lr 3.00e-04"
              for step, at_s in enumerate((57.6, 58.8)) for local in range(PER_NODE)]
    for local, rank in sorted(tied.items()):
        if nccl_base is not None:
            lines.append(f"[default{local}]:[rank{rank}]:[E314 09:31:00.{842000000 + 1000 * local} ProcessGroupNCCL.cpp:1609] "
                         f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group watchdog thread terminated with "
                         "exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5")
            continue
        lines += [
            f"[default{local}]:[rank{rank}]: Traceback (most recent call last):",
            f'[default{local}]:[rank{rank}]:   File "/workspace/train.py", line 212, in train_step',
            f"[default{local}]:[rank{rank}]:     loss.backward()",
            (f"[default{local}]:[rank{rank}]: RuntimeError: [/opt/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] "
             f"Connection closed by peer [10.0.0.{node + 1}]:{23187 + local}"),
        ]
    at_s = 60.6 + 0.1 * node
    api = "torch/distributed/elastic/multiprocessing/api.py"
    first = killed if killed is not None else min(tied, default=0)
    for local in range(PER_NODE):
        if local != first:
            lines.append(f"W{_glog_time(at_s)} {agent_pid} {api}:900] Sending process {_pid(node, local)} closing signal "
                         "SIGTERM")
    code = -9 if killed is not None else 1
    lines.append(f"E{_glog_time(at_s + 0.2)} {agent_pid} {api}:874] failed (exitcode: {code}) local_rank: {first} "
                 f"(pid: {_pid(node, first)}) of binary: /usr/bin/python3")
    return "\n".join(lines) + "\n"


def _diagnose(diagnoser: Diagnoser, tmp_path: Path, files: dict[str, str]) -> list:  # type: ignore[type-arg]
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    incidents, _ = diagnoser.diagnose([str(tmp_path / name) for name in files], "identity")
    return incidents


def test_a_nodes_base_rank_comes_from_one_tie_on_it(tmp_path: Path, diagnoser: Diagnoser) -> None:
    """4 nodes of 4 workers. On node03 only local rank 0's traceback reached the file (`[default0]:[rank8]:`):
    one tie, so node03's workers are ranks 8-11, and the killed local rank 2 is rank 10. (No other node's tie
    says anything about node03, and no node is left without one: neither the free block nor a guess applies.)
    (Off: `IdentityResolver` without the base from one tie (`self.bases` empty, or `rank_of` not adding the
    base) -> the report's local rank 2 names no rank.)"""
    files = {f"node0{n + 1}.log": torchrun_node(n, tied={0: 4 * n}) for n in range(4) if n != 2}
    files["node03.log"] = torchrun_node(2, killed=2, tied={0: 8})
    primary = _diagnose(diagnoser, tmp_path, files)[0]
    assert (primary.class_, primary.initiator.rank) == ("host_oom_kill", 10)
    assert (primary.initiator.host, primary.initiator.local_rank) == ("node03", 2)


def test_the_one_block_no_other_node_holds_belongs_to_the_node_left(tmp_path: Path, diagnoser: Diagnoser) -> None:
    """4 nodes of 4 workers; node03's agent killed its other workers before any of them printed a rank, so
    node03 has no tie. node01, node02 and node04 hold ranks 0-3, 4-7 and 12-15 (one tie each): the one free
    block, 8-11, is node03's, and its killed local rank 1 is rank 9. (Off: the free block not assigned when it
    is the only one -> the report names no rank.)"""
    files = {f"node0{n + 1}.log": torchrun_node(n, tied={1: 4 * n + 1}) for n in range(4) if n != 2}
    files["node03.log"] = torchrun_node(2, killed=1)
    primary = _diagnose(diagnoser, tmp_path, files)[0]
    assert (primary.class_, primary.initiator.rank) == ("host_oom_kill", 9)


def test_with_no_tie_at_all_nodes_in_natural_name_order_hold_consecutive_blocks(
    tmp_path: Path, diagnoser: Diagnoser
) -> None:
    """Slurm's node list node9, node10, node11, node12 (static rendezvous in that order): no traceback reached
    any file, so nothing ties a local rank to a rank anywhere. The engine's last resort is a guess, which it
    says it made: the nodes in their natural name order hold consecutive blocks (node9 ranks 0-3, node10 ranks
    4-7), so node10's killed local rank 3 is rank 7. (Off: no guess -> no rank; or names in plain string
    order, node10 first -> rank 3.)"""
    files = {f"node{n + 9}/train.log": torchrun_node(n, killed=3 if n == 1 else None) for n in range(4)}
    primary = _diagnose(diagnoser, tmp_path, files)[0]
    assert (primary.class_, primary.initiator.rank, primary.initiator.host) == ("host_oom_kill", 7, "node10")


def test_one_launchers_local_ranks_are_the_jobs_ranks(tmp_path: Path, diagnoser: Diagnoser) -> None:
    """A single-node job (`torchrun --nproc-per-node 4`) logged to one file whose name says no host: the one
    launcher numbers every process, so its local rank 3 is rank 3 (no line tied a local rank to another rank).
    (Off: the single-launcher rule -> the report names no rank.)"""
    text = torchrun_node(0, killed=3)
    primary = _diagnose(diagnoser, tmp_path, {"train.log": text})[0]
    assert (primary.class_, primary.initiator.rank) == ("host_oom_kill", 3)


def test_a_local_rank_two_launchers_tie_to_different_ranks_says_nothing(tmp_path: Path, diagnoser: Diagnoser) -> None:
    """`srun -N 2 torchrun --nproc-per-node 4` without `--label`: both nodes' output in one Slurm file, no
    host on any line. Every worker printed ProcessGroupNCCL's options with its prefixes, so local rank 1 is
    rank 1 on one node and rank 5 on the other: a conflicting tie, dropped (every local rank's is). The
    agent's report of the killed local rank 1 cannot say which of the two it was: the incident names the
    process by its local rank and pid, not by a rank it may not be. (Off: conflicting ties kept -> the first
    tie read, rank 1, is named, though the process killed was rank 5.)"""
    node_a = torchrun_node(0, tied={0: 0, 2: 2, 3: 3}, nccl_base=0, agent_pid=1400)
    node_b = torchrun_node(1, killed=1, tied={0: 4, 2: 6, 3: 7}, nccl_base=4, agent_pid=1900)
    primary = _diagnose(diagnoser, tmp_path, {"slurm-4412.out": node_a + node_b})[0]
    assert primary.class_ == "host_oom_kill"
    assert (primary.initiator.rank, primary.initiator.local_rank, primary.initiator.pid) == (None, 1, _pid(1, 1))


def _composer_node(node: int, *, killed: int | None = None) -> str:
    """One node of a 4-node MosaicML composer job (`composer -n 4 --world_size 16 --node_rank N`): the training
    script's python logging, then the launcher's report of the rank that crashed and of every process it
    stopped after it (`_print_process_exit_status`: global rank, PID, exit code)."""
    lines = [f"{_py_time(58.8 + 0.01 * local)} - INFO - train - step 1200/20000 | loss 2.1830 | lr 3.00e-04"
             for local in range(PER_NODE)]
    first = killed if killed is not None else 0
    rank = 4 * node + first
    lines.append(f"ERROR:composer.cli.launcher:Rank {rank} crashed with exit code {-9 if killed is not None else 1}.")
    lines.append("Waiting up to 30 seconds for all training processes to terminate. Press Ctrl-C to exit immediately.")
    for local in [first] + [k for k in range(PER_NODE) if k != first]:
        code = (-9 if killed is not None else 1) if local == first else -15
        lines.append(f"Global rank {4 * node + local} (PID {_pid(node, local)}) exited with code {code}")
    return "\n".join(lines) + "\n"


def test_a_pid_a_line_tied_to_a_rank_names_the_rank_of_a_kernel_line_about_that_pid(
    tmp_path: Path, diagnoser: Diagnoser
) -> None:
    """The kernel's OOM killer on node03 names only the pid it killed (`Killed process 4421 (python)`).
    composer's launcher on node03 printed `Global rank 9 (PID 4421) exited with code -9`: a line naming rank
    and pid ties node03's pid 4421 to rank 9. Every launcher reports its processes' exits (16 lines of one
    rule), too many to tell one failed process, so no launcher report fills the kernel line's rank: the tie
    does. (Off: ties of pids from lines naming rank and pid (`_note_who`) -> the kernel line names no rank.)"""
    files = {f"node0{n + 1}/console.log": _composer_node(n, killed=1 if n == 2 else None) for n in range(4)}
    files["node03/kern.log"] = (
        "2026-03-14T09:31:00.412311+00:00 node03 kernel: python invoked oom-killer: gfp_mask=0x140dca"
        "(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), order=0, oom_score_adj=0\n"
        f"2026-03-14T09:31:00.431207+00:00 node03 kernel: Out of memory: Killed process {_pid(2, 1)} (python) "
        "total-vm:187310244kB, anon-rss:163551204kB, file-rss:81920kB, shmem-rss:20480kB, UID:0 pgtables:327102kB "
        "oom_score_adj:0\n")
    primary = _diagnose(diagnoser, tmp_path, files)[0]
    assert (primary.class_, primary.initiator.rank, primary.initiator.host) == ("host_oom_kill", 9, "node03")


def test_the_initiating_line_takes_who_from_the_next_line_of_its_class_in_its_file(
    tmp_path: Path, diagnoser: Diagnoser
) -> None:
    """A single-process run (`python train.py`, DataLoader with 8 workers, a 64 MB /dev/shm): the worker's
    signal handler prints `Unexpected bus error encountered in worker`, naming nobody; the main process's
    traceback ends in `DataLoader worker (pid 325) is killed by signal: Bus error`, naming the process that
    died. Both tell one failure (one class, one file, the second right after the first): the incident names
    pid 325. (Off: `corroborated` -> the initiator names no process.)"""
    dl = "/usr/local/lib/python3.11/site-packages/torch/utils/data"
    text = f"""\
{_py_time(58.8)} - INFO - train - step 1200/20000 | loss 2.1830 | lr 3.00e-04
ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).
Traceback (most recent call last):
  File "{dl}/dataloader.py", line 1133, in _try_get_data
    data = self._data_queue.get(timeout=timeout)
  File "/usr/lib/python3.11/queue.py", line 180, in get
    self.not_empty.wait(remaining)
  File "{dl}/_utils/signal_handling.py", line 67, in handler
    _error_if_any_worker_fails()
RuntimeError: DataLoader worker (pid 325) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/workspace/train.py", line 388, in train
    for step, batch in enumerate(train_loader):
  File "{dl}/dataloader.py", line 1146, in _try_get_data
    raise RuntimeError(f'DataLoader worker (pid(s) {{pids_str}}) exited unexpectedly') from e
RuntimeError: DataLoader worker (pid(s) 325) exited unexpectedly
"""  # noqa: E501 - torch's message, whole
    primary = _diagnose(diagnoser, tmp_path, {"train.log": text})[0]
    assert (primary.class_, primary.initiator.pid) == ("shm_exhausted", 325)


def _child_failed(host: str, rank: int, local: int, code: int, pid: int, at_s: float) -> list[str]:
    """torchrun's ChildFailedError summary of a node, as it prints it (one failure, its root cause)."""
    t = T0 + timedelta(seconds=at_s)
    cause = (f"Signal {-code} (SIGKILL) received by PID {pid}" if code < 0 else
             "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    return [
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        f"  time      : {t:%Y-%m-%d_%H:%M:%S}",
        f"  host      : {host}",
        f"  rank      : {rank} (local_rank: {local})",
        f"  exitcode  : {code} (pid: {pid})",
        "  error_file: <N/A>",
        f"  traceback : {cause}",
        "============================================================",
    ]


def test_srun_labels_of_a_file_with_a_launcher_per_node_name_the_node_on_every_line(
    tmp_path: Path, diagnoser: Diagnoser
) -> None:
    """`srun -l -N 2 torchrun --nproc-per-node 4 --tee 3`: one Slurm file, each line behind srun's task label,
    which is the node (one launcher per node), not a rank. Node 1's agent reports its local rank 1 killed
    (-9) and its failure summary says that was rank 5; nothing else on node 1 names a rank. The file's first
    lines (`0: [default0]:...`) show a launcher per node, so diagnose reads every label of the file as its
    node, the summary's lines included: `1:   rank : 5 (local_rank: 1)` ties node 1's local rank 1 to rank 5.
    (Off: diagnose not sniffing the file (`sniff_srun_labels`) -> the summary's label-only lines are read as
    rank 1's (`1:   exitcode : -9 (pid: 4411)`) and the kill is blamed on rank 1.)"""
    node0 = torchrun_node(0, tied={2: 2}).splitlines() + _child_failed("gpu-node-01", 2, 2, 1, _pid(0, 2), 61.0)
    node1 = torchrun_node(1, killed=1).splitlines() + _child_failed("gpu-node-02", 5, 1, -9, _pid(1, 1), 61.1)
    text = "".join(f"{n}: {line}\n" for n, lines in ((0, node0), (1, node1)) for line in lines)
    primary = _diagnose(diagnoser, tmp_path, {"slurm-4412.out": text})[0]
    assert (primary.class_, primary.initiator.rank, primary.initiator.local_rank) == ("host_oom_kill", 5, 1)


def _one_worker_node(node: int, *, killed: bool = False) -> str:
    """A node of `torchrun --nnodes 8 --nproc-per-node 1` (NCCL): its worker prints ProcessGroupNCCL's options at
    start-up (`[default0]:[rankN]:`); when a peer dies it reports the dead peer from its watchdog and its agent
    reports it failed. The killed worker prints nothing; its agent reports the SIGKILL."""
    pid = _pid(node, 0)
    lines = [(f"[default0]:[rank{node}]:[I314 09:29:02.114000000 ProcessGroupNCCL.cpp:919] [PG ID 0 PG GUID 0 Rank "
              f"{node}] ProcessGroupNCCL initialization options: size: 8, global rank: {node}, TIMEOUT(ms): 600000, "
              "USE_HIGH_PRIORITY_STREAM: 0, SPLIT_FROM: 0, SPLIT_COLOR: 0, PG Name: 0"),
             f"[default0]:{_py_time(58.8)} - INFO - train - step 1200/20000 | loss 2.1830 | lr 3.00e-04"]
    api = "torch/distributed/elastic/multiprocessing/api.py"
    if not killed:
        lines.append(f"[default0]:[rank{node}]:[E314 09:31:00.842000000 ProcessGroupNCCL.cpp:1609] [PG ID 0 PG GUID "
                     f"0(default_pg) Rank {node}] Process group watchdog thread terminated with exception: NCCL error: "
                     "remote process exited or there was a network error, NCCL version 2.21.5")
    lines.append(f"E{_glog_time(61.0 + 0.1 * node)} 1400 {api}:874] failed (exitcode: {-9 if killed else 1}) "
                 f"local_rank: 0 (pid: {pid}) of binary: /usr/bin/python3")
    return "\n".join(lines) + "\n"


def test_a_pid_the_launcher_reported_with_its_local_rank_names_the_rank_of_a_kernel_line(
    tmp_path: Path, diagnoser: Diagnoser
) -> None:
    """8 nodes, one worker each. The kernel's OOM killer on node03 names only the pid it killed; node03's agent
    reported that pid's local rank (`failed (exitcode: -9) local_rank: 0 (pid: 4420)`), and node03's local
    rank 0 is rank 2 (its worker's start-up line). Seven agents report their workers failed too, more than one
    can tell apart, so no launcher report fills the kernel line's rank: the pid's local rank does.
    (Off: the launcher report's pid-to-local-rank tie (`JobFacts.local_of`) not read -> the kernel line names
    no rank.)"""
    files = {f"node0{n + 1}/train.log": _one_worker_node(n, killed=n == 2) for n in range(8)}
    files["node03/kern.log"] = (
        f"2026-03-14T09:31:00.431207+00:00 node03 kernel: Out of memory: Killed process {_pid(2, 0)} (python) "
        "total-vm:187310244kB, anon-rss:163551204kB, file-rss:81920kB, shmem-rss:20480kB, UID:0 pgtables:327102kB "
        "oom_score_adj:0\n")
    primary = _diagnose(diagnoser, tmp_path, files)[0]
    assert (primary.class_, primary.initiator.rank, primary.initiator.host) == ("host_oom_kill", 2, "node03")
