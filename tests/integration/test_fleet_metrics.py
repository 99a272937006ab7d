"""Issue 9 end to end: /metrics counters move by the expected amounts, /readyz follows the worker's
state, and an evidence-only shipper feeds the same incident as a full one (real broker, real worker,
real `rootrank ship` processes)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from correlator.diagnose import diagnose_paths
from correlator.simulate import log_paths, simulate
from tests.fixtures.kafka import (
    REPO,
    BrokerAddress,
    WorkerProcess,
    ensure_pipeline_topics,
    free_port,
    incident_essentials,
    latest_revisions,
    pipeline_env,
    start_noida,
    start_pipeline,
    wait_for,
)

pytestmark = pytest.mark.integration


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(port: int) -> dict[str, float]:
    """name{labels} -> value for every rootrank_ sample; {} while nothing serves on `port`."""
    try:
        _, body = http_get(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("rootrank_") and "_created" not in line.split(" ")[0]:
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def ship_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("ROOTRANK_") and not k.lower().endswith("_proxy")}


def start_ship(bootstrap: str, state: Path, job: str, host: str, path: str, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "correlator.cli", "ship", "--bootstrap", bootstrap, "--state-dir", str(state),
           "--linger-ms", "100", "--job", job, "--host", host, "--file", path, *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=ship_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("fleet-noida")
    broker = start_noida(workdir)
    try:
        yield broker
    finally:
        broker.stop()


def test_metrics_count_shipped_lines_and_incidents_end_to_end(broker: BrokerAddress, tmp_path: Path) -> None:
    pipeline = start_pipeline(broker, tmp_path, "rr-fleet")
    worker = pipeline.worker
    shippers: list[subprocess.Popen[bytes]] = []
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{worker.web_port}/readyz")[0] == 200, 60, what="worker ready")
        before = scrape(worker.web_port)
        job = "fleet-metrics-1"
        truth = simulate("cuda_oom", world_size=8, hosts=2, seed=5, noise_lines=30, out=tmp_path / "sim")
        paths = log_paths(tmp_path / "sim", truth)
        expected = [incident_essentials(i.to_json_dict()) for i in diagnose_paths(paths, job_id=job)]
        ports = []
        started = time.monotonic()
        for index, path in enumerate(paths):
            port = free_port()
            ports.append(port)
            # --follow keeps the shipper (and its /metrics) up after it has sent the file.
            shippers.append(start_ship(broker, tmp_path / f"state{index}", job, Path(path).parent.name, path,
                                       "--follow", "--metrics-port", str(port)))
        # Bytes, not text: universal newlines would count the "\r" of progress bars as line ends.
        file_lines = sum(Path(p).read_bytes().rstrip(b"\n").count(b"\n") + 1 for p in paths)

        def shipped_all() -> bool:
            return sum(scrape(p).get('rootrank_ship_acked_total{unit="lines"}', 0) for p in ports) >= file_lines

        try:
            wait_for(shipped_all, 60, what="the shippers to have every line acknowledged")
        except AssertionError:
            for ship in shippers:
                ship.terminate()
            acked = [scrape(p).get('rootrank_ship_acked_total{unit="lines"}') for p in ports]
            raise AssertionError(f"acked {acked} of {file_lines}: {[s.communicate(timeout=30)[1][-3000:] for s in shippers]}")
        sent = sum(scrape(p).get("rootrank_ship_lines_sent_total", 0) for p in ports)
        nonblank = sum(1 for p in paths for line in Path(p).read_bytes().split(b"\n") if line.strip())
        want = sorted(expected, key=lambda i: i["incident_id"])

        def essentials(streamed: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return sorted((incident_essentials(i) for i in latest_revisions(streamed).values()),
                          key=lambda i: i["incident_id"])

        # Two shippers start at slightly different times: an early close may be revised later.
        incidents = pipeline.incidents(job, until=lambda out: essentials(out) == want, timeout=60)
        elapsed = time.monotonic() - started
        distinct = len({i["incident_id"] for i in incidents})
        revisions = len(incidents) - distinct

        def delta(name: str) -> float:
            return total(scrape(worker.web_port), name) - total(before, name)

        # The worker counts every non-blank line it was sent (blank lines keep numbering only).
        wait_for(lambda: delta("rootrank_ingest_lines_total") >= nonblank, 20, what="worker line count")
        assert sent == file_lines
        assert delta("rootrank_ingest_lines_total") == nonblank
        assert delta("rootrank_ingest_bytes_total") > 0
        wait_for(lambda: delta("rootrank_incidents_total") >= distinct, 10, what="incident count")
        after = scrape(worker.web_port)
        # One count per incident (its first revision); revisions are counted apart.
        assert total(after, "rootrank_incidents_total") - total(before, "rootrank_incidents_total") == distinct
        assert (total(after, "rootrank_incident_revisions_total")
                - total(before, "rootrank_incident_revisions_total")) == revisions
        cls, severity = expected[0]["class"], incidents[0]["severity"]
        assert after.get(f'rootrank_incidents_total{{class="{cls}",severity="{severity}"}}', 0) >= 1
        assert total(after, "rootrank_signals_total") - total(before, "rootrank_signals_total") > 0
        assert 'rootrank_batch_scan_seconds_count' in after and after['rootrank_batch_scan_seconds_count'] > 0
        assert any(k.startswith("rootrank_consumer_lag_messages{") for k in after) or wait_for(
            lambda: any(k.startswith("rootrank_consumer_lag_messages{") for k in scrape(worker.web_port)), 10,
            what="a consumer lag sample")
        print(f"\n{file_lines} lines shipped by {len(paths)} shippers = {sent:.0f} counted by them; worker counted "
              f"{delta('rootrank_ingest_lines_total'):.0f} non-blank lines; {distinct} incident(s) counted once ({revisions} revisions); "
              f"{elapsed:.1f}s")
    finally:
        for ship in shippers:
            ship.terminate()
        for ship in shippers:
            try:
                ship.wait(30)
            except subprocess.TimeoutExpired:
                ship.kill()
        pipeline.stop()


def test_readyz_is_not_ready_before_partitions_are_assigned(broker: BrokerAddress, tmp_path: Path) -> None:
    env = pipeline_env(broker, "rr-ready", tmp_path / "data")
    ensure_pipeline_topics(env)
    worker = WorkerProcess(env, tmp_path / "worker.log", role="match").start()
    statuses: list[tuple[int, dict[str, Any]]] = []
    try:
        def answered_ready() -> bool:
            worker._check_alive()
            try:
                status, body = http_get(f"http://127.0.0.1:{worker.web_port}/readyz")
            except OSError:
                return False
            statuses.append((status, json.loads(body)))
            return status == 200

        wait_for(answered_ready, 60, interval=0.05, what="/readyz to answer 200")
        assert http_get(f"http://127.0.0.1:{worker.web_port}/healthz")[0] == 200
        first_status, first = statuses[0]
        ready = statuses[-1][1]
        assert ready["rules_loaded"] and all(a["assigned"] > 0 and a["connected"] for a in ready["apps"].values())
        # Served before the group join finished: not ready, because no partition was assigned yet.
        not_ready = [body for status, body in statuses if status == 503]
        assert not_ready, f"never saw 503 before ready: first answer {first_status} {first}"
        assert all(any(a["assigned"] == 0 or a["rebalancing"] or not a["connected"] for a in body["apps"].values())
                   for body in not_ready)
        print(f"\n/readyz: {len(not_ready)} x 503 then 200; first answer {first}")

        # The broker goes away: the worker stays alive (liveness) but stops being ready.
        broker.stop()
        wait_for(lambda: http_get(f"http://127.0.0.1:{worker.web_port}/readyz")[0] == 503, 30,
                 what="/readyz to report 503 without a broker")
        assert http_get(f"http://127.0.0.1:{worker.web_port}/healthz")[0] == 200
    finally:
        worker.stop()
        if not broker.running():
            broker.start()


def test_evidence_only_shipper_feeds_the_same_incident_through_the_broker(broker: BrokerAddress, tmp_path: Path) -> None:
    """One host ships everything, the other only evidence (the two kinds can feed one job)."""
    pipeline = start_pipeline(broker, tmp_path, "rr-evidence")
    try:
        job = "fleet-evidence-1"
        truth = simulate("cuda_oom", world_size=16, hosts=2, seed=11, noise_lines=120, out=tmp_path / "sim")
        paths = log_paths(tmp_path / "sim", truth)
        expected = [incident_essentials(i.to_json_dict()) for i in diagnose_paths(paths, job_id=job)]
        results = []
        for index, path in enumerate(paths):
            extra = ["--evidence-only", "--context", "3"] if index % 2 == 0 else []
            ship = start_ship(broker, tmp_path / f"state{index}", job, Path(path).parent.name, path, *extra)
            _, err = ship.communicate(timeout=120)
            assert ship.returncode == 0, err
            results.append((path, bool(extra), err.decode().strip().splitlines()[-1]))
        incidents = pipeline.incidents(job, expect=len(expected), timeout=60)
        latest = [incident_essentials(i) for i in latest_revisions(incidents).values()]
        got = {(i["class"], i["initiator"].get("rank"), i["initiator"].get("host")) for i in latest}
        want = {(i["class"], i["initiator"].get("rank"), i["initiator"].get("host")) for i in expected}
        assert got == want
        for path, evidence_only, summary in results:
            print(f"\n{Path(path).parent.name}/{Path(path).name} {'evidence-only' if evidence_only else 'full'}: {summary}")
    finally:
        pipeline.stop()
