"""Streaming and offline give the same incident: a multi-rank job's logs, shipped with `rootrank ship`
through Kafka and the worker, end up on rootrank.incidents as the incident `rootrank diagnose`
finds in the same files (class, initiator, collateral, id)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from correlator.diagnosis.rules import load_ruleset
from correlator.tooling.simulate import log_paths, simulate
from tests.fixtures.kafka import (
    REPO,
    Pipeline,
    latest_revisions,
    offline_incidents,
    rules_snapshot,
    streamed_essentials,
)

pytestmark = pytest.mark.integration


def ship_files(pipeline: Pipeline, job: str, paths: list[str], state_dir: Path, *extra: str) -> None:
    """One `rootrank ship` per host file (tagged with that host), all at once like one per host."""
    procs = []
    for path in paths:
        host = Path(path).parent.name
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "correlator.cli", "ship", "--job", job, "--host", host, "--file", path,
             "--state-dir", str(state_dir), "--linger-ms", "100", *extra],
            cwd=REPO, env=pipeline.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert " 0 still spooled" in err, err


@pytest.mark.parametrize("cls,seed", [("cuda_oom", 3), ("nccl_timeout", 5)])
def test_shipped_job_gives_the_offline_incident(noida_pipeline: Pipeline, tmp_path: Path, cls: str, seed: int) -> None:
    truth = simulate(cls, world_size=8, hosts=2, seed=seed, noise_lines=12, out=tmp_path / "sim",
                     ruleset=load_ruleset(rules_snapshot()))
    paths = log_paths(tmp_path / "sim", truth)
    job = f"eq-{cls}-{seed}-{time.time_ns() % 10**8}"
    offline = offline_incidents(paths, job)
    assert offline, f"diagnose found nothing in {paths}"

    started = time.monotonic()
    ship_files(noida_pipeline, job, paths, tmp_path / "ship-state")
    try:
        streamed = noida_pipeline.incidents(job, until=lambda s: streamed_essentials(s, job) == offline, timeout=60)
    except AssertionError:
        assert streamed_essentials(noida_pipeline.incidents(job, timeout=5), job) == offline  # shows the difference
        raise
    lines = sum(Path(p).read_bytes().count(b"\n") for p in paths)
    print(f"\n{cls}: {lines} lines from {len(paths)} hosts shipped; the offline incident(s) on "
          f"rootrank.incidents after {time.monotonic() - started:.1f}s, in {len(streamed)} message(s)")
    # One message per revision, revisions counted from 1 without gaps.
    latest: dict[str, Any] = latest_revisions(streamed)
    for incident_id, incident in latest.items():
        revisions = sorted(i["revision"] for i in streamed if i["incident_id"] == incident_id)
        assert revisions == list(range(1, incident["revision"] + 1))
