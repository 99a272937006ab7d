"""What the simulated job really did (truth.json beside its logs), and where its logs are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class SimulateError(ValueError):
    """A scenario that cannot be built (unknown class, bad layout); the message says why."""


class TruthInitiator(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int | None
    host: str | None = None
    local_rank: int | None = None
    pid: int | None = None
    gpu: str | None = None
    all: bool = Field(default=False, description="every rank failed the same way (a deterministic data/config error)")
    unknown: bool = Field(default=False, description="only consequences were logged; no line shows who started it")
    host_only: bool = Field(default=False, description="a host's launcher failed before any rank existed")


class Truth(BaseModel):
    """What the simulated job really did; written as truth.json next to the logs."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    class_: str = Field(alias="class")
    initiator: TruthInitiator
    world_size: int
    job_id: str
    seed: int
    skew_s: dict[str, float]
    hosts: list[str]
    format: str
    mode: str
    story: str = Field(default="", description="which variant of the class's story the logs tell")
    accepted: list[str] = Field(default_factory=list,
                                description="classes a diagnosis may name instead (the failure's own cause, logged too)")
    software: dict[str, str] = Field(default_factory=dict, description="the job's Python, torch and NCCL releases")
    attempt: int = Field(default=0, description="the torchelastic attempt (or requeued run) whose failure ended the job")
    restart_class: str | None = Field(default=None, description="what failed in attempt 0, when the job restarted")
    failure_lines: list[str] = Field(default_factory=list)
    failure_ts: str | None = Field(default=None, description="true UTC time of the first failure line")
    files: list[str] = Field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)



def read_truth(folder: Path) -> Truth:
    return Truth.model_validate_json((Path(folder) / "truth.json").read_text(encoding="utf-8"))


def logs_dir(folder: Path, truth: Truth) -> Path:
    """The folder holding the simulated job's logs (what `rootrank diagnose` is pointed at)."""
    return Path(folder) / truth.job_id


def log_paths(folder: Path, truth: Truth) -> list[str]:
    return [str(Path(folder) / name) for name in truth.files]
