"""Signals (matched lines and progress facts) and incidents: the engine's input and output."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

Role = Literal["cause", "collateral", "either"]
Severity = Literal["critical", "high", "medium", "low", "info"]
SEVERITIES: tuple[Severity, ...] = ("info", "low", "medium", "high", "critical")  # the least severe first
# The one order of severities: the engine (what explains, what is a warning, which incident comes first,
# which cause the state keeps at its bound), the webhooks' minimum severity and `diagnose --fail-on`.
SEVERITY_RANK: dict[str, int] = {severity: rank for rank, severity in enumerate(SEVERITIES)}

MAX_EVIDENCE_LINE = 2_000


class Signal(BaseModel):
    """A line that hit a rule (kind=match) or a fact the engine needs (kind=fact: progress, world size).

    `order` is the position of the line in its source; it orders lines that carry no timestamp.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    job_id: str
    rule_id: str
    rule_version: int = 1
    kind: Literal["match", "fact"] = "match"
    class_: str | None = Field(default=None, alias="class")
    role: Role = "either"
    severity: Severity = "medium"
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    gpu: str | None = None
    ts: datetime | None = None
    received_ts: datetime | None = None
    source: str | None = None
    file: str | None = None
    order: int = 0
    attempt: int | None = None
    line: str = ""
    fields: dict[str, str | int | float] = Field(default_factory=dict)

    # JSON has no NaN or infinity (orjson writes null, which reads back as no number at all): a non-finite
    # value (a loss of nan, an infinite grad norm) travels as the string pydantic names it, and reads back as
    # the float. A captured string never reads so: the extractor makes "nan" and "inf" floats.
    @field_serializer("fields", when_used="json")
    def _fields_json(self, fields: dict[str, str | int | float]) -> dict[str, str | int | float]:
        if all(not isinstance(v, float) or math.isfinite(v) for v in fields.values()):
            return fields
        return {k: _NON_FINITE_NAME.get(str(v), v) if isinstance(v, float) else v for k, v in fields.items()}

    @field_validator("fields", mode="before")
    @classmethod
    def _fields_read(cls, fields: object) -> object:
        if isinstance(fields, dict) and any(isinstance(v, str) and v in _NON_FINITE for v in fields.values()):
            return {k: _NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in fields.items()}
        return fields


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_NON_FINITE_NAME = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


class Initiator(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    gpu: str | None = None
    ts: str | None = None
    rule: str
    line: str


class CollateralEntry(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, defer_build=True)

    class_: str = Field(alias="class")
    ranks: list[int] = Field(default_factory=list)
    hosts: list[str] = Field(default_factory=list)
    count: int = 0


class Evidence(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    rank: int | None = None
    host: str | None = None
    ts: str | None = None
    rule: str
    line: str


class Incident(BaseModel):
    """The JSON contract of `rootrank diagnose --format json` and of the incidents topic/index."""

    # Built on first use (defer_build), as the incident models: a diagnosis that finds nothing never does.
    model_config = ConfigDict(frozen=True, populate_by_name=True, defer_build=True)

    incident_id: str
    job_id: str
    class_: str = Field(alias="class")
    title: str
    severity: Severity
    confidence: float
    confidence_reason: str
    initiator: Initiator
    collateral: list[CollateralEntry] = Field(default_factory=list)
    evidence: list[Evidence] = Field(default_factory=list)
    fix: list[str] = Field(default_factory=list)
    verify: list[str] = Field(default_factory=list)
    references: list[str] = Field(default_factory=list)
    # Beyond the diagnose contract: what the streaming side and the sinks need.
    revision: int = 1
    status: Literal["open", "closed"] = "open"
    window_start: str | None = None
    window_end: str | None = None
    rule_set_version: str = ""
    rule_versions: dict[str, int] = Field(default_factory=dict)
    world_size: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    attempt: int = 0
    recovered: bool = False
    clock: str = ""
    dropped: dict[str, int] = Field(default_factory=dict)

    def to_json_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)
