"""Retry budget of a webhook delivery (kept apart from delivery.py so config loading stays light)."""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(default=12, ge=1)
    initial_backoff_s: float = Field(default=1.0, gt=0)
    max_backoff_s: float = Field(default=60.0, gt=0)
    budget_s: float = Field(default=600.0, gt=0, description="give up (dead-letter) after this long")
    timeout_s: float = Field(default=10.0, gt=0, description="one attempt, connect to last byte")
    max_retry_after_s: float = Field(default=300.0, ge=0, description="a longer Retry-After is dead-lettered")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Wait after failed attempt number `attempt` (1-based)."""
        ceiling = min(self.max_backoff_s, self.initial_backoff_s * (2 ** (attempt - 1)))
        return float(ceiling / 2 + rng.uniform(0, ceiling / 2))
