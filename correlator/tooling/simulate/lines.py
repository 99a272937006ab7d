"""A log line of the simulated job and how it is written: rank prefixes, NCCL, glog, python logging,
kernel."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from correlator.tooling.simulate.job import Process

# How a line is rendered; the timestamp styles use the host's (skewed) clock.
Style = Literal["rank", "rank_pylog", "rank_glog", "rank_old_glog", "rank_ds", "nccl", "nccl_raw", "agent_glog",
                "agent_py", "agent", "kern", "vllm", "trtllm", "raw"]


@dataclass
class LogLine:
    t: float  # true time (epoch seconds) the line was written
    host: str
    style: Style
    body: str
    proc: Process | None = None
    level: str = "I"  # glog/pylog level
    srcloc: str = ""  # glog source location
    thread: int = 0
    delay: float = 0.0  # extra seconds before the line reaches the file/forwarder (late lines)
    cause: bool = False  # a line of the initiating failure (the scale suite may flush it late)

    @property
    def has_ts(self) -> bool:
        return self.style in ("rank_pylog", "rank_glog", "rank_ds", "agent_glog", "agent_py", "kern", "vllm", "trtllm")


_PYLOG_LEVEL = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}


def utc_datetime(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def render_line(line: LogLine, skew: float) -> str:
    local = utc_datetime(line.t + skew)
    p = line.proc
    if line.style == "rank":
        assert p is not None
        return f"[rank{p.rank}]: {line.body}" if line.body else f"[rank{p.rank}]:"
    if line.style == "rank_pylog":
        assert p is not None
        ts = local.strftime("%Y-%m-%d %H:%M:%S") + f",{local.microsecond // 1000:03d}"
        return f"[rank{p.rank}]:{ts} - {_PYLOG_LEVEL.get(line.level, 'INFO')} - {line.srcloc or 'train'} - {line.body}"
    if line.style == "rank_glog":
        assert p is not None
        # torch >= 2.4 c10 logging: month without padding, nanoseconds, no thread id.
        frac = f"{local.microsecond:06d}{(p.pid * 7 + int(line.t * 1000)) % 1000:03d}"
        return f"[rank{p.rank}]:[{line.level}{local.month}{local.day:02d} {local:%H:%M:%S}.{frac} {line.srcloc}] {line.body}"
    if line.style == "rank_old_glog":
        # torch <= 2.2: no time in the c10 header
        assert p is not None
        return f"[rank{p.rank}]:[{line.level} {line.srcloc}] {line.body}"
    if line.style == "rank_ds":
        # DeepSpeed's logger: [2026-03-14 09:26:53,123] [INFO] [engine.py:3121:load_checkpoint] message
        assert p is not None
        ts = local.strftime("%Y-%m-%d %H:%M:%S") + f",{local.microsecond // 1000:03d}"
        return f"[rank{p.rank}]:[{ts}] [{_PYLOG_LEVEL.get(line.level, 'INFO')}] [{line.srcloc}] {line.body}"
    if line.style == "vllm":
        # vLLM worker: (VllmWorker rank=5 pid=41234) ERROR 03-14 09:26:53 [multiproc_executor.py:527] message
        who = f"(VllmWorker rank={p.rank} pid={p.pid}) " if p is not None else ""
        level = _PYLOG_LEVEL.get(line.level, "INFO")
        return f"{who}{level} {local:%m-%d %H:%M:%S} [{line.srcloc}] {line.body}"
    if line.style == "trtllm":
        assert p is not None
        return f"[{local:%m/%d/%Y-%H:%M:%S}] [TRT-LLM] [RANK {p.rank}] [{line.level}] {line.body}"
    if line.style == "raw":
        return line.body
    if line.style == "nccl":
        assert p is not None
        return f"{p.host}:{p.pid}:{line.thread or p.pid} [{p.local_rank}] NCCL INFO {line.body}"
    if line.style == "nccl_raw":
        assert p is not None
        return f"{p.host}:{p.pid}:{line.thread or p.pid} [{p.local_rank}] {line.body}"
    if line.style == "agent_glog":
        return f"{line.level}{local:%m%d %H:%M:%S}.{local.microsecond:06d} {line.thread} {line.srcloc}] {line.body}"
    if line.style == "agent_py":
        # torchelastic before 2.3: python logging with its own header
        ts = local.strftime("%Y-%m-%d %H:%M:%S") + f",{local.microsecond // 1000:03d}"
        return f"[{ts}] {line.srcloc}: [{_PYLOG_LEVEL.get(line.level, 'INFO')}] {line.body}"
    if line.style == "agent":
        return line.body
    if line.style == "kern":
        return f"{rfc3339(local)} {line.host} kernel: {line.body}"
    raise AssertionError(line.style)


def rfc3339(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond:06d}+00:00"

