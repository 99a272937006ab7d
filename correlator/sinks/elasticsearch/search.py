"""Queries over the incidents index: what `rootrank incidents`, `rootrank show` (and `rootrank hosts`) run.

The query builders are pure (dict in, dict out) so they can be read and tested without a cluster;
the `search_*` functions run them with an `elasticsearch` client.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from correlator.diagnosis.models import Incident
from correlator.sinks.elasticsearch.documents import HARDWARE_LIKE_CLASSES, doc_to_incident

if TYPE_CHECKING:
    from elasticsearch import Elasticsearch

# Fields a free-text query looks in: what a person remembers of an incident.
TEXT_FIELDS = [
    "message",
    "rootrank.title^3",
    "error.message^2",
    "rootrank.evidence.line",
    "rootrank.confidence_reason",
    "rootrank.fix",
    "rootrank.incident_id",
    "rootrank.job_id",
    "rootrank.class",
    "host.name",
]

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """`30m`, `6h`, `7d`, `2w` (ago), or an ISO date/time (UTC when it has no zone)."""
    now = now or datetime.now(UTC)
    m = _RELATIVE.match(value)
    if m:
        return now - timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2).lower()])
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError as exc:
        raise ValueError(f"--since {value!r}: use 30m, 6h, 7d, 2w or an ISO date like 2025-01-31T12:00") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class IncidentFilter:
    job: str | None = None
    class_: str | None = None
    host: str | None = None
    since: datetime | None = None
    text: str | None = None
    size: int = 50


def incidents_query(f: IncidentFilter) -> dict[str, Any]:
    """The bool query for a filter. `host` matches the initiating host or a host with collateral
    failures: "incidents on host X" should show both."""
    filters: list[dict[str, Any]] = []
    if f.job:
        filters.append({"term": {"rootrank.job_id": f.job}})
    if f.class_:
        filters.append({"term": {"rootrank.class": f.class_}})
    if f.host:
        filters.append({"bool": {"should": [{"term": {"host.name": f.host}},
                                            {"term": {"rootrank.collateral_hosts": f.host}}],
                                 "minimum_should_match": 1}})
    if f.since:
        filters.append({"range": {"@timestamp": {"gte": f.since.astimezone(UTC).isoformat().replace("+00:00", "Z")}}})
    must: list[dict[str, Any]] = []
    if f.text:
        must.append({"simple_query_string": {"query": f.text, "fields": TEXT_FIELDS, "default_operator": "and"}})
    return {"bool": {"filter": filters, "must": must or [{"match_all": {}}]}}


@dataclass(frozen=True)
class IncidentHit:
    incident: Incident
    timestamp: str
    index: str


def search_incidents(client: Elasticsearch, alias: str, f: IncidentFilter) -> list[IncidentHit]:
    """Newest first."""
    resp = client.search(
        index=alias,
        query=incidents_query(f),
        sort=[{"@timestamp": {"order": "desc"}}, {"rootrank.incident_id": {"order": "asc"}}],
        size=f.size,
        ignore_unavailable=True,
    )
    return [_hit(h) for h in resp["hits"]["hits"]]


def _hit(hit: dict[str, Any]) -> IncidentHit:
    source = hit["_source"]
    return IncidentHit(doc_to_incident(source), str(source.get("@timestamp", "")), str(hit.get("_index", "")))


class AmbiguousId(LookupError):
    def __init__(self, prefix: str, ids: Sequence[str]) -> None:
        self.ids = list(ids)
        super().__init__(f"{prefix!r} matches {len(ids)} incidents: {', '.join(ids[:10])}")


def get_incident(client: Elasticsearch, alias: str, incident_id: str) -> IncidentHit | None:
    """By id; a unique prefix of an id is enough (ids are long)."""
    resp = client.search(index=alias, query={"ids": {"values": [incident_id]}}, size=1, ignore_unavailable=True)
    hits = resp["hits"]["hits"]
    if hits:
        return _hit(hits[0])
    resp = client.search(index=alias, query={"prefix": {"rootrank.incident_id": incident_id}}, size=11,
                         ignore_unavailable=True)
    hits = resp["hits"]["hits"]
    if len(hits) > 1:
        raise AmbiguousId(incident_id, [h["_source"]["rootrank"]["incident_id"] for h in hits])
    return _hit(hits[0]) if hits else None


@dataclass
class Offender:
    host: str
    count: int
    gpus: dict[str, int] = field(default_factory=dict)
    classes: dict[str, int] = field(default_factory=dict)
    incident_ids: list[str] = field(default_factory=list)
    jobs: int = 0


def repeat_offenders_query(since: datetime | None, min_incidents: int, size: int = 100,
                           classes: Sequence[str] | None = None) -> dict[str, Any]:
    """Search body (query + aggs): hosts that initiated hardware-like incidents at least `min_incidents` times."""
    filters: list[dict[str, Any]] = [{"terms": {"rootrank.class": sorted(classes or HARDWARE_LIKE_CLASSES)}}]
    if since:
        filters.append({"range": {"@timestamp": {"gte": since.astimezone(UTC).isoformat().replace("+00:00", "Z")}}})
    return {
        "size": 0,
        "query": {"bool": {"filter": filters}},
        "aggs": {
            "hosts": {
                "terms": {"field": "rootrank.initiator.host", "size": size, "min_doc_count": max(1, min_incidents)},
                "aggs": {
                    "gpus": {"terms": {"field": "rootrank.initiator.gpu", "size": 16}},
                    "classes": {"terms": {"field": "rootrank.class", "size": 16}},
                    "jobs": {"cardinality": {"field": "rootrank.job_id"}},
                    "recent": {"top_hits": {"size": 10, "sort": [{"@timestamp": {"order": "desc"}}],
                                            "_source": {"includes": ["rootrank.incident_id"]}}},
                },
            }
        },
    }


def repeat_offenders(client: Elasticsearch, alias: str, *, since: datetime | None = None, min_incidents: int = 3,
                     classes: Sequence[str] | None = None) -> list[Offender]:
    body = repeat_offenders_query(since, min_incidents, classes=classes)
    resp = client.search(index=alias, ignore_unavailable=True, **body)
    out = []
    for b in resp.get("aggregations", {}).get("hosts", {}).get("buckets", []):
        if int(b["doc_count"]) < min_incidents:  # min_doc_count does it on ES; not every server honours it
            continue
        out.append(Offender(
            host=str(b["key"]),
            count=int(b["doc_count"]),
            gpus={str(g["key"]): int(g["doc_count"]) for g in b["gpus"]["buckets"]},
            classes={str(c["key"]): int(c["doc_count"]) for c in b["classes"]["buckets"]},
            incident_ids=[h["_source"]["rootrank"]["incident_id"] for h in b["recent"]["hits"]["hits"]],
            jobs=int(b["jobs"]["value"]),
        ))
    return out


# --- terminal output ----------------------------------------------------------------------------


def _initiator_short(incident: Incident) -> str:
    i = incident.initiator
    parts = []
    if i.rank is not None:
        parts.append(f"rank {i.rank}")
    where = i.host or ""
    if i.gpu is not None:
        where += f"/gpu{i.gpu}"
    if where:
        parts.append(where)
    return " ".join(parts) or "-"


def format_incident_rows(hits: Sequence[IncidentHit]) -> str:
    """One aligned line per incident (plain text, so it greps and pipes)."""
    header = ("TIME", "INCIDENT", "JOB", "CLASS", "INITIATOR", "SEVERITY", "CONF", "REV", "TITLE")
    rows = [header]
    for h in hits:
        i = h.incident
        rows.append((h.timestamp[:19].replace("T", " "), i.incident_id, i.job_id, i.class_, _initiator_short(i),
                     i.severity, f"{i.confidence:.2f}", str(i.revision), i.title))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
                     for r in rows)
