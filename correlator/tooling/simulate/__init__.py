"""`rootrank simulate`: logs of a multi-rank job that fails in a known way, with the truth beside them.

The scenario model (one job, `world_size` ranks spread evenly over `hosts`):

1. start-up: every rank prints NCCL INFO init lines (`ncclCommInitRank ... rank R nranks N`, which
   tie host:pid to the rank and give the world size) and, on torch >= 2.3, ProcessGroupNCCL's
   initialization options per process group;
2. training: per-step python-logging progress lines from every rank;
3. the failure: the class's story (stories_compute.py, stories_data.py) prints what the failing
   library prints - a traceback ending in the allocator's OOM message, the kernel's Xid or OOM-killer
   lines, NCCL WARN lines, a DataLoader worker's re-raised exception, every rank's torch.load error -
   written from the upstream message formats, with wording that varies by release and seed. The rule
   library is never read for it, so `simulate -> diagnose` tests the rules against independent lines;
4. consequences: ranks blocked in the collective hit the NCCL watchdog after its timeout (same SeqNum,
   same true time on every rank, so the lines are also the skew anchors; the PG prefix, counters and
   `Some NCCL operations have failed or timed out` as the torch release prints them), then each host's
   torchelastic agent tears its workers down (SIGTERM, `failed (exitcode: N) local_rank: K (pid: P)`,
   ChildFailedError with a "Root Cause" that names whichever local rank died first - often a victim).

Per-host clock skew is applied to every timestamp a line carries (python logging, torch/glog
brackets, torchelastic agent, kernel); the truth records it. Lines without timestamps (tracebacks,
NCCL INFO) are written where they happen in the file, as in real logs. By default the job ends just
now, so `rootrank incidents --since 1h` finds it; `start=` fixes the start for reproducible bytes.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from correlator.tooling.simulate.classes import DEMO_CLASS, DEMO_RANK, taxonomy
from correlator.tooling.simulate.lines import rfc3339, utc_datetime
from correlator.tooling.simulate.scenario import Options, Scenario
from correlator.tooling.simulate.story import STORIES
from correlator.tooling.simulate.truth import (
    SimulateError,
    Truth,
    TruthInitiator,
    log_paths,
    logs_dir,
    read_truth,
)
from correlator.tooling.simulate.writing import FORMATS, LAYOUTS, write_logs

__all__ = [
    "DEMO_RANK",
    "FORMATS",
    "LAYOUTS",
    "STORIES",
    "Options",
    "SimulateError",
    "Truth",
    "classes",
    "log_paths",
    "logs_dir",
    "read_truth",
    "simulate",
    "simulate_demo",
]


def classes() -> tuple[str, ...]:
    """The failure classes the simulator can play (every class of the taxonomy)."""
    return taxonomy()


def simulate(
    cls: str,
    *,
    world_size: int = 64,
    hosts: int = 8,
    seed: int = 0,
    skew_max_s: float = 3.0,
    fmt: str = "plain",
    noise_lines: int = 24,
    late_lines: int = 0,
    out: Path,
    initiator_rank: int | None = None,
    demo: bool = False,
    start: datetime | None = None,
    options: Options | None = None,
    ruleset: object | None = None,
    layout: str = "hosts",
) -> Truth:
    """Write the logs of one simulated failing job into `out` and return (and write) its truth.

    noise_lines: training steps (one progress line per rank each) before the failure.
    late_lines: lines (among those carrying a timestamp) that reach the file/forwarder 5-60 s late.
    demo: the bundled demo scenario's exact wording (Xid 79 "fallen off the bus").
    start: when the job started. Default: the job is placed so that its last line is written just now
      (a red herring an hour after the job died is the last line then). Pass a fixed start for
      byte-identical output across runs.
    options: the scale suite's variations (tensor-parallel groups, a restart, red herrings, a late cause).
    ruleset: accepted for callers of the earlier API; the simulator does not read rules.
    layout: plain logs only: `hosts` (a file per host), `single` (the whole job in one file) or `logdir`
      (torchrun's `--log-dir` tree per host: HOST/attempt_N/LOCAL_RANK/stderr.log without rank prefixes,
      HOST/agent.log, HOST/kern.log).

    Layout (JOB = truth.job_id, e.g. sim-cuda-oom-3): out/JOB/<host>/train.log (+ out/JOB/<host>/kern.log)
    for plain, out/JOB/messages.jsonl for the JSON forwarders, out/JOB/rsyslog.log for rsyslog;
    out/truth.json beside the job's folder, so `rootrank diagnose out/JOB` reads logs only.
    """
    del ruleset
    if fmt not in FORMATS:
        raise SimulateError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    if layout not in LAYOUTS or (layout != "hosts" and fmt != "plain"):
        raise SimulateError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}, and only `hosts` for --format {fmt}")
    sc = Scenario(
        cls, world_size=world_size, hosts=hosts, seed=seed, skew_max_s=skew_max_s, noise_lines=noise_lines,
        late_lines=late_lines, initiator_rank=initiator_rank, classes=taxonomy(), demo=demo,
        start=start or datetime(2026, 1, 1, tzinfo=UTC), options=options,
    )
    sc.build()
    sc.finish_herrings()
    if start is None:
        # The last line (skew and buffering included) lands one second before now.
        skew = {h.name: h.skew for h in sc.hosts}
        last = max(ln.t + ln.delay + skew[ln.host] for ln in sc.lines)
        sc.shift(time.time() - 1.0 - last)
    sc.make_late()
    out = Path(out)
    files = write_logs(sc, fmt, out, layout)
    init = sc.initiator
    if sc.mode in ("all", "launch_all", "serve_all"):
        initiator = TruthInitiator(rank=None, all=True)
    elif sc.mode == "victims":
        initiator = TruthInitiator(rank=None, unknown=True)
    elif sc.host_level:
        initiator = TruthInitiator(rank=None, host=sc.hosts[0].name, host_only=True)
    else:
        initiator = TruthInitiator(rank=init.rank, host=init.host, local_rank=init.local_rank, pid=init.pid, gpu=init.gpu)
    before = sc.story.before or (None if sc.options.restart is None else "restart")
    truth = Truth.model_validate(
        {
            "class": cls,
            "initiator": initiator,
            "world_size": world_size,
            "job_id": sc.job_id,
            "seed": seed,
            "skew_s": {h.name: h.skew for h in sc.hosts},
            "hosts": [h.name for h in sc.hosts],
            "format": fmt,
            "mode": sc.mode,
            "story": sc.variant,
            "accepted": list(sc.story.accepted),
            "software": {"python": sc.env.python, "torch": ".".join(map(str, sc.env.torch[:2])), "nccl": sc.env.nccl},
            "attempt": 1 if before in ("disk_full", "restart") else 0,
            "restart_class": "disk_full" if before == "disk_full" else sc.options.restart,
            "failure_lines": [ln for ln in sc.failure_lines if ln][:8],
            "failure_ts": rfc3339(utc_datetime(sc.failure_t)).replace("+00:00", "Z") if sc.failure_t is not None else None,
            "files": files,
        }
    )
    (out / "truth.json").write_text(json.dumps(truth.to_json_dict(), indent=2) + "\n", encoding="utf-8")
    return truth


def simulate_demo(out: Path, *, fmt: str = "plain", seed: int = 0, start: datetime | None = None) -> Truth:
    """The bundled demo: 64 ranks on 8 hosts, the GPU of rank 37 falls off the bus (Xid 79)."""
    return simulate(
        DEMO_CLASS, world_size=64, hosts=8, seed=seed, fmt=fmt, out=out, initiator_rank=DEMO_RANK, demo=True, start=start
    )
