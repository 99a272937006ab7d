"""Structural checks of deploy/kibana/*.ndjson (Kibana cannot run here): valid JSON lines, the
saved-object envelope, references that resolve, and every field used present in the index template
of the data view it reads; plus the import request `rootrank setup --kibana` sends."""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest

from correlator.sinks.elasticsearch.indices import mapped_fields
from correlator.sinks.kibana import KibanaImportError, import_saved_objects, load_objects

ROOT = Path(__file__).resolve().parents[2]
KIBANA = ROOT / "deploy" / "kibana"
TEMPLATES = ROOT / "deploy" / "elasticsearch"
KNOWN_TYPES = {"index-pattern", "search", "lens", "visualization", "dashboard"}
AGGREGATABLE = {"keyword", "date", "long", "integer", "float", "double", "boolean", "scaled_float", "short"}
KQL_FIELD = re.compile(r"([A-Za-z_@][\w.@]*)\s*:")


def _lines() -> list[tuple[Path, int, str]]:
    out = []
    for path in sorted(KIBANA.glob("*.ndjson")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            out.append((path, n, line))
    return out


def _objects() -> list[dict[str, Any]]:
    return [json.loads(line) for _, _, line in _lines() if line.strip()]


def _fields_by_index() -> dict[str, dict[str, str]]:
    """Data-view title (the write alias) -> the fields its template maps."""
    out = {}
    for path in TEMPLATES.glob("*.index-template.json"):
        template = json.loads(path.read_text(encoding="utf-8"))
        out[template["_meta"]["write_alias"]] = mapped_fields(template)
    return out


def _by_key() -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["type"], o["id"]): o for o in _objects()}


def _view_fields(view_id: str) -> dict[str, str]:
    view = _by_key()[("index-pattern", view_id)]
    return _fields_by_index()[view["attributes"]["title"]]


def _ref(obj: dict[str, Any], name: str) -> dict[str, str]:
    matches = [r for r in obj["references"] if r["name"] == name]
    assert len(matches) == 1, f"{obj['type']}/{obj['id']}: reference {name!r} missing or repeated"
    return matches[0]


def test_every_line_is_a_saved_object() -> None:
    lines = _lines()
    assert {p.name for p, _, _ in lines} >= {"01-data-views.ndjson", "04-dashboards.ndjson"}
    for path, n, line in lines:
        where = f"{path.name}:{n}"
        assert line.strip(), f"{where}: empty line"
        obj = json.loads(line)
        assert isinstance(obj, dict), where
        assert obj.get("type") in KNOWN_TYPES, f"{where}: type {obj.get('type')!r}"
        assert isinstance(obj.get("id"), str) and obj["id"], f"{where}: id"
        assert isinstance(obj.get("attributes"), dict) and obj["attributes"].get("title"), f"{where}: attributes.title"
        for ref in obj.get("references", []):
            assert set(ref) == {"type", "id", "name"}, f"{where}: reference {ref}"


def test_ids_are_unique_and_every_reference_resolves() -> None:
    objects = _objects()
    keys = [(o["type"], o["id"]) for o in objects]
    assert len(keys) == len(set(keys)), "duplicate saved object"
    for o in objects:
        for ref in o["references"]:
            assert (ref["type"], ref["id"]) in set(keys), f"{o['type']}/{o['id']} -> missing {ref['type']}/{ref['id']}"


def test_data_views_point_at_the_write_aliases_and_a_date_time_field() -> None:
    views = [o for o in _objects() if o["type"] == "index-pattern"]
    fields_by_index = _fields_by_index()
    assert sorted(v["attributes"]["title"] for v in views) == ["rootrank-incidents", "rootrank-signals"]
    for v in views:
        fields = fields_by_index[v["attributes"]["title"]]
        assert fields[v["attributes"]["timeFieldName"]] == "date"
        for name in json.loads(v["attributes"].get("fieldFormatMap", "{}")):
            assert name in fields, f"{v['id']}: field format for unknown field {name}"


def test_saved_searches_use_existing_fields() -> None:
    searches = [o for o in _objects() if o["type"] == "search"]
    assert {s["id"] for s in searches} >= {"rootrank-recent-incidents", "rootrank-signals-drilldown"}
    for s in searches:
        source = json.loads(s["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"])
        view = _ref(s, source["indexRefName"])
        assert view["type"] == "index-pattern"
        fields = _view_fields(view["id"])
        used = list(s["attributes"]["columns"]) + [f for f, _ in s["attributes"]["sort"]]
        used += KQL_FIELD.findall(source["query"]["query"])
        for name in used:
            assert name in fields, f"search {s['id']}: field {name!r} is not in the {view['id']} template"


def _lens_fields(lens: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """(data view id, [(operation, field)]) of a single-layer Lens object, checking its references."""
    layers = lens["attributes"]["state"]["datasourceStates"]["formBased"]["layers"]
    views = set()
    used = []
    for layer_id, layer in layers.items():
        views.add(_ref(lens, f"indexpattern-datasource-layer-{layer_id}")["id"])
        assert sorted(layer["columnOrder"]) == sorted(layer["columns"]), f"{lens['id']}: columnOrder"
        for column in layer["columns"].values():
            if column["sourceField"] != "___records___":
                used.append((column["operationType"], column["sourceField"]))
            order_by = column.get("params", {}).get("orderBy", {})
            if order_by.get("type") == "column":
                assert order_by["columnId"] in layer["columns"], f"{lens['id']}: orderBy {order_by}"
    for vis_layer in lens["attributes"]["state"]["visualization"]["layers"]:
        columns = layers[vis_layer["layerId"]]["columns"]
        for accessor in [vis_layer["xAccessor"], vis_layer.get("splitAccessor"), *vis_layer["accessors"]]:
            assert accessor is None or accessor in columns, f"{lens['id']}: accessor {accessor}"
    assert len(views) == 1
    return views.pop(), used


def test_lens_charts_aggregate_on_aggregatable_fields() -> None:
    charts = [o for o in _objects() if o["type"] == "lens"]
    assert charts
    for chart in charts:
        view_id, used = _lens_fields(chart)
        fields = _view_fields(view_id)
        used += [("filter", f) for f in KQL_FIELD.findall(chart["attributes"]["state"]["query"]["query"])]
        for operation, name in used:
            assert name in fields, f"lens {chart['id']}: field {name!r} is not in the {view_id} template"
            assert fields[name] in AGGREGATABLE, f"lens {chart['id']}: {operation} on {name} ({fields[name]})"


def test_dashboard_shows_classes_over_time_repeat_offenders_and_recent_incidents() -> None:
    by_key = _by_key()
    boards = [o for o in _objects() if o["type"] == "dashboard"]
    assert len(boards) == 1
    board = boards[0]
    panels = json.loads(board["attributes"]["panelsJSON"])
    assert len({p["panelIndex"] for p in panels}) == len(panels)
    shown = []
    for panel in panels:
        ref = _ref(board, panel["panelRefName"])
        assert ref["type"] == panel["type"]
        shown.append(by_key[(ref["type"], ref["id"])])
        grid = panel["gridData"]
        assert grid["i"] == panel["panelIndex"] and grid["x"] >= 0 and grid["x"] + grid["w"] <= 48
    lens_ops = {o["id"]: set(_lens_fields(o)[1]) for o in shown if o["type"] == "lens"}
    assert any({("date_histogram", "@timestamp"), ("terms", "rootrank.class")} <= ops for ops in lens_ops.values())
    assert any(("terms", "rootrank.initiator.host") in ops for ops in lens_ops.values())
    columns = [set(o["attributes"]["columns"]) for o in shown if o["type"] == "search"]
    assert any({"host.name", "rootrank.initiator.rank", "error.message", "rootrank.fix"} <= c for c in columns)
    json.loads(board["attributes"]["optionsJSON"])
    json.loads(board["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"])


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_objects", KIBANA / "build_objects.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ndjson_files_are_what_the_generator_writes() -> None:
    generator = _load_generator()
    for name, objects in generator.build().items():
        assert (KIBANA / name).read_text(encoding="utf-8") == generator.render(objects), (
            f"{name} is stale: run python deploy/kibana/build_objects.py"
        )


def test_load_objects_points_data_views_at_another_prefix() -> None:
    titles = sorted(o["attributes"]["title"] for o in load_objects(KIBANA, "ml-fleet") if o["type"] == "index-pattern")
    assert titles == ["ml-fleet-incidents", "ml-fleet-signals"]
    assert len(load_objects(KIBANA)) == len(_objects())


# --- the import request ------------------------------------------------------------------------


class _FakeKibana(BaseHTTPRequestHandler):
    """Records what a client posts to the saved-objects import endpoint and answers like Kibana."""

    requests: ClassVar[list[dict[str, Any]]] = []
    status: ClassVar[int] = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests.append({"path": self.path, "headers": self.headers, "body": body})
        if type(self).status != 200:
            self.send_response(type(self).status)
            self.end_headers()
            self.wfile.write(b'{"message":"no"}')
            return
        count = body.count(b'"attributes"')
        payload = json.dumps({"success": True, "successCount": count, "successResults": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_kibana() -> Iterator[str]:
    _FakeKibana.requests = []
    _FakeKibana.status = 200
    server = HTTPServer(("127.0.0.1", 0), _FakeKibana)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_import_posts_every_object_as_one_multipart_ndjson_file(fake_kibana: str) -> None:
    objects = load_objects(KIBANA)
    result = import_saved_objects(fake_kibana, objects, username="elastic", password="s3cret", space="ml")
    assert result.success and result.success_count == len(objects)
    [req] = _FakeKibana.requests
    assert req["path"] == "/s/ml/api/saved_objects/_import?overwrite=true"
    assert req["headers"]["kbn-xsrf"]
    assert req["headers"]["Authorization"] == "Basic " + base64.b64encode(b"elastic:s3cret").decode()
    boundary = req["headers"]["Content-Type"].split("boundary=")[1]
    part = req["body"].split(f"--{boundary}".encode())[1]
    head, _, content = part.partition(b"\r\n\r\n")
    assert b'name="file"; filename="rootrank.ndjson"' in head
    sent = [json.loads(line) for line in content.strip().split(b"\n")]
    assert [(o["type"], o["id"]) for o in sent] == [(o["type"], o["id"]) for o in objects]
    assert sent[0]["type"] == "index-pattern"  # data views first, so references resolve in one import


def test_import_reports_kibana_errors(fake_kibana: str) -> None:
    _FakeKibana.status = 403
    with pytest.raises(KibanaImportError, match="HTTP 403"):
        import_saved_objects(fake_kibana, load_objects(KIBANA), wait_s=0)
