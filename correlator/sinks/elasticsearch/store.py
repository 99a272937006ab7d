"""Elasticsearch sink: index templates, incident and signal documents, an idempotent bulk writer.

Layout in Elasticsearch (prefix `rootrank` by default):

- `rootrank-incidents`: a write alias over `rootrank-incidents-000001`, `-000002`, ... One document per
  incident, `_id` = incident_id; a revision overwrites the previous one (external versioning by
  revision, so a late re-delivery of an older revision never overwrites a newer one).
- `rootrank-signals`: the same over `rootrank-signals-NNNNNN`; one document per matched line, with a
  deterministic `_id`, for drill-down. Raw log lines are not indexed.

Why write aliases + rollover and not data streams: a data stream is append-only (`op_type=create`),
so an incident revision could not overwrite its document by `_id`; aliases also run unchanged on the
test server. Rollover keeps indices bounded; because a rolled-over alias writes new documents to the
new index, the writer first looks up (real-time multi-get, not search) whether an `_id` already lives
in an older index behind the alias and, if so, writes the revision there: one document per incident
whatever the rollovers.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from correlator.diagnosis.models import Incident, Signal
from correlator.stream import metrics

if TYPE_CHECKING:
    from elasticsearch import Elasticsearch

    from correlator.config import ElasticsearchSettings, Settings

log = logging.getLogger(__name__)

ECS_VERSION = "8.11.0"
TEMPLATE_VERSION = 2  # bump when a mapping changes; `rootrank setup` then re-installs the templates

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


# --- names ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexNames:
    """Alias, template and first backing index of one kind of document."""

    alias: str

    @property
    def template(self) -> str:
        return self.alias

    @property
    def pattern(self) -> str:
        return f"{self.alias}-*"

    @property
    def first_index(self) -> str:
        return f"{self.alias}-000001"


def incidents_names(prefix: str = "rootrank") -> IndexNames:
    return IndexNames(f"{prefix}-incidents")


def signals_names(prefix: str = "rootrank") -> IndexNames:
    return IndexNames(f"{prefix}-signals")


# --- templates ---------------------------------------------------------------------------------


def _kw(ignore_above: int = 1024) -> dict[str, Any]:
    return {"type": "keyword", "ignore_above": ignore_above}


def _text_kw() -> dict[str, Any]:
    return {"type": "text", "fields": {"keyword": _kw()}}


# A date that came from a log line may be unparseable; keep the document (and the value in
# _source) rather than reject the incident.
_LENIENT_DATE: dict[str, Any] = {"type": "date", "ignore_malformed": True}

_SETTINGS: dict[str, Any] = {
    "index": {
        "number_of_shards": 1,
        # One replica when the cluster has a second node, none on a single node (stays green).
        "auto_expand_replicas": "0-1",
        "refresh_interval": "1s",
    }
}

_LABELS_AS_KEYWORDS: list[dict[str, Any]] = [
    {
        "labels_as_keywords": {
            "path_match": "labels.*",
            "match_mapping_type": "string",
            "mapping": {"type": "keyword", "ignore_above": 1024},
        }
    }
]


def _ecs_common() -> dict[str, Any]:
    return {
        "@timestamp": {"type": "date"},
        "message": {"type": "text"},
        "ecs": {"properties": {"version": _kw()}},
        "event": {
            "properties": {
                "kind": _kw(),
                "type": _kw(),
                "outcome": _kw(),
                "dataset": _kw(),
                "module": _kw(),
                "id": _kw(),
                "reason": _kw(),
                "severity": {"type": "long"},
                "start": {"type": "date"},
                "end": {"type": "date"},
                "ingested": {"type": "date"},
            }
        },
        "host": {"properties": {"name": _kw()}},
        "process": {"properties": {"pid": {"type": "long"}}},
        "rule": {
            "properties": {"id": _kw(), "name": _kw(), "version": _kw(), "ruleset": _kw(), "category": _kw()}
        },
        "labels": {"type": "object", "dynamic": True},
    }


def _incident_properties() -> dict[str, Any]:
    initiator = {
        "properties": {
            "rank": {"type": "integer"},
            "local_rank": {"type": "integer"},
            "host": _kw(),
            "pid": {"type": "long"},
            "gpu": _kw(),
            "host_gpu": _kw(),
            "ts": _LENIENT_DATE,
            "rule": _kw(),
            "line": {"type": "text"},
        }
    }
    rootrank = {
        "properties": {
            "incident_id": _kw(),
            "job_id": _kw(),
            "class": _kw(),
            "category": _kw(),
            "hardware_like": {"type": "boolean"},
            "title": _text_kw(),
            "severity": _kw(),
            "confidence": {"type": "float"},
            "confidence_reason": {"type": "text"},
            "initiator": initiator,
            "collateral": {
                "properties": {
                    "class": _kw(),
                    "ranks": {"type": "integer"},
                    "hosts": _kw(),
                    "count": {"type": "integer"},
                }
            },
            "collateral_classes": _kw(),
            "collateral_hosts": _kw(),
            "collateral_count": {"type": "integer"},
            "evidence": {
                "properties": {
                    "rank": {"type": "integer"},
                    "host": _kw(),
                    "ts": _LENIENT_DATE,
                    "rule": _kw(),
                    "line": {"type": "text"},
                }
            },
            "evidence_count": {"type": "integer"},
            "fix": {"type": "text"},
            "verify": {"type": "text"},
            "references": {"type": "keyword", "index": False},
            "revision": {"type": "integer"},
            "status": _kw(),
            "window_start": _LENIENT_DATE,
            "window_end": _LENIENT_DATE,
            "rule_set_version": _kw(),
            # Kept for display and exact round trips, not indexed: one field per rule id would grow
            # the mapping with the rule library. `rules` is the searchable list.
            "rule_versions": {"type": "object", "enabled": False},
            "rules": _kw(),
            "world_size": {"type": "integer"},
            "labels": {"type": "object", "enabled": False},
            # The engine's attempt, survival, clock and state-bound fields (the mapping is strict: a
            # field missing here dead-letters every incident).
            "attempt": {"type": "integer"},
            "recovered": {"type": "boolean"},
            "clock": _kw(),
            "dropped": {"type": "object", "enabled": False},
        }
    }
    return {**_ecs_common(), "error": {"properties": {"message": {"type": "text"}, "type": _kw()}}, "rootrank": rootrank}


def _signal_properties() -> dict[str, Any]:
    rootrank = {
        "properties": {
            "job_id": _kw(),
            "rule_id": _kw(),
            "rule_version": {"type": "integer"},
            "kind": _kw(),
            "class": _kw(),
            "role": _kw(),
            "severity": _kw(),
            "rank": {"type": "integer"},
            "local_rank": {"type": "integer"},
            "gpu": _kw(),
            "source": _kw(),
            "order": {"type": "long"},
            "ts": _LENIENT_DATE,
            "received_ts": _LENIENT_DATE,
            "fields": {"type": "object", "enabled": False},
        }
    }
    return {**_ecs_common(), "log": {"properties": {"file": {"properties": {"path": _kw()}}}}, "rootrank": rootrank}


def _template(names: IndexNames, properties: dict[str, Any], what: str) -> dict[str, Any]:
    return {
        "index_patterns": [names.pattern],
        # Above the built-in templates (priority 100 for logs-*-*), so ours wins on our names.
        "priority": 200,
        "version": TEMPLATE_VERSION,
        "_meta": {"managed_by": "rootrank", "description": what, "write_alias": names.alias},
        "template": {
            "settings": _SETTINGS,
            "mappings": {
                # Every field the sink writes is declared: a drift between documents and mapping fails
                # loudly (the document goes to the dead-letter topic) instead of mapping itself.
                "dynamic": "strict",
                "dynamic_templates": _LABELS_AS_KEYWORDS,
                "properties": properties,
            },
        },
    }


def incidents_template(prefix: str = "rootrank") -> dict[str, Any]:
    return _template(incidents_names(prefix), _incident_properties(), "rootrank incidents, one document per incident_id")


def signals_template(prefix: str = "rootrank") -> dict[str, Any]:
    return _template(signals_names(prefix), _signal_properties(), "rootrank signals: matched log lines for drill-down")


def index_templates(prefix: str = "rootrank") -> dict[str, dict[str, Any]]:
    """Template name -> body of `PUT _index_template/<name>`."""
    return {
        incidents_names(prefix).template: incidents_template(prefix),
        signals_names(prefix).template: signals_template(prefix),
    }


def mapped_fields(template: Mapping[str, Any]) -> dict[str, str]:
    """Every field path a template maps (`rootrank.initiator.host` -> `keyword`), multi-fields included."""
    out: dict[str, str] = {}

    def walk(props: Mapping[str, Any], prefix: str) -> None:
        for name, spec in props.items():
            path = f"{prefix}{name}"
            if "properties" in spec:
                out[path] = "object"
                walk(spec["properties"], f"{path}.")
                continue
            out[path] = str(spec.get("type", "object"))
            for sub, sub_spec in spec.get("fields", {}).items():
                out[f"{path}.{sub}"] = str(sub_spec.get("type"))

    walk(template["template"]["mappings"]["properties"], "")
    return out


def write_template_files(folder: Path, prefix: str = "rootrank") -> list[Path]:
    """The templates as JSON files (deploy/elasticsearch/), for clusters set up without `rootrank setup`."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, body in index_templates(prefix).items():
        path = folder / f"{name}.index-template.json"
        path.write_text(json.dumps(body, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


# --- documents ---------------------------------------------------------------------------------


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
    rootrank["initiator"] = {**data["initiator"], "host_gpu": host_gpu}  # type: ignore[dict-item]
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


# --- client, templates, aliases ------------------------------------------------------------------


def make_client(es: ElasticsearchSettings, *, request_timeout_s: float | None = None, max_retries: int = 0) -> Elasticsearch:
    """A client from the settings. The sink does its own retries (with backoff and a stop signal),
    so the client's are off by default."""
    from elasticsearch import Elasticsearch

    kwargs: dict[str, Any] = {
        "request_timeout": request_timeout_s if request_timeout_s is not None else es.request_timeout_s,
        "max_retries": max_retries,
        "retry_on_timeout": max_retries > 0,
    }
    if es.api_key:
        kwargs["api_key"] = es.api_key
    elif es.username:
        kwargs["basic_auth"] = (es.username, es.password or "")
    if es.ca_certs:
        kwargs["ca_certs"] = es.ca_certs
    if not es.verify_certs:
        kwargs["verify_certs"] = False
        kwargs["ssl_show_warn"] = False
    return Elasticsearch(es.url, **kwargs)


def bootstrap_write_index(client: Elasticsearch, names: IndexNames) -> bool:
    """Create the first backing index with the write alias unless the alias exists. True if created."""
    from elasticsearch import BadRequestError

    if client.indices.exists_alias(name=names.alias):
        return False
    try:
        client.indices.create(index=names.first_index, aliases={names.alias: {"is_write_index": True}})
        return True
    except BadRequestError as exc:
        # Another worker won the race, or the first index exists without the alias (a deleted alias).
        if "resource_already_exists" not in str(exc):
            raise
        if not client.indices.exists_alias(name=names.alias):
            client.indices.put_alias(index=names.first_index, name=names.alias, is_write_index=True)
        return False


def install_templates(settings: Settings, client: Elasticsearch | None = None) -> list[str]:
    """`rootrank setup`: put both index templates and bootstrap both write aliases. Idempotent.

    Returns one human-readable line per action.
    """
    es = client or make_client(settings.elasticsearch, max_retries=3)
    prefix = settings.elasticsearch.index_prefix
    lines = []
    for name, body in index_templates(prefix).items():
        es.indices.put_index_template(name=name, **body)
        lines.append(f"template {name} (patterns {', '.join(body['index_patterns'])}, version {body['version']})")
    for names in (incidents_names(prefix), signals_names(prefix)):
        created = bootstrap_write_index(es, names)
        lines.append(f"alias    {names.alias} -> {names.first_index if created else 'existing write index'}"
                     + (" (created)" if created else ""))
    return lines


def rollover_conditions(es: ElasticsearchSettings) -> dict[str, Any]:
    conditions: dict[str, Any] = {}
    if es.rollover_max_age:
        conditions["max_age"] = es.rollover_max_age
    if es.rollover_max_primary_shard_size:
        conditions["max_primary_shard_size"] = es.rollover_max_primary_shard_size
    if es.rollover_max_docs:
        conditions["max_docs"] = es.rollover_max_docs
    return conditions


def rollover_if_needed(client: Elasticsearch, alias: str, conditions: Mapping[str, Any]) -> str | None:
    """Roll the alias over when a condition holds; the new index name, or None."""
    if not conditions:
        return None
    resp = client.indices.rollover(alias=alias, conditions=dict(conditions))
    return str(resp["new_index"]) if resp.get("rolled_over") else None


# --- bulk writer ---------------------------------------------------------------------------------


class SinkStopped(Exception):
    """The stop signal was set while a write was still unacknowledged: nothing may be committed."""


@dataclass(frozen=True)
class IndexRequest:
    """One document to index. `version` (an incident's revision) makes the write external-versioned."""

    alias: str
    doc_id: str
    source: Mapping[str, Any]
    version: int | None = None
    ref: Any = None  # the caller's handle (e.g. the Kafka record), returned with rejections


@dataclass
class BulkOutcome:
    written: int = 0
    stale: int = 0  # an equal-or-newer revision was already indexed: nothing to do
    rejected: list[tuple[IndexRequest, str]] = field(default_factory=list)  # permanent, per document
    attempts: int = 0


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    maximum_s: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        base = min(self.maximum_s, self.initial_s * self.multiplier ** max(0, attempt - 1))
        return base * (1.0 + random.uniform(-self.jitter, self.jitter))


_RETRIABLE_ITEM_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class WriterStats:
    bulks: int = 0
    docs_written: int = 0
    docs_stale: int = 0
    docs_rejected: int = 0
    retries: int = 0
    last_error: str = ""
    last_bulk_s: float = 0.0


class BulkWriter:
    """Writes documents with the bulk API until every one is acknowledged (or permanently rejected).

    - Idempotent: `_id` is given by the caller; a document already living in an older index behind
      the alias (after a rollover) is written there, found by a real-time multi-get.
    - Whole-request failures (connection refused, timeouts, 429/5xx, even 401) are retried forever with
      exponential backoff: an outage must back up the source, never drop a document. `wait` is called
      instead of sleeping, so a Kafka consumer can keep its group membership while it waits.
    - Item failures: 429/5xx are retried; 409 on a versioned write means an equal or newer revision is
      there (counted as stale, not an error); a missing alias is re-bootstrapped; any other 4xx
      (a mapping error) is permanent and returned in `rejected` for the caller's dead-letter topic.
    """

    def __init__(
        self,
        client: Elasticsearch,
        *,
        backoff: Backoff | None = None,
        stop: threading.Event | None = None,
        wait: Callable[[float], None] | None = None,
        bootstrap: Callable[[str], None] | None = None,
        refresh: bool | str = False,
    ) -> None:
        self.client = client
        self.backoff = backoff or Backoff()
        self.stop = stop or threading.Event()
        self._wait = wait
        self._bootstrap = bootstrap
        self.refresh = refresh
        self.stats = WriterStats()
        self._last_warning = 0.0

    # The default `wait` just sleeps, interruptibly.
    def _sleep(self, seconds: float) -> None:
        if self._wait is not None:
            deadline = time.monotonic() + seconds
            while not self.stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wait(left)
        else:
            self.stop.wait(seconds)
        if self.stop.is_set():
            raise SinkStopped("stopped while a bulk write was unacknowledged")

    def _warn(self, message: str) -> None:
        self.stats.last_error = message
        now = time.monotonic()
        if now - self._last_warning >= 10.0:  # an outage logs a line every 10 s, not per retry
            self._last_warning = now
            log.warning("elasticsearch: %s (retrying; nothing is committed until it succeeds)", message)

    def _older_indices(self, alias: str) -> list[str]:
        found = self.client.indices.get_alias(name=alias)
        older = [idx for idx, meta in found.items() if not meta["aliases"][alias].get("is_write_index", False)]
        # Newest first: a document written after several rollovers is in the most recent one.
        return sorted(older, reverse=True)

    def _targets(self, requests: Sequence[IndexRequest]) -> dict[tuple[str, str], str]:
        """(alias, id) -> the older concrete index that already holds the id."""
        targets: dict[tuple[str, str], str] = {}
        by_alias: dict[str, list[str]] = {}
        for r in requests:
            by_alias.setdefault(r.alias, []).append(r.doc_id)
        for alias, ids in by_alias.items():
            older = self._older_indices(alias)
            if not older:
                continue
            docs = [{"_index": idx, "_id": doc_id} for idx in older for doc_id in ids]
            resp = self.client.mget(docs=docs, source=False, realtime=True)
            for hit in resp["docs"]:
                if hit.get("found"):
                    targets.setdefault((alias, str(hit["_id"])), str(hit["_index"]))
        return targets

    @staticmethod
    def _dedupe(requests: Iterable[IndexRequest]) -> list[IndexRequest]:
        """One request per document: the highest version, the latest on a tie (bulk order is not a
        contract across shards, and an older revision must never win)."""
        latest: dict[tuple[str, str], IndexRequest] = {}
        for r in requests:
            key = (r.alias, r.doc_id)
            prev = latest.get(key)
            if prev is None or (r.version or 0) >= (prev.version or 0):
                latest[key] = r
        return list(latest.values())

    def write(self, requests: Sequence[IndexRequest]) -> BulkOutcome:
        from elastic_transport import TransportError
        from elasticsearch import ApiError, NotFoundError

        outcome = BulkOutcome()
        pending = self._dedupe(requests)
        # Requests folded into another by _dedupe count as written when their survivor is.
        folded = len(requests) - len(pending)
        attempt = 0
        while pending:
            attempt += 1
            outcome.attempts = attempt
            if attempt > 1:
                self.stats.retries += 1
                self._sleep(self.backoff.delay(attempt - 1))
            try:
                targets = self._targets(pending)
                operations: list[Mapping[str, Any]] = []
                for r in pending:
                    target = targets.get((r.alias, r.doc_id))
                    action: dict[str, Any] = {"_index": target or r.alias, "_id": r.doc_id}
                    if target is None:
                        # Never let a missing alias auto-create a concrete index named like the alias.
                        action["require_alias"] = True
                    if r.version is not None:
                        action["version"] = r.version
                        action["version_type"] = "external_gte"
                    operations.append({"index": action})
                    operations.append(r.source)
                started = time.perf_counter()
                resp = self.client.bulk(operations=operations, refresh=self.refresh)
                self.stats.last_bulk_s = time.perf_counter() - started
                metrics.observe_es_bulk(self.stats.last_bulk_s)
                self.stats.bulks += 1
            except NotFoundError as exc:
                # get_alias: the alias is gone (a wiped cluster); put it back, then retry.
                metrics.observe_es_bulk(failure="alias_missing")
                self._warn(f"alias missing: {exc}")
                self._rebootstrap(pending)
                continue
            except (ApiError, TransportError) as exc:
                self._warn(f"bulk of {len(pending)} failed: {type(exc).__name__}: {exc}")
                metrics.observe_es_bulk(failure=type(exc).__name__)
                continue
            retry: list[IndexRequest] = []
            missing_alias: set[str] = set()
            for r, item in zip(pending, resp["items"], strict=True):
                result = item.get("index") or next(iter(item.values()))
                status = int(result.get("status", 500))
                error = result.get("error")
                if status < 300 and not error:
                    outcome.written += 1
                elif status == 409 and r.version is not None:
                    outcome.stale += 1
                elif status in _RETRIABLE_ITEM_STATUS:
                    retry.append(r)
                elif status == 404 and isinstance(error, dict) and error.get("type") == "index_not_found_exception":
                    missing_alias.add(r.alias)
                    retry.append(r)
                else:
                    reason = error.get("reason", str(error)) if isinstance(error, dict) else str(error)
                    etype = error.get("type", "error") if isinstance(error, dict) else "error"
                    outcome.rejected.append((r, f"elasticsearch rejected the document ({status} {etype}): {reason}"))
            if retry:
                self._warn(f"{len(retry)} of {len(pending)} documents not accepted yet")
            if missing_alias:
                self._rebootstrap([r for r in retry if r.alias in missing_alias])
            pending = retry
        outcome.written += folded
        self.stats.docs_written += outcome.written
        self.stats.docs_stale += outcome.stale
        self.stats.docs_rejected += len(outcome.rejected)
        metrics.observe_es_bulk(rejected=len(outcome.rejected))
        return outcome

    def _rebootstrap(self, requests: Sequence[IndexRequest]) -> None:
        if self._bootstrap is None:
            return
        for alias in sorted({r.alias for r in requests}):
            try:
                self._bootstrap(alias)
            except Exception as exc:  # the next attempt retries; the outage may still be going on
                self._warn(f"could not re-create {alias}: {exc}")
                log.debug("re-creating %s failed", alias, exc_info=True)


if __name__ == "__main__":  # python -m correlator.sinks.elasticsearch.store deploy/elasticsearch
    import sys

    for written in write_template_files(Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/elasticsearch")):
        print(f"wrote {written}")
