"""The simulated logs on disk: plain files per host, an rsyslog file, or the JSON messages a forwarder sends."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, get_args

from correlator.tooling.simulate.job import Host
from correlator.tooling.simulate.lines import LogLine, render_line, rfc3339, utc_datetime
from correlator.tooling.simulate.scenario import Scenario

Format = Literal["plain", "fluentbit", "vector", "filebeat", "rsyslog"]
FORMATS: tuple[Format, ...] = get_args(Format)
# How plain logs are laid out: a file per host (`hosts`), the whole job in one file (`single`, as a Slurm
# job's output), or torchrun's `--log-dir` tree per host (`logdir`: a file per worker process and attempt,
# without the `[rankN]:` prefix, the agent's own lines and the kernel's beside it).
Layout = Literal["hosts", "single", "logdir"]
LAYOUTS: tuple[Layout, ...] = get_args(Layout)
_RANK_PREFIX = re.compile(r"\[rank\d+\]: ?")
_STREAM = "stderr"  # torchrun's workers and its agent write everything (logging, NCCL, glog, tracebacks) there


def _pod(job_id: str, host: Host) -> str:
    return f"{job_id}-worker-{host.index}"


def _message(fmt: Format, sc: Scenario, line: LogLine, text: str, read_t: float, offset: int) -> dict[str, Any]:
    host = next(h for h in sc.hosts if h.name == line.host)
    local_read = read_t + host.skew
    pod = _pod(sc.job_id, host)
    container_file = f"/var/log/pods/training_{pod}_5f0c2a1e-{host.index:04d}/pytorch/0.log"
    kern = line.style == "kern"
    labels = {
        "training.kubeflow.org/job-name": sc.job_id,
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": str(host.index),
    }
    if fmt == "fluentbit":
        if kern:
            # tail of the node's kern.log, with the node name added by a record_modifier filter
            return {"@timestamp": round(local_read, 6), "log": text, "file": "/var/log/kern.log", "hostname": host.name}
        return {
            "@timestamp": round(local_read, 6),
            "time": rfc3339(utc_datetime(local_read)).replace("+00:00", "Z"),
            "stream": _STREAM,
            "log": text,
            "kubernetes": {
                "pod_name": pod,
                "namespace_name": "training",
                "host": host.name,
                "container_name": "pytorch",
                "labels": labels,
            },
        }
    if fmt == "vector":
        ts = utc_datetime(local_read).strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc_datetime(local_read).microsecond:06d}Z"
        if kern:
            return {"message": text, "timestamp": ts, "host": host.name, "file": "/var/log/kern.log", "source_type": "file"}
        return {
            "message": text,
            "timestamp": ts,
            "stream": _STREAM,
            "source_type": "kubernetes_logs",
            "file": container_file,
            "kubernetes": {
                "pod_name": pod,
                "pod_namespace": "training",
                "pod_node_name": host.name,
                "container_name": "pytorch",
                "pod_labels": labels,
            },
        }
    if fmt == "filebeat":
        d = utc_datetime(local_read)
        path = "/var/log/kern.log" if kern else f"/var/log/training/{sc.job_id}/{host.name}.log"
        return {
            "@timestamp": d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z",
            "message": text,
            "host": {"name": host.name},
            "log": {"file": {"path": path}, "offset": offset},
            "input": {"type": "filestream"},
            "agent": {"type": "filebeat", "version": "8.15.0"},
            "ecs": {"version": "8.0.0"},
        }
    raise AssertionError(fmt)


def _plain_file(line: LogLine, layout: Layout, attempts: dict[tuple[int, int], int]) -> str:
    """The file (relative to the job's folder) a plain line is written to, in `layout`."""
    if layout == "single":
        return "train.log"
    if line.style == "kern":
        return f"{line.host}/kern.log"
    if layout == "hosts":
        return f"{line.host}/train.log"
    proc = line.proc
    if proc is None or line.style.startswith("agent"):
        return f"{line.host}/agent.log"  # torchrun's own output: its console, not a worker's file
    # torchrun names a worker's folder by attempt and local rank; a restarted worker has a new pid.
    attempt = attempts.setdefault((proc.rank, proc.pid), sum(1 for r, _ in attempts if r == proc.rank))
    return f"{line.host}/attempt_{attempt}/{proc.local_rank}/stderr.log"


def write_logs(sc: Scenario, fmt: Format, root: Path, layout: Layout = "hosts") -> list[str]:
    """Write the logs under root/<job id>/; returns their paths relative to root.

    The folder is named after the job so that `rootrank diagnose root/<job id>` names the job right.
    `layout` (plain only): see LAYOUTS.
    """
    job_dir = sc.job_id
    out = root / job_dir
    out.mkdir(parents=True, exist_ok=True)
    skew = {h.name: h.skew for h in sc.hosts}
    # File order = when the line reached the file (late lines were buffered); ties keep emit order.
    ordered = sorted(enumerate(sc.lines), key=lambda il: (il[1].t + il[1].delay, il[0]))
    files: list[str] = []
    if fmt == "plain":
        per_file: dict[str, list[str]] = {}
        attempts: dict[tuple[int, int], int] = {}
        for _, line in ordered:
            # A folder per host names the host for every file in it (the kernel log has no rank prefixes).
            name = _plain_file(line, layout, attempts)
            text = render_line(line, skew[line.host])
            if layout == "logdir" and line.style.startswith("rank"):
                text = _RANK_PREFIX.sub("", text, count=1)  # torchrun's files hold the worker's output as written
            per_file.setdefault(name, []).append(text)
        for name in sorted(per_file):
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text("\n".join(per_file[name]) + "\n", encoding="utf-8")
            files.append(f"{job_dir}/{name}")
        return files
    if fmt == "rsyslog":
        rows: list[tuple[float, int, str]] = []
        for i, line in ordered:
            read_t = line.t + line.delay + 0.002
            local = utc_datetime(read_t + skew[line.host])
            text = render_line(line, skew[line.host])
            if line.style == "kern":
                rows.append((read_t + 0.05, i, f"{rfc3339(local)} {line.host} kernel: {line.body}"))
            else:
                rows.append((read_t + 0.05, i, f"{rfc3339(local)} {line.host} train: {text}"))
        rows.sort()
        (out / "rsyslog.log").write_text("\n".join(r[2] for r in rows) + "\n", encoding="utf-8")
        return [f"{job_dir}/rsyslog.log"]
    messages: list[tuple[float, int, dict[str, Any]]] = []
    offsets: dict[str, int] = {}
    for i, line in ordered:
        read_t = line.t + line.delay + sc.rng.uniform(0.01, 0.25)
        text = render_line(line, skew[line.host])
        key = f"{line.host}:{line.style == 'kern'}"
        offset = offsets.get(key, 0)
        offsets[key] = offset + len(text.encode("utf-8")) + 1
        arrival = read_t + sc.rng.uniform(0.005, 0.05)
        messages.append((arrival, i, _message(fmt, sc, line, text, read_t, offset)))
    messages.sort(key=lambda m: (m[0], m[1]))
    with (out / "messages.jsonl").open("w", encoding="utf-8") as fh:
        for _, _, msg in messages:
            fh.write(json.dumps(msg, ensure_ascii=False, separators=(",", ":")) + "\n")
    return [f"{job_dir}/messages.jsonl"]
