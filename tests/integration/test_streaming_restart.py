"""A worker stopped in the middle of a job (SIGTERM, or SIGKILL) and started again recovers the job's
state from the changelog: the incident is the offline one, and each revision is emitted once.

Tansu (consumer groups and restarts right); the faust producer sends one message per batch there
(configuration), so changelog recovery sees the whole log.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from correlator.diagnosis.rules import load_ruleset
from correlator.stream.agents.match import MatchProcessor, RawMessage
from correlator.tooling.simulate import log_paths, simulate
from tests.fixtures.kafka import (
    Pipeline,
    offline_diagnoser,
    offline_incidents,
    produce,
    rules_snapshot,
    ship_format_messages,
    start_pipeline,
    start_tansu,
    streamed_essentials,
    wait_for,
)

pytestmark = pytest.mark.integration

QUIET_S = "8"


def _added(metrics: dict[str, float]) -> float:
    return metrics.get('rootrank_signals_applied_total{outcome="added"}', 0.0)


@pytest.fixture(scope="module")
def restart_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """One broker and worker group for both tests: the worker the SIGTERM test restarts is the one
    the SIGKILL test kills (one worker start fewer)."""
    workdir = tmp_path_factory.mktemp("restart")
    broker = start_tansu(workdir)
    pipeline = start_pipeline(broker, workdir, "rr-restart", ENGINE__QUIET_WINDOW_S=QUIET_S)
    try:
        yield pipeline
    finally:
        pipeline.stop()
        broker.stop()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_worker_restart_mid_job_recovers_state(restart_pipeline: Pipeline, tmp_path: Path, how: int) -> None:
    pipeline = restart_pipeline
    truth = simulate("cuda_oom", world_size=8, hosts=2, seed=11, noise_lines=10, out=tmp_path / "sim",
                     ruleset=load_ruleset(rules_snapshot()))
    first_file, second_file = sorted(log_paths(tmp_path / "sim", truth))
    job = f"restart-{signal.Signals(how).name.lower()}"
    offline = offline_incidents([first_file, second_file], job)
    # What the match agent makes of the second half (the same processor the worker runs).
    processor = MatchProcessor(offline_diagnoser().extractor)
    second_half = ship_format_messages(job, second_file)
    second_half_messages = [RawMessage(v, "rootrank.logs", 0, i) for i, v in enumerate(second_half)]
    second_half_signals = len(processor.process(second_half_messages).signals)
    # Routine lines (progress, metric values) collapse per batch, so the worker's count lies between
    # the second half as one batch and as one batch per message.
    second_half_most = sum(len(processor.process([RawMessage(v, "rootrank.logs", 0, i)]).signals)
                           for i, v in enumerate(second_half))
    first_half = ship_format_messages(job, first_file)
    first_half_signals = len(processor.process([RawMessage(v, "rootrank.logs", 0, i) for i, v in enumerate(first_half)]).signals)

    alive = [w for w in pipeline.workers if w.proc is not None and w.proc.poll() is None]
    worker = alive[0] if alive else pipeline.add_worker()
    worker.wait_ready()
    before = _added(worker.metrics())
    produce(pipeline.bootstrap, "rootrank.logs", first_half, key=b"first")
    # The stop must come after the whole first half is in the job table (a loaded machine processes
    # it slowly); what is tested is that the table survives the stop, not a race with the stop.
    wait_for(lambda: _added(worker.metrics()) - before >= first_half_signals, 60,
             what="all of the first half's signals in the job table")
    time.sleep(4)  # past faust's commit interval: the first half is committed, only the changelog has it
    started = time.monotonic()
    code = worker.stop(how)
    if how == signal.SIGTERM:
        assert code == 0, worker.log_tail()

    # The second half arrives while the worker is down.
    produce(pipeline.bootstrap, "rootrank.logs", second_half, key=b"second")
    restarted = pipeline.add_worker()
    restarted.wait_ready()

    streamed = pipeline.incidents(job, until=lambda s: streamed_essentials(s, job) == offline, timeout=90)
    # Only the second half was new to the restarted worker: the first came back from the changelog.
    assert second_half_signals <= _added(restarted.metrics()) <= second_half_most
    seen = [(i["incident_id"], i["revision"]) for i in streamed]
    assert len(seen) == len(set(seen)), f"a revision was emitted twice: {seen}"
    print(f"\n{signal.Signals(how).name}: incident recovered and right {time.monotonic() - started:.1f}s after the "
          f"stop; {len(seen)} incident message(s), {second_half_signals} signals new after restart")
