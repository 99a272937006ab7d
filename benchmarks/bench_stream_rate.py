"""Streaming at forwarder rates: one `rootrank worker` (match + correlate) against a raw aiokafka loop,
over the same Fluent Bit messages, in the same run.

The input: N one-line Fluent Bit messages (kafka output, `Format json`, no kubernetes filter, so
about 200 bytes each; see common.fluentbit_plain_value: `@timestamp` float epoch seconds -- the kafka
output's default timestamp_key --, `log` with its trailing newline, `stream`, `hostname` and `job_id`
from a record_modifier filter; the worker takes the job from `job_id`). The lines are training-shaped
(benchmarks/training_log.py's templates: about half metric/progress lines, a third NCCL and framework
chatter, the rest other INFO lines; only the templates behind torchrun's `[rankN]:` prefix), dated
from their record's time, round-robin over 64 ranks on 8 hosts (8 ranks a host), one job, one line
per rank about every 0.7 s, ending a bit before now. At the end, a failure: rank 37 (gpu-node-004,
GPU 5) dies with PyTorch's CUDA out-of-memory traceback in backward, and WATCHDOG_AFTER_S later every
other rank logs the c10d watchdog's collective timeout (default 10 min NCCL timeout: the others
waited in the gradient all-reduce rank 37 never joined). `rootrank diagnose` on the same lines (a
plain text file) must name rank 37.

Then, on a Tansu broker (as bench_end_to_end):
1. the values are produced with kafka-python (acks=all), and read back once with kafka-python doing
   nothing (bench_end_to_end.run_scenario's own reference, printed too);
2. one `rootrank worker --role match,correlate` subprocess reads the topic from the start: lines/s
   from its own counters (rootrank_lines_total), its CPU from /proc, the incident it emits (read from
   the incidents topic) -- run_scenario, unchanged, with the end-to-end benchmark's settings;
3. the reference: a raw aiokafka consumer in a `getmany` loop (no group, from the earliest offset)
   reads every message once, doing nothing but counting (common.aiokafka_consume_all): once before the
   worker and once after it, so a burst of other work on a shared machine during one of them shows as a
   spread; the faster of the two is the reference (the ratio is not flattered by a slow reading).
Targets: the worker >= 100,000 lines/s and >= 0.4x the raw aiokafka loop, and its incident names
rank 37. Nothing here is tuned for the result: the worker runs with bench_end_to_end's settings.

On a shared machine, each process gets what CPU the others leave it: the lines/s of the worker and of
the loop then depend on when each ran. Both also print their lines per CPU-second (the work they do, not
when they got a core), and their ratio: what the lines/s ratio is on a machine with a core for each.

Run: python -m benchmarks.bench_stream_rate [--messages 500000] [--ranks 64] [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.common import (
    MiB,
    aiokafka_consume_all,
    fluentbit_plain_value,
    stop_cleanly_on_sigterm,
    tansu_broker,
    text_bytes,
)
from benchmarks.training_log import CHATTER, OTHER, ROUTINE

TARGET_LINES_S = 100_000.0
TARGET_VS_RAW = 0.4

JOB = "llm-pretrain-7b-1203"
RANKS_PER_HOST = 8
INITIATOR = 37  # gpu-node-004, local rank / GPU 5
LINE_EVERY_S = 0.7  # each rank logs a line about every 0.7 s (two lines per ~1.4 s step)
WATCHDOG_TIMEOUT_MS = 600_000  # init_process_group's default NCCL timeout
WATCHDOG_AFTER_S = WATCHDOG_TIMEOUT_MS / 1000 + 0.05  # the all-reduce was enqueued as rank 37 died
END_BEFORE_NOW_S = 30.0
REPO = Path(__file__).resolve().parents[1]


def _dated(template: str) -> str:
    """A training_log template with its fixed date and hour replaced by fields, so the line's own
    time is its record's (the engine reads both)."""
    out = (template.replace("2026-03-14 09:", "{ymd} {hh:02d}:")
           .replace("[I314 09:", "[I{md} {hh:02d}:")
           .replace("[W314 09:", "[W{md} {hh:02d}:"))
    assert "314 09" not in out and "2026-03-14" not in out, template
    return out


def _templates(group: list[str]) -> list[str]:
    return [_dated(t) for t in group if t.startswith("[rank{r}]")]


def _glog_time(at: float) -> str:
    """glog's `MMDD HH:MM:SS.uuuuuu` (UTC)."""
    tm = time.gmtime(at)
    return f"{tm.tm_mon:02d}{tm.tm_mday:02d} {time.strftime('%H:%M:%S', tm)}.{int(at % 1 * 1e6):06d}"


def _routine_line(template: str, rng: random.Random, at: float, rank: int, ranks: int, step: int) -> str:
    tm = time.gmtime(at)
    frac = at % 1
    return template.format(
        r=rank, r1=(rank + 1) % ranks, s=step, cs=step * 512, loss=rng.random() * 3, g=rng.random() * 2,
        lr=3e-4 * rng.random(), ep=step / 5000, ms=1200 + rng.random() * 400,
        ymd=time.strftime("%Y-%m-%d", tm), md=f"{tm.tm_mon:02d}{tm.tm_mday:02d}", hh=tm.tm_hour, mm=tm.tm_min,
        ss=tm.tm_sec, ms3=int(frac * 1000), us=int(frac * 1e6), sps=300 + rng.random() * 50,
        p=rng.randrange(100), host=_host(rank), pid=30000 + rank, tid=31000 + rank, gpu=rank % RANKS_PER_HOST,
        c=rng.randrange(24), tf=150 + rng.random() * 20,
    )


def _host(rank: int) -> str:
    return f"gpu-node-{rank // RANKS_PER_HOST:03d}"


def oom_traceback(rank: int) -> list[str]:
    """PyTorch >= 2.4's CUDA OOM in the backward pass, behind torchrun's prefix (as the tail reads it:
    one line per message, no multiline parser)."""
    site = "/usr/local/lib/python3.11/dist-packages"
    gpu = rank % RANKS_PER_HOST
    body = [
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 612, in <module>',
        "    main()",
        '  File "/workspace/train.py", line 588, in main',
        "    train(args, model, optimizer, train_loader)",
        '  File "/workspace/train.py", line 401, in train',
        "    loss.backward()",
        f'  File "{site}/torch/_tensor.py", line 581, in backward',
        "    torch.autograd.backward(",
        f'  File "{site}/torch/autograd/__init__.py", line 347, in backward',
        "    _engine_run_backward(",
        f'  File "{site}/torch/autograd/graph.py", line 825, in _engine_run_backward',
        "    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass",
        (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity of "
         f"79.11 GiB of which 1.02 GiB is free. Process {30000 + rank} has 78.08 GiB memory in use. Of the allocated "
         "memory 74.12 GiB is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated. If reserved "
         "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
         "fragmentation.  See documentation for Memory Management  "
         "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"),
    ]
    return [f"[rank{rank}]:{text}" for text in body]


def watchdog_line(rank: int, at: float, seq: int, ran_ms: int) -> str:
    return (f"[rank{rank}]:[E{_glog_time(at)} ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=26214400, NumelOut=26214400, "
            f"Timeout(ms)={WATCHDOG_TIMEOUT_MS}) ran for {ran_ms} milliseconds before timing out.")


def make_input(messages: int, ranks: int, *, seed: int = 7,
               now: float | None = None) -> tuple[list[tuple[bytes | None, bytes]], list[str]]:
    """(the Kafka values, their lines in the same order): `messages` values in all, the failure's last."""
    if not 0 <= INITIATOR < ranks:
        raise SystemExit(f"--ranks must be more than {INITIATOR} (rank {INITIATOR} is the one that fails)")
    rng = random.Random(seed)
    routine, chatter, other = _templates(ROUTINE), _templates(CHATTER), _templates(OTHER)
    oom = oom_traceback(INITIATOR)
    tail = len(oom) + ranks - 1
    normal = messages - tail
    if normal < ranks:
        raise SystemExit(f"--messages must be at least {ranks + tail}")
    now = time.time() if now is None else now
    end = now - END_BEFORE_NOW_S
    t_fail = end - WATCHDOG_AFTER_S - 0.5
    gap = LINE_EVERY_S / ranks
    t0 = t_fail - normal * gap
    lines: list[str] = []
    values: list[tuple[bytes | None, bytes]] = []

    def add(at: float, rank: int, line: str) -> None:
        lines.append(line)
        values.append((None, fluentbit_plain_value(at, line, host=_host(rank), job=JOB)))

    for i in range(normal):
        rank, at = i % ranks, t0 + i * gap
        u = rng.random()
        group = routine if u < 0.5 else chatter if u < 0.5 + 1 / 3 else other
        add(at, rank, _routine_line(rng.choice(group), rng, at, rank, ranks, 1000 + i // (2 * ranks)))
    for k, line in enumerate(oom):
        add(t_fail + k * 1e-4, INITIATOR, line)
    seq = 3 * (1000 + normal // (2 * ranks)) + 1
    enqueued = t_fail + 0.02
    for rank in range(ranks):
        if rank != INITIATOR:
            at = enqueued + WATCHDOG_TIMEOUT_MS / 1000 + 0.01 + rng.random() * 0.08
            add(at, rank, watchdog_line(rank, at, seq, int((at - enqueued) * 1000)))
    return values, lines


def offline_diagnosis(lines: list[str], workdir: Path) -> dict[str, Any]:
    """`rootrank diagnose FILE --format json --job JOB` on the lines as plain text: its first incident."""
    path = workdir / "stream-rate.log"
    path.write_text("\n".join(lines) + "\n")
    # `python -m correlator.cli` from this checkout (what the `rootrank` script runs), as the worker is started
    out = subprocess.run([sys.executable, "-m", "correlator.cli", "diagnose", str(path), "--format", "json", "--job",
                          JOB, "--progress", "never"], capture_output=True, check=True, timeout=600, cwd=REPO)
    incidents = orjson.loads(out.stdout).get("incidents") or []
    return incidents[0] if incidents else {}


def streamed_incident(broker: str, topic: str) -> dict[str, Any]:
    """The job's incident on the incidents topic (its latest open revision)."""
    from tests.fixtures.kafka import latest_revisions, read_topic

    records = read_topic(broker, topic, timeout=30, idle_s=3)
    incidents = [orjson.loads(r.value) for r in records if r.value]
    latest = [i for i in latest_revisions(incidents).values() if i.get("job_id") == JOB]
    return latest[0] if latest else {}


def _initiator(incident: dict[str, Any]) -> tuple[Any, Any]:
    init = incident.get("initiator") or {}
    return init.get("rank"), init.get("host")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=500_000, help="Fluent Bit messages (one line each)")
    parser.add_argument("--ranks", type=int, default=64, help=f"ranks ({RANKS_PER_HOST} a host)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 messages (figures not meaningful)")
    parser.add_argument("--timeout", type=float, default=1800, help="longest wait for the worker to read them all")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages = 20_000

    from benchmarks.bench_end_to_end import _topic_settings, run_scenario

    stop_cleanly_on_sigterm()
    load_before = os.getloadavg()
    values, lines = make_input(args.messages, args.ranks)
    wire = sum(len(v) for _, v in values)
    log_bytes = text_bytes(lines)
    workdir = Path(tempfile.mkdtemp(prefix="rootrank-bench-stream-"))
    name = "stream"
    try:
        offline = offline_diagnosis(lines, workdir)
        with tansu_broker(workdir) as broker:
            topics = _topic_settings(name)
            readings: list[dict[str, float]] = []

            def before_worker() -> None:  # the topic is filled, the worker not started yet
                readings.append(aiokafka_consume_all(broker, topics["topics__logs"], len(values), timeout=args.timeout))

            r = run_scenario(broker, workdir, name, values, len(lines), log_bytes, compression=None,
                             timeout=args.timeout, before_worker=before_worker)
            incident = streamed_incident(broker, topics["topics__incidents"])
            readings.append(aiokafka_consume_all(broker, topics["topics__logs"], len(values), timeout=args.timeout))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()

    for raw in readings:
        if raw["messages"] < len(values):
            raise RuntimeError(f"the aiokafka loop read {raw['messages']:.0f}/{len(values)} messages")
        if raw["timed_messages"] <= 0 or raw["wall_s"] <= 0:
            raise RuntimeError("the aiokafka loop read everything in one batch: too few messages to time")
    rates = [raw["timed_messages"] / raw["wall_s"] for raw in readings]
    raw = readings[rates.index(max(rates))]
    raw_lines_s = max(rates)
    raw_per_cpu_s = raw["timed_messages"] / max(raw["cpu_s"], 1e-9)
    worker_lines_s = r["worker_lines_s"]
    ratio = worker_lines_s / raw_lines_s
    cpu_ratio = r["worker_lines_per_cpu_s"] / raw_per_cpu_s
    rate_met = worker_lines_s >= TARGET_LINES_S
    ratio_met = ratio >= TARGET_VS_RAW
    inc_rank, inc_host = _initiator(incident)
    off_rank, off_host = _initiator(offline)
    rank_met = inc_rank == INITIATOR

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print(f"[stream-rate] {len(values):,} Fluent Bit messages, {args.ranks} ranks on "
          f"{-(-args.ranks // RANKS_PER_HOST)} hosts, job {JOB}: {wire / len(values):.0f} bytes a message on average "
          f"({wire / MiB:.1f} MiB on the wire, {log_bytes / MiB:.1f} MiB of log); "
          f"{r['incidents']:.0f} incident message(s), {r['deadletters']:.0f} dead letters")
    print(f"  worker (match+correlate, 1 process): {worker_lines_s:9.0f} lines/s  "
          f"(CPU share {r['worker_cpu_share']:.2f}; {r['worker_lines_per_cpu_s']:.0f} lines per CPU-second)")
    print(f"  reference raw aiokafka getmany loop: {raw_lines_s:9.0f} lines/s  "
          f"(CPU share {raw['cpu_s'] / raw['wall_s']:.2f}; {raw_per_cpu_s:.0f} lines per CPU-second; read before and "
          f"after the worker: {', '.join(f'{x:.0f}' for x in rates)} lines/s)")
    print(f"  (also: kafka-python raw consume {r['raw_consume_lines_s']:.0f} lines/s, kafka-python produce "
          f"{r['produce_lines_s']:.0f} lines/s)")
    print(f"  ratio worker / raw aiokafka = {ratio:.3f}x  (of lines per CPU-second: {cpu_ratio:.3f}x, the ratio "
          "with a core each)")
    print(f"  target >= {TARGET_LINES_S:,.0f} lines/s: {met(rate_met)}; target >= {TARGET_VS_RAW}x the raw loop: "
          f"{met(ratio_met)}")
    print(f"  streamed incident: class {incident.get('class')}, initiator rank {inc_rank} on {inc_host} "
          f"(expected rank {INITIATOR} on {_host(INITIATOR)}): {met(rank_met)}")
    print(f"  offline `rootrank diagnose` on the same lines: class {offline.get('class')}, initiator rank "
          f"{off_rank}{f' on {off_host}' if off_host else ''}: {met(off_rank == INITIATOR)}")
    print(f"  load average (1, 5, 15 min): before {', '.join(f'{x:.2f}' for x in load_before)}; after "
          f"{', '.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} CPUs)")
    sys.stdout.flush()
    return {
        **r,
        "bytes_per_message": wire / len(values),
        "raw_aiokafka_lines_s": raw_lines_s,
        "raw_aiokafka_lines_s_before": rates[0],
        "raw_aiokafka_lines_s_after": rates[-1],
        "raw_aiokafka_lines_per_cpu_s": raw_per_cpu_s,
        "worker_vs_raw_aiokafka_per_cpu_s": cpu_ratio,
        "raw_aiokafka_cpu_share": raw["cpu_s"] / raw["wall_s"],
        "worker_vs_raw_aiokafka": ratio,
        "target_lines_s_met": float(rate_met),
        "target_ratio_met": float(ratio_met),
        "incident_rank": float(inc_rank) if isinstance(inc_rank, int) else float("nan"),
        "incident_rank_met": float(rank_met),
        "offline_rank": float(off_rank) if isinstance(off_rank, int) else float("nan"),
        "load_1min_after": load_after[0],
    }


if __name__ == "__main__":
    main()
