"""Edge matching (`rootrank ship --evidence-only`): which lines the shipper keeps, and that what it
would send diagnoses to the same incident as the whole logs on a simulated 256-rank job."""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import pytest

from correlator.diagnosis.evidence import EvidenceFilter, evidence_lines
from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.rules import RuleSet, load_ruleset
from correlator.offline.diagnose import Diagnoser
from correlator.tooling.simulate import log_paths, simulate
from ingest.ship.wire_format import encode_batch, encode_batches

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.14 GiB"


@pytest.fixture(scope="module")
def ruleset() -> RuleSet:
    return load_ruleset()


@pytest.fixture(scope="module")
def matcher(ruleset: RuleSet) -> Matcher:
    return Matcher(ruleset)


def chatter(n: int) -> list[str]:
    return [f"[rank3]: dataloader worker {i} prefetched shard {i * 7}" for i in range(n)]


def test_hits_are_sent_with_context_and_their_own_line_numbers(matcher: Matcher) -> None:
    lines = [*chatter(20), f"[rank3]: {OOM}", *chatter(20)]
    [(first, run)] = EvidenceFilter(matcher, context=2).select("rank3.log", 100, lines)
    assert first == 118 and run == lines[18:23]  # 2 before, the hit, 2 after, numbered in the stream


def test_context_crosses_chunk_boundaries_and_nothing_is_sent_twice(matcher: Matcher) -> None:
    filt = EvidenceFilter(matcher, context=3, heartbeat_s=3600)
    first_chunk = chatter(10)
    second_chunk = [f"[rank3]: {OOM}", *chatter(1), f"[rank3]: {OOM}", *chatter(10)]
    assert filt.select("s", 0, first_chunk) == []  # nothing yet: held as possible context
    runs = filt.select("s", 10, second_chunk)
    # Three lines of the first chunk before the first hit, both hits, three after the second one.
    assert runs == [(7, first_chunk[7:] + second_chunk[:6])]
    assert filt.heartbeat("s") == []  # not due yet
    [(last, [text])] = filt.heartbeat("s", final=True)  # end of stream: the last line, with its number
    assert (last, text) == (10 + len(second_chunk) - 1, second_chunk[-1])
    assert filt.heartbeat("s", final=True) == []  # already sent
    assert (filt.lines_read, filt.lines_matched, filt.lines_selected) == (23, 2, 10)


def test_heartbeat_carries_latest_progress_when_due(matcher: Matcher) -> None:
    now = [0.0]
    filt = EvidenceFilter(matcher, context=0, heartbeat_s=30, clock=lambda: now[0])
    steps = [f"[rank5]: iteration {i}/1000 | consumed samples: {i * 64} | lm loss: 2.{i:03d}" for i in range(40)]
    assert filt.select("r5", 0, steps) == []
    now[0] = 31.0
    heartbeat = filt.heartbeat("r5")
    assert heartbeat and heartbeat[-1] == (39, [steps[39]])
    now[0] = 62.0
    assert filt.heartbeat("r5") == []  # nothing read since the last one


def test_evidence_only_finds_the_same_incident_on_a_256_rank_job(ruleset: RuleSet, matcher: Matcher,
                                                                  tmp_path: Path) -> None:
    started = time.monotonic()
    diagnoser = Diagnoser(ruleset, matcher=matcher)
    truth = simulate("cuda_oom", world_size=256, hosts=32, seed=3, noise_lines=200, out=tmp_path / "sim")
    paths = log_paths(tmp_path / "sim", truth)
    full_incidents, _ = diagnoser.diagnose(paths, "j256")
    full_bytes = evidence_bytes = full_z = evidence_z = 0
    shipped_paths = []
    for path in paths:
        lines = Path(path).read_bytes().decode("utf-8", "replace").split("\n")
        full = encode_batches([(None, None, t) for t in lines], job_id="j256", host="h", file=path, offset=0)
        runs = evidence_lines(matcher, lines, context=5)
        evidence = [encode_batch([(None, None, t) for t in run], job_id="j256", host="h", file=path, offset=first)
                    for first, run in runs]
        full_bytes += sum(map(len, full))
        evidence_bytes += sum(map(len, evidence))
        full_z += sum(len(zlib.compress(m, 6)) for m in full)
        evidence_z += sum(len(zlib.compress(m, 6)) for m in evidence)
        # What the worker would see: the shipped lines at their own line numbers, nothing else.
        kept = [""] * len(lines)
        for first, run in runs:
            kept[first : first + len(run)] = run
        out = tmp_path / "shipped" / Path(path).relative_to(tmp_path / "sim")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(kept))
        shipped_paths.append(str(out))
    edge_incidents, _ = diagnoser.diagnose(shipped_paths, "j256")

    def essentials(incidents: list) -> list[tuple[object, ...]]:
        return [(i.class_, i.initiator.rank, i.initiator.host, i.initiator.rule) for i in incidents]

    assert essentials(edge_incidents) == essentials(full_incidents)
    assert essentials(full_incidents)[0][:3] == ("cuda_oom", truth.initiator.rank, truth.initiator.host)
    ratio = full_bytes / evidence_bytes
    print(f"\n256 ranks / 32 hosts, {sum(len(Path(p).read_bytes()) for p in paths) / 1e6:.1f} MB of logs: full shipping "
          f"{full_bytes / 1e6:.2f} MB ({full_z / 1e6:.2f} MB deflated), evidence-only (context 5) "
          f"{evidence_bytes / 1e6:.3f} MB ({evidence_z / 1e6:.3f} MB deflated): {ratio:.1f}x less "
          f"({full_z / evidence_z:.1f}x compressed); same incident {essentials(edge_incidents)[0]}; "
          f"{time.monotonic() - started:.1f}s")
    assert ratio > 5
