"""One job's broken webhook never delays another's (issue 31), through the real stack `rootrank up` runs:
logs shipped with `rootrank ship`, matched, correlated (a 3 s quiet window), and notified.

Job A's webhook points at a port nothing listens on; job B's at a live receiver. A's incident is notified
first and its delivery starts retrying; then B's job breaks. B's notification must arrive while A is still
in its retries: under head-of-line blocking it could only arrive once A's retries ran out (A's budget here
is 45 s, against a quiet window of 3 s), so the check is A's state when B arrives, not a stopwatch. Then A's
retries run out (dead-lettered, kept, shown by `rootrank webhooks list` and the metric), a receiver starts
on A's port, and A's notification arrives once.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.http_receiver import HttpReceiver, free_port
from tests.integration.operator_support import Shell, new_user_shell

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUIET_WINDOW_S = 3.0
BUDGET_S = 45.0
DEAD_RETRY_INTERVAL_S = 2.0


def _noida_available() -> bool:
    from correlator.tooling.embedded import noida_binary

    return noida_binary() is not None


def delivery_of(sh: Shell, job: str) -> dict[str, Any]:
    listed = sh.run(f"rootrank webhooks list --job {job} --format json", check=True).stdout
    [view] = [json.loads(line) for line in listed.splitlines() if line.strip()]
    return view.get("delivery") or {}


def wait_for_state(sh: Shell, job: str, state: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        delivery = delivery_of(sh, job)
        if delivery.get("state") == state:
            return delivery
        assert time.monotonic() < deadline, f"{job}'s webhook never {state}: {delivery}\n{sh.up_log()}"
        time.sleep(0.5)


@pytest.mark.skipif(not _noida_available(), reason="noida-db is not installed (make install)")
def test_a_dead_receiver_on_job_a_never_delays_job_b(tmp_path: Path, http_receiver: HttpReceiver) -> None:
    dead_port = free_port()
    config = tmp_path / "up.yaml"
    config.write_text(yaml.safe_dump({
        "engine": {"quiet_window_s": QUIET_WINDOW_S},
        "webhooks": {
            "delivery": {"initial_backoff_s": 2, "max_backoff_s": 4, "budget_s": BUDGET_S, "max_attempts": 100,
                         "timeout_s": 2},
            "dead_retry_interval_s": DEAD_RETRY_INTERVAL_S,
        },
    }))
    with new_user_shell(tmp_path) as sh:
        ports = sh.start_up("--config", str(config), "--loglevel", "info")
        web_port = int(ports.split("--web-port ")[1].split()[0])
        sh.run(f"rootrank webhooks add --job job-a http://127.0.0.1:{dead_port}/a", check=True)
        sh.run(f"rootrank webhooks add --job job-b {http_receiver.url('/b')}", check=True)
        assert delivery_of(sh, "job-a") == {}  # nothing to deliver yet
        sh.run("rootrank simulate --demo --out sim", check=True)

        sh.run("rootrank ship --job job-a --host-from dir --file 'sim/*/*/*.log'", check=True)
        retrying = wait_for_state(sh, "job-a", "retrying", timeout=180)
        assert "connect failed" in retrying["last_error"] and retrying["next_retry_at"]

        sh.run("rootrank ship --job job-b --host-from dir --file 'sim/*/*/*.log'", check=True)
        shipped_b = time.time()
        [notified_b] = http_receiver.wait_for(1, delivered=True, path="/b", timeout=BUDGET_S * 2)
        a_when_b_arrived = delivery_of(sh, "job-a")
        b_delay = notified_b.received_at - shipped_b
        print(f"\njob B notified {b_delay:.1f}s after its logs were shipped (quiet window {QUIET_WINDOW_S:.0f}s "
              f"+ 5 s = {QUIET_WINDOW_S + 5:.0f}s); job A then: {a_when_b_arrived['state']}, "
              f"last error {a_when_b_arrived['last_error']}")
        # Under head-of-line blocking B would have waited for A's retries to run out (45 s, then dead).
        assert a_when_b_arrived["state"] == "retrying" and a_when_b_arrived["dead_lettered"] == 0
        assert json.loads(notified_b.body)["data"]["incident"]["job_id"] == "job-b"

        dead = wait_for_state(sh, "job-a", "dead", timeout=BUDGET_S * 3)
        assert dead["pending"] == 1 and dead["dead_lettered"] == 1 and dead["dead_since"] and dead["next_retry_at"]
        text = sh.run("rootrank webhooks list --job job-a", check=True).stdout
        assert "dead since" in text and "next retry" in text and "connect failed" in text, text
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics", timeout=10) as response:
            scraped = response.read().decode()
        assert 'rootrank_webhook_destinations{state="dead"} 1.0' in scraped
        assert "rootrank_webhook_pending_deliveries 1.0" in scraped

        revived = HttpReceiver(port=dead_port).start()
        came_up = time.time()
        try:
            [notified_a] = revived.wait_for(1, delivered=True, path="/a", timeout=60)
            time.sleep(2 * DEAD_RETRY_INTERVAL_S)  # nothing more may follow: one incident, one notification
            assert len(revived.requests) == 1
        finally:
            revived.stop()
        assert json.loads(notified_a.body)["data"]["incident"]["job_id"] == "job-a"
        after = delivery_of(sh, "job-a")
        assert after["state"] == "ok" and after["pending"] == 0 and after["delivered"] == 1
        assert len(http_receiver.delivered("/b")) == 1
        print(f"job A's receiver back: notified {notified_a.received_at - came_up:.1f}s later "
              f"(retried every {DEAD_RETRY_INTERVAL_S:.0f}s once its retries had run out)")
