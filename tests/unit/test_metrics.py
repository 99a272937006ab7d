"""correlator.stream.metrics without a worker: bounded label values, one count per incident, and the small
HTTP server `rootrank ship --metrics-port` runs (a real server on a free port)."""

from __future__ import annotations

import urllib.request
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from correlator.stream import metrics
from ingest.ship.runner import ShipStats


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels or {})
    return value or 0.0


def test_label_values_are_bounded() -> None:
    label = metrics.BoundedLabel({"known"}, cap=3)
    assert [label("known"), label("a"), label("b"), label("c"), label("a")] == ["known", "a", "b", "other", "a"]
    assert label(None) == "other"  # "unknown" would be a fourth value
    assert metrics.BoundedLabel(cap=5)("x" * 65) == "other"  # long values never become label values


def test_signals_by_rule_and_one_count_per_incident() -> None:
    signal = SimpleNamespace(rule_id="cuda-oom-pytorch", class_="cuda_oom")
    before = sample("rootrank_signals_total", {"rule_id": "cuda-oom-pytorch", "class": "cuda_oom"})
    metrics.count_signals([signal, signal])
    assert sample("rootrank_signals_total", {"rule_id": "cuda-oom-pytorch", "class": "cuda_oom"}) == before + 2

    labels = {"class": "gpu_hardware_error", "severity": "critical"}
    first, revised = (SimpleNamespace(class_="gpu_hardware_error", severity="critical", revision=r) for r in (1, 2))
    before, before_rev = sample("rootrank_incidents_total", labels), sample("rootrank_incident_revisions_total")
    metrics.count_incident(first)
    metrics.count_incident(revised)
    assert sample("rootrank_incidents_total", labels) == before + 1
    assert sample("rootrank_incident_revisions_total") == before_rev + 1


def test_dead_letters_and_decode_failures_by_reason() -> None:
    before = (sample("rootrank_dead_letters_total", {"stage": "match", "reason": "not_utf8"}),
              sample("rootrank_decode_failures_total", {"reason": "not_utf8"}),
              sample("rootrank_decode_failures_total", {"reason": "extract_error"}))
    metrics.count_dead_letters("match", [{"reason": "not_utf8"}, {"reason": "extract_error"}])
    assert sample("rootrank_dead_letters_total", {"stage": "match", "reason": "not_utf8"}) == before[0] + 1
    assert sample("rootrank_decode_failures_total", {"reason": "not_utf8"}) == before[1] + 1
    assert sample("rootrank_decode_failures_total", {"reason": "extract_error"}) == before[2]  # not a decode failure


def test_ship_metrics_server_serves_the_shippers_counters() -> None:
    registry = CollectorRegistry()
    stats = ShipStats(lines=120, messages=3, acked_messages=2, acked_lines=80, waited_messages=7,
                      backlog_acked_bytes=4096)
    registry.register(metrics.ShipStatsCollector(stats))
    server = metrics.serve_metrics(0, registry=registry)
    try:
        port = server.server_address[1]
        stats.acked_lines = 120  # read at scrape time, not copied at start
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        server.shutdown()
        server.server_close()
    assert "rootrank_ship_lines_sent_total 120.0" in text
    assert 'rootrank_ship_acked_total{unit="lines"} 120.0' in text
    assert "rootrank_ship_waited_messages_total 7.0" in text
    assert "rootrank_ship_backlog_acked_bytes_total 4096.0" in text
