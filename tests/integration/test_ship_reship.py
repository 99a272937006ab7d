"""Re-shipping is never silent: `rootrank ship` keeps its positions per Kafka cluster (and checks that the
topic still holds what it shipped), so the same file reaches a fresh stack, and shipping it twice to one
stack says why nothing was sent."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from correlator.tooling.embedded import free_port
from tests.fixtures.kafka import BrokerAddress, create_topics, read_topic, start_noida, start_tansu

pytestmark = pytest.mark.integration

TOPIC = "rootrank.logs"
LINES = 300


def _ship(bootstrap: str, cwd: Path, log: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOTRANK_") and not k.lower().endswith("_proxy")}
    env["ROOTRANK_CONTEXT"] = str(cwd / "no-context.json")  # no running `rootrank up` is taken for the target
    return subprocess.run(
        [sys.executable, "-m", "correlator.cli", "ship", "--bootstrap", bootstrap, "--job", "reship",
         "--linger-ms", "100", "--progress", "never", "--file", str(log), *extra],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False)


def _lines_in_topic(bootstrap: str) -> int:
    import orjson

    from ingest.ship.wire_format import parse_batch

    return sum(len(parse_batch(orjson.loads(r.value)).lines) for r in read_topic(bootstrap, TOPIC, idle_s=1.0))


def _fresh(start: Callable[[Path, int | None], BrokerAddress], workdir: Path, port: int) -> BrokerAddress:
    broker = start(workdir, port)
    create_topics(broker, [TOPIC], partitions=2)
    return broker


@pytest.mark.parametrize("start", [start_noida, start_tansu], ids=["noida-db", "tansu"])
def test_the_same_file_shipped_to_two_fresh_stacks_reaches_both(
    start: Callable[[Path, int | None], BrokerAddress], tmp_path: Path
) -> None:
    """Two fresh stacks on the same address, one after the other (a `rootrank up`, stopped, and a new one):
    noida-db gives every instance the same cluster id and no topic ids, Tansu the same cluster id and new
    topic ids; either way the second stack gets the file too, and the shipper says why it sends it again."""
    log = tmp_path / "rank0.log"
    log.write_text("".join(f"[rank0]: step {i} loss 2.{i % 97:02d}\n" for i in range(LINES)))
    port = free_port()
    for stack in ("first", "second"):
        broker = _fresh(start, tmp_path / stack, port)
        try:
            run = _ship(broker, tmp_path, log)
            assert run.returncode == 0, run.stderr
            assert f"{LINES} lines in" in run.stderr, run.stderr
            assert _lines_in_topic(broker) == LINES
            if stack == "second" and start is start_noida:
                assert "no longer holds the lines shipped at" in run.stderr, run.stderr
        finally:
            broker.stop()


def test_shipping_a_file_twice_to_one_stack_says_why_nothing_was_sent(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("".join(f"[rank0]: step {i} loss 2.{i % 97:02d}\n" for i in range(LINES)))
    broker = _fresh(start_noida, tmp_path / "stack", free_port())
    try:
        first = _ship(broker, tmp_path, log)
        assert first.returncode == 0 and f"{LINES} lines in" in first.stderr, first.stderr
        again = _ship(broker, tmp_path, log)
        assert again.returncode == 0, again.stderr
        assert f"{log}: already shipped up to line {LINES} at " in again.stderr, again.stderr
        assert "; --from-start sends it again" in again.stderr
        assert "0 lines in 0 messages" in again.stderr
        assert _lines_in_topic(broker) == LINES
        forced = _ship(broker, tmp_path, log, "--from-start")
        assert forced.returncode == 0 and f"{LINES} lines in" in forced.stderr, forced.stderr
        assert "already shipped" not in forced.stderr
        assert _lines_in_topic(broker) == 2 * LINES
    finally:
        broker.stop()
