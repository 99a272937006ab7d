"""`rootrank simulate`: the logs say what the truth says, with the skew and formats it claims."""

from __future__ import annotations

import json
import re
import statistics
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from correlator.cli import main
from correlator.tooling.simulate import (
    DEMO_RANK,
    FORMATS,
    STORIES,
    SimulateError,
    Truth,
    classes,
    logs_dir,
    read_truth,
    simulate,
    simulate_demo,
)

START = datetime(2026, 3, 14, 9, 0, 0, tzinfo=UTC)
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
TORCH_TS = re.compile(r"^\[rank(\d+)\]:\[[IWEF]\d{3,4} (\d\d):(\d\d):(\d\d)\.(\d{6})\d* ")
WATCHDOG = re.compile(r"Rank (\d+)\] Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+),")
# the three releases' progress lines (2.2-2.3, 2.4-2.5, 2.6+)
COMPLETED = re.compile(r"Rank (\d+)\] (?:Timeout at NCCL work: |Exception \(either an error or timeout\) detected by "
                       r"watchdog at work: | failure detected by watchdog at work sequence id: )(\d+)(?:, | PG status: )"
                       r"last enqueued (?:NCCL )?work: (\d+), last completed (?:NCCL )?work: (\d+)")
INIT = re.compile(r"^(\S+):(\d+):\d+ \[(\d+)\] NCCL INFO ncclCommInitRank comm \S+ rank (\d+) nranks (\d+) cudaDev (\d+)")


def _seed_with_torch(tmp_path: Path, cls: str, minimum: tuple[int, int], **kw: object) -> int:
    """The first seed whose simulated stack runs at least this torch (its c10 lines carry a time)."""
    for seed in range(2, 40):
        truth = simulate(cls, world_size=8, hosts=2, seed=seed, noise_lines=3, out=tmp_path / f"probe{seed}", start=START)
        if tuple(int(x) for x in truth.software["torch"].split(".")) >= minimum:
            return seed
    raise AssertionError("no seed with that torch")


def _plain_lines(root: Path, truth: Truth) -> dict[str, list[str]]:
    """host -> lines of its training log (kernel log excluded)."""
    out: dict[str, list[str]] = {}
    for rel in truth.files:
        path = root / rel
        if path.name == "train.log":
            out[path.parent.name] = path.read_text(encoding="utf-8").splitlines()
    return out


def _seconds(m: re.Match[str]) -> float:
    return int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4]) + int(m[5]) / 1e6


def test_demo_truth_matches_the_logs(tmp_path: Path) -> None:
    truth = simulate_demo(tmp_path, start=START)

    assert truth == read_truth(tmp_path)
    on_disk = json.loads((tmp_path / "truth.json").read_text())
    assert on_disk["class"] == "gpu_hardware_error"
    assert set(on_disk) >= {"class", "initiator", "world_size", "job_id", "seed", "skew_s"}
    ini = truth.initiator
    assert (ini.rank, truth.world_size, len(truth.hosts)) == (DEMO_RANK, 64, 8)
    lines = _plain_lines(tmp_path, truth)
    # NCCL init lines: every rank once, on the host the truth says, with the world size.
    seen: dict[int, tuple[str, int, int]] = {}
    for host, host_lines in lines.items():
        for line in host_lines:
            if m := INIT.match(line):
                assert m[1] == host and int(m[5]) == 64
                seen[int(m[4])] = (host, int(m[2]), int(m[6]))
    assert sorted(seen) == list(range(64))
    assert seen[DEMO_RANK] == (ini.host, ini.pid, ini.local_rank)
    assert ini.gpu == str(ini.local_rank)
    # The kernel Xid names the initiator's pid and the PCI address its NCCL init line gave (busId ab000).
    kern = (logs_dir(tmp_path, truth) / str(ini.host) / "kern.log").read_text()
    bus = next(ln for ln in lines[str(ini.host)] if f"rank {DEMO_RANK} nranks" in ln).split("busId ")[1][:2]
    assert f"NVRM: Xid (PCI:0000:{bus}:00): 79, pid={ini.pid}, GPU has fallen off the bus." in kern
    assert any(ln.startswith(f"[rank{DEMO_RANK}]: RuntimeError: CUDA error") for ln in lines[str(ini.host)])
    assert [p for p in logs_dir(tmp_path, truth).iterdir() if p.is_file()] == []  # logs only in host folders


def test_collateral_same_seq_everywhere_but_the_initiator(tmp_path: Path) -> None:
    truth = simulate("cuda_oom", world_size=16, hosts=4, seed=2, noise_lines=6, out=tmp_path, start=START)
    init = truth.initiator.rank
    watchdog: dict[int, int] = {}
    completed: dict[int, tuple[int, int, int]] = {}
    for host_lines in _plain_lines(tmp_path, truth).values():
        for line in host_lines:
            if m := WATCHDOG.search(line):
                watchdog[int(m[1])] = int(m[2])
            if m := COMPLETED.search(line):
                completed[int(m[1])] = (int(m[2]), int(m[3]), int(m[4]))
    # The seed is even: the initiator's host is not torn down early, so all 15 others time out.
    assert sorted(watchdog) == sorted(set(range(16)) - {init})
    assert len(set(watchdog.values())) == 1
    seq = next(iter(watchdog.values()))
    assert set(completed.values()) == {(seq, seq, seq - 1)}


def test_the_oom_is_a_training_steps_allocator_error_on_the_initiator(tmp_path: Path) -> None:
    truth = simulate("cuda_oom", world_size=16, hosts=4, seed=4, noise_lines=5, out=tmp_path, start=START)
    (headline,) = truth.failure_lines
    assert "CUDA out of memory" in headline or "CUDA error: out of memory" in headline
    assert "KV cache" not in headline and "cache blocks" not in headline  # not an inference engine's error
    lines = _plain_lines(tmp_path, truth)
    own = [ln for ln in lines[str(truth.initiator.host)] if ln.startswith(f"[rank{truth.initiator.rank}]:")]
    text = "\n".join(own)
    assert f"[rank{truth.initiator.rank}]: {headline}" in text
    assert "Traceback (most recent call last):" in text and ("train_step" in text or "backward" in text)
    others = [ln for h, host_lines in lines.items() for ln in host_lines if "out of memory" in ln and
              not ln.startswith(f"[rank{truth.initiator.rank}]:")]
    assert others == []


def test_every_class_has_a_story_and_no_rule_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lines are the simulator's own: with the rule loader broken, every class still simulates."""
    import correlator.diagnosis.rules as rules

    def no_rules(*args: object, **kwargs: object) -> None:
        raise AssertionError("the simulator read the rule library")

    monkeypatch.setattr(rules, "load_ruleset", no_rules)
    assert set(STORIES) == set(classes()) and len(classes()) == 48
    for cls in classes():
        truth = simulate(cls, world_size=8, hosts=2, seed=1, noise_lines=3, out=tmp_path / cls, start=START)
        assert truth.class_ == cls and truth.files, cls
        assert truth.failure_lines or truth.mode == "hang", cls


def test_lines_are_dated_now_by_default(tmp_path: Path) -> None:
    before = time.time()
    truth = simulate("cuda_oom", world_size=8, hosts=2, seed=3, noise_lines=3, out=tmp_path)
    assert truth.failure_ts is not None
    failed = datetime.fromisoformat(truth.failure_ts).timestamp()
    assert before - 3600 < failed < time.time()  # the cascade (10 min timeout) ends just now


def test_skew_is_applied_to_the_timestamps_lines_carry(tmp_path: Path) -> None:
    seed = _seed_with_torch(tmp_path, "cuda_oom", (2, 3))
    seed += seed % 2  # an even seed: every host but the initiator's waits for the watchdog
    truth = simulate("cuda_oom", world_size=32, hosts=4, seed=seed, skew_max_s=3.0, noise_lines=4, out=tmp_path / "s",
                     start=START)
    if tuple(int(x) for x in truth.software["torch"].split(".")) < (2, 3):
        pytest.skip("no timed watchdog lines for this seed")
    tmp_path = tmp_path / "s"
    assert len(set(truth.skew_s.values())) == 4 and all(abs(v) <= 3.0 for v in truth.skew_s.values())
    assert max(truth.skew_s.values()) - min(truth.skew_s.values()) > 0.5
    # Watchdog timeouts of one collective fire at the same true time on every rank: the spread of each
    # host's median timestamp is the host's skew.
    per_host: dict[str, list[float]] = defaultdict(list)
    for host, lines in _plain_lines(tmp_path, truth).items():
        for line in lines:
            if "Watchdog caught" in line and (m := TORCH_TS.match(line)):
                per_host[host].append(_seconds(m))
    medians = {h: statistics.median(v) for h, v in per_host.items()}
    ref = truth.hosts[0]
    for host, median in medians.items():
        assert median - medians[ref] == pytest.approx(truth.skew_s[host] - truth.skew_s[ref], abs=0.06)


def test_no_skew_gives_aligned_clocks(tmp_path: Path) -> None:
    truth = simulate("cuda_oom", world_size=8, hosts=2, seed=1, skew_max_s=0, noise_lines=3, out=tmp_path, start=START)
    assert set(truth.skew_s.values()) == {0.0}


def test_late_lines_break_timestamp_order(tmp_path: Path) -> None:
    def inversions(root: Path, truth: Truth) -> int:
        count = 0
        for lines in _plain_lines(root, truth).values():
            last: dict[str, float] = {}
            for line in lines:
                m = re.match(r"^\[rank(\d+)\]:\d{4}-\d\d-\d\d (\d\d):(\d\d):(\d\d),(\d{3})", line)
                if m:
                    t = int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4]) + int(m[5]) / 1000
                    if t < last.get(m[1], 0):
                        count += 1
                    last[m[1]] = t
        return count

    on_time = simulate("cuda_oom", world_size=8, hosts=2, seed=3, noise_lines=20, out=tmp_path / "a", start=START)
    late = simulate("cuda_oom", world_size=8, hosts=2, seed=3, noise_lines=20, late_lines=40, out=tmp_path / "b",
                    start=START)
    assert inversions(tmp_path / "a", on_time) == 0
    assert inversions(tmp_path / "b", late) > 0


def test_same_seed_same_bytes_other_seed_other_story(tmp_path: Path) -> None:
    a = simulate("cuda_oom", world_size=8, hosts=2, seed=11, noise_lines=4, out=tmp_path / "a", start=START)
    b = simulate("cuda_oom", world_size=8, hosts=2, seed=11, noise_lines=4, out=tmp_path / "b", start=START)
    c = simulate("cuda_oom", world_size=8, hosts=2, seed=12, noise_lines=4, out=tmp_path / "c", start=START)
    assert a == b
    for rel in a.files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    assert a.skew_s != c.skew_s


def test_all_ranks_class_has_no_single_initiator(tmp_path: Path) -> None:
    truth = simulate("checkpoint_corruption", world_size=8, hosts=2, seed=0, out=tmp_path, start=START)
    assert truth.initiator.all and truth.initiator.rank is None
    text = "\n".join(ln for lines in _plain_lines(tmp_path, truth).values() for ln in lines)
    ranks_failing = {int(m[1]) for m in re.finditer(r"^\[rank(\d+)\]: (?!Traceback| )", text, re.MULTILINE)}
    assert ranks_failing == set(range(8))
    assert "Watchdog caught" not in text


def test_straggler_stops_logging_and_prints_no_watchdog(tmp_path: Path) -> None:
    truth = simulate("straggler_hang", world_size=16, hosts=2, seed=5, noise_lines=6, out=tmp_path, start=START)
    rank = truth.initiator.rank
    lines = [ln for host_lines in _plain_lines(tmp_path, truth).values() for ln in host_lines]
    steps: dict[int, int] = defaultdict(int)
    for line in lines:
        if (m := RANK_PREFIX.match(line)) and (s := re.search(r" step (\d+)/", line)):
            steps[int(m[1])] = max(steps[int(m[1])], int(s[1]))
    assert steps[rank] == 5 and all(steps[r] == 6 for r in range(16) if r != rank)
    reporting = {int(m[1]) for line in lines if (m := WATCHDOG.search(line))}
    assert reporting == set(range(16)) - {rank}
    # No error line from the straggler: at most the start marker every rank prints, and nothing after it.
    own = [ln for ln in lines if ln.startswith(f"[rank{rank}]:")]
    assert not any(re.search(r"Error|Exception|Traceback", ln) for ln in own)
    assert own and "step 5/" in own[-1]


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "plain"])
def test_forwarder_formats_decode(tmp_path: Path, fmt: str) -> None:
    decoders = pytest.importorskip("ingest.decoders", reason="ingest.decoders is not installed")
    seed = _seed_with_torch(tmp_path, "cuda_oom", (2, 3))
    tmp_path = tmp_path / "f"
    truth = simulate("cuda_oom", world_size=16, hosts=4, seed=seed, fmt=fmt, noise_lines=4, out=tmp_path, start=START)
    (path,) = [tmp_path / f for f in truth.files]
    events = [decoders.to_event(record, default_job=truth.job_id)
              for raw in path.read_bytes().splitlines() for record in decoders.decode_value(raw)]
    assert events and all(e.host in truth.hosts for e in events if "\r" not in e.line)
    assert {e.source for e in events} <= {fmt, "plain"}
    ranked = [e for e in events if e.rank is not None]
    assert {e.rank for e in ranked} == set(range(16))
    # Event time is the line's own time (host clock) where it has one: watchdog lines of one host agree
    # with that host's skew.
    watch = defaultdict(list)
    for e in ranked:
        if "Watchdog caught" in e.line and e.ts is not None:
            watch[e.host].append(e.ts.timestamp())
    medians = {h: statistics.median(v) for h, v in watch.items()}
    h0, h1 = sorted(medians)[:2]
    assert medians[h1] - medians[h0] == pytest.approx(truth.skew_s[h1] - truth.skew_s[h0], abs=0.06)
    if fmt in ("fluentbit", "vector"):
        assert {e.job_id for e in ranked} == {truth.job_id}  # from the Kubeflow labels / pod names


def test_errors_are_explained(tmp_path: Path) -> None:
    with pytest.raises(SimulateError, match="unknown class"):
        simulate("no_such_class", out=tmp_path)
    with pytest.raises(SimulateError, match="multiple of --hosts"):
        simulate("cuda_oom", world_size=10, hosts=4, out=tmp_path)
    with pytest.raises(SimulateError, match="unknown format"):
        simulate("cuda_oom", fmt="syslog-ng", out=tmp_path)


def test_cli_writes_truth_and_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--class", "cuda_oom", "--world-size", "8", "--hosts", "2", "--seed", "3",
                 "--noise-lines", "3", "--start", "2026-03-14T09:00:00Z", "--out", str(tmp_path)])
    assert code == 0
    truth = read_truth(tmp_path)
    assert truth.class_ == "cuda_oom" and truth.world_size == 8
    assert all((tmp_path / f).is_file() for f in truth.files)
    assert "rootrank diagnose" in capsys.readouterr().out
    assert main(["simulate", "--class", "nope", "--out", str(tmp_path / "x")]) == 2
