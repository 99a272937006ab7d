"""What one notification is about: an incident, its transition, its stable delivery id and its link."""

from __future__ import annotations

import hashlib
import urllib.parse
from dataclasses import dataclass
from typing import Literal

from correlator.diagnosis.models import SEVERITY_RANK, Incident, Severity

Transition = Literal["opened", "revised", "closed"]

# Labels a job may use to name its own webhook (rootrank.webhook, rootrank.webhook.kind).
PRIVATE_LABEL_PREFIX = "rootrank.webhook"


def severity_at_least(severity: Severity | str, minimum: Severity | str | None) -> bool:
    if minimum is None:
        return True
    return SEVERITY_RANK.get(severity, 0) >= SEVERITY_RANK[minimum]


def transition_of(incident: Incident) -> Transition:
    """An incident message is one of three transitions; the first revision opens it."""
    if incident.status == "closed":
        return "closed"
    return "opened" if incident.revision <= 1 else "revised"


def transition_marker(incident: Incident) -> tuple[int, int]:
    """Orders the transitions of one incident: revision first, and closing after opening of that revision.

    A destination that has handled marker M never gets a transition <= M again (replays, restarts).
    """
    return (incident.revision, 1 if incident.status == "closed" else 0)


def delivery_id_for(incident: Incident) -> str:
    """incident_id + ":" + revision, identical on every retry and every replay.

    A close that does not bump the revision still needs its own id (receivers dedupe on it),
    hence the ":closed" suffix for that transition only.
    """
    base = f"{incident.incident_id}:{incident.revision}"
    return f"{base}:closed" if incident.status == "closed" else base


def incident_link(kibana_base_url: str | None, incident_id: str) -> str | None:
    """Link to the incident in Kibana.

    The base may carry an `{incident_id}` placeholder (a saved search or dashboard of the deployment);
    without one, a Discover query on the incident id is appended.
    """
    if not kibana_base_url:
        return None
    quoted = urllib.parse.quote(incident_id, safe="")
    if "{incident_id}" in kibana_base_url:
        return kibana_base_url.replace("{incident_id}", quoted)
    query = urllib.parse.quote(f"(query:(language:kuery,query:'incident_id:\"{incident_id}\"'))", safe="")
    return f"{kibana_base_url.rstrip('/')}/app/discover#/?_a={query}"


def redact_url(url: str) -> str:
    """scheme://host[:port]/… plus a short fingerprint: enough to tell targets apart in logs.

    Incoming-webhook URLs (Slack, many chat tools) are bearer secrets in their path and query,
    so the path never reaches a log line.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid url>"
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:8]
    return f"{parts.scheme}://{host}{port}/…#{digest}"


@dataclass(frozen=True)
class Notification:
    incident: Incident
    transition: Transition
    delivery_id: str
    link: str | None

    @classmethod
    def for_incident(cls, incident: Incident, kibana_base_url: str | None) -> Notification:
        # A label-declared webhook URL is a credential of that job: it is used, never forwarded.
        private = [key for key in incident.labels if key.startswith(PRIVATE_LABEL_PREFIX)]
        if private:
            labels = {k: v for k, v in incident.labels.items() if not k.startswith(PRIVATE_LABEL_PREFIX)}
            incident = incident.model_copy(update={"labels": labels})
        return cls(
            incident=incident,
            transition=transition_of(incident),
            delivery_id=delivery_id_for(incident),
            link=incident_link(kibana_base_url, incident.incident_id),
        )

    @property
    def event_time(self) -> str | None:
        """The incident's own time (not the send time), so a body is identical on every retry."""
        inc = self.incident
        return inc.window_end or inc.initiator.ts or inc.window_start
