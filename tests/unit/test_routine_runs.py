"""Progress markers of a shipped batch are found per run of one stream by scanning its tail
(Matcher.scan_routine), not by a callback per step line; what the extractor keeps must not change."""

from __future__ import annotations

import random

import pytest

from correlator.diagnosis.matcher import FREQUENT_CAP, Matcher
from correlator.diagnosis.rules import load_ruleset
from correlator.diagnosis.signals import SignalExtractor
from correlator.stream.agents.match import MatchProcessor, RawMessage
from ingest.ship.wire_format import encode_batch


@pytest.fixture(scope="module")
def extractor() -> SignalExtractor:
    ruleset = load_ruleset()
    return SignalExtractor(ruleset, Matcher(ruleset))


def hf_step(step: int, grad_norm: float) -> str:
    return (f"{{'loss': {2.5 - step / 10_000:.4f}, 'grad_norm': {grad_norm:.4f}, 'learning_rate': 2.9e-05, "
            f"'epoch': {step / 1000:.2f}}}")


def megatron_step(step: int, grad_norm: float) -> str:
    return (f" iteration {step:>8}/  500000 | consumed samples: {step * 128:>12} | elapsed time per iteration (ms): 1023.4 |"
            f" learning rate: 2.999E-04 | global batch size:   128 | lm loss: 6.512341E+00 | loss scale: 1.0 |"
            f" grad norm: {grad_norm:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |")


def deepspeed_step(step: int) -> str:
    return (f"[2026-03-14 09:29:09,570] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, skipped=0, "
            "lr=[0.0003], mom=[(0.9, 0.95)]")


def chatter(n: int) -> str:
    return f"gpu-node-048:30387:31387 [3] NCCL INFO Channel {n % 24:02d}/24 : 0[3] -> 1[3] via P2P/CUMEM/read"


def mixed_log(rng: random.Random, lines: int) -> list[str]:
    out: list[str] = []
    for i in range(lines):
        roll = rng.random()
        if roll < 0.3:
            out.append(hf_step(i, rng.uniform(0.1, 3.0)))
        elif roll < 0.45:
            out.append(megatron_step(i, rng.uniform(0.1, 3.0)))
        elif roll < 0.55:
            out.append(deepspeed_step(i))
        else:
            out.append(chatter(i))
    return out


def test_runs_report_each_progress_id_at_its_last_line_and_everything_else_as_the_full_scan(extractor: SignalExtractor) -> None:
    matcher = extractor.matcher
    rng = random.Random(7)
    lines = mixed_log(rng, 6000)
    # A long stretch with no step line, so some runs' last progress line lies far before their tail.
    lines[3000:4500] = [chatter(i) for i in range(1500)]
    buf = "\n".join(lines).encode()
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    full = matcher.scan_split(buf)[1]
    progress_ids = set(matcher.progress_expressions)
    assert {rid for _, rid in full} & progress_ids, "the fixture must hold progress markers"
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(lines)), 12))
        pairs = enumerate(zip([0, *cuts], [*cuts, len(lines)], strict=True))
        runs = [(starts[a], min(starts[b], len(buf))) for k, (a, b) in pairs if k % 2 == 0]
        expected: list[tuple[int, int]] = []
        last: dict[tuple[int, int], int] = {}
        for to, rid in full:
            run = next((k for k, (lo, hi) in enumerate(runs) if lo <= to < hi), None)
            if rid not in progress_ids or run is None:
                expected.append((to, rid))
            else:
                last[(run, rid)] = to
        expected.extend((to, rid) for (_run, rid), to in last.items())
        got = matcher.scan_routine(buf, runs)
        assert got == sorted(expected)
        assert len(got) < len(full)


def test_a_shipped_batch_keeps_every_process_latest_progress_and_its_metric_extremes(extractor: SignalExtractor) -> None:
    """Three processes' shipped messages in one fetched batch, more step lines in all than FREQUENT_CAP:
    each process (and each stream of one) keeps its own latest progress line and its grad-norm max/min."""
    rng = random.Random(3)
    values: list[bytes] = []
    expected_last: dict[tuple[int, str], str] = {}
    expected_norms: dict[int, set[tuple[float, float]]] = {}
    for rank in range(3):
        rows: list[tuple[float | None, str | None, str]] = []
        norms: dict[str, list[float]] = {}
        for step in range(FREQUENT_CAP):
            norm = round(rng.uniform(0.2, 2.0), 4)
            stream = "stderr" if rank == 1 and step % 3 == 0 else "stdout"
            norms.setdefault(stream, []).append(norm)
            rows.append((None, stream, hf_step(step, norm)))
            rows.append((None, stream, chatter(step)))
        for stream in ("stdout", "stderr") if rank == 1 else ("stdout",):
            expected_last[(rank, stream)] = [text for _, s, text in rows if s == stream and "'loss'" in text][-1]
        expected_norms[rank] = {(max(values), min(values)) for values in norms.values()}
        values.append(encode_batch(rows, job_id="llama", host=f"node-{rank}", rank=rank, file="train.log"))
    out = MatchProcessor(extractor).process([RawMessage(v, "rootrank.logs", 0, i) for i, v in enumerate(values)])
    progress: dict[tuple[int | None, str], set[str]] = {}
    for s in out.signals:
        if s.fields.get("marker") == "end":
            progress.setdefault((s.rank, s.rule_id), set()).add(s.line)
    rule_ids = {rule_id for (_, rule_id) in progress}
    assert rule_ids, "HF Trainer step dicts are progress markers of the rule library"
    for rank in range(3):
        # a signal per stream of the process (the signal does not name its stream)
        want = {line for (r, _stream), line in expected_last.items() if r == rank}
        for rule_id in rule_ids:
            assert progress.get((rank, rule_id)) == want, (rank, rule_id)
    metrics: dict[int | None, set[tuple[float, float]]] = {}
    for s in out.signals:
        if "metric_min" in s.fields:
            metrics.setdefault(s.rank, set()).add((float(s.fields["grad_norm"]), float(s.fields["metric_min"])))
    assert metrics == expected_norms


def test_short_shipped_messages_of_many_processes_each_keep_their_latest_progress(extractor: SignalExtractor) -> None:
    """Messages too short for a tail scan (a process that logs little flushes small batches): a fetched
    batch of 300 such messages holds more step lines than FREQUENT_CAP, and every process keeps its own."""
    values = [encode_batch([(None, "stdout", hf_step(step, 1.0)) for step in range(rank, rank + 4)],
                           job_id="llama", host=f"node-{rank // 8}", rank=rank, file="train.log")
              for rank in range(300)]
    assert FREQUENT_CAP < 300 * 4
    out = MatchProcessor(extractor).process([RawMessage(v, "rootrank.logs", 0, i) for i, v in enumerate(values)])
    latest: dict[tuple[int | None, str], str] = {}
    for s in out.signals:
        if s.fields.get("marker") == "end":
            latest[(s.rank, s.rule_id)] = s.line
    rule_ids = {rule_id for _, rule_id in latest}
    assert rule_ids
    assert latest == {(rank, rule_id): hf_step(rank + 3, 1.0) for rank in range(300) for rule_id in rule_ids}


def test_a_large_buffer_scanned_once_with_both_databases_gives_the_two_scans_hits(
    extractor: SignalExtractor, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From COMBINED_SCAN_BYTES on, scan_split scans once with one database of both expression sets: the
    failure hits and the routine hits it gives are those of the two separate scans."""
    from correlator.diagnosis import matcher as matcher_module

    matcher = extractor.matcher
    rng = random.Random(11)
    failures = ["[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                ("[rank2]:[E ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=8, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600041 "
                "milliseconds before timing out.")]
    lines = [f"[rank{rng.randrange(8)}]:{line}" for line in mixed_log(rng, 12_000)]
    for at in range(0, len(lines), 1500):
        lines.insert(at, failures[at % 2])
    buf = ("\n".join(lines) + "\n").encode()
    monkeypatch.setattr(matcher_module, "COMBINED_SCAN_BYTES", len(buf) + 1)
    main_apart, routine_apart = matcher.scan_split(buf, 10, len(buf) - 10)
    monkeypatch.setattr(matcher_module, "COMBINED_SCAN_BYTES", 1 << 10)
    main_once, routine_once = matcher.scan_split(buf, 10, len(buf) - 10)
    assert matcher.combined_db is not None
    assert len(main_apart) >= 16 and len(routine_apart) > 5_000
    assert sorted(main_once) == sorted(main_apart)  # the same (end, id) pairs; ids of one end may come in another order
    assert routine_once == routine_apart


@pytest.mark.parametrize("size", ["small", "large"], ids=["two-databases", "combined"])
def test_grouped_hits_are_the_split_hits_per_routine_id(
    extractor: SignalExtractor, monkeypatch: pytest.MonkeyPatch, size: str,
) -> None:
    """scan_grouped (what a diagnose region is scanned with) gives scan_split's hits: the failure hits
    sorted, and per routine id the end offsets of that id's hits, in buffer order, from any `lo`."""
    from correlator.diagnosis import matcher as matcher_module

    matcher = extractor.matcher
    lines = [f"[rank{n % 8}]:{line}" for n, line in enumerate(mixed_log(random.Random(5), 3_000))]
    lines[1234] = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    buf = ("\n".join(lines) + "\n").encode()
    monkeypatch.setattr(matcher_module, "COMBINED_SCAN_BYTES", 1 << 10 if size == "large" else len(buf) + 1)
    lo = buf.index(b"\n", 5_000) + 1
    main, routine = matcher.scan_split(buf, lo, len(buf))
    grouped_main, grouped = matcher.scan_grouped(buf, lo, len(buf))
    assert grouped_main == sorted(main) and main
    assert len(grouped) >= 3
    assert grouped == {rid: [to for to, i in routine if i == rid] for rid in {i for _, i in routine}}
    assert min(min(ends) for ends in grouped.values()) > lo
