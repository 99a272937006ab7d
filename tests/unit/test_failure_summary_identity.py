"""A rank that dies on a signal often prints nothing of its own (no faulthandler): the launcher's failure
summary is the only line about it, an entry whose `rank : N (local_rank: M)` line stands above the lines that
say how it ended (`exitcode : -11 (pid: P)`, `traceback : Signal 11 ...`). Those lines are that rank's.
(Off: the summary's rank line not read as the identity of the entry's next lines -> the segfault is known by
its pid only, and the incident names no rank.)"""

from __future__ import annotations

from pathlib import Path

from correlator.offline.diagnose import Diagnoser

AGENT = "torch/distributed/elastic/multiprocessing/api.py"


def _console() -> str:
    lines = [f"[default{r}]:[rank{r}]:2026-12-05 01:45:{10 + r:02d},000 - INFO - train - step 12/30 loss 2.31"
             for r in range(4)]
    for r in (0, 1, 3):
        lines += [
            f"[default{r}]:[rank{r}]: Traceback (most recent call last):",
            f'[default{r}]:[rank{r}]:   File "/work/train.py", line 68, in worker',
            f"[default{r}]:[rank{r}]:     loss.backward()",
            (f"[default{r}]:[rank{r}]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
            "pair.cc:537] Read error [127.0.0.1]:3486: Connection reset by peer. This is typically caused by a "
            "remote worker crashing. Check the logs of the remote worker"),
        ]
    lines += [
        "[default1]:terminate called without an active exception",
        f"W1205 01:45:34.482000 22809 {AGENT}:1028] Sending process 22838 closing signal SIGTERM",
        f"W1205 01:45:34.482000 22809 {AGENT}:1028] Sending process 22841 closing signal SIGTERM",
        (f"E1205 01:45:34.682000 22809 {AGENT}:1002] failed (exitcode: -6) local_rank: 1 (pid: 22839) of binary: "
        "/usr/bin/python3"),
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=======================================================",
        "train.py FAILED",
        "-------------------------------------------------------",
        "Failures:",
    ]
    for index, (rank, code, pid, name) in enumerate(((2, -11, 22840, "SIGSEGV"), (0, -15, 22838, "SIGTERM"),
                                                     (3, -15, 22841, "SIGTERM"))):
        lines += [f"[{index + 1}]:", "  time      : 2026-12-05_01:45:34", "  host      : node01",
                  f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: {pid})  ({name})",
                  "  error_file: <N/A>", f"  traceback : Signal {-code} ({name}) received by PID {pid}"]
    lines += ["-------------------------------------------------------", "Root Cause (first observed failure):",
              "[0]:", "  time      : 2026-12-05_01:45:34", "  host      : node01", "  rank      : 1 (local_rank: 1)",
              "  exitcode  : -6 (pid: 22839)  (SIGABRT)", "  error_file: <N/A>",
              "  traceback : Signal 6 (SIGABRT) received by PID 22839",
              "======================================================="]
    return "\n".join(lines) + "\n"


def test_a_silent_segfault_is_named_by_its_summary_entry(tmp_path: Path) -> None:
    """Rank 2 segfaults and prints nothing; its peers lose the connection, rank 1 aborts after, and the
    Root Cause block names rank 1 (the first exit seen). The summary's entry for rank 2 says SIGSEGV."""
    log = tmp_path / "console.log"
    log.write_text(_console())
    incidents, _ = Diagnoser().diagnose([str(log)])
    primary = incidents[0]
    assert (primary.class_, primary.initiator.rank) == ("process_crash_signal", 2)
