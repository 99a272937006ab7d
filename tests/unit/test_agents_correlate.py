"""The correlate agent under faust's test_context: signals in, incidents out when a window goes quiet.

The job table is a plain dict here (faust's Table needs a running producer for its changelog);
the integration tests run the real changelog-backed table against a broker.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import faust
import orjson
import pytest

from correlator.diagnosis.engine import Engine, JobState
from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.models import Signal
from correlator.diagnosis.rules import RuleSet, load_ruleset
from correlator.diagnosis.signals import SignalExtractor
from correlator.stream.agents.correlate import (
    JobCorrelator,
    JobEntry,
    close_message,
    make_correlate_agent,
    next_quiet_at,
    quiet_jobs,
)
from correlator.stream.agents.match import signal_to_bytes
from ingest.event import LogEvent

T0 = datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC)
QUIET_S = 5.0
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity of 79.14 GiB"


@pytest.fixture(scope="module")
def ruleset() -> RuleSet:
    return load_ruleset()


@pytest.fixture(scope="module")
def extractor(ruleset: RuleSet) -> SignalExtractor:
    return SignalExtractor(ruleset, Matcher(ruleset))


def oom_signals(extractor: SignalExtractor, job: str, ranks_at: list[tuple[int, float]]) -> list[Signal]:
    events = [
        LogEvent(job_id=job, host=f"node-{rank // 4}", rank=rank, ts=T0 + timedelta(seconds=at), offset=i,
                 line=OOM.format(gpu=rank % 4), file=f"rank{rank}.log")
        for i, (rank, at) in enumerate(ranks_at)
    ]
    signals = extractor.from_events(events)
    assert len(signals) == len(events)
    return signals


class Harness:
    """The agent with a settable clock, a dict table and an incidents channel."""

    def __init__(self, ruleset: RuleSet, table: dict[bytes, Any] | None = None) -> None:
        self.now = 1000.0
        self.table: dict[bytes, Any] = table if table is not None else {}
        self.app = faust.App(f"test-correlate-{uuid.uuid4().hex[:8]}", broker="kafka://127.0.0.1:9",
                             store="memory://", autodiscover=False)
        self.source, incidents = self.app.channel(), self.app.channel()
        self.incidents_seen = incidents.__aiter__()
        self.engine = Engine(ruleset)
        self.agent = make_correlate_agent(
            self.app, self.source, incidents, self.table, JobCorrelator(self.engine, quiet_window_s=QUIET_S),
            batch_size=1000, batch_within_s=0.02, clock=lambda: self.now,
        )

    async def put_batch(self, tested: Any, values: list[tuple[bytes, bytes]]) -> dict[str, Any]:
        before = len(tested.results)
        for key, value in values:
            await tested.put(key=key, value=value, partition=3, wait=False)
        while len(tested.results) == before:
            async with tested.new_value_processed:
                await asyncio.wait_for(tested.new_value_processed.wait(), 5)
        return dict(tested.results[len(tested.results) - 1])

    async def incidents(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                event = await asyncio.wait_for(self.incidents_seen.get(), 0.2)
            except TimeoutError:
                return out
            assert event.key == orjson.loads(event.value)["incident_id"].encode()
            out.append(orjson.loads(event.value))


def test_quiet_window_emits_once_and_revises_on_change(ruleset: RuleSet, extractor: SignalExtractor) -> None:
    h = Harness(ruleset)
    first = oom_signals(extractor, "job-a", [(3, 0.0)])
    later = oom_signals(extractor, "job-a", [(3, 0.0), (7, 4.0)])[1:]

    async def scenario() -> None:
        async with h.agent.test_context() as tested:
            summary = await h.put_batch(tested, [(b"job-a", signal_to_bytes(s)) for s in first])
            assert summary == {"signals_added": 1, "emitted": []}
            entry = h.table[b"job-a"]
            assert entry["open"] is True and entry["partition"] == 3

            # A close request before the window is quiet changes nothing.
            h.now += QUIET_S / 2
            assert await h.put_batch(tested, [(b"job-a", close_message("job-a", h.now))]) == {"signals_added": 0, "emitted": []}
            assert await h.incidents() == []

            h.now += QUIET_S
            summary = await h.put_batch(tested, [(b"job-a", close_message("job-a", h.now))])
            (incident,) = await h.incidents()
            expected = h.engine.correlate("job-a", first)[0].to_json_dict()
            assert summary["emitted"] == [f"{expected['incident_id']}#1"]
            assert (incident["incident_id"], incident["class"], incident["initiator"], incident["revision"]) == (
                expected["incident_id"], "cuda_oom", expected["initiator"], 1)
            assert incident["initiator"]["rank"] == 3
            assert h.table[b"job-a"]["open"] is False

            # A replay of the same signal (a restarted match worker) is dropped; closing again emits nothing.
            assert (await h.put_batch(tested, [(b"job-a", signal_to_bytes(first[0]))]))["signals_added"] == 0
            assert await h.put_batch(tested, [(b"job-a", close_message("job-a", h.now))]) == {"signals_added": 0, "emitted": []}

            # A late signal that changes the collateral: same incident id, revision 2.
            assert (await h.put_batch(tested, [(b"job-a", signal_to_bytes(s)) for s in later]))["signals_added"] == 1
            h.now += QUIET_S + 1
            await h.put_batch(tested, [(b"job-a", close_message("job-a", h.now))])
            (revised,) = await h.incidents()
            assert revised["incident_id"] == incident["incident_id"] and revised["revision"] == 2
            assert revised["initiator"]["rank"] == 3
            assert [(c["class"], c["ranks"]) for c in revised["collateral"]] == [("cuda_oom", [7])]

    asyncio.run(scenario())


def test_an_incident_a_late_line_supersedes_is_closed(ruleset: RuleSet, extractor: SignalExtractor) -> None:
    """Rank 3's earlier OOM arrives after rank 7's incident went out (its lines were held up): the new
    incident names rank 3, and rank 7's incident is sent once more, closed, naming its successor.
    Without the closing, rank 7's incident would stay open in Elasticsearch and on the pager."""
    h = Harness(ruleset)
    early, late = oom_signals(extractor, "job-s", [(3, 0.0), (7, 4.0)])

    async def scenario() -> None:
        async with h.agent.test_context() as tested:
            await h.put_batch(tested, [(b"job-s", signal_to_bytes(late))])
            h.now += QUIET_S + 1
            await h.put_batch(tested, [(b"job-s", close_message("job-s", h.now))])
            (first,) = await h.incidents()
            assert first["initiator"]["rank"] == 7 and first["status"] == "open"

            await h.put_batch(tested, [(b"job-s", signal_to_bytes(early))])
            h.now += QUIET_S + 1
            await h.put_batch(tested, [(b"job-s", close_message("job-s", h.now))])
            new, closed = await h.incidents()
            assert new["initiator"]["rank"] == 3 and new["incident_id"] != first["incident_id"]
            assert (closed["incident_id"], closed["revision"], closed["status"]) == (first["incident_id"], 2, "closed")
            assert closed["initiator"] == first["initiator"]
            assert new["incident_id"] in closed["confidence_reason"]

            # Closed once: another close of the quiet job sends nothing.
            h.now += QUIET_S + 1
            await h.put_batch(tested, [(b"job-s", close_message("job-s", h.now))])
            assert await h.incidents() == []

    asyncio.run(scenario())


def test_state_in_the_table_survives_a_new_agent(ruleset: RuleSet, extractor: SignalExtractor) -> None:
    """What a restarted worker sees after changelog recovery: the same dict, nothing emitted twice."""
    signals = oom_signals(extractor, "job-b", [(1, 0.0), (2, 1.0)])
    first = Harness(ruleset)

    async def run_first() -> list[dict[str, Any]]:
        async with first.agent.test_context() as tested:
            await first.put_batch(tested, [(b"job-b", signal_to_bytes(s)) for s in signals])
            first.now += QUIET_S
            await first.put_batch(tested, [(b"job-b", close_message("job-b", first.now))])
            return await first.incidents()

    emitted = asyncio.run(run_first())
    assert [i["revision"] for i in emitted] == [1]

    # The changelog holds the entries as JSON; recovery gives the new worker the same dicts.
    recovered = {k: orjson.loads(orjson.dumps(v)) for k, v in first.table.items()}
    second = Harness(ruleset, table=recovered)
    second.now = first.now + 60

    async def run_second() -> dict[str, Any]:
        async with second.agent.test_context() as tested:
            # Signals since the last commit are read again, then the window closes again.
            await second.put_batch(tested, [(b"job-b", signal_to_bytes(s)) for s in signals])
            second.now += 10 * QUIET_S
            summary = await second.put_batch(tested, [(b"job-b", close_message("job-b", second.now))])
            assert await second.incidents() == []
            return summary

    summary = asyncio.run(run_second())
    assert summary == {"signals_added": 0, "emitted": []}


def test_quiet_jobs_skips_open_windows_still_active_and_other_partitions() -> None:
    entries = [
        (b"quiet", {"open": True, "last_update": 100.0, "partition": 1}),
        (b"busy", {"open": True, "last_update": 118.0, "partition": 1}),
        (b"closed", {"open": False, "last_update": 10.0, "partition": 1}),
        (b"standby-copy", {"open": True, "last_update": 10.0, "partition": 2}),
    ]
    assert quiet_jobs(entries, now=120.0, quiet_window_s=5.0, active_partitions={1}) == ["quiet"]
    assert sorted(quiet_jobs(entries, now=120.0, quiet_window_s=5.0, active_partitions=None)) == ["quiet", "standby-copy"]
    # The next window to go quiet is the busy one's, at its last update + the window; none after that.
    assert next_quiet_at(entries, now=120.0, quiet_window_s=5.0, active_partitions={1}) == 123.0
    assert next_quiet_at(entries, now=124.0, quiet_window_s=5.0, active_partitions={1}) is None


def test_a_close_diagnoses_on_the_jobs_own_clock_however_long_it_was_quiet(ruleset: RuleSet,
                                                                            extractor: SignalExtractor) -> None:
    """Closing a window runs the engine as `rootrank diagnose` runs it, at the job's latest event: a
    checkpoint save logged as the job's last line has not missed its 1,200 s deadline, however long the
    job then stayed quiet on the wall clock (a replay, a late close, a restarted worker). (Off: the
    engine's clock advanced by the quiet time -> the absence rule fires after the job went quiet.)"""
    correlator = JobCorrelator(Engine(ruleset), quiet_window_s=QUIET_S)
    events = [LogEvent(job_id="j", host="node-0", rank=0, ts=T0, offset=0, file="rank0.log",
                       line="[Rank 0] Saving model checkpoint: /ckpt/global_step400")]
    signals = extractor.from_events(events)
    entry = JobEntry(state=JobState(job_id="j"))
    entry.state.add_all(signals, now=5000.0)
    entry.open = True
    offline = JobState(job_id="j")
    offline.add_all(signals)
    assert not Engine(ruleset).diagnose(offline)  # the deadline is not reached by the job's last line
    assert correlator.close(entry, 5000.0 + 7 * 24 * 3600) == []


def test_an_engine_error_closes_the_window_and_keeps_the_worker_going(ruleset: RuleSet, extractor: SignalExtractor) -> None:
    class FailingEngine(Engine):  # fault injection: the real engine, made to fail
        def diagnose(self, state: JobState, now: Any = None) -> list[Any]:
            raise RuntimeError("engine bug")

    h = Harness(ruleset)
    h.agent = make_correlate_agent(
        h.app, h.source, h.app.channel(), h.table, JobCorrelator(FailingEngine(ruleset), quiet_window_s=QUIET_S),
        batch_size=100, batch_within_s=0.02, clock=lambda: h.now, name="failing",
    )
    signals = oom_signals(extractor, "job-c", [(1, 0.0)])

    async def scenario() -> None:
        async with h.agent.test_context() as tested:
            await h.put_batch(tested, [(b"job-c", signal_to_bytes(s)) for s in signals])
            h.now += QUIET_S
            assert await h.put_batch(tested, [(b"job-c", close_message("job-c", h.now))]) == {"signals_added": 0, "emitted": []}
            assert h.table[b"job-c"]["open"] is False
            # The next job is still served.
            more = oom_signals(extractor, "job-d", [(2, 0.0)])
            assert (await h.put_batch(tested, [(b"job-d", signal_to_bytes(s)) for s in more]))["signals_added"] == 1

    asyncio.run(scenario())


def test_unreadable_stored_state_starts_the_job_afresh(ruleset: RuleSet, extractor: SignalExtractor) -> None:
    h = Harness(ruleset, table={b"job-e": {"state": {"signals": "not a list"}, "open": True}})
    signals = oom_signals(extractor, "job-e", [(4, 0.0)])

    async def scenario() -> None:
        async with h.agent.test_context() as tested:
            assert (await h.put_batch(tested, [(b"job-e", signal_to_bytes(s)) for s in signals]))["signals_added"] == 1

    asyncio.run(scenario())
    assert [s["rank"] for s in h.table[b"job-e"]["state"]["signals"]] == [4]


def test_a_window_restored_on_a_partition_just_taken_waits_a_quiet_window() -> None:
    """After a restart or a rebalance the table holds windows whose last signal is old: the match role
    may still be catching up on the rest of the failure, so such a window closes a quiet window after the
    partition was taken, not at once (the kill -9 test closed half a failure otherwise)."""
    entries = [(b"restored", {"open": True, "last_update": 100.0, "partition": 1}),
               (b"fresh", {"open": True, "last_update": 119.0, "partition": 1})]
    taken = {1: 118.0}
    assert quiet_jobs(entries, now=120.0, quiet_window_s=5.0, active_partitions={1}) == ["restored"]
    assert quiet_jobs(entries, now=120.0, quiet_window_s=5.0, active_partitions={1}, taken_at=taken) == []
    assert next_quiet_at(entries, now=120.0, quiet_window_s=5.0, active_partitions={1}, taken_at=taken) == 123.0
    assert quiet_jobs(entries, now=123.5, quiet_window_s=5.0, active_partitions={1}, taken_at=taken) == ["restored"]


def test_a_failure_later_lines_show_was_survived_is_sent_again_as_recovered(ruleset: RuleSet,
                                                                           extractor: SignalExtractor) -> None:
    """Rank 3's OOM is closed as the failure; then its later progress lines arrive (a forwarder held them
    up): the job went on after it, so the incident is revised, recovered, as `rootrank diagnose` of all the
    lines reports it. (Off: a revision is sent only when class, initiator or collateral change -> the store
    keeps the OOM open as what ended the job.)"""
    correlator = JobCorrelator(Engine(ruleset), quiet_window_s=QUIET_S)
    entry = JobEntry(state=JobState(job_id="j"))
    entry.state.add_all(oom_signals(extractor, "j", [(3, 0.0)]), now=100.0)
    first = correlator.close(entry, 110.0)
    assert [(i.class_, i.recovered, i.revision) for i in first] == [("cuda_oom", False, 1)]
    later = [LogEvent(job_id="j", host="node-0", rank=3, ts=T0 + timedelta(seconds=at), offset=10 + n,
                      file="rank3.log", line=f"{{'loss': 2.31, 'grad_norm': 1.02, 'learning_rate': 3e-05, 'epoch': {n}}}")
             for n, at in enumerate((30.0, 60.0, 90.0))]
    entry.state.add_all(extractor.from_events(later), now=120.0)
    entry.open = True
    revised = correlator.close(entry, 130.0)
    assert [(i.incident_id, i.recovered, i.revision) for i in revised] == [(first[0].incident_id, True, 2)]
