"""Scale of state: many concurrent jobs x ranks, millions of lines, in one correlating process.

Drives the correlate agent's work in-process, without Kafka: per batch of a job's lines,
`SignalExtractor.from_events` (one hyperscan scan per batch), then exactly what the correlate agent
does with the signals (JobCorrelator.apply on a JobEntry read from and written back to a dict
standing for the faust Table, as JSON-able dicts like the table holds), and at the end every job's
quiet window is closed (Engine.diagnose). The jobs advance together, round by round, so all of them
are open at once. Each job: chatter from every rank (lines that hit no rule), one rank runs out of GPU
memory, then every other rank reports the NCCL watchdog timeout, and keeps repeating it.

The main run's chatter hits no rule (signals come from the failures only); a second, smaller run
uses real chatter, where training-step lines hit progress-marker and metric rules, and reports how
many signals per line that makes and what that does to state and correlation cost.

Figures, each against a reference of the same run:
- process RSS per round (reference: RSS before any job state existed), and its growth from the round
  after the last new signal to the end (flat = the lines after that add nothing);
- doubling: the same jobs and the same failure signals with twice the chatter lines: matching time
  should double, correlation time should not (ratio of the two ratios).

Run: python -m benchmarks.bench_state [--jobs 1000] [--ranks 64] [--lines 10000000] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from benchmarks.common import process_rss_mb
from benchmarks.synthetic import CHATTER

TARGET_RSS_MB = 500.0

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity "
       "of 79.14 GiB of which 1.19 GiB is free.")
TIMEOUT = ("[E ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation timeout: "
           "WorkNCCL(SeqNum=9921, OpType=ALLREDUCE, NumelIn=50331648, NumelOut=50331648, Timeout(ms)=600000) "
           "ran for 600089 milliseconds before timing out.")
BATCH_LINES = 500  # the match agent's batch size (EngineSettings.batch_size)


def chatter_pool(extractor: Any, size: int = 4096, *, silent: bool = False) -> list[Any]:
    """Chatter events shared by every job. `silent`: only lines that hit no rule at all (a metric
    or progress pattern makes some chatter lines signals too: sampled per block, they follow lines)."""
    from ingest.event import LogEvent

    rng = random.Random(7)
    out: list[Any] = []
    while len(out) < size:
        r = rng.randrange(512)
        text = rng.choice(CHATTER).format(
            r=r, lr=r % 8, md="0314", hms=f"09:{rng.randrange(60):02d}:{rng.randrange(60):02d}",
            us=rng.randrange(10**6), s=len(out), loss=rng.random() * 3, g=rng.random() * 2,
            host=f"gpu-node-{r // 8:03d}", pid=30000 + r, tid=31000 + r, gpu=r % 8, c=rng.randrange(24),
            e=rng.randrange(9), p=rng.randrange(100), mm=rng.randrange(60), ss=rng.randrange(60), ms=rng.randrange(1000))
        # The writer's identity stays within a 64-rank job (8 hosts x 8 GPUs), whatever rank the text names.
        out.append(LogEvent.model_construct(job_id="chatter", host=f"gpu-node-{(r % 64) // 8:03d}", rank=r % 64,
                                            line=text, source="bench", offset=len(out)))
    if not silent:
        return out
    return [e for e in out if not extractor.matcher.scan_buffer(e.line.encode())]


def failure_events(job: str, ranks: int, t0: float, round_index: int, oom_round: int) -> list[Any]:
    """The job's failure lines in this round: the OOM on rank 11 % ranks, then timeouts on every other rank."""
    from ingest.event import LogEvent

    culprit = 11 % ranks
    out = []
    if round_index == oom_round:
        out.append(LogEvent.model_construct(
            job_id=job, host=f"{job}-node-{culprit // 8}", rank=culprit, local_rank=culprit % 8, pid=40000 + culprit,
            ts=datetime.fromtimestamp(t0, tz=UTC), line=OOM.format(gpu=culprit % 8), source="bench",
            offset=round_index * 10_000))
    elif round_index in (oom_round + 1, oom_round + 3):  # the watchdog reports, then repeats itself
        at = datetime.fromtimestamp(t0 + 600 + round_index, tz=UTC)
        out.extend(LogEvent.model_construct(
            job_id=job, host=f"{job}-node-{rank // 8}", rank=rank, local_rank=rank % 8, pid=40000 + rank,
            ts=at, line=TIMEOUT.format(rank=rank), source="bench", offset=round_index * 10_000 + rank)
            for rank in range(ranks) if rank != culprit)
    return out


@dataclass
class RunResult:
    lines: int = 0
    signals: int = 0
    match_s: float = 0.0
    correlate_s: float = 0.0
    close_s: float = 0.0
    incidents: int = 0
    right_initiator: int = 0
    rss_rounds: list[float] = field(default_factory=list)
    last_failure_round: int = 0
    state_json_bytes: int = 0


@dataclass
class Parts:
    """Built once, before the RSS baseline: the rule set, the matcher and the chatter lines."""

    extractor: Any
    correlator: Any
    pool: list[Any]
    silent_pool: list[Any]

    @classmethod
    def build(cls) -> Parts:
        from correlator.diagnosis.engine import Engine
        from correlator.diagnosis.rules import load_ruleset
        from correlator.diagnosis.signals import SignalExtractor
        from correlator.stream.agents.correlate import JobCorrelator

        ruleset = load_ruleset()
        extractor = SignalExtractor(ruleset)
        correlator = JobCorrelator(Engine(ruleset), quiet_window_s=20.0)
        return cls(extractor, correlator, chatter_pool(extractor), chatter_pool(extractor, silent=True))


def run(parts: Parts, jobs: int, ranks: int, lines_per_job: int, *, sample_rss: bool = True,
        silent: bool = False) -> RunResult:
    from correlator.stream.agents.correlate import Decoded, JobEntry, signal_digest
    from correlator.stream.agents.match import signal_to_bytes

    extractor, correlator = parts.extractor, parts.correlator
    pool = parts.silent_pool if silent else parts.pool
    table: dict[bytes, dict[str, Any]] = {}  # what the faust Table holds: job id -> entry dict
    result = RunResult()
    rounds = max(1, lines_per_job // BATCH_LINES)
    oom_round = min(2, rounds - 1)
    result.last_failure_round = min(oom_round + 3, rounds - 1)
    t0 = time.time() - 3600
    cursor = 0
    gc.collect()
    for round_index in range(rounds):
        for j in range(jobs):
            job = f"job-{j:05d}"
            chatter = pool[cursor : cursor + BATCH_LINES]
            cursor = (cursor + BATCH_LINES) % (len(pool) - BATCH_LINES)
            batch = chatter + failure_events(job, ranks, t0 + j, round_index, oom_round)
            t = time.perf_counter()
            signals = extractor.from_events(batch, order_base=round_index * 1_000_000)
            t2 = time.perf_counter()
            result.match_s += t2 - t
            result.lines += len(batch)
            if not signals:
                continue
            result.signals += len(signals)
            key = job.encode()
            entry = JobEntry.from_dict(job, table.get(key))
            items = []
            for signal in signals:
                raw = signal_to_bytes(signal)
                items.append(Decoded(job_id=job, signal=signal, digest=signal_digest(raw)))
            correlator.apply(entry, items, now=t0 + 700 + round_index, partition=0)
            table[key] = entry.to_dict()
            result.correlate_s += time.perf_counter() - t2
        if sample_rss:
            result.rss_rounds.append(process_rss_mb())
    t = time.perf_counter()
    for key, data in table.items():
        entry = JobEntry.from_dict(key.decode(), data)
        incidents = correlator.close(entry, t0 + 10_000)
        table[key] = entry.to_dict()
        result.incidents += len(incidents)
        if incidents and incidents[0].class_ == "cuda_oom" and incidents[0].initiator.rank == 11 % ranks:
            result.right_initiator += 1
    result.close_s = time.perf_counter() - t
    result.state_json_bytes = sum(len(orjson.dumps(v)) for v in table.values())
    if sample_rss:
        result.rss_rounds.append(process_rss_mb())
    return result


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--lines", type=int, default=10_000_000, help="chatter lines over all jobs")
    parser.add_argument("--double-jobs", type=int, default=100, help="jobs in the doubling comparison")
    parser.add_argument("--double-lines", type=int, default=4000, help="lines per job before doubling")
    parser.add_argument("--real-jobs", type=int, default=50, help="jobs in the run with real chatter")
    parser.add_argument("--real-lines", type=int, default=3000, help="lines per job in the run with real chatter")
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.ranks, args.lines, args.double_jobs, args.double_lines = 20, 16, 60_000, 5, 3000
        args.real_jobs, args.real_lines = 3, 3000

    parts = Parts.build()  # before the baseline, so the baseline has the code, rules and matcher in it
    run(parts, 2, args.ranks, 6 * BATCH_LINES, sample_rss=False)  # warm-up: lazily compiled regexes, caches
    gc.collect()
    baseline = process_rss_mb()
    t = time.perf_counter()
    big = run(parts, args.jobs, args.ranks, args.lines // args.jobs, silent=True)
    wall = time.perf_counter() - t
    peak = max(big.rss_rounds)
    settled = big.rss_rounds[min(big.last_failure_round + 1, len(big.rss_rounds) - 1)]
    growth = (big.rss_rounds[-1] - settled) / settled * 100.0
    print(f"[state] {args.jobs} jobs x {args.ranks} ranks, {big.lines:,} lines, {big.signals:,} signals in {wall:.0f}s; "
          f"{big.incidents} incidents, initiator right in {big.right_initiator}/{args.jobs}")
    print(f"  RSS per round (MB): {' '.join(f'{x:.0f}' for x in big.rss_rounds)}")
    print(f"  worker RSS peak {peak:.0f} MB (reference: {baseline:.0f} MB before any job state; state adds "
          f"{peak - baseline:.0f} MB = {(peak - baseline) * 1024 / args.jobs:.0f} KB per job); target < {TARGET_RSS_MB:.0f} MB: "
          f"{'met' if peak < TARGET_RSS_MB else 'NOT met'}")
    print(f"  RSS growth after the last failure line (round {big.last_failure_round + 2} -> end, chatter only): {growth:+.1f}% "
          f"({'flat' if abs(growth) < 5 else 'NOT flat'})")
    print(f"  time: matching {big.match_s:.1f}s ({big.lines / big.match_s:,.0f} lines/s), correlation "
          f"{big.correlate_s:.1f}s ({big.correlate_s / max(big.signals, 1) * 1e6:.0f} us per signal), "
          f"closing {args.jobs} windows {big.close_s:.1f}s ({big.close_s / args.jobs * 1e3:.1f} ms per job)")

    one = run(parts, args.double_jobs, args.ranks, args.double_lines, sample_rss=False, silent=True)
    two = run(parts, args.double_jobs, args.ranks, args.double_lines * 2, sample_rss=False, silent=True)
    match_ratio = two.match_s / one.match_s
    corr_one, corr_two = one.correlate_s + one.close_s, two.correlate_s + two.close_s
    corr_ratio = corr_two / corr_one
    print(f"  doubling lines at equal signals ({args.double_jobs} jobs): lines x{two.lines / one.lines:.2f}, "
          f"signals x{two.signals / max(one.signals, 1):.2f} -> matching time x{match_ratio:.2f} "
          f"(reference), correlation time x{corr_ratio:.2f} ({corr_one:.2f}s -> {corr_two:.2f}s)")
    print(f"  ratio correlation-growth / matching-growth = {corr_ratio / match_ratio:.2f} "
          f"(1.0 would mean correlation grows with lines; 0.5 with signals only)")
    # Real chatter: training-step lines hit progress-marker and metric rules, so some become signals too.
    real = run(parts, args.real_jobs, args.ranks, args.real_lines)
    # RSS freed by the main run is reused here, so the real run's state is sized by its JSON (what the
    # table's changelog holds), scaled by the main run's measured RSS per JSON byte.
    real_json_kb = real.state_json_bytes / 1024 / args.real_jobs
    big_json_kb = big.state_json_bytes / 1024 / args.jobs
    rss_per_json = (peak - baseline) / (big.state_json_bytes / 1024 / 1024) if big.state_json_bytes else float("nan")
    projected = baseline + real_json_kb * args.jobs / 1024 * rss_per_json
    per_job_kb = real_json_kb * rss_per_json
    print(f"  job state as JSON: {big_json_kb:.0f} KB per job (main run; RSS {rss_per_json:.1f} MB per JSON MB)")
    print(f"  with real chatter ({args.real_jobs} jobs x {args.ranks} ranks, {real.lines:,} lines): {real.signals:,} "
          f"signals = {real.signals / real.lines:.2f} per line (reference: {big.signals / big.lines:.4f} per line from "
          f"failures alone); correlation {real.correlate_s / max(real.signals, 1) * 1e6:.0f} us per signal; state "
          f"{real_json_kb:.0f} KB JSON per job = {real_json_kb / big_json_kb:.1f}x the main run's -> {args.jobs} jobs "
          f"~ {projected:.0f} MB RSS projected; target < {TARGET_RSS_MB:.0f} MB: "
          f"{'met' if projected < TARGET_RSS_MB else 'NOT met'}")
    return {
        "real_signals_per_line": real.signals / real.lines, "real_state_kb_per_job": per_job_kb,
        "real_correlate_us_per_signal": real.correlate_s / max(real.signals, 1) * 1e6,
        "lines": float(big.lines), "signals": float(big.signals), "rss_baseline_mb": baseline, "rss_peak_mb": peak,
        "rss_growth_after_signals_pct": growth, "match_s": big.match_s, "correlate_s": big.correlate_s,
        "close_s": big.close_s, "incidents": float(big.incidents), "right_initiator": float(big.right_initiator),
        "double_match_ratio": match_ratio, "double_correlate_ratio": corr_ratio,
    }


if __name__ == "__main__":
    main()
