"""Matcher and offline diagnose throughput against the hyperscan ceiling and GNU grep, same bytes, same run.

Run: python -m benchmarks.bench_matcher [--size-mb 1024]
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
import tempfile
import time
from pathlib import Path

import hyperscan

from benchmarks.synthetic import write_log
from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.patterns import pattern_flags
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
    if "(?" in out or "\\b" in out or "\\n" in out or "\\x" in out:
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
    return len(matcher.scan_buffer(mapped, *region))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--keep", help="write the log here and keep it")
    args = parser.parse_args(argv)
    ruleset = load_ruleset()
    matcher = Matcher(ruleset)
    workdir = Path(tempfile.mkdtemp(prefix="rootrank-bench-"))
    log = Path(args.keep) if args.keep else workdir / "synthetic.log"
    t = time.perf_counter()
    lines = write_log(log, args.size_mb * 1024 * 1024)
    size = log.stat().st_size
    print(f"synthetic log: {size / 1e6:.0f} MB, {lines} lines ({time.perf_counter() - t:.1f}s to write)")

    # 1. Ceiling: every pattern of the rule set (failure signatures, progress markers, metric values)
    # in one database, scanned over the file as contiguous buffers with no per-match work at all.
    everything = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    all_patterns = [
        (p, lr.rule.caseless) for lr in ruleset.rules
        for p in [*lr.rule.patterns, *(lr.rule.sequence.after if lr.rule.sequence else []),
                  *(lr.rule.absence.end if lr.rule.absence else [])]
    ]
    everything.compile(
        expressions=[p.encode() for p, _ in all_patterns], ids=list(range(len(all_patterns))),
        flags=[pattern_flags(caseless) for _, caseless in all_patterns],
    )
    with log.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        mapped.madvise(mmap.MADV_WILLNEED)
        t, c = time.perf_counter(), _cpu()
        everything.scan(mapped)
        ceiling, ceiling_cpu = time.perf_counter() - t, _cpu() - c

        # 2. The matcher as each diagnose scan process runs it: 16 MiB regions of the mapped file,
        # scanned in place, hits mapped to lines.
        t, c = time.perf_counter(), _cpu()
        regions = _regions(mapped, CHUNK_BYTES)
        hits = sum(len(matcher.scan_buffer(mapped, lo, hi)) for lo, hi in regions)
        ours, ours_cpu = time.perf_counter() - t, _cpu() - c

        # 2b. The same with one forked scan process per CPU, as `rootrank diagnose` runs it.
        jobs = default_jobs()
        global _FORKED
        _FORKED = (matcher, mapped)
        t = time.perf_counter()
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            parallel_hits = sum(pool.imap(_hits_in, regions))
        ours_parallel = time.perf_counter() - t
        assert parallel_hits == hits, (parallel_hits, hits)

    # 3. Full offline diagnose (read, scan, decode hits, correlate), as the CLI runs it (one scan
    # process per CPU), and in one process.
    t, c = time.perf_counter(), _cpu() + _cpu(children=True)
    incidents, _ = Diagnoser(ruleset, matcher=matcher, jobs=jobs).diagnose([str(log)])
    diag, diag_cpu = time.perf_counter() - t, _cpu() + _cpu(children=True) - c
    t = time.perf_counter()
    single_incidents, _ = Diagnoser(ruleset, matcher=matcher, jobs=1).diagnose([str(log)])
    diag_single = time.perf_counter() - t
    assert [i.incident_id for i in single_incidents] == [i.incident_id for i in incidents]

    # 4. GNU grep -E -f with the same patterns (those ERE can express).
    grep_s = None
    skipped = 0
    if shutil.which("grep"):
        pats = []
        for lr in ruleset.rules:
            for p in lr.rule.patterns:
                ere = to_ere(p)
                if ere is None:
                    skipped += 1
                else:
                    pats.append(ere)
        pfile = workdir / "patterns.ere"
        pfile.write_text("\n".join(pats) + "\n")
        t, c = time.perf_counter(), _cpu(children=True)
        # stdout to a pipe, not /dev/null: GNU grep stops at the first match when its output is /dev/null.
        done = subprocess.run(["grep", "-E", "-c", "-f", str(pfile), str(log)], capture_output=True, check=False,
                              env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        grep_s, grep_cpu = time.perf_counter() - t, _cpu(children=True) - c
        if done.returncode > 1:
            raise SystemExit(f"grep failed ({done.returncode}): {done.stderr.decode(errors='replace')[:500]}")
        grep_lines = int(done.stdout or 0)

    results = {
        "ceiling_mb_s": _rate(size, ceiling),
        "matcher_mb_s": _rate(size, ours),
        "diagnose_mb_s": _rate(size, diag),
        "matcher_vs_ceiling": ceiling / ours,
        "diagnose_vs_ceiling": ceiling / diag,
        "diagnose_jobs": float(jobs),
        "diagnose_single_mb_s": _rate(size, diag_single),
        "matcher_parallel_mb_s": _rate(size, ours_parallel),
        "matcher_parallel_vs_ceiling": ceiling / ours_parallel,
    }
    results.update({
        "ceiling_mb_cpu_s": _rate(size, ceiling_cpu),
        "matcher_mb_cpu_s": _rate(size, ours_cpu),
        "diagnose_mb_cpu_s": _rate(size, diag_cpu),
        "matcher_vs_ceiling_cpu": ceiling_cpu / ours_cpu,
        "diagnose_vs_ceiling_cpu": ceiling_cpu / diag_cpu,
    })
    print(f"hyperscan ceiling (all patterns, one DB, contiguous, no callbacks): {results['ceiling_mb_s']:8.0f} MB/s")
    print(f"rootrank matcher (lines + hits):         {results['matcher_mb_s']:8.0f} MB/s  "
          f"= {results['matcher_vs_ceiling']:.2f}x ceiling  ({hits} hits)")
    print(f"rootrank matcher, {jobs} scan processes:   {results['matcher_parallel_mb_s']:8.0f} MB/s  "
          f"= {results['matcher_parallel_vs_ceiling']:.2f}x ceiling (the ceiling is one thread)")
    print(f"rootrank diagnose (end to end, {jobs} scan processes): {results['diagnose_mb_s']:8.0f} MB/s  "
          f"= {results['diagnose_vs_ceiling']:.2f}x ceiling  ({len(incidents)} incident(s)); "
          f"target 200 MB/s: {'met' if results['diagnose_mb_s'] >= 200 else 'NOT met'}")
    print(f"rootrank diagnose --jobs 1 (one process): {results['diagnose_single_mb_s']:8.0f} MB/s  "
          f"= {ceiling / diag_single:.2f}x ceiling")
    if grep_s:
        results["grep_mb_s"] = _rate(size, grep_s)
        results["matcher_vs_grep"] = grep_s / ours
        results["diagnose_vs_grep"] = grep_s / diag
        results["matcher_parallel_vs_grep"] = grep_s / ours_parallel
        print(f"GNU grep -E -f (LC_ALL=C, {skipped} patterns not expressible in ERE; {grep_lines} lines matched): "
              f"{results['grep_mb_s']:8.0f} MB/s; matcher = {results['matcher_vs_grep']:.2f}x grep "
              f"({results['matcher_parallel_vs_grep']:.2f}x with {jobs} processes; target 4x), "
              f"diagnose = {results['diagnose_vs_grep']:.2f}x grep")
    print(f"per CPU-second (what each phase cost, whatever else ran): ceiling {results['ceiling_mb_cpu_s']:.0f} MB, "
          f"matcher {results['matcher_mb_cpu_s']:.0f} MB = {results['matcher_vs_ceiling_cpu']:.2f}x ceiling, "
          f"diagnose {results['diagnose_mb_cpu_s']:.0f} MB = {results['diagnose_vs_ceiling_cpu']:.2f}x ceiling", end="")
    if grep_s:
        results["grep_mb_cpu_s"] = _rate(size, grep_cpu)
        results["matcher_vs_grep_cpu"] = grep_cpu / ours_cpu
        results["diagnose_vs_grep_cpu"] = grep_cpu / diag_cpu
        print(f", grep {results['grep_mb_cpu_s']:.0f} MB: matcher = {results['matcher_vs_grep_cpu']:.2f}x grep, "
              f"diagnose = {results['diagnose_vs_grep_cpu']:.2f}x grep")
    else:
        print()
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
