"""`make bench`: every benchmark in sequence, each printing its figure, its reference and their ratio.

  1. matcher      rule set over a training-shaped log vs the hyperscan ceiling, GNU grep, ripgrep (bench_matcher)
  2. end-to-end   ship/Fluent Bit -> broker -> worker -> incidents vs raw kafka-python (bench_end_to_end)
  3. latency      last line -> incident on the topic / in ES / at the webhook vs the quiet window (bench_latency)
  4. state        1,000 jobs x 64 ranks: RSS, and correlation cost vs lines (bench_state)
  5. offline      `rootrank diagnose` MB/s vs grep and ripgrep on the same file (bench_matcher, same run as 1)
  6. stream       500,000 one-line Fluent Bit messages: one worker vs a raw aiokafka getmany loop (bench_stream_rate)
  7. families     diagnose and the match stage on one line family at a time (HF Trainer, Megatron, DeepSpeed, progress
                  bars, NCCL INFO, torchelastic, Python logging) vs the mixed log and a 3-phrase grep (bench_families)

Each benchmark runs in a process of its own, so one's memory (the 1 GB log, a fork pool) never shows
in another's figures (the state benchmark measures RSS). The machine is shared and noisy: compare
ratios, not absolute numbers, between runs.
`--quick` runs every benchmark at a seconds-long size (a smoke run, figures not meaningful);
`--only NAME[,NAME]` picks benchmarks.

Run: python -m benchmarks.run [--quick] [--only matcher,state]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


def _matcher(quick: bool) -> Any:
    from benchmarks import bench_matcher

    return bench_matcher.main(["--size-mb", "8" if quick else "300"])


def _end_to_end(quick: bool) -> Any:
    from benchmarks import bench_end_to_end

    return bench_end_to_end.main(["--quick"] if quick else ["--profile"])


def _latency(quick: bool) -> Any:
    from benchmarks import bench_latency

    return bench_latency.main(["--quick"] if quick else [])


def _state(quick: bool) -> Any:
    from benchmarks import bench_state

    return bench_state.main(["--quick"] if quick else [])


def _stream(quick: bool) -> Any:
    from benchmarks import bench_stream_rate

    return bench_stream_rate.main(["--quick"] if quick else [])


def _families(quick: bool) -> Any:
    from benchmarks import bench_families

    return bench_families.main(["--size-mb", "1", "--rounds", "1"] if quick else [])


# name -> runner; "offline" (5) is printed by the matcher benchmark, which times diagnose on the same file.
BENCHMARKS: dict[str, Callable[[bool], Any]] = {
    "matcher": _matcher,
    "end-to-end": _end_to_end,
    "latency": _latency,
    "state": _state,
    "stream": _stream,
    "families": _families,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run of each benchmark")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = list(BENCHMARKS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    failed = []
    for name in names:
        if not args.in_process:
            print(f"\n=== {name}{' (quick)' if args.quick else ''} ===", flush=True)
        t = time.perf_counter()
        if args.in_process or len(names) == 1:
            try:
                BENCHMARKS[name](args.quick)
            except Exception:  # noqa: BLE001  (one broken benchmark must not hide the others' figures)
                traceback.print_exc()
                failed.append(name)
        else:
            own = [sys.executable, "-m", "benchmarks.run", "--only", name, "--in-process", *(["--quick"] if args.quick else [])]
            if subprocess.run(own, check=False).returncode != 0:
                failed.append(name)
        if not args.in_process:
            print(f"=== {name}: {time.perf_counter() - t:.0f}s ===", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
