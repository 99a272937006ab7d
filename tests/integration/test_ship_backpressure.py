"""`rootrank ship --file` with a backlog much larger than its spool, against a real broker (noida-db):
reading the file waits for Kafka instead of dropping lines, also while the broker is down, and a
stop while waiting leaves the rest to the next run. Every line of the file is counted in the topic."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.fixtures.kafka import REPO, BrokerAddress, create_topics
from tests.integration.test_ship import TOPIC, ship_cmd, ship_env, shipped_lines
from tests.integration.test_ship_progress import _status

pytestmark = pytest.mark.integration

MiB = 1 << 20
WAITING = "reading the files waits"


@pytest.fixture
def broker(noida_kafka: BrokerAddress) -> BrokerAddress:
    create_topics(noida_kafka, [TOPIC], partitions=2)
    return noida_kafka


def _write_log(path: Path, first: int, min_bytes: int) -> int:
    """Append numbered lines until the file grew by `min_bytes`; the number of lines written."""
    n = first
    with path.open("a") as f:
        start = f.tell()
        while f.tell() - start < min_bytes:
            f.write("".join(f"[rank{i % 8}]: step {i} loss 2.{i % 97:02d} {'x' * (i % 64)}\n" for i in range(n, n + 10_000)))
            n += 10_000
    return n - first


def _count(broker: BrokerAddress, total: int, what: str) -> tuple[int, int, int]:
    """(lines found, missing, duplicates) of the `total` numbered lines; prints the figures."""
    lines = shipped_lines(broker, expect=None, idle_s=2.0, timeout=60)
    numbers = Counter(int(text.split(" step ", 1)[1].split(" ", 1)[0]) for _, _, text in lines)
    missing = total - len(set(numbers) & set(range(total)))
    duplicates = sum(c - 1 for c in numbers.values())
    print(f"\n{what}: {total} lines sent, {len(lines)} found in the topic ({len(numbers)} distinct), "
          f"{missing} missing, {duplicates} duplicates")
    return len(lines), missing, duplicates


def _dropped(stderr: str) -> bool:
    """Anything said dropped: by the spool (lines), the progress display (bytes), the overflow file."""
    return any(word in stderr for word in ("lines dropped", "bytes dropped", "DROPPED", "NOT shipped"))


def _spool_bytes(state: Path) -> int:
    """Bytes pending in the spool: its segments' bytes after the read cursor (popped records stay in
    a segment until all of it was read)."""
    pending = 0
    for spool in state.glob("*/spool"):
        try:
            seg, off = (int(x) for x in (spool / "cursor").read_text().split())
        except (OSError, ValueError):
            seg, off = 0, 0
        for path in spool.glob("*.seg"):
            number = int(path.stem)
            if number >= seg:
                pending += path.stat().st_size - (off if number == seg else 0)
    return pending


def _wait(predicate: object, what: str, timeout: float, ship: subprocess.Popen[bytes], err: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert ship.poll() is None, err.read_text()
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {err.read_text()[-2000:]}"
        time.sleep(0.2)


def test_a_backlog_30_times_the_spool_arrives_complete(broker: BrokerAddress, tmp_path: Path) -> None:
    log, state = tmp_path / "big.log", tmp_path / "state"
    total = _write_log(log, 0, 30 * MiB)
    size = log.stat().st_size
    started = time.monotonic()
    result = subprocess.run(ship_cmd(broker, state, "--job", "bigjob", "--file", str(log), "--spool-max-mib", "1",
                                     "--progress", "always", "--progress-interval", "0.5"),
                            cwd=REPO, env=ship_env(), capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    print(f"\n{size / MiB:.1f} MiB, {total} lines, --spool-max-mib 1: shipped in {took:.1f} s; {summary}")
    assert not _dropped(result.stderr)
    assert f"rootrank ship: {total} lines in " in summary
    # The progress display counted every byte of the backlog as acknowledged, nothing as dropped.
    assert [s for s in _status(result.stderr) if s[0]] == [(True, size, size)], result.stderr
    found, missing, duplicates = _count(broker, total, "30 MiB file through a 1 MiB spool")
    assert (found, missing, duplicates) == (total, 0, 0)


def test_a_broker_outage_mid_backlog_with_a_small_spool_loses_no_line(broker: BrokerAddress, tmp_path: Path) -> None:
    """Part of the file is shipped; the broker stops; 30 MiB more are written (a backlog 30 times
    the spool, and the producer's in-flight messages fail after --send-timeout); it comes back."""
    log, state, err = tmp_path / "rank0.log", tmp_path / "state", tmp_path / "ship.err"
    first = _write_log(log, 0, 2 * MiB)
    cmd = ship_cmd(broker, state, "--job", "outagejob", "--file", str(log), "--follow", "--spool-max-mib", "1",
                   "--send-timeout", "2", "--progress", "always", "--progress-interval", "0.5")
    with err.open("w") as stderr:
        ship = subprocess.Popen(cmd, cwd=REPO, env=ship_env(), stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        _wait(lambda: "caught up" in err.read_text(), "the first part", 30, ship, err)
        broker.stop()
        down_at = time.monotonic()
        total = first + _write_log(log, first, 30 * MiB)
        size = log.stat().st_size
        _wait(lambda: WAITING in err.read_text(), "the shipper to wait for room in the spool", 30, ship, err)
        time.sleep(max(0.0, 8.0 - (time.monotonic() - down_at)))  # down for ~8 s: waiting, not dropping
        spool_peak = _spool_bytes(state)
        assert spool_peak <= MiB, spool_peak  # the spool stays within its bound
        broker.start()
        up_at = time.monotonic()

        def saved_position() -> int:
            try:
                return int(next(iter(orjson.loads(next(state.glob("*/positions.json")).read_bytes()).values()))["pos"])
            except (StopIteration, OSError, ValueError, KeyError):
                return 0

        _wait(lambda: saved_position() == size, "the whole file to be acknowledged or spooled", 60, ship, err)
        caught_up_s = time.monotonic() - up_at
    finally:
        ship.terminate()
        ship.wait(timeout=60)
    stderr_text = err.read_text()
    assert ship.returncode == 0, stderr_text
    assert not _dropped(stderr_text)
    summary = stderr_text.strip().splitlines()[-1]
    print(f"\nbroker down {up_at - down_at:.1f} s while 30 MiB were written, --spool-max-mib 1 (spool at most "
          f"{spool_peak} bytes); all saved {caught_up_s:.1f} s after it came back; {summary}")
    found, missing, duplicates = _count(broker, total, "broker outage mid-backlog, 1 MiB spool")
    assert missing == 0 and found == total + duplicates


def test_stopped_while_waiting_the_next_run_ships_the_rest(broker: BrokerAddress, tmp_path: Path) -> None:
    """SIGTERM while the broker is down and the spool full: the shipper ends promptly, exit 0, the
    saved position before what it could not ship; the next run (broker back) ships the rest."""
    log, state, err = tmp_path / "rank0.log", tmp_path / "state", tmp_path / "ship.err"
    first = _write_log(log, 0, 2 * MiB)
    cmd = ship_cmd(broker, state, "--job", "stopjob", "--file", str(log), "--spool-max-mib", "1",
                   "--send-timeout", "2", "--drain-timeout", "2", "--progress", "always", "--progress-interval", "0.5")
    with err.open("w") as stderr:
        ship = subprocess.Popen([*cmd, "--follow"], cwd=REPO, env=ship_env(), stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        _wait(lambda: "caught up" in err.read_text(), "the first part", 30, ship, err)
        broker.stop()
        total = first + _write_log(log, first, 30 * MiB)
        _wait(lambda: WAITING in err.read_text(), "the shipper to wait for room in the spool", 30, ship, err)
        stopped_at = time.monotonic()
        ship.terminate()
        ship.wait(timeout=30)
        stop_s = time.monotonic() - stopped_at
    finally:
        if ship.poll() is None:
            ship.kill()
    stderr_text = err.read_text()
    assert ship.returncode == 0, stderr_text
    assert "left for the next run" in stderr_text and not _dropped(stderr_text)
    broker.start()
    again = subprocess.run(cmd, cwd=REPO, env=ship_env(), capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    print(f"\nstopped while waiting: ended {stop_s:.1f} s after SIGTERM; {stderr_text.strip().splitlines()[-1]}\n"
          f"next run: {again.stderr.strip().splitlines()[-1]}")
    found, missing, duplicates = _count(broker, total, "stopped while waiting, then the next run")
    assert missing == 0 and found == total + duplicates
