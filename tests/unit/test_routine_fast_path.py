"""The fast paths of routine lines (issue 30) give what the slow ones gave.

- A line that starts with no rank prefix is keyed to its process without a parse when it cannot name one:
  its first byte cannot start an identity, or its shape (digits made 0) is known to name nobody.
- A file of a training script's printed dicts (`{'loss': ...}`, HF Trainer's log) is a plain log, not
  forwarder JSON.
- With several scan processes a file from 8 MiB on is cut into regions for them.

Each test says what breaks it when its mechanism is switched off or wrong.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from benchmarks.families import GENERATORS
from correlator.diagnosis.models import Signal
from correlator.offline import diagnose
from correlator.offline.diagnose import Diagnoser, _regions
from correlator.offline.routine import NO_IDENTITY
from correlator.tooling.simulate import log_paths, simulate

# Lines with no rank prefix in front, whose identity the parser finds or not; digits move in each (the
# shape cache must not give one line's answer to another that names somebody).
ODD_STARTS = [
    "{'loss': 2.1, 'grad_norm': 0.8811, 'learning_rate': 2e-05, 'epoch': 0.1}",
    "3: {'loss': 2.1, 'grad_norm': 0.8811, 'learning_rate': 2e-05, 'epoch': 0.1}",  # srun --label: rank 3
    "17: {'loss': 2.1, 'grad_norm': 0.8811, 'learning_rate': 2e-05, 'epoch': 0.1}",
    "1234567: {'loss': 2.1, 'grad_norm': 0.8811}",  # too long for srun's label: nobody
    "  5: step 7 loss 2.5 grad_norm 1.5",
    " iteration      100/  500000 | lm loss: 2.331000E+00 | grad norm: 0.377 |",
    " [2026-12-04 10:00:02] iteration      100/  500000 | lm loss: 2.331000E+00 | grad norm: 0.377 |",
    "[2026-12-04 10:00:02,117] [INFO] [logging.py:96:log_dist] [Rank 0] step=100, skipped=0, lr=[0.0003]",
    "[2026-12-04 10:00:02,117 E 7046 7269] core.cc:361: step 12 loss 2.5",  # Ray's C++ header: a pid
    "2026-12-04 10:00:02,255 - INFO - train - Epoch 0 | step 1 | loss 2.0283",
    "2026-12-04T10:00:02.255123+00:00 gpu-node-3 train[4411]: step 12 loss 2.5 grad_norm 1.25",  # rsyslog
    "<13>1 2026-12-04T10:00:02.255Z gpu-node-3 train 4411 - - step 12 loss 2.5",
    "I1204 10:00:02.117123 21001 train.py:412] step 100 loss 2.1 grad_norm 1.5",  # glog: a pid
    "gpu-node-004:40036:40148 [4] NCCL INFO step 12 loss 2.5 grad_norm 1.5",  # host and pid
    "gpu-node-004: [2026-12-04 10:00:02,117] [INFO] step=100, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]",
    "(RayTrainWorker pid=4411, ip=10.0.3.7) step 12 loss 2.5 grad_norm 1.5",
    "(raylet) step 12 loss 2.5",
    "\x1b[32m[rank3]:\x1b[0m step 12 loss 2.5 grad_norm 1.5",
    "\x1b[32mINFO\x1b[0m step 12 loss 2.5",
    "Epoch 0:  12%|█▏        | 120/1000 [00:30<03:40,  4.00it/s, loss=2.34, v_num=0]",
    "\r 12%|█▏        | 120/1000 [00:30<03:40,  4.00it/s, loss=2.34]",
    "|  5 | loss 2.5 | grad_norm 1.5 |",
    "\tloss: 2.5",
    "Étape 12 loss 2.5",
    "[80746] [rank3]: step 12 loss 2.5",
    "[default3]: step 12 loss 2.5 grad_norm 1.5",
    "[1,7]<stdout>: step 12 loss 2.5 grad_norm 1.5",
    "[E1204 10:00:02.117123 4411 train.cpp:12] step 12 loss 2.5",
    "May  1 12:00:00 gpu-node-3 train[4411]: step 12 loss 2.5",
    "train-1  | step 12 loss 2.5 grad_norm 1.5",  # docker compose: a host
    "node-3.log:step 12 loss 2.5",
]


def _variants(line: str, rng: random.Random, n: int) -> list[str]:
    """`line` with its digits changed at random (the same shape), `n` times."""
    return ["".join(str(rng.randrange(10)) if c.isdigit() else c for c in line) for _ in range(n)]


@pytest.fixture(scope="module")
def diagnoser() -> Diagnoser:
    return Diagnoser()


def _reference_and_fast(diagnoser: Diagnoser, lines: list[str]) -> tuple[list[object], list[object]]:
    """Every line's process key by the per-line parse (the slow path), and as `_keys` gives it."""
    aggregator = diagnoser.routine
    aggregator._anonymous.clear()
    buf = ("\n".join(lines) + "\n").encode()
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line.encode()) + 1
    ends = [buf.index(b"\n", s) for s in starts]
    got_starts, keys = aggregator._keys(buf, 0, len(buf), ends)
    assert got_starts == starts
    fast = [aggregator._process(key) for key in keys]
    reference: list[object] = []
    for start, key in zip(starts, keys, strict=True):
        if isinstance(key, bytes):  # a rank prefix: the established fast key, not what this file tests
            reference.append(aggregator._process(key))
        else:
            reference.append(aggregator._slow_key(buf, start, len(buf)))
    return reference, fast


def test_lines_without_a_rank_prefix_get_the_process_their_parse_gives(diagnoser: Diagnoser) -> None:
    """Switched off or wrong (a first byte taken for one that names nobody, a shape's answer given to a line
    that names somebody), a line of a pid or a host is filed under nobody, or the other way round."""
    rng = random.Random(30)
    lines = [variant for line in ODD_STARTS for variant in [line, *_variants(line, rng, 6)]]
    rng.shuffle(lines)
    reference, fast = _reference_and_fast(diagnoser, lines)
    assert fast == reference
    named = sum(key != NO_IDENTITY for key in fast)
    assert named > len(lines) // 3 and fast.count(NO_IDENTITY) > len(lines) // 4  # both kinds are in the test


@pytest.mark.parametrize("family", sorted(GENERATORS))
def test_every_family_line_gets_the_process_its_parse_gives(diagnoser: Diagnoser, family: str) -> None:
    rng = random.Random(family)
    lines = [line for step in range(1, 900, 3) for line in GENERATORS[family](rng, step) if "\n" not in line]
    reference, fast = _reference_and_fast(diagnoser, lines)
    assert fast == reference


def _hf_dicts(path: Path) -> tuple[float, float, str]:
    """A Trainer's log as a plain `> file` captures it (rank 0, no prefix): max, min, last line."""
    norms = [1.0 + (step * 7 % 11) / 10 for step in range(3000)]
    norms[1234] = 87.5
    lines = [f"{{'loss': {2.5 - s / 3000:.4f}, 'grad_norm': {g!r}, 'learning_rate': 2e-05, 'epoch': {s / 1000:.2f}}}"
             for s, g in enumerate(norms)]
    lines.append("{'train_runtime': 1234.5678, 'train_samples_per_second': 41.2, 'train_loss': 1.2345, 'epoch': 3.0}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return max(norms), min(norms), lines[-2]


def test_a_file_of_printed_dicts_is_a_plain_log(diagnoser: Diagnoser, tmp_path: Path) -> None:
    """Read as forwarder JSON (the sniff switched back), every 4,096 lines give their own metric and progress
    signals and each line costs a decode: here one of each for the one process."""
    log = tmp_path / "trainer.log"
    high, low, last = _hf_dicts(log)
    assert not diagnose._looks_json_lines(log.read_bytes()[:65536])
    _, signals = diagnoser.diagnose([str(log)], "job")
    metric = [s for s in signals if "metric" in s.fields]
    assert len(metric) == 1 and metric[0].fields["grad_norm"] == high and metric[0].fields["metric_min"] == low
    progress = [s for s in signals if s.rule_id == "straggler-step-no-progress"]
    assert len(progress) == 1 and progress[0].line == last
    forwarder = tmp_path / "forwarder.jsonl"
    forwarder.write_text('{"log": "hello", "stream": "stderr"}\n{"log": "world"}\n', encoding="utf-8")
    assert diagnose._looks_json_lines(forwarder.read_bytes())


def test_scan_processes_cut_a_file_of_16_to_64_mb_into_regions() -> None:
    """Switched off (regions of 16 MiB whatever the processes), a 16 MB file is one region: one process scans it."""
    two, one = Diagnoser(jobs=2), Diagnoser(jobs=1)
    mib = 1024 * 1024
    assert [two.region_bytes(n * mib) for n in (8, 16, 32, 64, 300)] == [2 * mib, 4 * mib, 8 * mib, 16 * mib, 16 * mib]
    assert one.region_bytes(16 * mib) == 16 * mib
    assert two._mapped_from() == 8 * mib and one._mapped_from() == 16 * mib
    data = b"".join(b"x" * 99 + b"\n" for _ in range(16 * mib // 100))
    assert len(_regions(data, two.region_bytes(len(data)))) == 4


def _routine(signals: list[Signal]) -> list[tuple[object, ...]]:
    return sorted((s.rule_id, s.rank, s.host, s.pid, s.line, str(sorted(s.fields.items())))
                  for s in signals if "metric" in s.fields or s.fields.get("marker") == "end")


@pytest.mark.parametrize("cls", ["sdc_grad_norm_spike", "loss_nan", "straggler_hang"])
def test_metric_findings_are_the_same_with_one_process_two_and_any_regions(
    cls: str, diagnoser: Diagnoser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grad-norm spike on one rank, a non-finite loss and a hang after the last progress of every rank:
    the same incidents and the same routine signals (each process's latest progress line, its largest and
    smallest metric value) whether one process scans the files or two scan regions of any size."""
    truth = simulate(cls, world_size=32, hosts=4, seed=5, noise_lines=300, skew_max_s=2.0, out=tmp_path)
    paths = log_paths(tmp_path, truth)
    sizes = [Path(p).stat().st_size for p in paths]
    diagnoser.jobs = 1
    try:
        incidents, signals = diagnoser.diagnose(paths, truth.job_id)
        assert incidents and incidents[0].class_ == cls
        expected = ([i.incident_id for i in incidents], _routine(signals))
        monkeypatch.setattr(diagnose, "PARALLEL_BYTES", min(sizes) // 2)  # every file is mapped and split
        for region in (min(sizes) // 7, min(sizes) // 3, 64 * 1024):
            monkeypatch.setattr(diagnose, "CHUNK_BYTES", region)
            monkeypatch.setattr(diagnose, "MIN_REGION_BYTES", region // 2)
            for jobs in (1, 2):
                diagnoser.jobs = jobs
                got, got_signals = diagnoser.diagnose(paths, truth.job_id)
                assert ([i.incident_id for i in got], _routine(got_signals)) == expected, (region, jobs)
        diagnoser.jobs = 2
        assert len(_regions(Path(paths[0]).read_bytes(), diagnoser.region_bytes(sizes[0]))) > 1
    finally:
        diagnoser.jobs = 1


def _stream_lines(rng: random.Random, n: int, odd: bool) -> list[str]:
    """Metric lines in every shape the bulk fold must hand back or read: plain ones, a failure line with a
    grad norm (another rule hit it), two metric patterns on one line, one pattern twice, and with `odd` a
    value the bulk reader leaves to the regex."""
    out: list[str] = []
    for i in range(n):
        g = rng.random() * 3
        roll = rng.random()
        if roll < 0.05:
            out.append(f"step {i} grad_norm: {g:.3f} then grad_norm: {g * 5:.3f}")
        elif roll < 0.4:
            out.append(f"{{'loss': {g:.4f}, 'grad_norm': {g!r}, 'learning_rate': 2e-05, 'epoch': {i / 1000:.2f}}}")
        elif roll < 0.5:
            out.append(f" iteration {i:>8}/  500000 | lm loss: 2.3E+00 | params norm: {100 + g:.3f} | grad norm: {g:.3f} |")
        elif roll < 0.55:
            out.append(f"step {i} grad_norm: {g:.2f} gnorm {g * 2:.2f} grad_norm={g * 3:.2f}")
        elif roll < 0.57 and odd:
            out.append(f"step {i} grad_norm=4.5-{i}")  # a sign after the value: read by the regex
        elif roll < 0.6:
            out.append(f"RuntimeError: CUDA error: an illegal memory access was encountered grad_norm: {g:.2f}")
        elif roll < 0.63:
            out.append(f"step {i} grad_norm: {10 ** rng.randrange(1, 40):.1f} loss {g:.2f}")
        elif roll < 0.66:
            out.append("{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05}")
        else:
            out.append(f"gpu-node-1:{4000 + i % 5}:{4000 + i % 5} [0] NCCL INFO AllReduce: opCount {i:x} count 1024")
    return out


@pytest.mark.parametrize("framing", ["ship", "one-line"])
def test_the_match_stage_folds_metric_hits_in_bulk_as_line_by_line(framing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Switched off (every metric hit back to the line-by-line fold), the signals are the same; broken (a
    hard line, a line of two patterns or a second hit of a pattern folded in bulk), they are not."""
    import orjson

    from correlator.diagnosis.rules import load_ruleset
    from correlator.diagnosis.signals import SignalExtractor
    from correlator.stream.agents.match import MatchProcessor, RawMessage
    from ingest.ship.wire_format import encode_batch

    rng = random.Random(framing)
    batches: list[list[bytes]] = []
    for batch in range(4):  # the first batch has odd values: its pattern's hits all go line by line
        values: list[bytes] = []
        for message in range(10):
            lines = _stream_lines(rng, rng.choice([3, 40, 400]), odd=batch == 0)  # 3 lines: no run of their own
            if framing == "ship":
                values.append(encode_batch([(None, None, line) for line in lines], job_id="j", host=f"h{message % 3}",
                                           rank=message % 4, file="train.log", offset=(batch * 10 + message) * 1000))
            else:
                values.extend(orjson.dumps({"log": line + "\n", "stream": "stderr", "hostname": f"h{k % 3}",
                                            "job_id": "j"}) for k, line in enumerate(lines))
        batches.append(values)
    processor = MatchProcessor(SignalExtractor(load_ruleset()))

    def run() -> list[tuple[object, ...]]:
        rows = []
        for values in batches:
            out = processor.process_values(values, lambda i, v=values: RawMessage(v[i], "t", 0, i, 1.0))
            rows.extend((s.rule_id, s.rank, s.host, s.order, s.line, str(sorted(s.fields.items()))) for s in out.signals)
        return sorted(rows)

    fast = run()
    assert any("metric" in row[5] for row in fast)

    def line_by_line(_self: SignalExtractor, _buf: bytes, metric_raw: dict[int, list[int]],
                     *_args: object) -> list[tuple[int, int]]:
        return sorted((to, rid) for rid, ends in metric_raw.items() for to in ends)

    monkeypatch.setattr(SignalExtractor, "_metric_hits_in_bulk", line_by_line)
    assert run() == fast
