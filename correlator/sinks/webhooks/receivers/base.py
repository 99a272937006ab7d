"""What every receiver kind shares: its config model, the request it renders, text helpers."""

from __future__ import annotations

import hashlib
import urllib.parse
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, field_validator

from correlator.diagnosis.models import Incident
from correlator.sinks.webhooks.notification import Notification, redact_url

MAX_URL_LENGTH = 2048


def validate_http_url(url: str) -> str:
    """http(s) URL with a host; no whitespace or control characters (they would split headers)."""
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"url longer than {MAX_URL_LENGTH} characters")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise ValueError("url contains whitespace or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"url is not valid: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("url scheme must be http or https")
    if not parts.hostname:
        raise ValueError("url has no host")
    return url


class ReceiverConfig(BaseModel):
    """Base of every receiver kind's config: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def identity(self) -> str:
        """What makes two registrations the same destination (used for upserts and progress)."""
        raise NotImplementedError

    def display_target(self) -> str:
        """The destination, safe to print and log."""
        raise NotImplementedError


class UrlReceiverConfig(ReceiverConfig):
    url: str

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return validate_http_url(value)

    def identity(self) -> str:
        return self.url

    def display_target(self) -> str:
        return redact_url(self.url)


@dataclass
class OutboundRequest:
    """A rendered notification: POSTed as is on every attempt.

    `headers` may hold credentials; `signing_key` (raw HMAC key bytes) asks the delivery to add
    Standard Webhooks signature headers per attempt. Neither is ever logged.
    """

    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    signing_key: bytes | None = None


ConfigT = TypeVar("ConfigT", bound=ReceiverConfig)


class Receiver(ABC, Generic[ConfigT]):
    kind: ClassVar[str]
    config_model: ClassVar[type[ReceiverConfig]]

    def __init__(self, name: str, config: ConfigT) -> None:
        self.name = name
        self.config = config

    @abstractmethod
    def render(self, notification: Notification) -> OutboundRequest: ...

    def display_target(self) -> str:
        return self.config.display_target()


def dumps(value: Any) -> bytes:
    """Compact JSON, keys in insertion order: the exact bytes the exact-body tests pin."""
    return orjson.dumps(value)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def short_hash(text: str, length: int = 16) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def collateral_ranks(incident: Incident) -> int:
    """Distinct ranks hit as collateral (falls back to the line counts when ranks are unknown)."""
    ranks: set[int] = set()
    unranked = 0
    for entry in incident.collateral:
        if entry.ranks:
            ranks.update(entry.ranks)
        else:
            unranked += entry.count
    return len(ranks) + unranked


def initiator_text(incident: Incident) -> str:
    ini = incident.initiator
    parts: list[str] = []
    if ini.rank is not None:
        parts.append(f"rank {ini.rank}")
    if ini.host:
        parts.append(f"host {ini.host}")
    if ini.local_rank is not None:
        parts.append(f"local rank {ini.local_rank}")
    if ini.gpu:
        parts.append(f"GPU {ini.gpu}")
    if ini.pid is not None:
        parts.append(f"pid {ini.pid}")
    return ", ".join(parts) if parts else "unknown rank"


def summary_text(notification: Notification) -> str:
    """One line: what happened, where, to which job."""
    inc = notification.incident
    prefix = {"opened": "", "revised": "[revised] ", "closed": "[resolved] "}[notification.transition]
    return f"{prefix}{inc.title} — {initiator_text(inc)} — job {inc.job_id}"
