"""Writes the Kibana saved objects of rootrank as NDJSON (the format of Kibana's saved-objects import).

    python deploy/kibana/build_objects.py        # rewrites deploy/kibana/*.ndjson

Objects: data views for incidents and signals, saved searches, two Lens charts and a dashboard
(incidents over time by class, repeat-offender hosts, recent incidents with initiator and fix).
The files are generated so the escaped JSON-in-JSON Kibana wants (searchSourceJSON, panelsJSON) is
never edited by hand; tests/unit/test_kibana_objects.py checks the files against this script and
every field they use against the index templates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

INCIDENTS_VIEW = "rootrank-incidents"
SIGNALS_VIEW = "rootrank-signals"
CORE_MIGRATION = "8.8.0"


def _meta(obj_type: str, obj_id: str, attributes: dict[str, Any], references: list[dict[str, str]],
          type_migration: str) -> dict[str, Any]:
    return {
        "type": obj_type,
        "id": obj_id,
        "attributes": attributes,
        "references": references,
        "coreMigrationVersion": CORE_MIGRATION,
        "typeMigrationVersion": type_migration,
        "managed": False,
    }


def data_view(obj_id: str, title: str, name: str, formats: dict[str, Any] | None = None) -> dict[str, Any]:
    # `title` is the index expression: the write alias, which covers every rolled-over index.
    return _meta("index-pattern", obj_id, {
        "title": title,
        "name": name,
        "timeFieldName": "@timestamp",
        "allowNoIndex": True,
        "fieldFormatMap": json.dumps(formats or {}),
    }, [], "8.0.0")


def _search_source(query: str = "") -> str:
    return json.dumps({
        "query": {"query": query, "language": "kuery"},
        "filter": [],
        "indexRefName": "kibanaSavedObjectMeta.searchSourceJSON.index",
    })


def saved_search(obj_id: str, title: str, view_id: str, columns: list[str], query: str = "",
                 description: str = "") -> dict[str, Any]:
    return _meta("search", obj_id, {
        "title": title,
        "description": description,
        "columns": columns,
        "sort": [["@timestamp", "desc"]],
        "kibanaSavedObjectMeta": {"searchSourceJSON": _search_source(query)},
    }, [{"type": "index-pattern", "id": view_id, "name": "kibanaSavedObjectMeta.searchSourceJSON.index"}], "8.0.0")


def _count_column() -> dict[str, Any]:
    return {"label": "Incidents", "customLabel": True, "dataType": "number", "operationType": "count",
            "isBucketed": False, "scale": "ratio", "sourceField": "___records___", "params": {"emptyAsNull": True}}


def _terms_column(field: str, label: str, order_by: str, size: int) -> dict[str, Any]:
    return {
        "label": label, "customLabel": True, "dataType": "string", "operationType": "terms",
        "isBucketed": True, "scale": "ordinal", "sourceField": field,
        "params": {"size": size, "orderBy": {"type": "column", "columnId": order_by}, "orderDirection": "desc",
                   "otherBucket": True, "missingBucket": False, "parentFormat": {"id": "terms"}},
    }


def lens_xy(obj_id: str, title: str, view_id: str, *, x: dict[str, Any], split: dict[str, Any] | None,
            series_type: str, query: str = "", description: str = "") -> dict[str, Any]:
    layer_id = f"{obj_id}-layer"
    columns = {"x": x, "count": _count_column()}
    order = ["x", "count"]
    if split is not None:
        columns["split"] = split
        order = ["x", "split", "count"]
    layer: dict[str, Any] = {
        "layerId": layer_id, "layerType": "data", "seriesType": series_type,
        "xAccessor": "x", "accessors": ["count"], "isHistogram": x["operationType"] == "date_histogram",
    }
    if split is not None:
        layer["splitAccessor"] = "split"
    return _meta("lens", obj_id, {
        "title": title,
        "description": description,
        "visualizationType": "lnsXY",
        "state": {
            "datasourceStates": {"formBased": {"layers": {layer_id: {"columns": columns, "columnOrder": order,
                                                                     "incompleteColumns": {}}}}},
            "visualization": {
                "preferredSeriesType": series_type,
                "legend": {"isVisible": True, "position": "right"},
                "valueLabels": "hide",
                "layers": [layer],
            },
            "query": {"query": query, "language": "kuery"},
            "filters": [],
        },
    }, [{"type": "index-pattern", "id": view_id, "name": f"indexpattern-datasource-layer-{layer_id}"}], "8.9.0")


def dashboard(obj_id: str, title: str, panels: list[tuple[str, str, dict[str, int]]],
              description: str = "") -> dict[str, Any]:
    """`panels`: (saved object type, id, grid position)."""
    panels_json = []
    references = []
    for n, (obj_type, ref_id, grid) in enumerate(panels, start=1):
        index = str(n)
        panels_json.append({
            "type": obj_type, "panelIndex": index, "gridData": {**grid, "i": index},
            "embeddableConfig": {"enhancements": {}}, "panelRefName": f"panel_{index}", "version": "8.9.0",
        })
        references.append({"type": obj_type, "id": ref_id, "name": f"panel_{index}"})
    return _meta("dashboard", obj_id, {
        "title": title,
        "description": description,
        "panelsJSON": json.dumps(panels_json),
        "optionsJSON": json.dumps({"useMargins": True, "syncColors": False, "hidePanelTitles": False}),
        "timeRestore": True,
        "timeFrom": "now-7d",
        "timeTo": "now",
        "refreshInterval": {"pause": False, "value": 60000},
        "kibanaSavedObjectMeta": {"searchSourceJSON": json.dumps({"query": {"query": "", "language": "kuery"},
                                                                  "filter": []})},
    }, references, "8.9.0")


HARDWARE_QUERY = "rootrank.hardware_like : true"


def build() -> dict[str, list[dict[str, Any]]]:
    """File name -> objects, in import order (data views before what refers to them)."""
    views = [
        data_view(INCIDENTS_VIEW, "rootrank-incidents", "rootrank incidents",
                  {"rootrank.confidence": {"id": "percent"}}),
        data_view(SIGNALS_VIEW, "rootrank-signals", "rootrank signals (matched lines)"),
    ]
    searches = [
        saved_search(
            "rootrank-recent-incidents", "rootrank: recent incidents (initiator and fix)", INCIDENTS_VIEW,
            ["rootrank.job_id", "rootrank.class", "host.name", "rootrank.initiator.rank", "rootrank.initiator.gpu",
             "error.message", "rootrank.fix", "rootrank.confidence", "rootrank.revision"],
            description="Newest incidents first: which rank/host/GPU initiated the failure, its first line, the fix.",
        ),
        saved_search(
            "rootrank-hardware-incidents", "rootrank: hardware-like incidents by host", INCIDENTS_VIEW,
            ["host.name", "rootrank.initiator.gpu", "rootrank.class", "rootrank.job_id", "error.message"],
            query=HARDWARE_QUERY,
            description="GPU hardware, ECC, fabric and /dev/shm incidents: the evidence behind repeat offenders.",
        ),
        saved_search(
            "rootrank-signals-drilldown", "rootrank: matched lines (drill-down)", SIGNALS_VIEW,
            ["rootrank.job_id", "host.name", "rootrank.rank", "rule.id", "rootrank.class", "message"],
            description="Every matched line; filter on rootrank.job_id to see one job's evidence in time order.",
        ),
    ]
    charts = [
        lens_xy(
            "rootrank-incidents-by-class", "rootrank: incidents over time by class", INCIDENTS_VIEW,
            x={"label": "@timestamp", "dataType": "date", "operationType": "date_histogram", "sourceField": "@timestamp",
               "isBucketed": True, "scale": "interval",
               "params": {"interval": "auto", "includeEmptyRows": True, "dropPartials": False}},
            split=_terms_column("rootrank.class", "Failure class", "count", 10),
            series_type="bar_stacked",
        ),
        lens_xy(
            "rootrank-repeat-offender-hosts", "rootrank: repeat-offender hosts (hardware-like incidents)",
            INCIDENTS_VIEW,
            x=_terms_column("rootrank.initiator.host", "Initiating host", "count", 20),
            split=_terms_column("rootrank.class", "Failure class", "count", 5),
            series_type="bar_horizontal_stacked",
            query=HARDWARE_QUERY,
            description="Hosts that initiated GPU hardware, ECC, fabric or /dev/shm incidents, most first.",
        ),
    ]
    boards = [
        dashboard("rootrank-overview", "rootrank: incidents overview", [
            ("lens", "rootrank-incidents-by-class", {"x": 0, "y": 0, "w": 32, "h": 13}),
            ("lens", "rootrank-repeat-offender-hosts", {"x": 32, "y": 0, "w": 16, "h": 13}),
            ("search", "rootrank-recent-incidents", {"x": 0, "y": 13, "w": 48, "h": 16}),
            ("search", "rootrank-hardware-incidents", {"x": 0, "y": 29, "w": 48, "h": 12}),
        ], description="Which ranks and hosts break training jobs, and why."),
    ]
    return {
        "01-data-views.ndjson": views,
        "02-saved-searches.ndjson": searches,
        "03-visualizations.ndjson": charts,
        "04-dashboards.ndjson": boards,
    }


def render(objects: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(o, sort_keys=True, separators=(",", ":")) + "\n" for o in objects)


def main(folder: Path = HERE) -> int:
    for name, objects in build().items():
        (folder / name).write_text(render(objects), encoding="utf-8")
        print(f"wrote {folder / name} ({len(objects)} objects)")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
