"""Incidents and signals as Elasticsearch documents (ECS fields for Kibana and SIEM, `rootrank.*` for
the rest), and back."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from correlator.diagnosis.models import Incident, Signal

log = logging.getLogger(__name__)

ECS_VERSION = "8.11.0"

# ECS says event.severity is "the numeric severity according to the source"; these are the numbers
# Elastic Security uses for low/medium/high/critical, so rootrank incidents sort next to SIEM alerts.
SEVERITY_SCORE: dict[str, int] = {"info": 0, "low": 21, "medium": 47, "high": 73, "critical": 99}

# Classes whose initiator is most likely the machine, not the job: they make a host (or GPU) a
# repeat offender when it initiates them again and again (the fleet view of issue 9).
HARDWARE_LIKE_CLASSES: frozenset[str] = frozenset(
    {
        "gpu_hardware_error",  # Xid, uncorrectable ECC, fallen off the bus, PCIe AER
        "network_fabric_error",  # InfiniBand/RoCE completion errors, port flaps, NVLink
        "shm_exhausted",  # /dev/shm sized wrong on that node
        "sdc_gemm_mismatch",  # bit flips on one GPU
        "nccl_reduce_scatter_sdc",
    }
)



def _parse_time(value: str | datetime | None) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        text = value.strip()
        if not text:
            return None
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError:
            return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _now_iso() -> str:
    return _iso(datetime.now(UTC))


@lru_cache(maxsize=1)
def _class_categories() -> dict[str, str]:
    try:
        from correlator.diagnosis.rules import default_rules_dir, load_classes

        return {slug: c.category for slug, c in load_classes(default_rules_dir() / "classes.yaml").items()}
    except Exception:  # a missing class list must not stop incidents from being indexed
        log.warning("could not load rules/classes.yaml; incidents are indexed without a category", exc_info=True)
        return {}


_LABEL_KEY = re.compile(r"[^A-Za-z0-9_@-]")


def _ecs_labels(job_id: str, labels: Mapping[str, str]) -> dict[str, str]:
    # ECS labels are flat keyword pairs; dots in a key would create objects, so they become `_`.
    out = {_LABEL_KEY.sub("_", k)[:128]: str(v) for k, v in labels.items() if k}
    out["job_id"] = job_id
    return out


def incident_to_doc(incident: Incident) -> dict[str, Any]:
    """The Elasticsearch document of an incident: ECS fields for Kibana and SIEM, `rootrank.*` for the rest.

    `rootrank.*` holds the full incident (so `rootrank show` rebuilds it exactly, see `doc_to_incident`)
    plus derived fields made for aggregation: category, hardware_like, initiator.host_gpu,
    collateral_classes/hosts/count, evidence_count, rules.
    """
    data = incident.to_json_dict()
    initiator = incident.initiator
    started = (
        _parse_time(initiator.ts) or _parse_time(incident.window_start) or _parse_time(incident.window_end)
    )
    category = _class_categories().get(incident.class_)
    host_gpu = f"{initiator.host}/{initiator.gpu}" if initiator.host and initiator.gpu is not None else None
    rules = sorted({initiator.rule, *incident.rule_versions, *(e.rule for e in incident.evidence)})
    who = []
    if initiator.rank is not None:
        who.append(f"rank {initiator.rank}")
    if initiator.host:
        who.append(f"host {initiator.host}")
    if initiator.gpu is not None:
        who.append(f"GPU {initiator.gpu}")
    message = f"{incident.title} ({incident.class_}) on job {incident.job_id}"
    if who:
        message += ", initiated by " + ", ".join(who)

    rootrank: dict[str, Any] = dict(data)
    rootrank["initiator"] = {**initiator.model_dump(mode="json", by_alias=True), "host_gpu": host_gpu}
    rootrank.update(
        {
            "category": category,
            "hardware_like": incident.class_ in HARDWARE_LIKE_CLASSES,
            "collateral_classes": sorted({c.class_ for c in incident.collateral}),
            "collateral_hosts": sorted({h for c in incident.collateral for h in c.hosts}),
            "collateral_count": sum(c.count for c in incident.collateral),
            "evidence_count": len(incident.evidence),
            "rules": rules,
        }
    )
    event: dict[str, Any] = {
        "kind": "alert",
        "type": ["error", "end"] if incident.status == "closed" else ["error"],
        "outcome": "failure",
        "dataset": "rootrank.incidents",
        "module": "rootrank",
        "id": incident.incident_id,
        "reason": incident.title,
        "severity": SEVERITY_SCORE.get(incident.severity, 0),
    }
    if (start := _parse_time(incident.window_start)) is not None:
        event["start"] = _iso(start)
    if (end := _parse_time(incident.window_end)) is not None:
        event["end"] = _iso(end)
    doc: dict[str, Any] = {
        "@timestamp": _iso(started) if started else _now_iso(),
        "message": message,
        "ecs": {"version": ECS_VERSION},
        "event": event,
        "error": {"message": initiator.line, "type": incident.class_},
        "rule": {
            "id": initiator.rule,
            "name": initiator.rule,
            "version": str(incident.rule_versions[initiator.rule]) if initiator.rule in incident.rule_versions else None,
            "ruleset": incident.rule_set_version or None,
            "category": incident.class_,
        },
        "labels": _ecs_labels(incident.job_id, incident.labels),
        "rootrank": rootrank,
    }
    if initiator.host:
        doc["host"] = {"name": initiator.host}
    if initiator.pid is not None:
        doc["process"] = {"pid": initiator.pid}
    return doc


_DERIVED_INCIDENT_FIELDS = (
    "category", "hardware_like", "collateral_classes", "collateral_hosts", "collateral_count", "evidence_count", "rules",
)


def doc_to_incident(source: Mapping[str, Any]) -> Incident:
    """The incident an `incident_to_doc` document was made from."""
    data = dict(source["rootrank"])
    for name in _DERIVED_INCIDENT_FIELDS:
        data.pop(name, None)
    initiator = dict(data.get("initiator") or {})
    initiator.pop("host_gpu", None)
    data["initiator"] = initiator
    return Incident.model_validate(data)


def signal_doc_id(signal: Signal) -> str:
    """Deterministic: the same matched line re-delivered gets the same `_id` (idempotent writes)."""
    parts = [
        signal.job_id, signal.rule_id, signal.kind, signal.host or "", str(signal.rank), str(signal.pid),
        signal.file or "", str(signal.order), signal.ts.isoformat() if signal.ts else "", signal.line,
    ]
    return hashlib.blake2b("\x1f".join(parts).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def signal_to_doc(signal: Signal) -> dict[str, Any]:
    when = _parse_time(signal.ts) or _parse_time(signal.received_ts)
    doc: dict[str, Any] = {
        "@timestamp": _iso(when) if when else _now_iso(),
        "message": signal.line,
        "ecs": {"version": ECS_VERSION},
        "event": {
            "kind": "event",
            "dataset": "rootrank.signals",
            "module": "rootrank",
            "id": signal_doc_id(signal),
            "severity": SEVERITY_SCORE.get(signal.severity, 0),
        },
        "rule": {"id": signal.rule_id, "name": signal.rule_id, "version": str(signal.rule_version),
                 "category": signal.class_},
        "labels": {"job_id": signal.job_id},
        "rootrank": {
            "job_id": signal.job_id,
            "rule_id": signal.rule_id,
            "rule_version": signal.rule_version,
            "kind": signal.kind,
            "class": signal.class_,
            "role": signal.role,
            "severity": signal.severity,
            "rank": signal.rank,
            "local_rank": signal.local_rank,
            "gpu": signal.gpu,
            "source": signal.source,
            "order": signal.order,
            "ts": _iso(signal.ts) if signal.ts else None,
            "received_ts": _iso(signal.received_ts) if signal.received_ts else None,
            "fields": dict(signal.fields),
        },
    }
    if signal.host:
        doc["host"] = {"name": signal.host}
    if signal.pid is not None:
        doc["process"] = {"pid": signal.pid}
    if signal.file:
        doc["log"] = {"file": {"path": signal.file}}
    return doc
