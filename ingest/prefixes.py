"""Identity prefixes: who wrote a line (rank, host, pid, GPU) and when, from the text in front of it.

Launchers, loggers and aggregators put identity in front of each line, often several stacked:
`2024-01-01T12:00:00Z [rank3]:[E102 18:16:40.66 ProcessGroupNCCL.cpp:632] ...`. `parse_prefixes`
peels them off left to right, records what each one says, and returns the rest of the line.

Only true prefixes are removed. Identity that appears inside the message (`[Rank 3] Watchdog
caught ...`, composer's `Rank 0 crashed`) stays in the text: the rules extract it, because
there it is a claim about some rank, not the identity of the writer. Fixed-format logger headers
(glog, c10, vLLM, Ray's C++ logger: level, time, pid, source location) are removed whole, so a
traceback frame behind one keeps its indentation.

When two stacked prefixes say the same thing, the outer one wins (it was added last, by the
component closest to the collector, and is what the other lines of the stream carry too). For
time, the first timestamp with a full date wins over year-less ones (glog, vLLM, syslog).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePath
from typing import Literal

from ingest import timestamps as tsu

__all__ = ["Identity", "SrunLabels", "hosts_among", "identity_from_path", "parse_prefixes", "sniff_srun_labels"]

SrunLabels = Literal["auto", "rank", "node"]


@dataclass(frozen=True, slots=True)
class Identity:
    """What the prefixes of one line say. `text` is the line without them.

    `ts_has_date` is False when the line's time had no year (glog, vLLM, syslog) and the year
    was supplied or guessed; `severity` is the logger's level when a parsed header carried one
    ("debug", "info", "warning", "error", "fatal").
    """

    text: str
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    host: str | None = None
    gpu: str | None = None
    ts: datetime | None = None
    ts_has_date: bool = False
    severity: str | None = None

    def has_identity(self) -> bool:
        return (
            self.rank is not None
            or self.local_rank is not None
            or self.pid is not None
            or self.host is not None
            or self.gpu is not None
        )


_SEVERITY = {
    "I": "info", "W": "warning", "E": "error", "F": "fatal", "D": "debug", "V": "debug",
    "DEBUG": "debug", "INFO": "info", "WARN": "warning", "WARNING": "warning", "ERROR": "error",
    "CRITICAL": "fatal", "FATAL": "fatal",
}  # fmt: skip

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

_MON = r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_FRAC = r"(?:[.,](\d+))?"
_TZ = r"(Z|[+-]\d\d:?\d\d)?"

# --- prefixes that start with '[' -------------------------------------------------------------
# [rank3]:  (torch.distributed's per-rank prefix, also with --local-ranks-filter)
_RANK_COLON = re.compile(r"\[[Rr]ank(\d+)\]: ?")
# [default0]:  torchrun --tee / --log-line-prefix: [{role}{local_rank}]:
_ROLE_LOCAL = re.compile(r"\[([A-Za-z_][A-Za-z_-]*?)(\d+)\]: ?")
# OpenMPI --tag-output: [jobid,rank]<stream>:  and SageMaker's [1,mpirank:7,algo-1]<stderr>:
_MPI = re.compile(r"\[(\d+),(?:mpirank:)?(\d+)(?:,([^\]\s,]+))?\]<(?:stdout|stderr|stddiag)>: ?")
# [80746] [rank0]:  a number in brackets in front of an identity prefix: a log viewer's line number, not a pid
# (no launcher writes a pid there); it is passed over, and says nothing about who wrote the line
_LINE_NUMBER = re.compile(r"\[\d+\] (?=\[(?:[Rr]ank\d+|[A-Za-z_]+\d+)\]:)")
# [RANK 1]  upper case, SimpleTuner / TRT-LLM style (NCCL's "[Rank 1]" is message text)
_RANK_UPPER = re.compile(r"\[RANK (\d+)\] ?")
# [2024-09-11 17:52:11,320]  and Ray's C++ logger [2024-04-16 00:03:25,080 E 7046 7269] file.cc:361:
_BRACKET_DT = re.compile(
    r"\[(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)" + _FRAC + r" ?" + _TZ +
    r"(?: ([DIWEF]) (\d+) \d+\] (?:[\w.-]+:\d+: ?)?|\] ?)"
)  # fmt: skip
# TRT-LLM: [11/18/2025-09:33:30] [TRT-LLM] [RANK 0] [E]
_TRTLLM = re.compile(
    r"\[(\d\d)/(\d\d)/(\d{4})-(\d\d):(\d\d):(\d\d)\] (?:\[TRT-LLM\] ?)?(?:\[RANK (\d+)\] ?)?(?:\[([DIWEFV])\] ?)?"
)
# c10 logging: [E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607]  (month not zero-padded)
# (folly's signal handler writes the same without a source location: [E514 18:02:10.221] *** Signal 7)
_C10 = re.compile(r"\[([IWEF])(\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)(?: +(\d+))?(?: [^\]\s]+:\d+)?\] ?")
# dmesg: [ 1843.308145]  and dmesg --reltime deltas [  +0.000316]: relative, not wall-clock
_DMESG_REL = re.compile(r"\[ *\+?\d+\.\d+\] ?")
# dmesg -T: [Mon Jun  2 13:13:04 2025]
_DMESG_T = re.compile(
    r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MON + r" +(\d+) (\d\d):(\d\d):(\d\d) (\d{4})\] ?"
)
# UCX: [8d6bf97c3bf4:3039 :0:3095] Caught signal ...
_UCX = re.compile(r"\[([\w.-]+):(\d+) *:\d+:\d+\] ?")
# a level in brackets right before a timestamp ([INFO] 2021-09-13 ...) or right after one
_BRACKET_LEVEL = re.compile(r"\[(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\] ?")
_DATE_AHEAD = re.compile(r"\[?\d{4}[-/]\d\d[-/]\d\d")
# metaflow: [177/train/578 (pid 28936)] [09c561ee-a44c-4795-967c-7183a83b3160]
_METAFLOW = re.compile(r"\[[\w.-]+/[\w.-]+/[\w.-]+ \(pid (\d+)\)\] ?(?:\[[0-9a-fA-F-]{8,}\] ?)?")
# cheap gate for '[': could any bracketed prefix start here? ("[Rank 0] Watchdog", "[E file.cpp:1]"
# and "[c10d]" are message text and fail it at once instead of trying a dozen patterns)
_BRACKET_GATE = re.compile(
    r"\[(?:[Rr]ank\d|RANK \d|[IWEF]\d|\d|[ +]|[A-Za-z_][\w-]*\d\]:|[\w.-]+:\d|[\w.-]+/"
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) )"
)

# --- prefixes that start with '(' -------------------------------------------------------------
# Ray and vLLM: (RayWorkerVllm pid=7046) (Worker pid=1, ip=10.0.0.2) (VllmWorker rank=1 pid=9)
# (EngineCore_DP0 pid=43418) (raylet) (raylet, ip=10.0.0.2)
_PAREN = re.compile(
    r"\((?P<name>[A-Za-z_][\w.:-]*(?: [A-Za-z_]\w*)?(?=[ ,)]))?(?P<kv>(?:,? ?[A-Za-z_]\w*=[^\s,()]+)+)?\) ?"
)
_KV = re.compile(r"([A-Za-z_]\w*)=([^\s,()]+)")
_RAY_DAEMONS = frozenset(
    {"raylet", "gcs_server", "autoscaler", "monitor", "dashboard", "dashboard_agent", "log_monitor"}
)

# --- prefixes that start with a digit ---------------------------------------------------------
# kubectl logs --timestamps / CRI: 2024-01-01T12:00:00.123456789Z [stdout F ]
_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)" + _FRAC + _TZ + r"(?: (?:stdout|stderr) [FP])?(?: |$)"
)
# python logging / loguru: 2023-04-29 06:01:12.977, 2024-05-07 15:51:09,140 - , ... | INFO
_SPACE_DT = re.compile(
    r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)" + _FRAC + r"(?: ?(Z|[+-]\d\d:?\d\d|UTC))?(?:(?: [|-])? |$)"
)
# Go log / klog: 2022/03/21 15:13:18
_SLASH_DT = re.compile(r"(\d{4})/(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d)" + _FRAC + r"(?: |$)")
# NCCL: host:pid:tid [cudaDev]
_NCCL = re.compile(r"([\w.-]+):(\d+):(\d+) \[(\d+)\] ")
# srun --label: "3: " (only at the very start, and never a time like 12:34:56)
_SRUN = re.compile(r" *(\d{1,6}): ")

# --- prefixes that start with a letter --------------------------------------------------------
# glog / torch elastic: E1206 18:44:12.715298 2606 path/file.py:869]
_GLOG = re.compile(r"([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+) +(\d+) ([^\]\s]+):\d+\] ?")
# A launcher's own logger: torchelastic's agent and torchrun (a line it writes is about its node, not one rank)
_LAUNCHER_SOURCES = ("distributed/elastic/", "distributed/run.py", "distributed/launch")
# pdsh, clush and the DeepSpeed launcher (which runs pdsh) put the remote host in front: "node02: <line>".
# A host name, not a word: it carries a digit (node02, gpu-a100-7, ip-10-0-1-23, algo-1, dgx-03.cluster),
# or is localhost; exception names ("RuntimeError: "), levels ("INFO: ") and words ("loss: ") carry none.
# Words that do carry a digit and start user prints ("step3: ", "epoch2: ", "sha256: ") are not hosts.
_PDSH = re.compile(r"((?:[A-Za-z][A-Za-z0-9-]*\d[A-Za-z0-9-]*|localhost)(?:\.[A-Za-z][A-Za-z0-9-]*)*): ")
_PDSH_IPV4 = re.compile(r"(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}): ")
# A log aggregator's host name and a space in front of a line that has a prefix of its own (a rank prefix, a
# c10/glog header, a dated time): `compute-19-9 [rank935]:[E0520 ...]`. Without such a prefix behind it the
# first word of a line is not taken for a host.
_HOST_SPACE = re.compile(
    r"([A-Za-z][A-Za-z0-9-]*\d[A-Za-z0-9-]*(?:\.[A-Za-z][A-Za-z0-9-]*)*) "
    r"(?=\[[A-Za-z_]+\d+\]:|\[[IWEF]\d{3,4} |[IWEF]\d{4} \d\d:|\d{4}-\d\d-\d\d[ T]\d\d:)"
)
_NOT_HOST_STEMS = frozenset({
    "step", "steps", "epoch", "iter", "iteration", "batch", "rank", "layer", "block", "stage", "phase", "fold",
    "test", "run", "cuda", "sha", "md", "utf", "fp", "bf", "int", "uint", "float", "bfloat", "python", "py",
    "cp", "version", "v", "e", "x", "top", "p", "k", "round", "trial", "job", "task", "worker", "process",
})
_NOT_HOSTS = frozenset({"utf-8", "e2e", "x86-64", "p2p", "n2n", "b2b", "h2d", "d2h"})
_STEM_DIGITS = re.compile(r"([a-z]+)\d+")
# A program that relays its children's output says which stream a line came from ("stderr: ", accelerate's
# and transformers' test launchers): a label, not identity.
_STREAM_LABEL = re.compile(r"std(?:out|err): ")
# "[node02:3] ": a host and the local rank of the process on it (launch wrappers that tag per node and slot)
_HOST_SLOT = re.compile(r"\[([A-Za-z][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*):(\d{1,4})\] ")
# vLLM: ERROR 11-08 11:01:29 [core.py:502]
_VLLM = re.compile(
    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)"
    + _FRAC
    + r" (?:\[[^\]\s]+:\d+\] ?)?"
)
# syslog (traditional / journalctl short): May  1 12:00:00 host tag[pid]:
_SYSLOG = re.compile(
    _MON + r" ([ \d]?\d) (\d\d):(\d\d):(\d\d)" + _FRAC + r" ([\w.-]+) [\w./@-]+?(?:\[(\d+)\])?: ?"
)
_KERNEL = re.compile(r"kernel: ?")
# `grep PATTERN *.log` output: "node-3.log:" in front of the line (only at the very start). The
# file name is not taken as identity (it is whatever the user named the file); it is removed so
# the prefixes behind it are seen.
_GREP_FILE = re.compile(r"[\w.-]+\.(?:log|out|err|txt):(?=\S)")
# docker compose: "service-name  | " / "project-svc-1  | " (only at the very start). Compose names
# carry a '-', '_' or digit; requiring one keeps table rows ("Params | 124M") and loguru's
# "INFO     | msg" from being taken for a service.
_COMPOSE = re.compile(r"([A-Za-z0-9][\w.]*[-_0-9][\w.-]*) +\| ")
# cheap gate for lines that start with a letter: does any letter-led prefix fit at all?
_LETTER_GATE = re.compile(
    r"[\w.-]+:\d+:\d+ \[|[A-Za-z0-9][\w.-]* +\| |[\w.-]+\.(?:log|out|err|txt):|[IWEF]\d{4} |"
    r"[A-Za-z][\w.-]*\d[\w.-]*(?:: | (?=[\[\d]|[IWEF]\d{4} ))|localhost: |std(?:out|err): |"
    + _MON
    + r" [ \d]?\d \d|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-|kernel:"
)

_MAX_PREFIXES = 8


def _host_like(name: str) -> bool:
    """A pdsh-style prefix names a host, not a word a program printed ("step3", "sha256", "utf-8")."""
    lowered = name.lower()
    if lowered in _NOT_HOSTS:
        return False
    m = _STEM_DIGITS.fullmatch(lowered)
    return m is None or m[1] not in _NOT_HOST_STEMS


def _i(value: str | None) -> int | None:
    return int(value) if value else None


def _dated(m: re.Match[str], first: int, tz: str | None) -> datetime | None:
    """A full date-time from regex groups year, month, day, hh, mm, ss, fraction starting at `first`."""
    return tsu.build(
        int(m[first]),
        int(m[first + 1]),
        int(m[first + 2]),
        int(m[first + 3]),
        int(m[first + 4]),
        int(m[first + 5]),
        tsu.frac_to_us(m[first + 6]),
        tz,
    )


def _undated(
    year: int | None, month: int, day: int, hh: str, mm: str, ss: str, frac: str | None
) -> datetime | None:
    """A time without a year: the given year, else the most recent one that is not in the future."""
    return tsu.build(
        tsu.guess_year(month, day, year), month, day, int(hh), int(mm), int(ss), tsu.frac_to_us(frac)
    )


def parse_prefixes(line: str, *, year: int | None = None, srun_labels: SrunLabels = "auto") -> Identity:
    """Peel the identity/time prefixes off `line`.

    `year` completes year-less timestamps (glog, vLLM, syslog); without it the current year is
    used unless that puts the time in the future. `srun_labels`: what an `srun -l` task label is in
    this line's file (`sniff_srun_labels`): a rank (one task per rank), a node (one launcher per node),
    or "auto": a node when the line says so (a launcher's `[default3]:` or its agent's logger), else a rank.
    """
    if not line:
        return Identity(text=line)
    first = line[0]
    if first == "\x1b":
        line = _ANSI.sub("", line)
        if not line:
            return Identity(text=line)
        first = line[0]
    if first.isalpha():
        if _LETTER_GATE.match(line) is None:
            return Identity(text=line)
    elif first == "[":
        if _BRACKET_GATE.match(line) is None:
            return Identity(text=line)
    elif not (first in "( " or first.isdigit()):
        return Identity(text=line)

    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    host: str | None = None
    gpu: str | None = None
    ts: datetime | None = None
    ts_has_date = False
    severity: str | None = None
    srun_task: int | None = None  # srun --label's task id: the rank unless a rank prefix says otherwise
    launcher_line = False  # written by a launcher's own logger (torchelastic's agent), not by a rank

    pos = 0
    n = len(line)
    after_ts = False  # a bracketed level right after a timestamp is part of the same header
    for _ in range(_MAX_PREFIXES):
        if pos >= n:
            break
        c = line[pos]
        m: re.Match[str] | None = None
        was_ts = False
        # A timestamp is only built when it would be kept: the first one, or the first dated one.
        want_dated = ts is None or not ts_has_date
        want_undated = ts is None
        cand: datetime | None = None
        cand_dated = False
        if c == "[":
            if pos and _BRACKET_GATE.match(line, pos) is None:
                break
            if (m := _RANK_COLON.match(line, pos)) is not None:
                rank = rank if rank is not None else int(m[1])
            elif (m := _C10.match(line, pos)) is not None:
                severity = severity or _SEVERITY[m[1]]
                if want_undated:
                    cand = _undated(year, int(m[2]), int(m[3]), m[4], m[5], m[6], m[7])
                pid = pid if pid is not None else _i(m[8])
            elif (m := _BRACKET_DT.match(line, pos)) is not None:
                if want_dated:
                    cand = _dated(m, 1, m[8])
                    cand_dated = True
                if m[9]:  # Ray C++ header
                    severity = severity or _SEVERITY[m[9]]
                    pid = pid if pid is not None else int(m[10])
                was_ts = True
            elif (m := _MPI.match(line, pos)) is not None:
                rank = rank if rank is not None else int(m[2])
                host = host or m[3]
            elif (m := _ROLE_LOCAL.match(line, pos)) is not None:
                local_rank = local_rank if local_rank is not None else int(m[2])
            elif pos == 0 and (m := _LINE_NUMBER.match(line, pos)) is not None:
                pass
            elif (m := _TRTLLM.match(line, pos)) is not None:
                if want_dated:
                    cand = tsu.build(int(m[3]), int(m[1]), int(m[2]), int(m[4]), int(m[5]), int(m[6]))
                    cand_dated = True
                rank = rank if rank is not None else _i(m[7])
                if m[8]:
                    severity = severity or _SEVERITY[m[8]]
            elif (m := _RANK_UPPER.match(line, pos)) is not None:
                rank = rank if rank is not None else int(m[1])
            elif (m := _DMESG_REL.match(line, pos)) is not None:
                pass
            elif (m := _UCX.match(line, pos)) is not None:
                host = host or m[1]
                pid = pid if pid is not None else int(m[2])
            elif (m := _HOST_SLOT.match(line, pos)) is not None:
                host = host or m[1]
                local_rank = local_rank if local_rank is not None else int(m[2])
            elif (m := _METAFLOW.match(line, pos)) is not None:
                pid = pid if pid is not None else int(m[1])
            elif (m := _BRACKET_LEVEL.match(line, pos)) is not None:
                if after_ts or _DATE_AHEAD.match(line, m.end()):
                    severity = severity or _SEVERITY[m[1]]
                else:
                    m = None
            elif (m := _DMESG_T.match(line, pos)) is not None:
                if want_dated:
                    cand = tsu.build(int(m[6]), tsu.MONTHS[m[1]], int(m[2]), int(m[3]), int(m[4]), int(m[5]))
                    cand_dated = True
                was_ts = True
        elif c == "(":
            m = _PAREN.match(line, pos)
            if m is not None:
                name = m["name"]
                kv = dict(_KV.findall(m["kv"])) if m["kv"] else {}
                if "pid" in kv or name in _RAY_DAEMONS:
                    if kv.get("pid", "").isdigit():
                        pid = pid if pid is not None else int(kv["pid"])
                    if kv.get("rank", "").isdigit():
                        rank = rank if rank is not None else int(kv["rank"])
                    host = host or kv.get("ip")
                else:
                    m = None
        elif c.isdigit():
            if (m := _RFC3339.match(line, pos)) is not None:
                if want_dated:
                    cand = _dated(m, 1, m[8])
                    cand_dated = True
                was_ts = True
            elif (m := _SPACE_DT.match(line, pos)) is not None:
                if want_dated:
                    cand = _dated(m, 1, None if m[8] == "UTC" else m[8])
                    cand_dated = True
                was_ts = True
            elif (m := _SLASH_DT.match(line, pos)) is not None:
                if want_dated:
                    cand = _dated(m, 1, None)
                    cand_dated = True
                was_ts = True
            elif (m := _NCCL.match(line, pos)) is not None:
                host = host or m[1]
                pid = pid if pid is not None else int(m[2])
                gpu = gpu or m[4]
            elif pos == 0 and (m := _SRUN.match(line, pos)) is not None:
                srun_task = int(m[1])
            elif host is None and (m := _PDSH_IPV4.match(line, pos)) is not None:
                host = m[1]
            elif pos == 0 and (m := _GREP_FILE.match(line, pos)) is not None:
                pass
        elif c == " ":
            if pos == 0 and (m := _SRUN.match(line, pos)) is not None:
                srun_task = int(m[1])
        elif c.isalpha():
            if pos and _LETTER_GATE.match(line, pos) is None:
                break
            if (m := _GLOG.match(line, pos)) is not None:
                severity = severity or _SEVERITY[m[1]]
                if want_undated:
                    cand = _undated(year, int(m[2]), int(m[3]), m[4], m[5], m[6], m[7])
                pid = pid if pid is not None else int(m[8])
                launcher_line = launcher_line or any(part in m[9] for part in _LAUNCHER_SOURCES)
            elif (m := _NCCL.match(line, pos)) is not None:
                host = host or m[1]
                pid = pid if pid is not None else int(m[2])
                gpu = gpu or m[4]
            elif (m := _VLLM.match(line, pos)) is not None:
                severity = severity or _SEVERITY[m[1]]
                if want_undated:
                    cand = _undated(year, int(m[2]), int(m[3]), m[4], m[5], m[6], m[7])
            elif (m := _SYSLOG.match(line, pos)) is not None:
                if want_undated:
                    cand = _undated(year, tsu.MONTHS[m[1]], int(m[2]), m[3], m[4], m[5], m[6])
                host = host or m[7]
                pid = pid if pid is not None else _i(m[8])
            elif (m := _KERNEL.match(line, pos)) is not None:
                pass
            elif pos == 0 and (m := _COMPOSE.match(line, pos)) is not None:
                host = m[1]
            elif host is None and (
                (m := _PDSH.match(line, pos)) is not None
                or ((pos == 0 or after_ts) and (m := _HOST_SPACE.match(line, pos)) is not None)
            ):
                if _host_like(m[1]):
                    host = m[1]
                else:
                    m = None
            elif (m := _STREAM_LABEL.match(line, pos)) is not None or (
                pos == 0 and (m := _GREP_FILE.match(line, pos)) is not None
            ):
                pass
        if m is None or m.end() == pos:
            break
        if cand is not None:
            ts, ts_has_date = cand, cand_dated
        pos = m.end()
        after_ts = was_ts

    if srun_task is not None and srun_labels != "rank" and (
        srun_labels == "node" or local_rank is not None or launcher_line
    ):
        # srun started one launcher per node (`srun -l torchrun ...`): its label is the node's index, and the
        # launcher's `[default3]:` says the local rank on that node. The node stands in for its host name.
        host = host or f"task{srun_task}"
        srun_task = None
    return Identity(
        text=line[pos:] if pos else line,
        rank=rank if rank is not None else srun_task,
        local_rank=local_rank,
        pid=pid,
        host=host,
        gpu=gpu,
        ts=ts,
        ts_has_date=ts_has_date,
        severity=severity,
    )


# An srun label in front of a launcher's tee prefix or its agent's logger: srun started a launcher per node.
_SRUN_NODE_LINE = re.compile(
    r" *\d{1,6}: (?:\[[A-Za-z_][A-Za-z_-]*?\d+\]:|[IWEF]\d{4} [\d:.]+ +\d+ [^\]\s]*distributed/(?:elastic|run))"
)


def sniff_srun_labels(lines: Iterable[str]) -> SrunLabels:
    """What the `srun -l` labels of a file are, from its first lines: "node" when any of them shows a launcher
    per node (its `[default3]:` tee prefix or its agent's own logger behind the label), else "auto". Every line
    of such a file, the launcher's failure summary included, is then about its node, not the rank with the
    label's number."""
    for line in lines:
        if _SRUN_NODE_LINE.match(line) is not None:
            return "node"
    return "auto"


# --- identity from file paths -----------------------------------------------------------------

# Whole names only: "rank3", "rank_03", "rank-12", "worker-5" (a per-rank file), "local_rank5". Digits that
# happen to follow "rank" inside an arbitrary name ("train_rank_03_debug", "ranking-2024") say nothing.
_PATH_RANK = re.compile(r"^(?:rank|worker)[_-]?(\d+)$", re.IGNORECASE)
_PATH_LOCAL_RANK = re.compile(r"^local[_-]?rank[_-]?(\d+)$", re.IGNORECASE)
_PATH_POD = re.compile(
    r"^(?P<job>.+)-(?P<role>worker|master|launcher|chief|ps|evaluator)-(?P<idx>[0-9]+|[a-z0-9]{5})$"
)
_PATH_HOST_DIR = re.compile(r"^(?:node|host|nid|gpu-node|compute)[-_]?\d+$", re.IGNORECASE)
_PATH_SLURM = re.compile(r"^slurm-(\d+(?:_\d+)?)\.(?:out|err|log)$")
_PATH_ATTEMPT = re.compile(r"^attempt_(\d+)$")
_LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".gz")


# A host name as clusters name them: lower-case words and numbers joined by '-' or '.', with a digit and a
# separator (gpu-a100-0137, ip-10-1-3-77, dgx-h100-03, compute-2-14.cluster); a bare word with a number
# (node12, nid001234) is taken only in the conventional forms of _PATH_HOST_DIR.
_HOSTNAME = re.compile(r"[a-z][a-z0-9]*(?:[-.][a-z0-9]+)+")
# First words of names that are runs, outputs or pieces of data, not machines (train-37.log, part-00001).
_NOT_HOST_FIRST_WORDS = frozenset({
    "train", "training", "eval", "test", "debug", "run", "job", "log", "logs", "output", "out", "err", "stdout",
    "stderr", "console", "part", "shard", "chunk", "epoch", "step", "ckpt", "checkpoint", "model", "exp", "trial",
    "seed", "attempt", "rank", "worker", "process", "proc", "task", "slurm", "batch", "version", "v", "data",
    "result", "results", "report", "trace", "core", "dump", "node-exporter",
})


# What a per-host log's name says besides the host: `dmesg-node208.txt`, `node12.kern.log`, `gpu-3-console.log`
_LOG_KIND_AFFIX = re.compile(
    r"^(?:(?:dmesg|kern|kernel|syslog|journal|messages|console)[-_.])?(?P<host>.+?)"
    r"(?:[-_.](?:dmesg|kern|kernel|syslog|journal|messages|console|stdout|stderr|log|out|err))?$",
    re.IGNORECASE,
)


def machine_name(name: str) -> str:
    """The host a per-host log's file or folder name names, without a log-kind word around it."""
    m = _LOG_KIND_AFFIX.match(name)
    return m["host"] if m is not None else name


def hosts_among(paths: Iterable[str]) -> frozenset[str]:
    """Names that are machines in a set of log paths: file stems or folders shaped like cluster host names
    (gpu-a100-0137, ip-10-1-3-77, dmesg-node208) of which two or more differ only in their numbers at the same
    place in their paths (one file per host). A single such name is not enough: a job's folder is named like
    that too. The names are returned as they stand in the paths (`machine_name` gives the host of each)."""
    by_shape: dict[tuple[int, str], set[str]] = {}
    for path in paths:
        parts = [p for p in PurePath(path).parts if p not in ("/", "")]
        for depth, part in enumerate(reversed(parts)):
            name = _stem(part) if depth == 0 else part
            host = machine_name(name)
            if _hostname_shaped(host) or (_PATH_HOST_DIR.match(host) is not None and host != name):
                by_shape.setdefault((depth, re.sub(r"\d+", "#", name.lower())), set()).add(name)
    return frozenset(n for names in by_shape.values() if len(names) >= 2 for n in names)


def _hostname_shaped(name: str) -> bool:
    lowered = name.lower()
    if _HOSTNAME.fullmatch(lowered) is None or not any(c.isdigit() for c in lowered):
        return False
    first = re.split(r"[-.0-9]", lowered, maxsplit=1)[0]
    numbered = [t for t in re.split(r"[-.]", lowered) if any(c.isdigit() for c in t)]
    if all(t.isdigit() and len(t) == 4 and t[:2] in ("19", "20") for t in numbered):
        return False  # a year (ranking-2024.log): a dated name, not a machine
    return first not in _NOT_HOST_FIRST_WORDS and _host_like(name)


def _stem(name: str) -> str:
    lowered = name.lower()
    for _ in range(2):  # "worker-2.log.gz"
        for suffix in _LOG_SUFFIXES:
            if lowered.endswith(suffix):
                name = name[: -len(suffix)]
                lowered = lowered[: -len(suffix)]
                break
    return name


def identity_from_path(path: str, hosts: frozenset[str] = frozenset()) -> dict[str, str | int]:
    """Hints about a log file's writer from its path.

    Keys (only those found): `rank`, `local_rank`, `host`, `job_id`, `pod_index`, `attempt`.
    Only names that follow a convention count, as whole names: `rank3.log`, `rank_03.log`, `worker-5.log`,
    `logs/rank3/stdout.log` -> rank; `local_rank5.log` -> local_rank; `JOB-worker-2.log` -> job_id=JOB,
    pod_index=2 (a pod's index is not its global rank); `node01/...` or `node01.log` -> host;
    `slurm-12345.out` -> job_id; torchrun's `--log-dir` layout `<run>/attempt_1/3/stdout.log` -> attempt,
    local_rank. Digits inside an arbitrary name (`train_rank3_debug.log`) are not identity. `hosts`: other names
    that are hosts in this job (`hosts_among`: siblings named like a cluster's machines).
    """
    hints: dict[str, str | int] = {}
    parts = [p for p in PurePath(path).parts if p not in ("/", "")]
    if not parts:
        return hints
    base = parts[-1]
    stem = _stem(base)

    for i, part in enumerate(parts):
        is_base = i == len(parts) - 1
        name = stem if is_base else part
        if (m := _PATH_ATTEMPT.match(name)) is not None:
            hints["attempt"] = int(m[1])
            # torchelastic --log-dir: <run>/attempt_<n>/<local_rank>/{stdout,stderr}.log
            if i + 1 < len(parts) - 1 and parts[i + 1].isdigit():
                hints["local_rank"] = int(parts[i + 1])
            continue
        if (m := _PATH_LOCAL_RANK.match(name)) is not None:
            hints["local_rank"] = int(m[1])
        elif (m := _PATH_RANK.match(name)) is not None:
            hints["rank"] = int(m[1])
        if (m := _PATH_SLURM.match(part)) is not None:
            hints["job_id"] = m[1]
            continue
        if (m := _PATH_POD.match(name)) is not None:
            hints["job_id"] = m["job"]
            if m["idx"].isdigit():
                hints["pod_index"] = int(m["idx"])
            hints["host"] = name
            continue
        if _PATH_HOST_DIR.match(name) is not None:
            hints["host"] = name
        elif name in hosts:
            hints["host"] = machine_name(name)
    return hints
