"""A worker stopped in the middle of a job (SIGTERM, or SIGKILL) and started again recovers the job's
state from the changelog: the incident is the offline one, and each revision is emitted once.

Tansu (consumer groups and restarts right); the faust producer sends one message per batch there
(configuration), so changelog recovery sees the whole log.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from correlator.diagnose import Diagnoser
from correlator.simulate import log_paths, simulate
from tests.fixtures.kafka import (
    BrokerAddress,
    incident_essentials,
    latest_revisions,
    produce,
    ship_format_messages,
    start_pipeline,
    wait_for,
)

pytestmark = pytest.mark.integration

QUIET_S = "8"


def _added(metrics: dict[str, float]) -> float:
    return metrics.get('rootrank_signals_applied_total{outcome="added"}', 0.0)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_worker_restart_mid_job_recovers_state(tansu_broker: BrokerAddress, tmp_path: Path, how: int) -> None:
    truth = simulate("cuda_oom", world_size=8, hosts=2, seed=11, noise_lines=10, out=tmp_path / "sim")
    first_file, second_file = sorted(log_paths(tmp_path / "sim", truth))
    job = f"restart-{how}"
    diagnoser = Diagnoser()
    offline = sorted((incident_essentials(i.to_json_dict()) for i in diagnoser.diagnose([first_file, second_file], job)[0]),
                     key=lambda i: i["incident_id"])
    second_half_signals = len(diagnoser.signals_from_paths([second_file], job, _stats()))

    pipeline = start_pipeline(tansu_broker, tmp_path, f"rr-restart-{how}", ENGINE__QUIET_WINDOW_S=QUIET_S)
    try:
        worker = pipeline.worker
        produce(tansu_broker, "rootrank.logs", ship_format_messages(job, first_file), key=b"first")
        wait_for(lambda: _added(worker.metrics()) > 0, 30, what="the first half's signals in the job table")
        time.sleep(4)  # past faust's commit interval: the first half is committed, only the changelog has it
        started = time.monotonic()
        code = worker.stop(how)
        if how == signal.SIGTERM:
            assert code == 0, worker.log_tail()

        # The second half arrives while the worker is down.
        produce(tansu_broker, "rootrank.logs", ship_format_messages(job, second_file), key=b"second")
        restarted = pipeline.add_worker()
        restarted.wait_ready()

        def same_as_offline(streamed: list[dict[str, object]]) -> bool:
            latest = latest_revisions(streamed).values()  # type: ignore[arg-type]
            return sorted((incident_essentials(i) for i in latest), key=lambda i: i["incident_id"]) == offline

        streamed = pipeline.incidents(job, until=same_as_offline, timeout=60)
        # Only the second half was new to the restarted worker: the first came back from the changelog.
        assert _added(restarted.metrics()) == second_half_signals
        seen = [(i["incident_id"], i["revision"]) for i in streamed]
        assert len(seen) == len(set(seen)), f"a revision was emitted twice: {seen}"
        print(f"\n{signal.Signals(how).name}: incident recovered and right {time.monotonic() - started:.1f}s after the "
              f"stop; {len(seen)} incident message(s), {second_half_signals} signals new after restart")
    finally:
        pipeline.stop()


def _stats():  # type: ignore[no-untyped-def]
    from correlator.diagnose import DiagnoseStats

    return DiagnoseStats()
