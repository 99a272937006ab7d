"""Incidents and signals built directly from the models, for the Elasticsearch tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from correlator.diagnosis.models import CollateralEntry, Evidence, Incident, Initiator, Signal

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

# (class, rule, initiator line, fix) of a few realistic failures
FAILURES = {
    "cuda_oom": ("cuda-oom-pytorch",
                 ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity "
                  "of 79.14 GiB"),
                 "Reduce the per-GPU micro-batch size or sequence length."),
    "gpu_hardware_error": ("gpu-xid-79",
                           "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
                           "Drain the node and have the GPU reseated or replaced."),
    "network_fabric_error": ("ib-completion-error",
                             "NET/IB : Got completion from peer 10.0.0.7 with error 12, opcode 0, len 0, vendor err 129",
                             "Check the InfiniBand port counters and cabling of the host."),
    "disk_full": ("enospc", "OSError: [Errno 28] No space left on device: '/ckpt/step_1200'",
                  "Free space on the checkpoint volume or raise its quota."),
}


def make_incident(
    n: int,
    *,
    job: str = "job-a",
    cls: str = "cuda_oom",
    host: str = "node-01",
    rank: int = 11,
    gpu: str | None = "5",
    revision: int = 1,
    minutes: float | None = None,
    collateral_hosts: tuple[str, ...] = ("node-02", "node-03"),
    status: str = "open",
) -> Incident:
    rule, line, fix = FAILURES[cls]
    ts = T0 + timedelta(minutes=n if minutes is None else minutes)
    return Incident.model_validate({
        "incident_id": f"inc-{job}-{n:04d}",
        "job_id": job,
        "class": cls,
        "title": f"{cls.replace('_', ' ')} on rank {rank}",
        "severity": "critical" if cls != "disk_full" else "high",
        "confidence": 0.9,
        "confidence_reason": "earliest unexplained cause-class signal",
        "initiator": Initiator(rank=rank, local_rank=rank % 8, host=host, pid=4000 + rank, gpu=gpu,
                               ts=ts.isoformat().replace("+00:00", "Z"), rule=rule, line=line),
        "collateral": [CollateralEntry.model_validate({"class": "nccl_timeout", "ranks": [0, 1, 2, 3],
                                                       "hosts": list(collateral_hosts), "count": 4})],
        "evidence": [Evidence(rank=rank, host=host, ts=ts.isoformat(), rule=rule, line=line),
                     Evidence(rank=0, host=collateral_hosts[0] if collateral_hosts else host, ts=None,
                              rule="nccl-watchdog-timeout",
                              line="[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42)")],
        "fix": [fix],
        "verify": ["The job passes the failing step."],
        "references": ["https://example.org/runbook"],
        "revision": revision,
        "status": status,
        "window_start": ts.isoformat(),
        "window_end": (ts + timedelta(seconds=20)).isoformat(),
        "rule_set_version": "rs-test-1",
        "rule_versions": {rule: 2, "nccl-watchdog-timeout": 1},
        "world_size": 16,
        "labels": {"team": "llm", "training.kubeflow.org/job-name": job},
    })


def make_signal(n: int, *, job: str = "job-a", kind: str = "match") -> Signal:
    return Signal.model_validate({
        "job_id": job, "rule_id": "cuda-oom-pytorch", "rule_version": 2, "kind": kind, "class": "cuda_oom",
        "role": "cause", "severity": "critical", "host": f"node-{n % 3:02d}", "rank": n, "local_rank": n % 8,
        "pid": 100 + n, "gpu": str(n % 8), "ts": T0 + timedelta(seconds=n),
        "received_ts": T0 + timedelta(seconds=n, milliseconds=5),
        "source": "fluentbit", "file": f"/logs/{job}/rank{n}.log", "order": n,
        "line": f"[rank{n}]: torch.OutOfMemoryError: CUDA out of memory (line {n})",
        "fields": {"gpu": n % 8, "tried": "2.00 GiB"},
    })
