"""Matcher and offline diagnose throughput against the hyperscan ceiling and GNU grep, same bytes, same run.

Run: python -m benchmarks.bench_matcher [--size-mb 1024]
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.synthetic import write_log
from correlator.diagnose import CHUNK_BYTES, Diagnoser
import hyperscan

from correlator.matcher import Matcher, _flags
from correlator.rules import load_ruleset


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
        flags=[_flags(caseless) for _, caseless in all_patterns],
    )
    t, c = time.perf_counter(), _cpu()
    with log.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            everything.scan(chunk)
    ceiling, ceiling_cpu = time.perf_counter() - t, _cpu() - c

    # 2. The matcher as diagnose uses it: chunk scan + hits mapped to lines.
    t, c = time.perf_counter(), _cpu()
    hits = 0
    with log.open("rb") as fh:
        carry = b""
        while chunk := fh.read(CHUNK_BYTES):
            buf = carry + chunk
            cut = buf.rfind(b"\n") + 1
            hits += len(matcher.scan_buffer(buf[:cut]))
            carry = buf[cut:]
    ours, ours_cpu = time.perf_counter() - t, _cpu() - c

    # 3. Full offline diagnose (read, scan, decode hits, correlate).
    t, c = time.perf_counter(), _cpu()
    incidents, _ = Diagnoser(ruleset, matcher=matcher).diagnose([str(log)])
    diag, diag_cpu = time.perf_counter() - t, _cpu() - c

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
        subprocess.run(["grep", "-E", "-c", "-f", str(pfile), str(log)], stdout=subprocess.DEVNULL, check=False,
                       env={"LC_ALL": "C"})
        grep_s, grep_cpu = time.perf_counter() - t, _cpu(children=True) - c

    results = {
        "ceiling_mb_s": _rate(size, ceiling),
        "matcher_mb_s": _rate(size, ours),
        "diagnose_mb_s": _rate(size, diag),
        "matcher_vs_ceiling": ceiling / ours,
        "diagnose_vs_ceiling": ceiling / diag,
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
    print(f"rootrank diagnose (end to end):          {results['diagnose_mb_s']:8.0f} MB/s  "
          f"= {results['diagnose_vs_ceiling']:.2f}x ceiling  ({len(incidents)} incident(s))")
    if grep_s:
        results["grep_mb_s"] = _rate(size, grep_s)
        results["matcher_vs_grep"] = grep_s / ours
        results["diagnose_vs_grep"] = grep_s / diag
        print(f"GNU grep -E -f (LC_ALL=C, {skipped} patterns not expressible in ERE): "
              f"{results['grep_mb_s']:8.0f} MB/s; matcher = {results['matcher_vs_grep']:.2f}x grep, "
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
