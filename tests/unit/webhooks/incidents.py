"""Incidents built directly from correlator.diagnosis.models, as the correlator would publish them."""

from __future__ import annotations

from typing import Any

from correlator.diagnosis.models import CollateralEntry, Evidence, Incident, Initiator


def make_incident(
    job_id: str = "llm-pretrain-7",
    *,
    incident_id: str | None = None,
    world_size: int = 256,
    initiator_rank: int = 11,
    revision: int = 1,
    status: str = "open",
    severity: str = "critical",
    class_: str = "cuda_oom",
    labels: dict[str, str] | None = None,
    **overrides: Any,
) -> Incident:
    """A 256-rank job where rank 11 ran out of GPU memory and every other rank hit the NCCL watchdog."""
    collateral_ranks = [r for r in range(world_size) if r != initiator_rank]
    fields: dict[str, Any] = {
        "incident_id": incident_id or f"inc-{job_id}-0001",
        "job_id": job_id,
        "class": class_,
        "title": f"CUDA out of memory on rank {initiator_rank}",
        "severity": severity,
        "confidence": 0.93,
        "confidence_reason": "earliest unexplained cause; 255 ranks' timeouts explained by it",
        "initiator": Initiator(
            rank=initiator_rank,
            local_rank=3,
            host="gpu-node-02",
            pid=48211,
            gpu="3",
            ts="2025-03-01T10:15:02.118000Z",
            rule="cuda.oom",
            line="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB <GPU 3>",
        ),
        "collateral": [
            CollateralEntry(
                class_="nccl_timeout",
                ranks=collateral_ranks,
                hosts=[f"gpu-node-{h:02d}" for h in range(world_size // 8)],
                count=len(collateral_ranks),
            )
        ],
        "evidence": [
            Evidence(rank=initiator_rank, host="gpu-node-02", ts="2025-03-01T10:15:02.118000Z", rule="cuda.oom",
                     line="torch.OutOfMemoryError: CUDA out of memory."),
        ],
        "fix": ["Lower the per-GPU micro-batch size", "Enable activation checkpointing"],
        "verify": ["torch.cuda.max_memory_allocated() stays below 90% of the GPU"],
        "references": ["https://pytorch.org/docs/stable/notes/cuda.html#memory-management"],
        "revision": revision,
        "status": status,
        "window_start": "2025-03-01T10:15:02.118000Z",
        "window_end": "2025-03-01T10:25:40.000000Z",
        "rule_set_version": "rs-1",
        "rule_versions": {"cuda.oom": 1},
        "world_size": world_size,
        "labels": labels if labels is not None else {"team": "ml-infra"},
    }
    fields.update(overrides)
    return Incident.model_validate(fields)
