"""The webhook sink as a real worker process: Tansu broker, faust worker, local HTTP receiver.

Each test starts its own broker, receiver and worker (`python -m correlator.sinks.webhooks.agent`),
restarts or kills the worker where the scenario says so, and stops everything it started.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from correlator import cli
from correlator.diagnosis.models import Incident
from correlator.sinks.webhooks.receivers.generic_json import generate_secret
from correlator.tooling.embedded import stop_process
from tests.fixtures.http_receiver import HttpReceiver
from tests.fixtures.kafka import create_topics, env_without_proxies, free_port, produce, read_topic
from tests.unit.webhooks.incidents import make_incident

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TOKEN = "it-api-token-5b1c9e"
INCIDENTS = "rootrank.incidents"
DEADLETTER = "rootrank.webhooks.deadletter"
PARTITIONS = 2


class SinkWorker:
    """`python -m correlator.sinks.webhooks.agent` in a subprocess, with its log in a file."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> float:
        """Start and wait until the API answers (tables recovered); returns the seconds that took."""
        started = time.monotonic()
        env = {k: v for k, v in env_without_proxies().items() if not k.startswith("ROOTRANK_")}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "correlator.sinks.webhooks.agent", "--config", str(self.config),
                 "--web-port", str(self.port), "--loglevel", "INFO"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        while True:
            assert self.proc.poll() is None, f"worker exited: {self.log_tail()}"
            if self.api("GET", "readiness-probe", token=None)[0] == 200:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise AssertionError(f"worker not ready in {timeout}s: {self.log_tail()}")
            time.sleep(0.3)

    def stop(self, *, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        stop_process(proc, signal.SIGKILL if kill else signal.SIGTERM, timeout=60)

    def api(self, method: str, job_id: str, body: Any = None, *, token: str | None = TOKEN) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}/jobs/{job_id}/webhooks", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_text()[-chars:]


@pytest.fixture
def sink_worker(tansu_broker: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """A factory: sink_worker(webhooks settings) -> SinkWorker (not started); stopped at teardown."""
    create_topics(tansu_broker, [INCIDENTS, DEADLETTER], partitions=PARTITIONS)
    workers: list[SinkWorker] = []

    def make(webhooks: dict[str, Any]) -> SinkWorker:
        config = {
            "app_id": f"rr-{request.node.name[:40]}",
            "kafka": {"bootstrap_servers": str(tansu_broker), "session_timeout_s": 6, "producer_max_batch_size": 1},
            "topics": {"partitions": PARTITIONS},
            "data_dir": str(tmp_path / "data"),
            "webhooks": {"api_token": TOKEN, "kibana_base_url": "https://kibana.example.com", **webhooks},
        }
        path = tmp_path / "rootrank.yaml"
        path.write_text(yaml.safe_dump(config))
        worker = SinkWorker(path, tmp_path / "worker.log")
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.stop()


def publish(broker: str, *incidents: Incident) -> None:
    for incident in incidents:
        produce(broker, INCIDENTS, [incident.model_dump_json(by_alias=True).encode()],
                key=incident.incident_id.encode())


def ids_at(receiver: HttpReceiver, path: str) -> list[str | None]:
    return [r.webhook_id for r in receiver.requests if r.path == path]


def assert_no_secrets(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text


def test_registrations_survive_a_restart_and_each_job_gets_only_its_incidents(
    tansu_broker: str, http_receiver: HttpReceiver, sink_worker: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = generate_secret()
    http_receiver.expect_secret(secret)
    worker = sink_worker({"delivery": {"initial_backoff_s": 0.2, "max_backoff_s": 1, "budget_s": 60}})
    first_start = worker.start()

    # The HTTP API, over real HTTP: token for writes, input validated.
    assert worker.api("PUT", "job-a", {"url": http_receiver.url("/a")}, token=None)[0] == 401
    assert worker.api("PUT", "job-a", {"url": http_receiver.url("/a")}, token="wrong")[0] == 401
    assert worker.api("PUT", "job-a", {"url": "ftp://example.com/x"})[0] == 422
    assert worker.api("PUT", "..", {"url": http_receiver.url("/a")})[0] in (400, 404)
    status, created = worker.api("PUT", "job-a", {"url": http_receiver.url("/a"), "secret": secret})
    assert status == 201 and created["webhook"]["signed"] is True

    # The CLI, against the same worker.
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret)
    common = ["--api", worker.url, "--token-file", str(token_file)]
    add_b = ["webhooks", "add", "--job", "job-b", http_receiver.url("/b"), "--secret-file", str(secret_file), *common]
    assert cli.main(add_b) == 0
    assert cli.main(["webhooks", "add", "--job", "job-c", http_receiver.url("/c"), *common]) == 0
    assert cli.main(["webhooks", "list", "--job", "job-c", *common]) == 0
    assert http_receiver.url("/c") in capsys.readouterr().out
    assert cli.main(["webhooks", "remove", "--job", "job-c", http_receiver.url("/c"), *common]) == 0
    assert cli.main(["webhooks", "list", "--job", "job-c", *common]) == 0
    assert http_receiver.url("/c") not in capsys.readouterr().out
    # The worker reads its own changelog back: a stale copy of a removed webhook must never show.
    stale = 0
    for i in range(10):
        assert worker.api("PUT", "job-e", {"url": http_receiver.url(f"/e{i}")})[0] == 201
        removed = urllib.request.Request(
            f"{worker.url}/jobs/job-e/webhooks?all=true", method="DELETE", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(removed, timeout=10) as response:
            assert json.loads(response.read())["removed"] == 1
        for _ in range(6):
            stale += len(worker.api("GET", "job-e")[1]["webhooks"])
            time.sleep(0.03)
    assert stale == 0

    # A 256-rank failure published three times (the correlator may re-publish), plus other jobs.
    opened = make_incident("job-a", incident_id="a-1", world_size=256)
    t0 = time.monotonic()
    publish(tansu_broker, opened, make_incident("job-b", incident_id="b-1"), opened,
            make_incident("job-c", incident_id="c-1"), opened)
    http_receiver.wait_for(1, delivered=True, path="/a", timeout=60)
    http_receiver.wait_for(1, delivered=True, path="/b", timeout=60)
    first_latency = time.monotonic() - t0
    time.sleep(3)  # duplicates would have arrived by now
    assert ids_at(http_receiver, "/a") == ["a-1:1"]
    assert ids_at(http_receiver, "/b") == ["b-1:1"]
    assert ids_at(http_receiver, "/c") == []

    # Restart: registrations come back from the changelog, progress too (no re-sends).
    worker.stop()
    second_start = worker.start()
    status, listed = worker.api("GET", "job-a")
    assert status == 200 and [w["target"] for w in listed["webhooks"]] == [http_receiver.url("/a")]
    assert [w["target"] for w in worker.api("GET", "job-b")[1]["webhooks"]] == [http_receiver.url("/b")]

    revised = make_incident("job-a", incident_id="a-1", world_size=256, revision=2, initiator_rank=12)
    closed = make_incident("job-a", incident_id="a-1", world_size=256, revision=2, initiator_rank=12, status="closed")
    publish(tansu_broker, revised, opened, revised, make_incident("job-b", incident_id="b-1", revision=2), closed)
    http_receiver.wait_for(3, delivered=True, path="/a", timeout=60)
    http_receiver.wait_for(2, delivered=True, path="/b", timeout=60)
    time.sleep(3)
    assert ids_at(http_receiver, "/a") == ["a-1:1", "a-1:2", "a-1:2:closed"]
    assert ids_at(http_receiver, "/b") == ["b-1:1", "b-1:2"]
    assert all(r.signature_valid for r in http_receiver.requests)
    assert_no_secrets(worker.log_text(), secret, secret.removeprefix("whsec_"), TOKEN)
    print(f"\nworker ready in {first_start:.1f}s, after restart {second_start:.1f}s; "
          f"first notifications {first_latency:.2f}s after publishing")


def test_receiver_down_20s_with_worker_restarts_in_between_loses_nothing(
    tansu_broker: str, http_receiver: HttpReceiver, sink_worker: Any
) -> None:
    """Down for 20 s; meanwhile the worker is stopped (SIGTERM) mid-retry, restarted, killed (SIGKILL)
    mid-retry and restarted again. The notification arrives once the receiver is back, once."""
    worker = sink_worker(
        {"delivery": {"initial_backoff_s": 0.5, "max_backoff_s": 2, "budget_s": 180, "max_attempts": 500, "timeout_s": 2}}
    )
    worker.start()
    assert worker.api("PUT", "job-d", {"kind": "slack", "url": http_receiver.url("/services/T1/B1/d")})[0] == 201

    def retrying_since(count: int) -> None:
        deadline = time.monotonic() + 30
        while worker.log_text().count("webhook d-1:1 ") <= count:
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.2)

    http_receiver.go_down()
    down_at = time.monotonic()
    publish(tansu_broker, make_incident("job-d", incident_id="d-1"))
    retrying_since(0)
    stopping = time.monotonic()
    worker.stop()  # SIGTERM mid-retry: nothing acked, so nothing committed; and no waiting for the retries
    stop_s = time.monotonic() - stopping
    seen = worker.log_text().count("webhook d-1:1 ")
    worker.start()
    retrying_since(seen)  # the restarted worker picked the incident up again
    worker.stop(kill=True)  # SIGKILL mid-retry
    killed_at = time.monotonic() - down_at
    restart_s = worker.start()
    time.sleep(max(0.0, 20 - (time.monotonic() - down_at)))
    http_receiver.come_up()
    up_at = time.time()

    [delivered] = http_receiver.wait_for(1, delivered=True, timeout=60)
    after_up = delivered.received_at - up_at
    time.sleep(3)
    assert [r.webhook_id for r in http_receiver.requests] == ["d-1:1"]
    assert read_topic(tansu_broker, DEADLETTER, idle_s=1.0, timeout=10) == []
    assert stop_s < 10, f"SIGTERM took {stop_s:.1f}s: the stop waited for the retries"
    print(f"\nreceiver down 20s: worker stopped mid-retry in {stop_s:.1f}s, restarted, killed at {killed_at:.1f}s, "
          f"ready again in {restart_s:.1f}s; delivered {after_up:.2f}s after the receiver came back")


def test_configured_routes_retry_500s_and_dead_letter_final_failures(
    tansu_broker: str, http_receiver: HttpReceiver, sink_worker: Any
) -> None:
    secret = generate_secret()
    worker = sink_worker(
        {
            "receivers": {
                "signed": {"kind": "generic_json", "url": http_receiver.url("/signed"), "secret": secret},
                "chat": {"kind": "slack", "url": http_receiver.url("/services/T9/B9/ChatPathSecret")},
            },
            "routes": [
                {"match": {"job": "train-*", "class": ["cuda_*"]}, "receivers": ["signed"]},
                {"match": {"class": "nccl_*", "min_severity": "high"}, "receivers": ["chat"]},
            ],
            "delivery": {"initial_backoff_s": 0.2, "max_backoff_s": 1, "budget_s": 60},
        }
    )
    worker.start()
    http_receiver.expect_secret(secret)
    http_receiver.fail_next(2, status=500)
    t0 = time.monotonic()
    publish(tansu_broker, make_incident("train-1", incident_id="t-1"))
    http_receiver.wait_for(1, delivered=True, path="/signed", timeout=60)
    retried_in = time.monotonic() - t0
    signed = [r for r in http_receiver.requests if r.path == "/signed"]
    assert [r.status for r in signed] == [500, 500, 200]
    assert {r.webhook_id for r in signed} == {"t-1:1"}
    assert all(r.signature_valid for r in signed)

    http_receiver.expect_secret(None)
    http_receiver.answer_next(404)
    publish(tansu_broker, make_incident("train-2", incident_id="t-2", class_="nccl_timeout"))  # -> chat: 404
    [record] = read_topic(tansu_broker, DEADLETTER, expect=1, timeout=60)
    dead = json.loads(record.value)
    assert dead["delivery_id"] == "t-2:1" and dead["reason"] == "final answer 404"
    assert dead["incident"]["incident_id"] == "t-2"
    assert "ChatPathSecret" not in record.value.decode()
    # Partitions are processed independently, so these two go after the dead letter is written.
    publish(
        tansu_broker,
        make_incident("other-1", incident_id="o-1"),  # matches no route
        make_incident("train-3", incident_id="t-3"),  # the sink went on after the dead letter
    )
    http_receiver.wait_for(2, delivered=True, path="/signed", timeout=60)
    time.sleep(2)
    assert ids_at(http_receiver, "/signed") == ["t-1:1", "t-1:1", "t-1:1", "t-3:1"]
    assert ids_at(http_receiver, "/services/T9/B9/ChatPathSecret") == ["t-2:1"]
    assert_no_secrets(worker.log_text(), secret, "ChatPathSecret", TOKEN)
    print(f"\n500, 500, 200 through the worker: delivered {retried_in:.2f}s after publishing")


def test_a_second_worker_joins_mid_retry_uses_the_registration_and_nothing_is_sent_twice(
    tansu_broker: str, http_receiver: HttpReceiver, sink_worker: Any, tmp_path: Path
) -> None:
    """Receiver down, 6 incidents on 2 partitions, the first worker retrying one of them (all 6 queued
    with their pending deliveries in the table); a second worker joins (rebalance: one partition moves,
    and its pending deliveries with it). Once the receiver is back every incident is delivered exactly
    once: none stranded in the buffers the rebalance clears or left behind with the partition, none sent
    twice."""
    first = sink_worker(
        {"delivery": {"initial_backoff_s": 0.5, "max_backoff_s": 2, "budget_s": 180, "max_attempts": 500, "timeout_s": 2}}
    )
    first.start()
    second = SinkWorker(first.config, tmp_path / "worker-2.log")
    try:
        assert first.api("PUT", "job-m", {"url": http_receiver.url("/m")})[0] == 201
        http_receiver.go_down()
        publish(tansu_broker, *[make_incident("job-m", incident_id=f"m-{i}") for i in range(6)])
        time.sleep(3)  # the first worker is retrying one of them
        second.start()  # rebalance: one partition moves, possibly the one being retried
        assert [w["target"] for w in second.api("GET", "job-m")[1]["webhooks"]] == [http_receiver.url("/m")]
        time.sleep(5)
        http_receiver.come_up()
        http_receiver.wait_for(6, delivered=True, timeout=60)
        time.sleep(3)  # a duplicate would have arrived by now
        expected = [f"m-{i}:1" for i in range(6)]
        # Exactly once: 6 deliveries, each id once, and no other request while the receiver was up.
        assert sorted(r.webhook_id or "" for r in http_receiver.delivered()) == expected
        assert sorted(r.webhook_id or "" for r in http_receiver.requests) == expected
        # The first worker queued all six at once (no incident waits behind another's retries); the moved
        # partition's pending deliveries went with the partition, and its new owner delivered them.
        queued = [w.log_text().count("notification(s) queued") for w in (first, second)]
        delivered = [w.log_text().count(" delivered to ") for w in (first, second)]
        abandoned = first.log_text().count("moved to another worker")
        print(f"\ntwo workers, rebalance mid-retry: incidents queued {queued[0]} + {queued[1]}, delivered "
              f"{delivered[0]} + {delivered[1]}, {abandoned} in-flight delivery handed over; all 6 delivered once")
        assert queued[0] == 6
        assert all(delivered), "both workers should own a partition of the incidents topic and deliver its share"
    finally:
        second.stop()


def test_a_destination_that_gave_up_keeps_its_deliveries_across_a_restart(
    tansu_broker: str, http_receiver: HttpReceiver, sink_worker: Any
) -> None:
    """Job A's receiver refuses connections until its retries run out: the delivery is dead-lettered as
    kept and stays pending (the webhook-pending table). The worker restarts meanwhile; once A's receiver is
    back, A is notified once. Job B, on a live receiver, was notified at once and is not notified again."""
    dead = HttpReceiver(port=free_port())
    worker = sink_worker({
        "delivery": {"initial_backoff_s": 0.2, "max_backoff_s": 0.5, "budget_s": 3, "timeout_s": 2},
        "dead_retry_interval_s": 1,
    })
    worker.start()
    assert worker.api("PUT", "job-a", {"url": dead.url("/a")})[0] == 201
    assert worker.api("PUT", "job-b", {"url": http_receiver.url("/b")})[0] == 201
    publish(tansu_broker, make_incident("job-a", incident_id="a-1"), make_incident("job-b", incident_id="b-1"))
    http_receiver.wait_for(1, delivered=True, path="/b", timeout=60)
    [record] = read_topic(tansu_broker, DEADLETTER, expect=1, timeout=60)
    letter = json.loads(record.value)
    assert letter["delivery_id"] == "a-1:1" and letter["kept"] is True and "kept pending" in letter["reason"]
    deadline = time.monotonic() + 30
    while (delivery := worker.api("GET", "job-a")[1]["webhooks"][0]["delivery"] or {}).get("state") != "dead":
        assert time.monotonic() < deadline, delivery
        time.sleep(0.3)
    assert delivery["pending"] == 1 and "connect failed" in delivery["last_error"] and delivery["next_retry_at"]

    worker.stop()
    worker.start()
    dead.come_up()
    try:
        [notified] = dead.wait_for(1, delivered=True, path="/a", timeout=60)
        time.sleep(3)  # a duplicate would have arrived by now
        assert [r.webhook_id for r in dead.requests] == ["a-1:1"]
    finally:
        dead.stop()
    assert ids_at(http_receiver, "/b") == ["b-1:1"]
    assert "pending deliveries queued again" in worker.log_text()
    print(f"\ngave up, restarted, receiver back: notified once ({notified.webhook_id})")
