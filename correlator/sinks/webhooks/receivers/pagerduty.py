"""PagerDuty Events API v2 (POST /v2/enqueue): trigger on open and revision, resolve on close.

`dedup_key` is the incident id, so a revision updates the same alert and the close resolves it.
The routing key is an integration credential: it lives in the body, so bodies are never logged.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import SecretStr, field_validator

from correlator.sinks.webhooks.notification import Notification, redact_url
from correlator.sinks.webhooks.receivers.base import (
    OutboundRequest,
    Receiver,
    ReceiverConfig,
    clip,
    collateral_ranks,
    dumps,
    initiator_text,
    short_hash,
    summary_text,
    validate_http_url,
)

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
SUMMARY_LIMIT = 1024
DEDUP_KEY_LIMIT = 255

# rootrank severities -> the four PagerDuty knows.
SEVERITY = {"critical": "critical", "high": "error", "medium": "warning", "low": "info", "info": "info"}


class PagerDutyConfig(ReceiverConfig):
    kind: str = "pagerduty"
    routing_key: SecretStr
    url: str = EVENTS_URL

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return validate_http_url(value)

    @field_validator("routing_key")
    @classmethod
    def _check_key(cls, value: SecretStr) -> SecretStr:
        key = value.get_secret_value()
        if not key or len(key) > 128 or not key.isascii() or not key.isalnum():
            raise ValueError("routing_key must be 1..128 ASCII letters and digits")
        return value

    def identity(self) -> str:
        return f"{self.url}#{short_hash(self.routing_key.get_secret_value())}"

    def display_target(self) -> str:
        return f"{redact_url(self.url)} (routing key …{short_hash(self.routing_key.get_secret_value(), 6)})"


def event(notification: Notification, routing_key: str) -> dict[str, object]:
    inc = notification.incident
    dedup_key = clip(inc.incident_id, DEDUP_KEY_LIMIT)
    if notification.transition == "closed":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key}
    ini = inc.initiator
    details: dict[str, object] = {
        "job_id": inc.job_id,
        "incident_id": inc.incident_id,
        "revision": inc.revision,
        "transition": notification.transition,
        "initiator": initiator_text(inc),
        "first_line": ini.line,
        "rule": ini.rule,
        "confidence": inc.confidence,
        "confidence_reason": inc.confidence_reason,
        "collateral_ranks": collateral_ranks(inc),
        "collateral": [entry.model_dump(mode="json", by_alias=True) for entry in inc.collateral],
        "fix": inc.fix,
        "verify": inc.verify,
        "delivery_id": notification.delivery_id,
    }
    payload: dict[str, object] = {
        "summary": clip(summary_text(notification), SUMMARY_LIMIT),
        "source": ini.host or inc.job_id,
        "severity": SEVERITY.get(inc.severity, "error"),
        "timestamp": notification.event_time,
        "component": f"rank {ini.rank}" if ini.rank is not None else "unknown rank",
        "group": inc.job_id,
        "class": inc.class_,
        "custom_details": details,
    }
    body: dict[str, object] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key,
        "payload": payload,
        "client": "rootrank",
    }
    if notification.event_time is None:
        # PagerDuty rejects a null timestamp; without one it stamps the arrival time.
        del payload["timestamp"]
    if notification.link:
        body["client_url"] = notification.link
        body["links"] = [{"href": notification.link, "text": "Incident in Kibana"}]
    return body


class PagerDutyReceiver(Receiver[PagerDutyConfig]):
    kind: ClassVar[str] = "pagerduty"
    config_model: ClassVar[type[ReceiverConfig]] = PagerDutyConfig

    def render(self, notification: Notification) -> OutboundRequest:
        body = event(notification, self.config.routing_key.get_secret_value())
        return OutboundRequest(url=self.config.url, body=dumps(body))
