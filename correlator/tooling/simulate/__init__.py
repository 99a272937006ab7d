"""`rootrank simulate`: logs of a multi-rank job that fails in a known way, with the truth beside them.

The scenario model (one job, `world_size` ranks spread evenly over `hosts`):

1. start-up: every rank prints NCCL INFO init lines (`ncclCommInitRank ... rank R nranks N`, which
   tie host:pid to the rank and give the world size);
2. training chatter: per-step python-logging lines from every rank, tqdm bars from rank 0;
3. the failure: the initiating rank (or every rank, for deterministic data/checkpoint errors) prints
   the failure lines of the class, taken from the rule library's own `examples.match` so the
   simulator and the rules cannot drift apart;
4. collateral: ranks blocked in the collective hit the NCCL watchdog after its timeout (same SeqNum,
   same true time on every rank, so the lines are also the skew anchors), then each host's
   torchelastic agent tears its workers down (SIGTERM, ChildFailedError with a "Root Cause" that
   names whichever local rank died first - often a victim, as in real logs).

Per-host clock skew is applied to every timestamp a line carries (python logging, torch/glog
brackets, torchelastic agent, rsyslog); the truth records it. Lines without timestamps
(tracebacks, NCCL INFO, tqdm) are written where they happen in the file, as in real logs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from correlator.diagnosis.rules import RuleSet
from correlator.tooling.simulate.classes import DEMO_CLASS, DEMO_RANK
from correlator.tooling.simulate.examples import split_example
from correlator.tooling.simulate.lines import rfc3339, utc_datetime
from correlator.tooling.simulate.regex_sample import sample_matching
from correlator.tooling.simulate.rule_lookup import default_ruleset
from correlator.tooling.simulate.scenario import Scenario
from correlator.tooling.simulate.truth import (
    SimulateError,
    Truth,
    TruthInitiator,
    log_paths,
    logs_dir,
    read_truth,
)
from correlator.tooling.simulate.writing import FORMATS, write_logs

__all__ = [
    "DEMO_RANK",
    "FORMATS",
    "SimulateError",
    "Truth",
    "default_start",
    "log_paths",
    "logs_dir",
    "read_truth",
    "sample_matching",
    "simulate",
    "simulate_demo",
    "split_example",
]


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
    ruleset: RuleSet | None = None,
    demo: bool = False,
    start: datetime | None = None,
) -> Truth:
    """Write the logs of one simulated failing job into `out` and return (and write) its truth.

    noise_lines: training-chatter lines per rank before the failure (one per step).
    late_lines: lines (among those carrying a timestamp) that reach the file/forwarder 5-60 s late.
    demo: the bundled demo scenario's exact wording (Xid 79 "fallen off the bus").
    start: when the job started (default: 18:30 UTC yesterday). Year-less timestamps (glog, torch)
      are read as "the most recent such date", so a start in the recent past keeps every line's
      year unambiguous; pass a fixed start for byte-identical output across days.

    Layout (JOB = truth.job_id, e.g. sim-cuda-oom-3): out/JOB/<host>/train.log (+ out/JOB/<host>/kern.log)
    for plain, out/JOB/messages.jsonl for the JSON forwarders, out/JOB/rsyslog.log for rsyslog;
    out/truth.json beside the job's folder, so `rootrank diagnose out/JOB` reads logs only.
    """
    if fmt not in FORMATS:
        raise SimulateError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    rs = ruleset or default_ruleset()
    sc = Scenario(
        cls, world_size=world_size, hosts=hosts, seed=seed, skew_max_s=skew_max_s, noise_lines=noise_lines,
        late_lines=late_lines, initiator_rank=initiator_rank, ruleset=rs, demo=demo,
        start=start or default_start(),
    )
    sc.build()
    sc.make_late()
    out = Path(out)
    files = write_logs(sc, fmt, out)  # type: ignore[arg-type]
    init = sc.initiator
    initiator = (
        TruthInitiator(rank=None, all=True)
        if sc.mode == "all"
        else TruthInitiator(rank=None, unknown=True)
        if sc.mode == "victims"
        else TruthInitiator(rank=init.rank, host=init.host, local_rank=init.local_rank, pid=init.pid, gpu=init.gpu)
    )
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
            "rule": sc.rule.id if sc.rule is not None else None,
            "failure_lines": sc.failure_lines[:8],
            "failure_ts": rfc3339(utc_datetime(sc.failure_t)).replace("+00:00", "Z") if sc.failure_t is not None else None,
            "files": files,
        }
    )
    (out / "truth.json").write_text(json.dumps(truth.to_json_dict(), indent=2) + "\n", encoding="utf-8")
    return truth


def default_start(now: datetime | None = None) -> datetime:
    """18:30 UTC the day before `now`: recent, in the past, and the same for a whole day."""
    now = now or datetime.now(UTC)
    return (now - timedelta(days=1)).replace(hour=18, minute=30, second=0, microsecond=0)


def simulate_demo(out: Path, *, fmt: str = "plain", seed: int = 0, start: datetime | None = None) -> Truth:
    """The bundled demo: 64 ranks on 8 hosts, the GPU of rank 37 falls off the bus (Xid 79)."""
    return simulate(
        DEMO_CLASS, world_size=64, hosts=8, seed=seed, fmt=fmt, out=out, initiator_rank=DEMO_RANK, demo=True, start=start
    )

