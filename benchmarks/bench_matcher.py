"""Matcher and offline diagnose throughput against the hyperscan ceiling, GNU grep and ripgrep, same bytes,
same run, on a log shaped like a training job's (half metric/progress lines, 512 ranks).

Run: python -m benchmarks.bench_matcher [--size-mb 300] [--shape training|chatter] [--keep FILE]
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.synthetic import write_log
from benchmarks.training_log import write_training_log
from correlator.diagnosis.matcher import COMBINED_SCAN_BYTES, Matcher
from correlator.diagnosis.rules import load_ruleset
from correlator.offline.diagnose import CHUNK_BYTES, Diagnoser, _regions, default_jobs


def to_ere(pattern: str) -> str | None:
    """The same pattern in POSIX ERE for grep -E, or None when ERE cannot say it."""
    out = pattern
    out = re.sub(r"\(\?P<\w+>", "(", out)
    out = out.replace("(?:", "(").replace("(?i)", "")
    out = out.replace(r"\d", "[0-9]").replace(r"\s", "[[:space:]]").replace(r"\w", "[[:alnum:]_]")
    out = out.replace("*?", "*").replace("+?", "+").replace("??", "?")
    out = out.replace(r"\S", "[^[:space:]]").replace(r"\D", "[^0-9]")
    # GNU grep -E and ripgrep both read \b as a word boundary; lookarounds, inline flags, \n and \x they do not share.
    if "(?" in out or "\\n" in out or "\\x" in out:
        return None
    return out


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def _cpu(children: bool = False) -> float:
    """CPU seconds of this process (or of its reaped children): on a shared, busy machine CPU time
    is what a phase cost; wall time also counts the time other processes had the cores."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


_FORKED: tuple[Matcher, mmap.mmap] | None = None  # what the forked scan processes inherit


def _hits_in(region: tuple[int, int]) -> int:
    assert _FORKED is not None
    matcher, mapped = _FORKED
    main_raw, _routine = matcher.scan_grouped(mapped, *region)
    return len(matcher.scan_buffer(mapped, *region, raw=main_raw))


def _expressions(matcher: Matcher) -> list[str]:
    """Every pattern the matcher scans for (failure signatures, sequence preconditions, absence ends,
    progress markers, metric values), each once."""
    out: list[str] = []
    for rule in matcher.rules:
        for p in [*rule.patterns, *(rule.sequence.after if rule.sequence else []), *(rule.absence.end if rule.absence else [])]:
            if p not in out:
                out.append(p)
    return out


def _timed(argv: list[str], out_path: Path) -> tuple[float, float, int]:
    """Run a matcher program with its output to a file (GNU grep stops at the first match when its
    output is /dev/null); (wall s, CPU s, lines written)."""
    t, c = time.perf_counter(), _cpu(children=True)
    with out_path.open("wb") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, check=False,
                              env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    wall, cpu = time.perf_counter() - t, _cpu(children=True) - c
    if done.returncode > 1:
        raise SystemExit(f"{argv[0]} failed ({done.returncode}): {done.stderr.decode(errors='replace')[:500]}")
    with out_path.open("rb") as fh:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return wall, cpu, lines


def startup(workdir: Path, runs: int = 3) -> tuple[float, list[float]]:
    """Wall seconds of `rootrank diagnose` on a one-line file: with an empty cache (cold), then warm."""
    one = workdir / "one-line.log"
    one.write_text("[rank0]: step 1 loss 2.5\n", encoding="utf-8")
    env = {**os.environ, "ROOTRANK_CACHE_DIR": str(workdir / "startup-cache")}
    times = []
    for _ in range(runs + 1):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "correlator.cli", "diagnose", str(one)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return times[0], times[1:]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=300)
    parser.add_argument("--shape", choices=["training", "chatter"], default="training",
                        help="training: half metric/progress lines, as a real job's log (benchmarks/training_log.py); "
                        "chatter: the older synthetic log (benchmarks/synthetic.py)")
    parser.add_argument("--keep", help="write the log here and keep it (reused when it exists)")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start")
    ruleset = load_ruleset()
    matcher = Matcher(ruleset)
    workdir = Path(tempfile.mkdtemp(prefix="rootrank-bench-"))
    log = Path(args.keep) if args.keep else workdir / f"{args.shape}.log"
    t = time.perf_counter()
    if not (args.keep and log.exists()):
        writer = write_training_log if args.shape == "training" else write_log
        writer(log, args.size_mb * 1024 * 1024)
    size = log.stat().st_size
    print(f"{args.shape} log: {size / 1e6:.0f} MB ({time.perf_counter() - t:.1f}s to write)")

    with log.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        mapped.madvise(mmap.MADV_WILLNEED)
        lines = mapped[:].count(b"\n")
        # 1. Ceiling: exactly the database the matcher scans a 16 MiB region with (failure signatures and
        # routine patterns in one, see COMBINED_SCAN_BYTES), over the whole mapped file, with no callback at
        # all. Each expression set's own database is timed too.
        t, c = time.perf_counter(), _cpu()
        matcher.db.scan(mapped)
        main_s, main_cpu = time.perf_counter() - t, _cpu() - c
        routine_s = routine_cpu = 0.0
        if matcher.routine_db is not None:
            t, c = time.perf_counter(), _cpu()
            matcher.routine_db.scan(mapped)
            routine_s, routine_cpu = time.perf_counter() - t, _cpu() - c
        ceiling, ceiling_cpu = main_s + routine_s, main_cpu + routine_cpu
        combined = matcher.combined_database() if CHUNK_BYTES >= COMBINED_SCAN_BYTES else None
        if combined is not None:
            t, c = time.perf_counter(), _cpu()
            combined.scan(mapped)
            ceiling, ceiling_cpu = time.perf_counter() - t, _cpu() - c

        # 2. The matcher as each diagnose scan process runs it: 16 MiB regions of the mapped file, scanned
        # in place, every hit reported (routine hits included), failure hits mapped to lines.
        regions = _regions(mapped, CHUNK_BYTES)
        t, c = time.perf_counter(), _cpu()
        hits = routine_hits = 0
        for lo, hi in regions:
            main_raw, routine_raw = matcher.scan_grouped(mapped, lo, hi)
            hits += len(matcher.scan_buffer(mapped, lo, hi, raw=main_raw))
            routine_hits += sum(map(len, routine_raw.values()))
        ours, ours_cpu = time.perf_counter() - t, _cpu() - c

        # 2b. The same with one forked scan process per CPU, as `rootrank diagnose` runs it.
        jobs = default_jobs()
        global _FORKED  # noqa: PLW0603 - what the forked scan processes inherit, set before the fork
        _FORKED = (matcher, mapped)
        t = time.perf_counter()
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            parallel_hits = sum(pool.imap(_hits_in, regions))
        ours_parallel = time.perf_counter() - t
        assert parallel_hits == hits, (parallel_hits, hits)

    # 3. Full offline diagnose (read, scan, routine lines per process, failure lines to signals, correlate),
    # as the CLI runs it (one scan process per CPU), and in one process: both must give the same incidents.
    t, c = time.perf_counter(), _cpu() + _cpu(children=True)
    incidents, _ = Diagnoser(ruleset, matcher=matcher, jobs=jobs).diagnose([str(log)])
    diag, diag_cpu = time.perf_counter() - t, _cpu() + _cpu(children=True) - c
    t, c = time.perf_counter(), _cpu()
    single_incidents, _ = Diagnoser(ruleset, matcher=matcher, jobs=1).diagnose([str(log)])
    diag_single, diag_single_cpu = time.perf_counter() - t, _cpu() - c
    same = [i.incident_id for i in single_incidents] == [i.incident_id for i in incidents]
    assert same, "--jobs 1 and the default found different incidents"

    # 4. GNU grep -E and ripgrep, with every pattern the matcher scans that ERE can express.
    expressions = _expressions(matcher)
    pats = [e for e in (to_ere(p) for p in expressions) if e is not None]
    pfile = workdir / "patterns.ere"
    pfile.write_text("\n".join(pats) + "\n")
    results: dict[str, float] = {
        "ceiling_mb_s": _rate(size, ceiling),
        "ceiling_main_mb_s": _rate(size, main_s),
        "ceiling_routine_mb_s": _rate(size, routine_s) if routine_s else 0.0,
        "matcher_mb_s": _rate(size, ours),
        "diagnose_mb_s": _rate(size, diag),
        "matcher_vs_ceiling": ceiling / ours,
        "diagnose_vs_ceiling": ceiling / diag,
        "diagnose_jobs": float(jobs),
        "diagnose_single_mb_s": _rate(size, diag_single),
        "matcher_parallel_mb_s": _rate(size, ours_parallel),
        "matcher_parallel_vs_ceiling": ceiling / ours_parallel,
        "ceiling_mb_cpu_s": _rate(size, ceiling_cpu),
        "matcher_mb_cpu_s": _rate(size, ours_cpu),
        "diagnose_mb_cpu_s": _rate(size, diag_cpu),
        "diagnose_single_mb_cpu_s": _rate(size, diag_single_cpu),
        "matcher_vs_ceiling_cpu": ceiling_cpu / ours_cpu,
        "diagnose_vs_ceiling_cpu": ceiling_cpu / diag_cpu,
        "routine_ns_per_hit": 0.0,
    }
    print(f"{lines} lines; {routine_hits} routine hits (metric values, progress markers: "
          f"{routine_hits / max(lines, 1):.0%} of the lines), {hits} failure/fact hits")
    scanned = "failure signatures and routine patterns in one database" if combined is not None else "its two databases"
    print(f"hyperscan ceiling (what the matcher scans a region with: {scanned}; no callbacks): "
          f"{results['ceiling_mb_s']:8.0f} MB/s  (failure signatures alone {results['ceiling_main_mb_s']:.0f} MB/s; "
          f"routine patterns alone {results['ceiling_routine_mb_s']:.0f} MB/s)")
    print(f"rootrank matcher (every hit, failure hits to lines):  {results['matcher_mb_s']:8.0f} MB/s  "
          f"= {results['matcher_vs_ceiling']:.2f}x ceiling")
    print(f"rootrank matcher, {jobs} scan processes:   {results['matcher_parallel_mb_s']:8.0f} MB/s  "
          f"= {results['matcher_parallel_vs_ceiling']:.2f}x ceiling (the ceiling is one thread)")
    print(f"rootrank diagnose (end to end, {jobs} scan processes): {results['diagnose_mb_s']:8.0f} MB/s  "
          f"= {results['diagnose_vs_ceiling']:.2f}x ceiling  ({len(incidents)} incident(s), the same with --jobs 1)")
    print(f"rootrank diagnose --jobs 1 (one process): {results['diagnose_single_mb_s']:8.0f} MB/s  "
          f"= {ceiling / diag_single:.2f}x ceiling")
    references = [("grep", ["grep", "-E", "-f", str(pfile), str(log)], "GNU grep -E -f")]
    if shutil.which("rg"):
        # --no-unicode: with Unicode word boundaries ripgrep falls back to a slow engine (> 100 s on 12 MB here).
        references.append(("rg", ["rg", "--no-unicode", "--no-filename", "--no-line-number", "-f", str(pfile), str(log)],
                           "ripgrep -f"))
    else:
        print("ripgrep: not installed, skipped (apt-get install ripgrep)")
    for key, argv_, label in references:
        if not shutil.which(argv_[0]):
            print(f"{label}: not installed, skipped")
            continue
        wall, cpu, matched = _timed(argv_, workdir / f"{key}.out")
        results[f"{key}_mb_s"] = _rate(size, wall)
        results[f"{key}_mb_cpu_s"] = _rate(size, cpu)
        results[f"diagnose_vs_{key}"] = wall / diag
        results[f"matcher_vs_{key}"] = wall / ours
        results[f"diagnose_vs_{key}_cpu"] = cpu / diag_cpu
        print(f"{label} (LC_ALL=C, output to a file; {len(pats)} of {len(expressions)} patterns, the rest not "
              f"expressible in ERE; {matched} lines matched): {results[f'{key}_mb_s']:8.0f} MB/s; "
              f"diagnose = {results[f'diagnose_vs_{key}']:.2f}x {key} "
              f"(--jobs 1: {wall / diag_single:.2f}x), matcher = {results[f'matcher_vs_{key}']:.2f}x {key}")
    print(f"per CPU-second (what each phase cost, whatever else ran): ceiling {results['ceiling_mb_cpu_s']:.0f} MB, "
          f"matcher {results['matcher_mb_cpu_s']:.0f} MB, diagnose {results['diagnose_mb_cpu_s']:.0f} MB "
          f"({results['diagnose_single_mb_cpu_s']:.0f} MB with --jobs 1)"
          + "".join(f", {k} {results[f'{k}_mb_cpu_s']:.0f} MB" for k in ("grep", "rg") if f"{k}_mb_cpu_s" in results))
    cold, warm = startup(workdir)
    results["startup_cold_s"], results["startup_warm_s"] = cold, min(warm)
    print(f"start-up, diagnose on a one-line file: {cold:.2f} s with an empty cache, then "
          f"{', '.join(f'{w:.2f}' for w in warm)} s (target < 0.4 s after the first run: "
          f"{'met' if max(warm) < 0.4 else 'NOT met'})")
    load = os.getloadavg()
    print(f"machine: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
