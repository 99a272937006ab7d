"""The canonical event every decoder produces."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

MAX_LINE_CHARS = 16_384


class LogEvent(BaseModel):
    """One log line with the identity of the process that wrote it.

    `line` is the text with the identity prefixes that were parsed off removed; `raw_line` keeps
    the original only when it differs (for evidence display).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    gpu: str | None = None
    ts: datetime | None = None
    received_ts: datetime | None = None
    source: str = "plain"
    stream: str | None = None
    file: str | None = None
    offset: int | None = Field(default=None, description="position of the line in its source (line number or byte offset)")
    line: str
    raw_line: str | None = Field(default=None, description="the line as received, when prefixes were removed")
    truncated: bool = False
    attempt: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
