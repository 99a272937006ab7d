"""`diagnose` and the stream's match stage on one line family at a time, against GNU grep and the mixed log.

Each family file (`benchmarks/families.py`: HF Trainer dicts, Megatron iteration lines, DeepSpeed step lines,
progress bars, NCCL INFO, torchelastic agent lines, Python logging INFO) and the first `--size-mb` of the
mixed training-shaped log (`benchmarks/training_log.py`) are measured in the same run, interleaved:

    for each round:  for each family F (the order turns every round):
        grep F, diagnose F, diagnose mixed, grep mixed, match stage F, match stage mixed

and every figure is the median over the rounds. The ratios are taken pair by pair inside a round (a
family against the mixed log measured right after it; a rate against the grep of the same file right
before it), so load that moves between rounds moves both sides of a ratio.

- grep: GNU grep of three phrases a user looks for first (`grep -F -e Traceback -e Error -e 'NCCL WARN'`,
  `LC_ALL=C`, the matching lines written to a file: GNU grep stops at the first match when its output is
  /dev/null).
- diagnose: `Diagnoser.diagnose` as the CLI builds it (one scan process per CPU), in this process, so the
  CLI's start-up (about 0.3 s, the matcher benchmark's start-up line) is not in it.
- match stage: `MatchProcessor.process_values` (the match role's call per fetched batch, no Kafka) over
  the file's lines framed as `rootrank ship` sends them (one stream, messages of up to 256 KiB), in
  batches of up to 16 MiB of values as the batch reader hands them over (`engine.scan_max_bytes`).

Run: python -m benchmarks.bench_families [--size-mb 16] [--rounds 5] [--families hf_trainer,megatron]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.families import FAMILIES, write_family
from benchmarks.training_log import write_training_log

PHRASES = ("Traceback", "Error", "NCCL WARN")
MIXED = "mixed"
STREAM_BATCH_BYTES = 16 * 1024 * 1024


def write_inputs(workdir: Path, size_bytes: int, families: list[str]) -> dict[str, Path]:
    """Every family's file and the mixed log's first `size_bytes` (cut after a newline)."""
    paths: dict[str, Path] = {}
    for name in families:
        paths[name] = workdir / f"{name}.log"
        write_family(name, paths[name], size_bytes)
    whole = workdir / "mixed-whole.log"
    write_training_log(whole, size_bytes, block_lines=max(1000, min(100_000, size_bytes // 250)))
    data = whole.read_bytes()
    cut = data.rfind(b"\n", 0, size_bytes) + 1 if len(data) > size_bytes else len(data)
    paths[MIXED] = workdir / "mixed.log"
    paths[MIXED].write_bytes(data[: cut or len(data)])
    whole.unlink()
    return paths


def grep_seconds(path: Path, out: Path) -> float:
    argv = ["grep", "-F", *[arg for phrase in PHRASES for arg in ("-e", phrase)], str(path)]
    t = time.perf_counter()
    with out.open("wb") as fh:
        done = subprocess.run(argv, stdout=fh, stderr=subprocess.PIPE, check=False,
                              env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    seconds = time.perf_counter() - t
    if done.returncode > 1:
        raise SystemExit(f"grep failed ({done.returncode}): {done.stderr.decode(errors='replace')[:300]}")
    return seconds


def stream_batches(path: Path, message_bytes: int = 256 * 1024) -> tuple[list[list[bytes]], int]:
    """The file's lines as `rootrank ship FILE` sends them (one stream: the file, no rank of its own, lines
    already in the file carry no read time; messages of up to `message_bytes` of text, the shipper's
    `batch_max_bytes`), grouped in batches of up to STREAM_BATCH_BYTES of values; and the number of lines."""
    from ingest.ship.wire_format import encode_batch

    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and not lines[-1]:
        lines.pop()
    values: list[bytes] = []
    first = size = 0
    for n, line in enumerate(lines):
        size += len(line) + 1
        if size >= message_bytes or n == len(lines) - 1:
            chunk = [(None, None, text) for text in lines[first : n + 1]]
            values.append(encode_batch(chunk, job_id="bench", host="bench-host", file=str(path), offset=first))
            first, size = n + 1, 0
    batches: list[list[bytes]] = [[]]
    size = 0
    for value in values:
        if size + len(value) > STREAM_BATCH_BYTES and batches[-1]:
            batches.append([])
            size = 0
        batches[-1].append(value)
        size += len(value)
    return batches, len(lines)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=16.0, help="size of each family file and of the mixed log")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; figures are their medians")
    parser.add_argument("--families", help=f"comma-separated subset of: {', '.join(FAMILIES)}")
    parser.add_argument("--jobs", type=int, default=0, help="diagnose's scan processes (0: as the CLI, one per CPU)")
    parser.add_argument("--no-stream", action="store_true", help="leave the match stage out")
    parser.add_argument("--keep", help="write the files into this folder and keep them (reused when present)")
    args = parser.parse_args(argv)
    families = list(FAMILIES) if not args.families else [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown famil(ies): {', '.join(unknown)}")

    from correlator.diagnosis.rules import load_ruleset
    from correlator.diagnosis.signals import SignalExtractor
    from correlator.offline.diagnose import Diagnoser, default_jobs
    from correlator.stream.agents.match import MatchProcessor, RawMessage

    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start",
          flush=True)
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rootrank-families-"))
    workdir.mkdir(parents=True, exist_ok=True)
    size_bytes = int(args.size_mb * 1024 * 1024)
    t = time.perf_counter()
    names = [*families, MIXED]
    if args.keep and all((workdir / f"{n}.log").exists() for n in names):
        paths = {n: workdir / f"{n}.log" for n in names}
    else:
        paths = write_inputs(workdir, size_bytes, families)
    sizes = {n: p.stat().st_size for n, p in paths.items()}
    line_counts = {n: p.read_bytes().count(b"\n") for n, p in paths.items()}
    print(f"files: {len(paths)} of about {args.size_mb:g} MiB ({time.perf_counter() - t:.1f}s to write)", flush=True)

    ruleset = load_ruleset()
    jobs = args.jobs or default_jobs()
    diagnoser = Diagnoser(ruleset, jobs=jobs)
    processor = MatchProcessor(SignalExtractor(ruleset, diagnoser.matcher))
    batches: dict[str, list[list[bytes]]] = {}
    if not args.no_stream:
        t = time.perf_counter()
        for name in names:
            batches[name], _ = stream_batches(paths[name])
        print(f"ship framing: {sum(len(v) for b in batches.values() for v in b)} messages "
              f"({time.perf_counter() - t:.1f}s)", flush=True)
    grep_out = workdir / "grep.out"

    combined = diagnoser.matcher.combined_database()

    def ceiling_seconds(name: str) -> float:
        """The database a region is scanned with, over the file, one process, no callback: what the scan
        alone costs before any line is looked at."""
        data = paths[name].read_bytes()
        t = time.perf_counter()
        if combined is not None:
            combined.scan(data)
        return time.perf_counter() - t

    def diagnose_seconds(name: str) -> float:
        t = time.perf_counter()
        diagnoser.diagnose([str(paths[name])])
        return time.perf_counter() - t

    def stream_seconds(name: str) -> float:
        now = time.time()
        t = time.perf_counter()
        for batch in batches[name]:
            processor.process_values(batch, lambda i, b=batch: RawMessage(b[i], "bench", 0, i, now))
        return time.perf_counter() - t

    # warm-up: compiled databases, extract regexes, the page cache
    diagnose_seconds(MIXED)
    if batches:
        stream_seconds(MIXED)
    grep_seconds(paths[MIXED], grep_out)

    grep_s: dict[str, list[float]] = {n: [] for n in names}
    diag_s: dict[str, list[float]] = {n: [] for n in names}
    stream_s: dict[str, list[float]] = {n: [] for n in names}
    ceiling_s: dict[str, list[float]] = {n: [] for n in names}
    # per family, ratios taken inside a pair: (family rate / mixed rate), (rate / grep rate of the same file)
    vs_mixed: dict[str, list[float]] = {n: [] for n in families}
    stream_vs_mixed: dict[str, list[float]] = {n: [] for n in families}
    diag_vs_grep: dict[str, list[float]] = {n: [] for n in names}
    stream_vs_grep: dict[str, list[float]] = {n: [] for n in names}
    loads: list[float] = []

    def measure(name: str, timer: Callable[[str], float], into: dict[str, list[float]]) -> float:
        seconds = timer(name)
        into[name].append(seconds)
        return seconds

    t_all = time.perf_counter()
    for rnd in range(args.rounds):
        order = families[rnd % len(families):] + families[: rnd % len(families)]
        loads.append(os.getloadavg()[0])
        for name in order:
            g = measure(name, lambda n: grep_seconds(paths[n], grep_out), grep_s)
            d = measure(name, diagnose_seconds, diag_s)
            dm = measure(MIXED, diagnose_seconds, diag_s)
            gm = measure(MIXED, lambda n: grep_seconds(paths[n], grep_out), grep_s)
            measure(name, ceiling_seconds, ceiling_s)
            if rnd == 0 or name == order[0]:
                measure(MIXED, ceiling_seconds, ceiling_s)
            vs_mixed[name].append((sizes[name] / d) / (sizes[MIXED] / dm))
            diag_vs_grep[name].append(g / d)
            diag_vs_grep[MIXED].append(gm / dm)
            if batches:
                s = measure(name, stream_seconds, stream_s)
                sm = measure(MIXED, stream_seconds, stream_s)
                stream_vs_mixed[name].append((sizes[name] / s) / (sizes[MIXED] / sm))
                stream_vs_grep[name].append(g / s)
                stream_vs_grep[MIXED].append(gm / sm)
    loads.append(os.getloadavg()[0])

    results: dict[str, dict[str, float]] = {}
    print(f"\n{args.rounds} round(s) in {time.perf_counter() - t_all:.0f}s; load average (1 min) at each round's start "
          f"and the end: {', '.join(f'{x:.2f}' for x in loads)}")
    print(f"diagnose: in process, {jobs} scan process(es), start-up excluded; match stage: MatchProcessor.process_values "
          f"over ship batches, one process; grep: grep -F {' '.join(repr(p) for p in PHRASES)}; ceiling: hyperscan's "
          "scan of the file with the rule set's database, one process, no callback; medians of the rounds; ratios "
          "paired inside a round")
    header = (f"{'family':16s} {'MB':>5s} {'lines':>8s} | {'grep MB/s':>9s} {'ceiling':>8s} | {'diagnose MB/s':>13s} "
              f"{'lines/s':>10s} {'x grep':>7s} {'x mixed':>8s}")
    if batches:
        header += f" | {'match MB/s':>10s} {'lines/s':>10s} {'x grep':>7s} {'x mixed':>8s}"
    print(header)
    print("-" * len(header))
    for name in names:
        mb = sizes[name] / 1e6
        row = {
            "mb": mb,
            "lines": float(line_counts[name]),
            "grep_mb_s": mb / _median(grep_s[name]),
            "ceiling_mb_s": mb / _median(ceiling_s[name]),
            "diagnose_mb_s": mb / _median(diag_s[name]),
            "diagnose_lines_s": line_counts[name] / _median(diag_s[name]),
            "diagnose_vs_grep": _median(diag_vs_grep[name]),
            "diagnose_vs_mixed": _median(vs_mixed[name]) if name != MIXED else 1.0,
        }
        line = (f"{name:16s} {mb:5.1f} {line_counts[name]:8d} | {row['grep_mb_s']:9.0f} {row['ceiling_mb_s']:8.0f} | "
                f"{row['diagnose_mb_s']:13.1f} {row['diagnose_lines_s']:10.0f} {row['diagnose_vs_grep']:6.3f}x "
                f"{row['diagnose_vs_mixed']:7.2f}x")
        if batches:
            row |= {
                "match_mb_s": mb / _median(stream_s[name]),
                "match_lines_s": line_counts[name] / _median(stream_s[name]),
                "match_vs_grep": _median(stream_vs_grep[name]),
                "match_vs_mixed": _median(stream_vs_mixed[name]) if name != MIXED else 1.0,
            }
            line += (f" | {row['match_mb_s']:10.1f} {row['match_lines_s']:10.0f} {row['match_vs_grep']:6.3f}x "
                     f"{row['match_vs_mixed']:7.2f}x")
        print(line)
        results[name] = row
    worst = min(families, key=lambda n: results[n]["diagnose_vs_mixed"])
    print(f"\nslowest family (diagnose): {worst} at {results[worst]['diagnose_vs_mixed']:.2f}x the mixed log "
          f"(target >= 0.5x: {'met' if results[worst]['diagnose_vs_mixed'] >= 0.5 else 'NOT met'}); mixed log "
          f"{results[MIXED]['diagnose_vs_grep']:.3f}x grep (target >= 0.4x: "
          f"{'met' if results[MIXED]['diagnose_vs_grep'] >= 0.4 else 'NOT met'})")
    if batches:
        worst_s = min(families, key=lambda n: results[n]["match_vs_mixed"])
        print(f"slowest family (match stage): {worst_s} at {results[worst_s]['match_vs_mixed']:.2f}x the mixed log")
    print(f"the scan alone (ceiling) reads the mixed log at {results[MIXED]['ceiling_mb_s'] / results[MIXED]['grep_mb_s']:.3f}x "
          f"grep in one process, so {jobs} scan process(es) bound diagnose at about "
          f"{jobs * results[MIXED]['ceiling_mb_s'] / results[MIXED]['grep_mb_s']:.2f}x grep before any line is looked at")
    load = os.getloadavg()
    print(f"machine: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
