"""Index names, templates (the mappings), write aliases and rollover of rootrank's indices.

Layout in Elasticsearch (prefix `rootrank` by default):

- `rootrank-incidents`: a write alias over `rootrank-incidents-000001`, `-000002`, ... One document per
  incident, `_id` = incident_id; a revision overwrites the previous one (external versioning by
  revision, so a late re-delivery of an older revision never overwrites a newer one).
- `rootrank-signals`: the same over `rootrank-signals-NNNNNN`; one document per matched line, with a
  deterministic `_id`, for drill-down. Raw log lines are not indexed.

Why write aliases + rollover and not data streams: a data stream is append-only (`op_type=create`),
so an incident revision could not overwrite its document by `_id`; aliases also run unchanged on the
test server. Rollover keeps indices bounded; because a rolled-over alias writes new documents to the
new index, the writer (`writer.py`) first looks up whether an `_id` already lives in an older index
behind the alias and, if so, writes the revision there: one document per incident whatever the
rollovers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from correlator.sinks.elasticsearch.client import make_client

if TYPE_CHECKING:
    from elasticsearch import Elasticsearch

    from correlator.config import ElasticsearchSettings, Settings

TEMPLATE_VERSION = 2  # bump when a mapping changes; `rootrank setup` then re-installs the templates


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
            "attempt": {"type": "integer"},
            "recovered": {"type": "boolean"},
            "clock": {"type": "text"},
            # class -> count of signals the bounded job state could not keep: for display
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



if __name__ == "__main__":  # python -m correlator.sinks.elasticsearch.indices deploy/elasticsearch
    import sys

    for written in write_template_files(Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/elasticsearch")):
        print(f"wrote {written}")
