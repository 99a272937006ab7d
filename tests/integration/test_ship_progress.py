"""`rootrank ship --progress always` against a real broker (noida-db), stderr not a terminal: plain
status lines whose acknowledged byte count reaches the backlog's total, then "caught up"; after a
restart the backlog is only what was added since; with --follow, shipping goes on live after it."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.kafka import REPO, BrokerAddress, create_topics, read_topic
from tests.integration.test_ship import TOPIC, ship_cmd, ship_env, shipped_lines

pytestmark = pytest.mark.integration

STATUS = re.compile(r"^rootrank ship: backlog (caught up: )?(\d+)/(\d+) bytes acknowledged", re.MULTILINE)


@pytest.fixture
def broker(noida_kafka: BrokerAddress) -> BrokerAddress:
    create_topics(noida_kafka, [TOPIC], partitions=2)
    return noida_kafka


def _status(stderr: str) -> list[tuple[bool, int, int]]:
    """(is the caught-up line, acknowledged, total) for every status line."""
    return [(bool(m.group(1)), int(m.group(2)), int(m.group(3))) for m in STATUS.finditer(stderr)]


def _write_log(path: Path, first: int, count: int) -> None:
    with path.open("a") as f:
        f.write("".join(f"[rank{i % 8}]: step {i} loss 2.{i % 97:02d} {'x' * (i % 64)}\n"
                        for i in range(first, first + count)))


def test_plain_status_lines_reach_the_backlog_total(broker: BrokerAddress, tmp_path: Path) -> None:
    log, state = tmp_path / "big.log", tmp_path / "state"
    _write_log(log, 0, 50_000)
    size = log.stat().st_size
    assert size > 2 << 20  # a few MiB
    cmd = ship_cmd(broker, state, "--job", "progressjob", "--file", str(log), "--progress", "always",
                   "--progress-interval", "0.2", "--batch-kib", "64")
    result = subprocess.run(cmd, cwd=REPO, env=ship_env(), capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr
    print("\n" + result.stderr)
    assert "\x1b" not in result.stderr  # not a terminal: no escape codes
    status = _status(result.stderr)
    assert status and all(total == size for _, _, total in status), status
    acked = [a for _, a, _ in status]
    assert acked == sorted(acked)  # acknowledged bytes only grow
    assert status[-1] == (True, size, size)  # caught up: every byte of the backlog acknowledged
    assert [c for c, _, _ in status].count(True) == 1
    assert "0 still spooled" in result.stderr.splitlines()[-1]
    assert len(shipped_lines(broker, expect=None, idle_s=1.0)) == 50_000

    # Restarted after more lines were written: the backlog is what was added, from the saved position.
    _write_log(log, 50_000, 2000)
    added = log.stat().st_size - size
    again = subprocess.run(cmd, cwd=REPO, env=ship_env(), capture_output=True, text=True, timeout=180, check=False)
    assert again.returncode == 0, again.stderr
    assert _status(again.stderr)[-1] == (True, added, added), again.stderr
    assert len(read_topic(broker, TOPIC, expect=None, idle_s=1.0)) > 0


def test_follow_says_caught_up_then_ships_live(broker: BrokerAddress, tmp_path: Path) -> None:
    log, err_path = tmp_path / "rank0.log", tmp_path / "ship.err"
    _write_log(log, 0, 20_000)
    size = log.stat().st_size
    cmd = ship_cmd(broker, tmp_path / "state", "--job", "followprogress", "--file", str(log), "--follow",
                   "--progress", "always", "--progress-interval", "0.2")
    with err_path.open("w") as err:
        ship = subprocess.Popen(cmd, cwd=REPO, env=ship_env(), stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while "caught up" not in err_path.read_text() and time.monotonic() < deadline:
            assert ship.poll() is None, err_path.read_text()
            time.sleep(0.2)
        caught_up = [s for s in _status(err_path.read_text()) if s[0]]
        assert caught_up == [(True, size, size)], err_path.read_text()
        assert "following live" in err_path.read_text()
        _write_log(log, 20_000, 100)  # live lines after the backlog: still shipped
        deadline = time.monotonic() + 30
        while len(shipped_lines(broker, expect=None, idle_s=0.5, timeout=5)) < 20_100:
            assert time.monotonic() < deadline, "the live lines were not shipped"
            time.sleep(0.3)
    finally:
        ship.terminate()
        ship.wait(timeout=60)
    assert ship.returncode == 0, err_path.read_text()
    assert len([s for s in _status(err_path.read_text()) if s[0]]) == 1  # said once, no status after it
