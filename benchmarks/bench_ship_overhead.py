"""What `rootrank ship -- COMMAND` costs the wrapped command: its wall time, bare vs wrapped.

The command is a Python process printing N realistic training-log lines as fast as it can (a worst
case: real training prints far slower). It measures its own wall time, from its first line to its
exit, and writes it to a side file, so the figure is what the wrapped process experiences.
Bare: its stdout goes through a pipe to `cat > /dev/null` (a pipe is what a wrapper replaces).
Wrapped: `rootrank ship --job bench -- COMMAND`, shipping to a real broker (noida-db started here
on a free port, or --bootstrap), stdout passed through to /dev/null. Runs alternate, median of
--repeat. Also reported: the shipper's own total time (start-up and drain included), and that
every line reached Kafka.

Run: python -m benchmarks.bench_ship_overhead [--lines 1000000] [--repeat 5] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COMMAND = textwrap.dedent("""
    import sys, time
    n, out = int(sys.argv[1]), sys.argv[2]
    t0 = time.perf_counter()
    w = sys.stdout.write
    for i in range(n):
        r = i % 64
        w(f"[rank{r}]:[I1206 18:{(i // 60000) % 60:02d}:{(i // 1000) % 60:02d}.{i % 1000:03d}000 train.py:412] "
          f"step {i // 64} loss {2 + (i % 997) / 1000:.4f} lr 3.0e-04 grad_norm {(i % 89) / 10:.3f} tokens/s 41234\\n")
    sys.stdout.flush()
    elapsed = time.perf_counter() - t0
    with open(out, "w") as f:
        f.write(repr(elapsed))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ROOTRANK_") and not k.lower().endswith("_proxy")}


def run_bare(script: Path, lines: int, work: Path) -> float:
    side = work / "bare.t"
    cmd = f"{sys.executable} {script} {lines} {side} | cat > /dev/null"
    subprocess.run(cmd, shell=True, check=True, env=_env())
    return float(side.read_text())


def run_wrapped(script: Path, lines: int, work: Path, bootstrap: str, run: int) -> tuple[float, float, str]:
    side = work / "wrapped.t"
    state = work / f"state-{run}"
    t0 = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "correlator.cli", "ship", "--bootstrap", bootstrap, "--job", f"bench-{run}",
         "--topic", f"bench.ship.{run}", "--state-dir", str(state), "--", sys.executable, str(script), str(lines), str(side)],
        cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True,
    )
    total = time.perf_counter() - t0
    return float(side.read_text()), total, result.stderr.decode().strip().splitlines()[-1]


def count_lines(bootstrap: str, topic: str, expect: int, timeout: float = 120.0) -> int:
    import orjson
    from kafka import KafkaConsumer, TopicPartition

    from ingest.ship.wire_format import parse_batch

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", max_partition_fetch_bytes=8 * 1024 * 1024)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        consumer.assign([TopicPartition(topic, p) for p in parts])
        consumer.seek_to_beginning()
        seen: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(seen) < expect and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    batch = orjson.loads(record.value)
                    seen.update(range(batch["offset"], batch["offset"] + len(parse_batch(batch).lines)))
        return len(seen)
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--bootstrap", help="a running Kafka (default: start noida-db on a free port)")
    args = parser.parse_args(argv)

    from correlator.tooling.embedded import ManagedProcess, noida_binary

    work = Path(tempfile.mkdtemp(prefix="rootrank-bench-ship-"))
    script = work / "printer.py"
    script.write_text(COMMAND)
    broker: ManagedProcess | None = None
    bootstrap = args.bootstrap
    if not bootstrap:
        binary = noida_binary()
        if binary is None:
            sys.exit("noida-db not found: pip install noida-db, or pass --bootstrap")
        port = _free_port()
        broker = ManagedProcess("noida-db", [binary, "start", "--only", "kafka", "--kafka-port", str(port), "--host",
                                             "127.0.0.1", "--data-dir", str(work / "noida")], work / "noida.log")
        broker.start(("127.0.0.1", port))
        bootstrap = f"127.0.0.1:{port}"
    try:
        bare: list[float] = []
        wrapped: list[float] = []
        totals: list[float] = []
        summary = ""
        for run in range(args.repeat):
            bare.append(run_bare(script, args.lines, work))
            w, total, summary = run_wrapped(script, args.lines, work, bootstrap, run)
            wrapped.append(w)
            totals.append(total)
            print(f"run {run + 1}: bare {bare[-1]:.3f}s  wrapped {w:.3f}s  (shipper total {total:.2f}s)", file=sys.stderr)
        received = count_lines(bootstrap, f"bench.ship.{args.repeat - 1}", args.lines)
    finally:
        if broker is not None:
            broker.stop()
    b, w = statistics.median(bare), statistics.median(wrapped)
    result = {
        "lines": float(args.lines),
        "bare_s": b,
        "wrapped_s": w,
        "overhead_pct": (w - b) / b * 100.0,
        "shipper_total_s": statistics.median(totals),
        "lines_received_last_run": float(received),
    }
    print(json.dumps(result, indent=2))
    verdict = "under" if result["overhead_pct"] < 5.0 else "OVER"
    print(f"{args.lines} lines: the wrapped command took {w:.3f}s vs {b:.3f}s bare (median of {args.repeat}): "
          f"{result['overhead_pct']:+.1f}% ({verdict} the 5% budget); the shipper finished {result['shipper_total_s']:.2f}s "
          f"after start, {received}/{args.lines} lines in Kafka. Last run: {summary}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
