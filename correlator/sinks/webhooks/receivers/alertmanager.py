"""The Alertmanager webhook payload (version "4"), for receivers that already speak it.

One incident = one alert group with one alert: `status` firing on open/revision, resolved on
close; `fingerprint` derives from the incident id so every revision updates the same alert.
Label names follow Prometheus rules ([a-zA-Z_][a-zA-Z0-9_]*): incident labels are sanitised.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import SecretStr

from correlator.sinks.webhooks.notification import Notification
from correlator.sinks.webhooks.receivers.base import (
    OutboundRequest,
    Receiver,
    ReceiverConfig,
    UrlReceiverConfig,
    collateral_ranks,
    dumps,
    initiator_text,
    short_hash,
    summary_text,
)

ZERO_TIME = "0001-01-01T00:00:00Z"
ALERT_NAME = "RootrankIncident"
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]")


def label_name(key: str) -> str:
    name = _LABEL_BAD.sub("_", key)
    if not name or name[0].isdigit():
        name = "_" + name
    return name


class AlertmanagerConfig(UrlReceiverConfig):
    kind: str = "alertmanager"
    receiver_name: str = "rootrank"
    external_url: str = ""
    bearer_token: SecretStr | None = None


def payload(notification: Notification, receiver_name: str, external_url: str) -> dict[str, object]:
    inc = notification.incident
    ini = inc.initiator
    status = "resolved" if notification.transition == "closed" else "firing"
    labels: dict[str, str] = {}
    # Incident labels first: the fixed ones below win on a name clash.
    for key, value in sorted(inc.labels.items()):
        labels[label_name(key)] = value
    labels.update(
        {
            "alertname": ALERT_NAME,
            "job_id": inc.job_id,
            "incident_id": inc.incident_id,
            "class": inc.class_,
            "severity": inc.severity,
        }
    )
    if ini.rank is not None:
        labels["rank"] = str(ini.rank)
    if ini.host:
        labels["host"] = ini.host
    labels = dict(sorted(labels.items()))
    annotations = {
        "summary": summary_text(notification),
        "description": f"{inc.title}. Initiator: {initiator_text(inc)}. First line: {ini.line}",
        "collateral_ranks": str(collateral_ranks(inc)),
        "confidence": f"{inc.confidence:.2f}",
        "fix": "\n".join(inc.fix),
        "revision": str(inc.revision),
        "delivery_id": notification.delivery_id,
    }
    if notification.link:
        annotations["link"] = notification.link
    starts_at = inc.window_start or ini.ts or notification.event_time or ZERO_TIME
    ends_at = (inc.window_end or notification.event_time or ZERO_TIME) if status == "resolved" else ZERO_TIME
    group_labels = {"incident_id": inc.incident_id}
    alert = {
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": starts_at,
        "endsAt": ends_at,
        "generatorURL": notification.link or "",
        "fingerprint": short_hash(inc.incident_id),
    }
    return {
        "version": "4",
        "groupKey": f'{{}}:{{incident_id="{inc.incident_id}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver_name,
        "groupLabels": group_labels,
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": external_url,
        "alerts": [alert],
    }


class AlertmanagerReceiver(Receiver[AlertmanagerConfig]):
    kind: ClassVar[str] = "alertmanager"
    config_model: ClassVar[type[ReceiverConfig]] = AlertmanagerConfig

    def render(self, notification: Notification) -> OutboundRequest:
        cfg = self.config
        headers = {}
        if cfg.bearer_token is not None:
            headers["Authorization"] = f"Bearer {cfg.bearer_token.get_secret_value()}"
        return OutboundRequest(
            url=cfg.url, body=dumps(payload(notification, cfg.receiver_name, cfg.external_url)), headers=headers
        )
