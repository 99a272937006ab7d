"""Smoke run of the in-process benchmarks at tiny sizes: they run and print ratios against their
references. No timing threshold: this machine is shared; `make bench` is where figures come from."""

from __future__ import annotations

import re

import pytest

from benchmarks import bench_families, bench_matcher, bench_state, run

RATIO = re.compile(r"\d+\.\d+x")


def test_matcher_benchmark_prints_ratios_to_the_ceiling_and_grep(capsys: pytest.CaptureFixture[str]) -> None:
    results = bench_matcher.main(["--size-mb", "1"])
    out = capsys.readouterr().out
    assert "x ceiling" in out and RATIO.search(out)
    assert results["matcher_vs_ceiling"] > 0 and results["diagnose_vs_ceiling"] > 0
    assert "matcher_vs_grep" in results and "x grep" in out


def test_state_benchmark_prints_rss_against_its_baseline_and_the_doubling_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = bench_state.main(["--jobs", "4", "--ranks", "8", "--lines", "12000", "--double-jobs", "2",
                                "--double-lines", "3000", "--real-jobs", "1", "--real-lines", "3000"])
    out = capsys.readouterr().out
    assert "reference:" in out and "ratio correlation-growth / matching-growth" in out
    # Every job's OOM on rank 11 % 8 = 3 is found as the initiator: the benchmark drives the real engine.
    assert results["incidents"] >= 4 and results["right_initiator"] == 4
    assert results["double_match_ratio"] > 0 and results["double_correlate_ratio"] > 0


def test_families_benchmark_prints_every_family_against_the_mixed_log_and_grep(capsys: pytest.CaptureFixture[str]) -> None:
    results = bench_families.main(["--size-mb", "0.25", "--rounds", "1"])
    out = capsys.readouterr().out
    assert set(results) == {*bench_families.FAMILIES, bench_families.MIXED}
    for name in bench_families.FAMILIES:
        line = next(row for row in out.splitlines() if row.startswith(name))
        assert len(RATIO.findall(line)) == 4, line  # diagnose and match stage, each against grep and the mixed log
    assert "load average" in out and "x grep" in out
    assert all(row["diagnose_vs_mixed"] > 0 and row["match_vs_grep"] > 0 for row in results.values())


def test_run_lists_every_benchmark_and_refuses_unknown_names() -> None:
    assert set(run.BENCHMARKS) == {"matcher", "end-to-end", "stream", "latency", "state", "families"}
    with pytest.raises(SystemExit):
        run.main(["--only", "nonsense"])
