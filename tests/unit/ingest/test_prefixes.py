"""Golden tests for identity prefixes: one test per style, each asserting the exact Identity."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ingest.prefixes import Identity, identity_from_path, parse_prefixes


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


# (line, expected Identity) for every prefix style the launchers and loggers write.
GOLDEN: list[tuple[str, Identity]] = [
    # torch.distributed per-rank prefix
    (
        "[rank12]: Traceback (most recent call last):",
        Identity(text="Traceback (most recent call last):", rank=12),
    ),
    # per-rank prefix keeps the indentation of a traceback frame (one space belongs to the prefix)
    (
        '[rank2]:   File "/opt/app/train.py", line 88, in step',
        Identity(text='  File "/opt/app/train.py", line 88, in step', rank=2),
    ),
    # per-rank prefix stacked on c10 logging (month not zero padded, nanoseconds)
    (
        (
            "[rank3]:[E514 11:02:33.123456789 ProcessGroupNCCL.cpp:612] [Rank 3] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE) ran for 600011 milliseconds"
        ),
        Identity(
            text="[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE) "
            "ran for 600011 milliseconds",
            rank=3,
            ts=utc(2025, 5, 14, 11, 2, 33, 123456),
            severity="error",
        ),
    ),
    # the same header without a source location (folly's fatal signal handler)
    (
        "[rank1]:[E514 18:02:10.221] *** Signal 7 (SIGBUS) received by PID 77120 ***",
        Identity(
            text="*** Signal 7 (SIGBUS) received by PID 77120 ***",
            rank=1,
            ts=utc(2025, 5, 14, 18, 2, 10, 221000),
            severity="error",
        ),
    ),
    # a log viewer's line number in front of the rank prefix: passed over, not a pid
    (
        "[51234] [rank6]:[W1107 08:00:01.000000500 TCPStore.cpp:131] [c10d] recvValue failed",
        Identity(
            text="[c10d] recvValue failed",
            rank=6,
            ts=utc(2025, 11, 7, 8, 0, 1, 0),
            severity="warning",
        ),
    ),
    # pdsh / the DeepSpeed launcher: the remote host in front of whatever the node printed
    (
        "node02: [default1]:[rank5]: RuntimeError: boom",
        Identity(text="RuntimeError: boom", rank=5, local_rank=1, host="node02"),
    ),
    ("gpu-a100-07: [rank11]: Traceback (most recent call last):",
     Identity(text="Traceback (most recent call last):", rank=11, host="gpu-a100-07")),
    # a traceback frame behind the host keeps its indentation
    ('ip-10-0-1-23:   File "/opt/train.py", line 3, in <module>',
     Identity(text='  File "/opt/train.py", line 3, in <module>', host="ip-10-0-1-23")),
    ("10.0.0.5: [rank2]: ValueError: bad", Identity(text="ValueError: bad", rank=2, host="10.0.0.5")),
    ("localhost: [default0]:hello", Identity(text="hello", local_rank=0, host="localhost")),
    # a log aggregator's host and a space, in front of a line with a prefix of its own
    ("compute-19-9 [rank935]: RuntimeError: boom", Identity(text="RuntimeError: boom", rank=935, host="compute-19-9")),
    (
        "compute-23-5 W0520 21:56:57.766000 376613 torch/distributed/elastic/multiprocessing/api.py:900] Sending",
        Identity(text="Sending", pid=376613, host="compute-23-5", severity="warning",
                 ts=utc(2025, 5, 20, 21, 56, 57, 766000)),
    ),
    # a relaying launcher's stream label
    ("stderr: [rank1]: KeyError: 'label'", Identity(text="KeyError: 'label'", rank=1)),
    # a host and slot in brackets
    ("[node04:3] ValueError: bad", Identity(text="ValueError: bad", local_rank=3, host="node04")),
    # srun -l in front of torchrun's tee prefix: one launcher per node, the label is the node
    ("1: [default1]:[rank3]: oops", Identity(text="oops", rank=3, local_rank=1, host="task1")),
    ("1: [default1]:step 3", Identity(text="step 3", local_rank=1, host="task1")),
    # ... and in front of the launcher's agent logger
    (
        "2: W1204 20:37:25.488000 6816 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 6825",
        Identity(text="Sending process 6825", pid=6816, host="task2", severity="warning",
                 ts=utc(2025, 12, 4, 20, 37, 25, 488000)),
    ),
    # torchrun --tee: [role][local_rank]:
    ("[default3]:loss=nan at step 400", Identity(text="loss=nan at step 400", local_rank=3)),
    ("[trainer1]: epoch 2 done", Identity(text="epoch 2 done", local_rank=1)),
    # OpenMPI --tag-output, SageMaker flavour with host
    (
        "[1,mpirank:5,algo-2]<stderr>:NCCL error: unhandled system error",
        Identity(text="NCCL error: unhandled system error", rank=5, host="algo-2"),
    ),
    # OpenMPI --tag-output, plain
    ("[1,11]<stdout>:step 10 loss 2.31", Identity(text="step 10 loss 2.31", rank=11)),
    # NCCL debug output: host:pid:tid [cudaDev]
    (
        "gpu-node-07:41022:41310 [5] NCCL INFO Channel 03/0 : 5[5] -> 6[6] via P2P/IPC",
        Identity(
            text="NCCL INFO Channel 03/0 : 5[5] -> 6[6] via P2P/IPC", pid=41022, host="gpu-node-07", gpu="5"
        ),
    ),
    (
        "10-3-1-8:700:702 [0] transport/net_ib.cc:88 NCCL WARN NET/IB : port down",
        Identity(
            text="transport/net_ib.cc:88 NCCL WARN NET/IB : port down", pid=700, host="10-3-1-8", gpu="0"
        ),
    ),
    # NCCL line behind a bracketed timestamp (llm-d / vLLM pod logs)
    (
        (
            "[2025-08-02 10:11:12] infer-pod-3:99:120 [2] transport/net_ib.cc:190 NCCL WARN NET/IB : mlx5_4:1 "
            "Got async error event: port error"
        ),
        Identity(
            text="transport/net_ib.cc:190 NCCL WARN NET/IB : mlx5_4:1 Got async error event: port error",
            pid=99,
            host="infer-pod-3",
            gpu="2",
            ts=utc(2025, 8, 2, 10, 11, 12),
            ts_has_date=True,
        ),
    ),
    # UCX crash header
    (
        "[a1b2c3d4e5f6:4410 :0:4502] Caught signal 11 (Segmentation fault: address not mapped)",
        Identity(
            text="Caught signal 11 (Segmentation fault: address not mapped)", pid=4410, host="a1b2c3d4e5f6"
        ),
    ),
    # Ray worker prefixes
    (
        "(Worker pid=3301, ip=10.0.4.17) RuntimeError: CUDA error: an illegal memory access",
        Identity(text="RuntimeError: CUDA error: an illegal memory access", pid=3301, host="10.0.4.17"),
    ),
    (
        "(RayWorkerVllm pid=812) Fatal Python error: Aborted",
        Identity(text="Fatal Python error: Aborted", pid=812),
    ),
    (
        "(raylet) A worker died or was killed while executing a task",
        Identity(text="A worker died or was killed while executing a task"),
    ),
    # Ray prefix stacked on the per-rank prefix and c10 logging
    (
        (
            "(RayTrainWorker pid=777, ip=172.16.0.9) [rank4]:[E1224 13:23:05.483840160 ProcessGroupNCCL.cpp:542] "
            "[Rank 20] NCCL error: remote process exited"
        ),
        Identity(
            text="[Rank 20] NCCL error: remote process exited",
            rank=4,
            pid=777,
            host="172.16.0.9",
            ts=utc(2025, 12, 24, 13, 23, 5, 483840),
            severity="error",
        ),
    ),
    # Ray's C++ logger behind a Ray prefix
    (
        "(RayWorkerVllm pid=812) [2024-06-01 10:00:00,250 E 812 901] logging.cc:361: *** SIGABRT received",
        Identity(
            text="*** SIGABRT received",
            pid=812,
            ts=utc(2024, 6, 1, 10, 0, 0, 250000),
            ts_has_date=True,
            severity="error",
        ),
    ),
    # vLLM worker prefixes and vLLM's own log header
    (
        "(VllmWorker rank=2 pid=1900) INFO 03-04 05:06:07 [gpu_worker.py:101] Loading weights",
        Identity(text="Loading weights", rank=2, pid=1900, ts=utc(2025, 3, 4, 5, 6, 7), severity="info"),
    ),
    (
        "(EngineCore_DP0 pid=5150) ERROR 10-23 09:29:42 [multiproc_executor.py:154] Worker proc VllmWorker-1 died",
        Identity(
            text="Worker proc VllmWorker-1 died", pid=5150, ts=utc(2025, 10, 23, 9, 29, 42), severity="error"
        ),
    ),
    # srun --label
    (
        "7: RuntimeError: NCCL communicator was aborted",
        Identity(text="RuntimeError: NCCL communicator was aborted", rank=7),
    ),
    (" 3: step 5", Identity(text="step 5", rank=3)),
    # a rank prefix behind srun's task label names the rank (the task id is the launcher's numbering)
    ("3: [rank11]: torch.OutOfMemoryError: CUDA out of memory.",
     Identity(text="torch.OutOfMemoryError: CUDA out of memory.", rank=11)),
    # glog as written by torch elastic: severity, time without year, pid, source location
    (
        (
            "E0412 07:08:09.101112 4242 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -9) "
            "local_rank: 2 (pid: 4250) of binary: /usr/bin/python3"
        ),
        Identity(
            text="failed (exitcode: -9) local_rank: 2 (pid: 4250) of binary: /usr/bin/python3",
            pid=4242,
            ts=utc(2025, 4, 12, 7, 8, 9, 101112),
            severity="error",
        ),
    ),
    # [RANK N] ts [LEVEL] (SimpleTuner-style logger)
    (
        "[RANK 3] 2026-02-01 08:09:10,111 [ERROR] Detected mismatch between collectives on ranks.",
        Identity(
            text="Detected mismatch between collectives on ranks.",
            rank=3,
            ts=utc(2026, 2, 1, 8, 9, 10, 111000),
            ts_has_date=True,
            severity="error",
        ),
    ),
    # docker compose service prefix
    (
        "llm-api-server  | ERROR 07-08 11:01:29 [core.py:502] EngineCore encountered a fatal error.",
        Identity(
            text="EngineCore encountered a fatal error.",
            host="llm-api-server",
            ts=utc(2025, 7, 8, 11, 1, 29),
            severity="error",
        ),
    ),
    # kubectl/Go log timestamp in front of a Python logging timestamp (double timestamps)
    (
        "2023/06/01 09:10:11 2023-06-01 09:10:11,555 INFO Epoch 2 TRAIN info lr 1e-4",
        Identity(text="INFO Epoch 2 TRAIN info lr 1e-4", ts=utc(2023, 6, 1, 9, 10, 11), ts_has_date=True),
    ),
    # kubectl logs --timestamps (RFC 3339, nanoseconds) in front of the per-rank prefix
    (
        "2024-01-01T12:00:00.123456789Z [rank1]: torch.OutOfMemoryError: CUDA out of memory.",
        Identity(
            text="torch.OutOfMemoryError: CUDA out of memory.",
            rank=1,
            ts=utc(2024, 1, 1, 12, 0, 0, 123456),
            ts_has_date=True,
        ),
    ),
    # RFC 3339 with an offset: converted to UTC
    (
        "2024-01-01T14:00:00+02:00 starting",
        Identity(text="starting", ts=utc(2024, 1, 1, 12, 0, 0), ts_has_date=True),
    ),
    # an undecoded CRI line: time, stream and tag are all prefix
    (
        "2024-02-02T02:02:02.5Z stderr F [rank0]: boom",
        Identity(text="boom", rank=0, ts=utc(2024, 2, 2, 2, 2, 2, 500000), ts_has_date=True),
    ),
    # python logging / loguru timestamps
    (
        "2023-09-09 10:00:00.321 | INFO     | trainer:fit:55 - epoch 1",
        Identity(
            text="INFO     | trainer:fit:55 - epoch 1", ts=utc(2023, 9, 9, 10, 0, 0, 321000), ts_has_date=True
        ),
    ),
    (
        "2024-05-07 15:51:09,140 - root - INFO - Starting training step",
        Identity(
            text="root - INFO - Starting training step",
            ts=utc(2024, 5, 7, 15, 51, 9, 140000),
            ts_has_date=True,
        ),
    ),
    # DeepSpeed's bracketed timestamp and level
    (
        "[2024-10-01 01:02:03,004] [WARNING] [stage3.py:2100:step] 4 pytorch allocator cache flushes",
        Identity(
            text="[stage3.py:2100:step] 4 pytorch allocator cache flushes",
            ts=utc(2024, 10, 1, 1, 2, 3, 4000),
            ts_has_date=True,
            severity="warning",
        ),
    ),
    # torch elastic's old [LEVEL] ts format
    (
        "[ERROR] 2022-01-02 03:04:05,006 error_handler: {",
        Identity(
            text="error_handler: {", ts=utc(2022, 1, 2, 3, 4, 5, 6000), ts_has_date=True, severity="error"
        ),
    ),
    # TensorRT-LLM
    (
        "[12/01/2025-10:20:30] [TRT-LLM] [RANK 2] [E] Failed to initialize executor on rank 2",
        Identity(
            text="Failed to initialize executor on rank 2",
            rank=2,
            ts=utc(2025, 12, 1, 10, 20, 30),
            ts_has_date=True,
            severity="error",
        ),
    ),
    # dmesg: seconds since boot are not a wall-clock time
    (
        "[ 9021.004411] NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.",
        Identity(text="NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus."),
    ),
    (
        "[  +0.000120] pcieport 0000:00:02.0: AER: Corrected error received",
        Identity(text="pcieport 0000:00:02.0: AER: Corrected error received"),
    ),
    # dmesg -T: a wall-clock time with a date
    (
        "[Tue Jun  3 04:05:06 2025] NVRM: Xid (PCI:0000:3b:00): 48, pid=12, DBE",
        Identity(
            text="NVRM: Xid (PCI:0000:3b:00): 48, pid=12, DBE", ts=utc(2025, 6, 3, 4, 5, 6), ts_has_date=True
        ),
    ),
    # journalctl -k / kern.log
    (
        "kernel: NVRM: Xid (PCI:0000:1a:00): 94, pid=3, Ch 00000008",
        Identity(text="NVRM: Xid (PCI:0000:1a:00): 94, pid=3, Ch 00000008"),
    ),
    (
        "Jun  2 13:13:04 gpu-node-4 kernel: NVRM: Xid (PCI:0000:1a:00): 63, Row Remapper",
        Identity(
            text="NVRM: Xid (PCI:0000:1a:00): 63, Row Remapper",
            host="gpu-node-4",
            ts=utc(2025, 6, 2, 13, 13, 4),
        ),
    ),
    # `grep PATTERN *.log` output: the file name goes, the prefixes behind it are parsed
    (
        "infer-pod-2.log:[2025-09-17 15:16:23] infer-pod-2:311:405 [0] transport/net_ib.cc:199 NCCL WARN x",
        Identity(
            text="transport/net_ib.cc:199 NCCL WARN x",
            pid=311,
            host="infer-pod-2",
            gpu="0",
            ts=utc(2025, 9, 17, 15, 16, 23),
            ts_has_date=True,
        ),
    ),
    # metaflow: timestamp, [run/step/task (pid N)], [uuid], then the app's own timestamp
    (
        (
            "2023-05-01 01:02:03.456 [12/train/34 (pid 9876)] [0a1b2c3d-0000-4444-8888-123456789abc] "
            "2023-05-01 01:02:03 ERROR [__main__] OSError: [Errno 28] No space left on device"
        ),
        Identity(
            text="ERROR [__main__] OSError: [Errno 28] No space left on device",
            pid=9876,
            ts=utc(2023, 5, 1, 1, 2, 3, 456000),
            ts_has_date=True,
        ),
    ),
]


@pytest.mark.parametrize(("line", "expected"), GOLDEN, ids=[g[0][:40] for g in GOLDEN])
def test_prefix_style_gives_exact_identity(line: str, expected: Identity) -> None:
    assert parse_prefixes(line, year=2025) == expected


NOT_PREFIXES = [
    # identity inside the message is a claim about a rank, not the writer's identity
    "[E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation timeout",
    "ERROR:composer.cli.launcher:Rank 0 crashed with exit code 1.",
    "Training on [rank5] finished",
    "[Rank 2] NCCL watchdog thread terminated with exception",
    "[PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog",
    # things that look like prefixes but are not
    "12:30:01 is when it started",
    "3",
    "(1) In PyTorch 2.6, we changed the default value",
    "(base) user@box:~$ nvidia-smi",
    "{'loss': 1.23, 'grad_norm': 0.5, 'epoch': 0.1}",
    '  File "/usr/lib/python3.10/queue.py", line 180, in get',
    " 3 0x0000000000008609 start_thread()  ???:0",
    "frame #4: <unknown function> + 0xdbbf4 (0x7f in libstdc++.so.6)",
    "Traceback (most recent call last):",
    "May 10  17:16:33.739",
    "[12] Timeout",
    "INFO     | __main__:train:26 - Start Train",
    "Params | 124 M",
    # words a program prints before a colon are not pdsh hosts, digits or not
    "step3: loss 2.1",
    "epoch10: done",
    "sha256: 9f2c",
    "utf-8: decode error",
    "RuntimeError: Connection closed by peer",
    "Note: training resumed",
    "epoch3 [rank1]: took 4 s",  # a word a program prints, with a digit, is not a host
    "",
]


@pytest.mark.parametrize("line", NOT_PREFIXES)
def test_lines_without_prefixes_are_untouched(line: str) -> None:
    assert parse_prefixes(line, year=2025) == Identity(text=line)


def test_outer_prefix_wins_over_inner_for_the_same_field() -> None:
    ident = parse_prefixes("[rank2]: [rank5]: hello")
    assert ident.rank == 2
    assert ident.text == "hello"


def test_dated_timestamp_beats_year_less_one_in_the_same_line() -> None:
    ident = parse_prefixes("2024-03-01T00:00:01Z E0229 23:59:59.000001 77 x.py:1] msg", year=2019)
    assert ident.ts == utc(2024, 3, 1, 0, 0, 1)
    assert ident.ts_has_date is True
    assert ident.pid == 77
    assert ident.text == "msg"


def test_year_less_timestamp_uses_given_year() -> None:
    assert parse_prefixes("[rank0]:[E101 00:00:00.000000001 a.cpp:1] x", year=2021).ts == utc(2021, 1, 1)


def test_year_less_timestamp_without_year_is_never_in_the_future() -> None:
    now = datetime.now(UTC)
    ident = parse_prefixes("E1231 23:59:59.999999 1 a.py:1] late in the year")
    assert ident.ts is not None
    assert ident.ts_has_date is False
    assert ident.ts.year in (now.year, now.year - 1)
    assert (ident.ts - now).days < 2


def test_invalid_calendar_date_gives_no_timestamp_but_still_strips() -> None:
    ident = parse_prefixes("2023-02-30 10:00:00,000 - x - INFO - hello")
    assert ident.ts is None
    assert ident.text == "x - INFO - hello"


def test_ansi_colours_are_removed_before_parsing() -> None:
    ident = parse_prefixes("\x1b[36mtrainer-1  |\x1b[0m [rank1]: ok")
    assert ident == Identity(text="ok", rank=1, host="trainer-1")


def test_all_timestamps_are_utc_aware() -> None:
    for line, _ in GOLDEN:
        ts = parse_prefixes(line, year=2025).ts
        assert ts is None or ts.tzinfo is UTC


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/logs/rank3.log", {"rank": 3}),
        ("/logs/rank_03.txt", {"rank": 3}),
        ("/logs/train_rank_03.txt", {}),
        ("/logs/myrank7model.log", {}),
        ("/data/ranking-2024.log", {}),
        ("/logs/worker-5.log", {"rank": 5}),
        ("/tmp/torchelastic_k2/5521_x8/attempt_0/3/stdout.log", {"attempt": 0, "local_rank": 3}),
        ("/logs/rank-12/stdout.log", {"rank": 12}),
        ("/logs/local_rank5.log", {"local_rank": 5}),
        (
            "/var/log/pods/llama-ft-worker-2.log",
            {"job_id": "llama-ft", "pod_index": 2, "host": "llama-ft-worker-2"},
        ),
        ("/k8s/bert-pt-master-0/main.log", {"job_id": "bert-pt", "pod_index": 0, "host": "bert-pt-master-0"}),
        ("/k8s/mpi-job-launcher-x7k2p.log", {"job_id": "mpi-job", "host": "mpi-job-launcher-x7k2p"}),
        ("/shared/node01/train.log", {"host": "node01"}),
        ("/shared/node01.log", {"host": "node01"}),
        ("/home/u/slurm-12345.out", {"job_id": "12345"}),
        ("/home/u/slurm-777_3.out", {"job_id": "777_3"}),
        ("/tmp/elastic/run-1/attempt_2/4/stderr.log", {"attempt": 2, "local_rank": 4}),
        ("/tmp/plain/train.log", {}),
        ("", {}),
    ],
)
def test_identity_from_path(path: str, expected: dict[str, str | int]) -> None:
    assert identity_from_path(path) == expected


def test_srun_labels_are_a_files_nodes_when_any_line_shows_a_launcher_per_node() -> None:
    """`srun -l torchrun ...`: every line of the file, the launcher's failure summary included, is about a node.
    (Off: the summary's `1:   exitcode  : -11 (pid: 7)` reads as rank 1.)"""
    from ingest.prefixes import sniff_srun_labels

    lines = ["0: [default0]:step 1", "1: [default1]:[rank3]: step 1", "1:   exitcode  : -11 (pid: 7)"]
    assert sniff_srun_labels(lines) == "node"
    assert sniff_srun_labels(["0: step 1", "3: step 1"]) == "auto"
    summary = parse_prefixes(lines[2], srun_labels="node")
    assert (summary.rank, summary.host) == (None, "task1")
    assert parse_prefixes(lines[2]).rank == 1  # one task per rank: the label is the rank
    assert parse_prefixes("3: [rank3]: x", srun_labels="rank").rank == 3


def test_machines_among_log_paths_are_names_shaped_like_hosts_that_differ_in_their_numbers() -> None:
    """One file per host, named like the cluster's machines: two or more such names at the same place; a job's
    folder named like a host (sigabrt-run-2/console.log) is one name, not a set of machines. (Off: every
    host-shaped name is a host -> the job folder becomes the host of every line.)"""
    from ingest.prefixes import hosts_among

    paths = ["/logs/gpu-a100-0137.log", "/logs/gpu-a100-0138.log", "/logs/ip-10-1-3-77/rank37.out",
             "/logs/ip-10-1-3-78/rank45.out", "/cases/sigabrt-run-2/console.log", "/logs/train-37.txt",
             "/logs/train-38.txt", "/logs/part-00001.log", "/logs/part-00002.log"]
    hosts = hosts_among(paths)
    assert hosts == {"gpu-a100-0137", "gpu-a100-0138", "ip-10-1-3-77", "ip-10-1-3-78"}
    assert identity_from_path("/logs/ip-10-1-3-77/rank37.out", hosts) == {"host": "ip-10-1-3-77", "rank": 37}
    assert identity_from_path("/cases/sigabrt-run-2/console.log", hosts) == {}
    # a log-kind word around the host's name is not part of it
    kern = hosts_among(["/job/dmesg/dmesg-node208.txt", "/job/dmesg/dmesg-node209.txt"])
    assert identity_from_path("/job/dmesg/dmesg-node208.txt", kern) == {"host": "node208"}
