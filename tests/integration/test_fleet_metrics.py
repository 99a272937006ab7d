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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from correlator.tooling.simulate import log_paths, simulate
from tests.fixtures.kafka import (
    REPO,
    BrokerAddress,
    Pipeline,
    WorkerProcess,
    ensure_pipeline_topics,
    free_port,
    incident_essentials,
    latest_revisions,
    offline_diagnoser,
    pipeline_env,
    rules_snapshot,
    start_noida,
    wait_for,
)

pytestmark = pytest.mark.integration


_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never goes through a proxy


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with _LOCAL.open(url, timeout=2) as resp:
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
    """The shipper's environment: no proxies, and the session's rule snapshot (what the worker matches with)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOTRANK_") and not k.lower().endswith("_proxy")}
    env["ROOTRANK_ENGINE__RULES_DIR"] = str(rules_snapshot())
    return env


def start_ship(bootstrap: str, state: Path, job: str, host: str, path: str, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "correlator.cli", "ship", "--bootstrap", bootstrap, "--state-dir", str(state),
           "--linger-ms", "100", "--job", job, "--host", host, "--file", path, *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=ship_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


_DIAGNOSER: list[Any] = []


def offline_expected(paths: list[str], job: str) -> list[dict[str, Any]]:
    """`rootrank diagnose` on the session's rule snapshot (the rules loaded once for the module)."""
    if not _DIAGNOSER:
        _DIAGNOSER.append(offline_diagnoser())
    incidents, _ = _DIAGNOSER[0].diagnose(list(paths), job)
    return sorted((incident_essentials(i.to_json_dict()) for i in incidents), key=lambda i: i["incident_id"])


@dataclass
class Fleet:
    broker: BrokerAddress
    pipeline: Pipeline
    readyz: list[tuple[int, dict[str, Any]]]  # every /readyz answer from the worker's start until ready


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One broker and one worker for the module; /readyz is polled from the moment the worker starts."""
    workdir = tmp_path_factory.mktemp("fleet")
    broker = start_noida(workdir)
    env = pipeline_env(broker, "rr-fleet", workdir / "data")
    ensure_pipeline_topics(env)
    worker = WorkerProcess(env, workdir / "worker.log").start()
    pipeline = Pipeline(broker, env, [worker], workdir)
    statuses: list[tuple[int, dict[str, Any]]] = []

    def answered_ready() -> bool:
        worker._check_alive()
        try:
            status, body = http_get(f"http://127.0.0.1:{worker.web_port}/readyz")
        except OSError:
            return False
        statuses.append((status, json.loads(body)))
        return status == 200

    try:
        wait_for(answered_ready, 60, interval=0.05, what="/readyz to answer 200")
        yield Fleet(broker, pipeline, statuses)
    finally:
        # Without a broker (the last test stops it) a clean shutdown has nothing to commit to: don't wait long.
        worker.stop(timeout=30.0 if broker.running else 3.0)
        broker.stop()


def test_readyz_is_not_ready_before_partitions_are_assigned(fleet: Fleet) -> None:
    port = fleet.pipeline.worker.web_port
    assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    first_status, first = fleet.readyz[0]
    ready = fleet.readyz[-1][1]
    assert fleet.readyz[-1][0] == 200 and ready["ready"]
    assert ready["rules_loaded"] and all(a["assigned"] > 0 and a["connected"] for a in ready["apps"].values())
    # Served before the group join finished: not ready, because no partition was assigned yet.
    not_ready = [body for status, body in fleet.readyz if status == 503]
    assert not_ready, f"never saw 503 before ready: first answer {first_status} {first}"
    assert all(not body["ready"] and any(a["assigned"] == 0 or a["rebalancing"] or not a["connected"]
                                         for a in body["apps"].values()) for body in not_ready)
    print(f"\n/readyz: {len(not_ready)} x 503 then 200; first answer {first}")


def test_metrics_count_shipped_lines_and_incidents_end_to_end(fleet: Fleet, tmp_path: Path) -> None:
    pipeline, broker = fleet.pipeline, fleet.broker
    worker = pipeline.worker
    shippers: list[subprocess.Popen[bytes]] = []
    try:
        before = scrape(worker.web_port)
        job = "fleet-metrics-1"
        truth = simulate("cuda_oom", world_size=8, hosts=2, seed=5, noise_lines=30, out=tmp_path / "sim")
        paths = log_paths(tmp_path / "sim", truth)
        ports = []
        started = time.monotonic()
        for index, path in enumerate(paths):
            port = free_port()
            ports.append(port)
            # --follow keeps the shipper (and its /metrics) up after it has sent the file.
            shippers.append(start_ship(broker, tmp_path / f"state{index}", job, Path(path).parent.name, path,
                                       "--follow", "--metrics-port", str(port)))
        expected = offline_expected(paths, job)  # while the shippers start
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
            errors = [s.communicate(timeout=30)[1][-3000:] for s in shippers]
            raise AssertionError(f"acked {acked} of {file_lines}: {errors}") from None
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
              f"{delta('rootrank_ingest_lines_total'):.0f} non-blank lines; "
              f"{distinct} incident(s) counted once ({revisions} revisions); "
              f"{elapsed:.1f}s")
    finally:
        for ship in shippers:
            ship.terminate()
        for ship in shippers:
            try:
                ship.wait(30)
            except subprocess.TimeoutExpired:
                ship.kill()


def test_evidence_only_shipper_feeds_the_same_incident_through_the_broker(fleet: Fleet, tmp_path: Path) -> None:
    """One host ships everything, the other only evidence (the two kinds can feed one job)."""
    job = "fleet-evidence-1"
    truth = simulate("cuda_oom", world_size=16, hosts=2, seed=11, noise_lines=120, out=tmp_path / "sim")
    paths = log_paths(tmp_path / "sim", truth)
    evidence_only = [index % 2 == 0 for index in range(len(paths))]
    ships = [start_ship(fleet.broker, tmp_path / f"state{index}", job, Path(path).parent.name, path,
                        *(["--evidence-only", "--context", "3"] if evidence_only[index] else []))
             for index, path in enumerate(paths)]
    expected = {(i["class"], i["initiator"].get("rank"), i["initiator"].get("host"))
                for i in offline_expected(paths, job)}  # while the shippers run
    summaries = []
    for ship in ships:
        _, err = ship.communicate(timeout=120)
        assert ship.returncode == 0, err
        summaries.append(err.decode().strip().splitlines()[-1])

    def initiators(streamed: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
        return {(i["class"], i["initiator"].get("rank"), i["initiator"].get("host"))
                for i in latest_revisions(streamed).values()}

    incidents = fleet.pipeline.incidents(job, until=lambda out: initiators(out) == expected, timeout=60)
    assert initiators(incidents) == expected
    for path, evidence, summary in zip(paths, evidence_only, summaries, strict=True):
        print(f"\n{Path(path).parent.name}/{Path(path).name} {'evidence-only' if evidence else 'full'}: {summary}")


def test_readyz_turns_503_when_the_broker_goes_away(fleet: Fleet) -> None:
    """Last in the module: it stops the module's broker. The worker stays alive (liveness) but is no
    longer ready, so Kubernetes stops routing to it without restarting it."""
    port = fleet.pipeline.worker.web_port
    assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
    fleet.broker.stop()
    started = time.monotonic()
    wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 503, 30,
             what="/readyz to answer 503 without a broker")
    status, body = http_get(f"http://127.0.0.1:{port}/readyz")
    assert status == 503 and not any(a["connected"] for a in json.loads(body)["apps"].values())
    assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    print(f"\n/readyz 503 {time.monotonic() - started:.1f}s after the broker stopped; /healthz still 200")
