"""Every taxonomy class round-trips: simulate a job that fails that way, diagnose its logs, get the truth back.

For each class and a few seeds (clock skew on, the forwarder format rotating, late lines on one seed):
`diagnose_paths` must name the simulated class, and the simulated initiator's rank (or, when every rank
fails the same way, just the class). A failure message says what was simulated and what came back, so a
miss points at the rule library (its examples), the decoders or the engine.

ROOTRANK_ROUNDTRIP_SEEDS=N runs N seeds per class (default 3).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from correlator.diagnosis.rules import load_ruleset
from correlator.tooling.simulate import FORMATS, Truth, log_paths, simulate

CLASSES = sorted(load_ruleset().classes)
SEEDS = range(int(os.environ.get("ROOTRANK_ROUNDTRIP_SEEDS", "3")))
JSON_FORMATS = [f for f in FORMATS if f != "plain"]


RULESET = load_ruleset()


def _scenario(cls: str, seed: int) -> dict[str, object]:
    """Seed 0: the full 64 ranks on 8 hosts, plain files. Others: 16 ranks on 4 hosts, a forwarder format
    chosen by class and seed, late lines on seed 2. Skew up to 3 s everywhere."""
    if seed == 0:
        return {"world_size": 64, "hosts": 8, "fmt": "plain", "late_lines": 0, "noise_lines": 12}
    fmt = JSON_FORMATS[(CLASSES.index(cls) + seed) % len(JSON_FORMATS)] if seed % 2 else "plain"
    return {"world_size": 16, "hosts": 4, "fmt": fmt, "late_lines": 6 if seed == 2 else 0, "noise_lines": 8}


def _describe(truth: Truth, incidents: list[object]) -> str:
    got = [
        f"{i.class_} rank={i.initiator.rank} host={i.initiator.host} rule={i.initiator.rule} "  # type: ignore[attr-defined]
        f"conf={i.confidence}: {i.confidence_reason}"  # type: ignore[attr-defined]
        for i in incidents[:3]
    ]
    want = "every rank" if truth.initiator.all else f"rank {truth.initiator.rank} on {truth.initiator.host}"
    return (
        f"simulated {truth.class_} by {want} (mode {truth.mode}, rule {truth.rule}, format {truth.format}, "
        f"failure line {truth.failure_lines[:1]}); diagnosed: {got or 'no incident'}"
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cls", CLASSES)
def test_simulated_class_round_trips(cls: str, seed: int, tmp_path: Path) -> None:
    from correlator.offline.diagnose import diagnose_paths

    truth = simulate(cls, seed=seed, skew_max_s=3.0, out=tmp_path, **_scenario(cls, seed))  # type: ignore[arg-type]
    incidents = diagnose_paths(log_paths(tmp_path, truth), job_id=truth.job_id)

    assert incidents, _describe(truth, incidents)
    primary = incidents[0]
    # The simulated class, or a class the rule library says causes it when the scenario logged that
    # cause too (a partial save after "No space left on device" is diagnosed as the full disk).
    causes = {c for c, explained in RULESET.explains_by_class().items() if cls in explained}
    assert primary.class_ == cls or (primary.class_ in causes and truth.mode != "hang"), _describe(truth, incidents)
    if truth.initiator.unknown:
        # Nothing in the logs shows who started it: a diagnosis must not claim a rank with confidence.
        assert primary.initiator.rank is None or primary.confidence < 0.5, _describe(truth, incidents)
    elif not truth.initiator.all:
        # The process is named either by its global rank, or by host plus local rank or pid (a
        # launcher's line names local ranks only).
        got, want = primary.initiator, truth.initiator
        same_process = got.rank == want.rank or (
            got.rank is None and got.host == want.host
            and ((got.local_rank is not None and got.local_rank == want.local_rank)
                 or (got.pid is not None and got.pid == want.pid))
        )
        assert same_process, _describe(truth, incidents)
