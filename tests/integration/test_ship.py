"""`rootrank ship` against a real broker (noida-db: persistent, restartable): wrapping a command,
following files through rotation and truncation, resuming from the saved position, reading stdin,
and losing no line while the broker restarts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from ingest.ship.wire_format import parse_batch
from tests.fixtures.kafka import REPO, BrokerAddress, create_topics, read_topic

pytestmark = pytest.mark.integration

TOPIC = "rootrank.logs"


def ship_cmd(bootstrap: str, state: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "correlator.cli", "ship", "--bootstrap", bootstrap, "--state-dir", str(state),
            "--linger-ms", "100", *args]


def ship_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ROOTRANK_") and not k.lower().endswith("_proxy")}


def shipped_lines(bootstrap: str, topic: str = TOPIC, **read: Any) -> list[tuple[dict[str, Any], int, str]]:
    """(batch header, line number in its stream, text) for every line in the topic."""
    out = []
    for record in read_topic(bootstrap, topic, **read):
        batch = orjson.loads(record.value)
        header = {k: v for k, v in batch.items() if k not in ("lines", "text", "ts", "stream")}
        for index, (_ts, _stream, text) in enumerate(parse_batch(batch).lines):
            out.append((header, batch["offset"] + index, text))
    return out


@pytest.fixture
def broker(noida_kafka: BrokerAddress) -> BrokerAddress:
    create_topics(noida_kafka, [TOPIC], partitions=2)
    return noida_kafka


def test_wrapped_command_passes_through_and_ships_tagged_lines(broker: BrokerAddress, tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import sys
        for i in range(500):
            print(f"[rank{i % 4}]: out line {i}")
            if i % 100 == 0:
                print(f"err line {i}", file=sys.stderr)
        sys.stdout.write("no newline at the end")
        sys.exit(3)
    """)
    bare = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=False)
    wrapped = subprocess.run(ship_cmd(broker, tmp_path / "state", "--job", "wrapjob", "--host", "node-w", "--rank", "5",
                                      "--", sys.executable, "-c", script),
                             cwd=REPO, env=ship_env(), capture_output=True, timeout=120, check=False)
    assert wrapped.returncode == bare.returncode == 3
    assert wrapped.stdout == bare.stdout  # byte for byte, through unchanged
    assert wrapped.stderr.startswith(bare.stderr)  # then our one-line summary
    assert b"0 still spooled" in wrapped.stderr

    lines = shipped_lines(broker, expect=None, idle_s=1.0)
    headers = {(h["job_id"], h["host"], h["rank"]) for h, _, _ in lines}
    assert headers == {("wrapjob", "node-w", 5)}
    stdout_lines = sorted((n, t) for h, n, t in lines if t.startswith(("[rank", "no newline")))
    assert [t for _, t in stdout_lines] == [f"[rank{i % 4}]: out line {i}" for i in range(500)] + ["no newline at the end"]
    assert sorted(t for _, _, t in lines if t.startswith("err")) == sorted(f"err line {i}" for i in range(0, 500, 100))


def test_stdin_is_shipped(broker: BrokerAddress, tmp_path: Path) -> None:
    data = "".join(f"stdin line {i}\n" for i in range(1000)).encode()
    result = subprocess.run(ship_cmd(broker, tmp_path / "state", "--job", "stdinjob"), input=data, cwd=REPO,
                            env=ship_env(), capture_output=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    lines = shipped_lines(broker, expect=None, idle_s=1.0)
    assert sorted(n for _, n, _ in lines) == list(range(1000))
    assert {t for _, _, t in lines} == {f"stdin line {i}" for i in range(1000)}


def test_follow_survives_rotation_and_truncation_and_resumes(broker: BrokerAddress, tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    state = tmp_path / "state"
    log.write_text("".join(f"gen1 line {i}\n" for i in range(100)))
    cmd = ship_cmd(broker, state, "--job", "followjob", "--file", str(log), "--follow")
    ship = subprocess.Popen(cmd, cwd=REPO, env=ship_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def count() -> int:
            return len(shipped_lines(broker, expect=None, idle_s=0.5, timeout=5))

        _wait(lambda: count() >= 100, "the first 100 lines")
        with log.open("a") as f:  # appended while followed; the last one without its newline yet
            f.write("".join(f"gen1 line {i}\n" for i in range(100, 150)) + "gen1 line 150")
        time.sleep(0.5)
        with log.open("a") as f:
            f.write("\n")
        _wait(lambda: count() >= 151, "the appended lines")
        log.rename(tmp_path / "rank0.log.1")  # rotation: a new file under the same name
        log.write_text("".join(f"gen2 line {i}\n" for i in range(40)))
        _wait(lambda: count() >= 191, "the lines of the rotated-in file")
        log.write_text("gen3 line 0\n")  # truncated in place (copytruncate), shorter than before
        _wait(lambda: count() >= 192, "the line after truncation")
    finally:
        ship.terminate()
        _, err = ship.communicate(timeout=60)
    assert ship.returncode == 0, err

    # Stopped; more lines arrive; a new shipper resumes from the saved position: nothing twice.
    with log.open("a") as f:
        f.write("".join(f"gen3 line {i}\n" for i in range(1, 30)))
    resumed = subprocess.run(cmd[:-1], cwd=REPO, env=ship_env(), capture_output=True, timeout=120,  # no --follow
                             check=False)
    assert resumed.returncode == 0, resumed.stderr
    texts = Counter(t for _, _, t in shipped_lines(broker, expect=None, idle_s=1.0))
    want = ([f"gen1 line {i}" for i in range(151)] + [f"gen2 line {i}" for i in range(40)]
            + [f"gen3 line {i}" for i in range(30)])
    assert sorted(texts) == sorted(want)
    assert max(texts.values()) == 1, [t for t, n in texts.items() if n > 1]


@pytest.mark.parametrize("send_timeout,down_s", [(30.0, 2.0), (1.0, 4.0)], ids=["producer-retries", "disk-spool"])
def test_ship_loses_no_line_across_a_broker_restart(broker: BrokerAddress, tmp_path: Path, send_timeout: float,
                                                    down_s: float) -> None:
    """Short outage: the producer's own retries carry the lines over. Outage longer than the send
    timeout: the messages go to the disk spool and are drained, in order, once the broker is back."""
    total = 20_000
    script = textwrap.dedent(f"""
        import sys, time
        for i in range({total}):
            print(f"[rank{{i % 8}}]: iteration {{i}} loss 2.{{i % 97:02d}}", flush=(i % 50 == 0))
            if i % 50 == 0:
                time.sleep(0.015)
    """)
    ship = subprocess.Popen(ship_cmd(broker, tmp_path / "state", "--job", "restartjob", "--send-timeout", str(send_timeout),
                                     "--", sys.executable, "-c", script),
                            cwd=REPO, env=ship_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)
        down_at = time.time()
        broker.restart(down_s=down_s)  # mid-stream: the broker goes away and comes back
        up_at = time.time()
        _, err = ship.communicate(timeout=180)
    finally:
        if ship.poll() is None:
            ship.kill()
    assert ship.returncode == 0, err
    records = read_topic(broker, TOPIC, expect=None, idle_s=2.0, timeout=60)
    # Batches were made while the broker was down, and delivered after: the outage was real.
    assert any(down_at * 1000 < r.timestamp < up_at * 1000 for r in records)
    lines = shipped_lines(broker, expect=None, idle_s=2.0, timeout=60)
    numbers = Counter(n for _, n, _ in lines)
    missing = sorted(set(range(total)) - set(numbers))
    duplicates = sum(c - 1 for c in numbers.values())
    summary = err.decode().strip().splitlines()[-1]
    print(f"\nsent {total} lines across a {down_s:.0f} s broker restart: {len(numbers)} distinct received, "
          f"{len(missing)} missing, {duplicates} duplicates (at-least-once); {summary}")
    if send_timeout < down_s:
        # The outage outlasted the send timeout: batches must have gone through the disk spool.
        spooled = re.search(rb"(\d+) went through the spool", err)
        assert spooled and int(spooled.group(1)) > 0, err
    assert not missing, missing[:20]
    assert {t for _, _, t in lines} == {f"[rank{i % 8}]: iteration {i} loss 2.{i % 97:02d}" for i in range(total)}


def _wait(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)
