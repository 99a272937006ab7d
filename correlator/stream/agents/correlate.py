"""The `correlate` agent: signals in, incidents out, one job's state per table key.

Each job's `JobState` lives in a faust Table (changelog-backed, so a restarted or rebalanced worker
recovers it). A timer looks for jobs whose window went quiet and sends a *close* control message
through the signals topic, keyed by the job: the close is then handled by whichever worker owns the
job's partition at that moment, in order with the job's signals, and its table write is committed
with the offsets like any other. Closing diagnoses the job with the same engine `rootrank diagnose`
uses and emits new or revised incidents (same id; revision + 1 when class, initiator or collateral
change). What was emitted is remembered in the state, so a restart or a replay does not emit twice.

Replays: after a crash, signals since the last committed offset are read again (and the match
agent may send duplicates of signals it had already sent). A bounded ring of signal digests per job
drops those duplicates, so counts in the incident stay what they were.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import Counter

from correlator.diagnosis.engine import Engine, JobState
from correlator.diagnosis.models import Incident, Signal
from correlator.stream import metrics

log = logging.getLogger(__name__)

SEEN_DIGESTS_PER_JOB = 4096
ENTRY_CACHE_JOBS = 256  # parsed job entries kept by the correlate agent (the most recently written)
CONTROL_CLOSE = "close"

SIGNALS_APPLIED = Counter("rootrank_signals_applied_total", "signals added to job state, by outcome", ["outcome"])
INCIDENTS_EMITTED = Counter("rootrank_incidents_emitted_total", "incidents sent, by kind", ["kind"])
JOB_ERRORS = Counter("rootrank_correlate_job_errors_total", "jobs the correlator could not handle, by reason", ["reason"])


def signal_digest(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def incident_fingerprint(incident: Incident) -> str:
    """What makes a new revision: the class, the initiator, the collateral, and whether the job survived it (a
    failure later lines show the job went on after becomes a recovered warning: the sink and the receivers
    must hear it, or the store keeps it open as what ended the job while `diagnose` lists it as survived)."""
    data = incident.to_json_dict()
    basis = {"class": data["class"], "initiator": data["initiator"], "collateral": data["collateral"],
             "recovered": data["recovered"]}
    return hashlib.sha256(orjson.dumps(basis, option=orjson.OPT_SORT_KEYS)).hexdigest()[:24]


def incident_to_bytes(incident: Incident) -> bytes:
    return orjson.dumps(incident.to_json_dict())


def close_message(job_id: str, now: float) -> bytes:
    return orjson.dumps({"control": CONTROL_CLOSE, "job_id": job_id, "at": now})


@dataclass
class JobEntry:
    """The table value for one job (stored as a JSON dict)."""

    state: JobState
    seen: list[str] = field(default_factory=list)
    open: bool = False
    partition: int | None = None
    # The last revision sent of each incident that is still open: what to close when a later
    # diagnosis of the job no longer has it.
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, job_id: str, data: dict[str, Any] | None) -> JobEntry:
        if not data:
            return cls(state=JobState(job_id=job_id))
        return cls(
            state=JobState.model_validate(data["state"]),
            seen=list(data.get("seen") or []),
            open=bool(data.get("open")),
            partition=data.get("partition"),
            sent=dict(data.get("sent") or {}),
        )

    # Each signal's JSON dict from the last to_dict, by identity (signals are frozen): a batch changes
    # a few of a job's signals, so only those are dumped again.
    dumped_signals: dict[int, tuple[Signal, dict[str, Any]]] = field(
        default_factory=dict, repr=False, compare=False)

    def state_dict(self) -> dict[str, Any]:
        state = self.state
        dumped: dict[int, tuple[Signal, dict[str, Any]]] = {}
        signals: list[dict[str, Any]] = []
        for signal in state.signals:
            cached = self.dumped_signals.get(id(signal))
            data = cached[1] if cached is not None and cached[0] is signal else signal.model_dump(mode="json", by_alias=True)
            dumped[id(signal)] = (signal, data)
            signals.append(data)
        self.dumped_signals = dumped
        rest = state.model_dump(mode="json", by_alias=True, exclude={"signals"})
        rest["signals"] = signals
        return {name: rest[name] for name in JobState.model_fields}  # in JobState's order, as model_dump gives them

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state_dict(),
            "seen": self.seen[-SEEN_DIGESTS_PER_JOB:],
            "open": self.open,
            "last_update": self.state.last_update,
            "partition": self.partition,
            "sent": self.sent,
        }


@dataclass
class Decoded:
    """A message from the signals topic: a signal, a close request, or junk."""

    job_id: str
    signal: Signal | None = None
    digest: str | None = None
    close: bool = False


def decode_signal_messages(key: bytes | str | None, value: bytes | str | None) -> list[Decoded]:
    """A signals record: one signal, a JSON list of one job's signals (what the match agent sends for
    a job with several signals in a batch), or a close request. Junk gives [] (logged).

    A signal's replay digest is taken over its own JSON (re-serialized), so a signal re-sent after a
    crash is recognised whether it came alone or in a list the first time."""
    if value is None:
        return []
    raw = value.encode("utf-8") if isinstance(value, str) else value
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        log.warning("skipping a signals message that is not JSON (%d bytes)", len(raw))
        return []
    items: list[object]
    if isinstance(data, dict):
        if data.get("control") == CONTROL_CLOSE:
            return [Decoded(job_id=str(data.get("job_id")), close=True)]
        items = [data]
    elif isinstance(data, list):
        items = data
    else:
        return []
    out: list[Decoded] = []
    for item in items:
        if not isinstance(item, dict):
            log.warning("skipping a signals list entry that is not an object")
            continue
        try:
            signal = Signal.model_validate(item)
        except ValueError as exc:
            log.warning("skipping a signals message that is not a Signal: %s", exc)
            continue
        own = raw if len(items) == 1 and isinstance(data, dict) else orjson.dumps(item)
        out.append(Decoded(job_id=signal.job_id, signal=signal, digest=signal_digest(own)))
    return out


class JobCorrelator:
    """The agent's work without faust: apply signals to a job entry, close quiet windows."""

    def __init__(self, engine: Engine, *, quiet_window_s: float) -> None:
        self.engine = engine
        self.quiet_window_s = quiet_window_s

    def apply(self, entry: JobEntry, items: Iterable[Decoded], now: float, partition: int | None) -> int:
        """Add signals to the job; returns how many were new (not replays)."""
        added = 0
        seen = set(entry.seen)
        for item in items:
            if item.signal is None or item.digest is None:
                continue
            if item.digest in seen:
                SIGNALS_APPLIED.labels("duplicate").inc()
                continue
            seen.add(item.digest)
            entry.seen.append(item.digest)
            entry.state.add(item.signal, now)
            added += 1
        SIGNALS_APPLIED.labels("added").inc(added)
        if added:
            entry.state.last_update = now
            entry.open = True
            if partition is not None:
                entry.partition = partition
        if len(entry.seen) > SEEN_DIGESTS_PER_JOB:
            del entry.seen[: len(entry.seen) - SEEN_DIGESTS_PER_JOB]
        return added

    def is_quiet(self, entry: JobEntry, now: float) -> bool:
        last = entry.state.last_update
        return entry.open and (last is None or now - last >= self.quiet_window_s)

    def close(self, entry: JobEntry, now: float) -> list[Incident]:
        """Diagnose a quiet job; returns the incidents to emit (new, or revised) and marks them emitted.

        The engine's clock is the job's own, its latest event, as `rootrank diagnose` runs it: how long
        the job has been quiet (on the wall clock, which depends on when its lines arrived) changes
        nothing, so a replay, a restart or a late close gives the same incidents."""
        entry.open = False
        state = entry.state
        incidents = self.engine.diagnose(state)
        out: list[Incident] = []
        for incident in incidents:
            fingerprint = incident_fingerprint(incident)
            if state.emitted.get(incident.incident_id) == fingerprint:
                continue
            revision = state.revisions.get(incident.incident_id, 0) + 1
            state.emitted[incident.incident_id] = fingerprint
            state.revisions[incident.incident_id] = revision
            revised = incident.model_copy(update={"revision": revision})
            entry.sent[incident.incident_id] = revised.to_json_dict()
            out.append(revised)
        out.extend(self.close_superseded(entry, incidents))
        return out

    @staticmethod
    def close_superseded(entry: JobEntry, incidents: Sequence[Incident]) -> list[Incident]:
        """Incidents sent earlier that this diagnosis no longer has: lines that came later (a rank's
        lines held up by a forwarder or a rebalance) changed who or what initiated the failure. Each is
        sent once more, closed, naming the incident of its attempt that replaces it, so an
        Elasticsearch document or a pager alert that named the wrong rank does not stay open."""
        state = entry.state
        current = {incident.incident_id for incident in incidents}
        out: list[Incident] = []
        for incident_id in [i for i in entry.sent if i not in current]:
            previous = Incident.model_validate(entry.sent.pop(incident_id))
            successor = next((i for i in incidents if i.attempt == previous.attempt),
                             incidents[0] if incidents else None)
            reason = (f"superseded by incident {successor.incident_id} ({successor.class_}): later lines changed the "
                      f"diagnosis" if successor is not None else "superseded: later lines changed the diagnosis")
            revision = state.revisions.get(incident_id, previous.revision) + 1
            state.revisions[incident_id] = revision
            state.emitted[incident_id] = "closed"
            out.append(previous.model_copy(update={"revision": revision, "status": "closed",
                                                   "confidence_reason": reason}))
        return out


def _group_by_job(events: Sequence[Any]) -> dict[str, tuple[list[Decoded], int | None]]:
    groups: dict[str, tuple[list[Decoded], int | None]] = {}
    for event in events:
        for decoded in decode_signal_messages(event.key, event.value):
            items, _ = groups.get(decoded.job_id, ([], None))
            items.append(decoded)
            groups[decoded.job_id] = (items, event.message.partition)
    return groups


def _load_entry(job_id: str, data: dict[str, Any] | None) -> JobEntry:
    """The job's entry; a stored value this version cannot read starts the job afresh instead of
    stopping the partition (it would fail again on every retry)."""
    try:
        return JobEntry.from_dict(job_id, data)
    except (ValueError, KeyError, TypeError):
        log.exception("job %s: stored state unreadable, starting it afresh", job_id)
        JOB_ERRORS.labels("state_unreadable").inc()
        return JobEntry(state=JobState(job_id=job_id))


def _close_safely(correlator: JobCorrelator, entry: JobEntry, now: float) -> list[Incident]:
    """Diagnose a quiet job. An engine error is logged and counted, the window stays closed (so the
    timer does not ask again until new signals arrive), and the worker keeps going."""
    try:
        return correlator.close(entry, now)
    except Exception:
        log.exception("job %s: diagnosis failed; window closed without an incident", entry.state.job_id)
        JOB_ERRORS.labels("diagnose_failed").inc()
        entry.open = False
        return []


def make_correlate_agent(
    app: Any,
    source: Any,
    incidents_out: Any,
    table: Any,
    correlator: JobCorrelator,
    *,
    batch_size: int,
    batch_within_s: float,
    clock: Callable[[], float] = time.time,
    name: str = "correlate",
) -> Any:
    """Register the agent on `app`.

    `table` maps the job id (UTF-8 bytes, exactly the signals topic's key) to the job's entry dict:
    in production a faust Table whose changelog partition is computed from the key
    (use_partitioner=True), because a batch mixes partitions; the raw key bytes make that partition
    the job's signals partition. Yields one summary per batch: signals added, incidents emitted.
    """

    # The entries this agent wrote last, beside the exact dict it stored: while the table still holds
    # that dict, the entry is reused instead of re-validating the job's whole state on every batch
    # (a recovered or rebalanced table holds other dicts, which are read afresh). Popped while a
    # batch changes the entry, so an entry is never reused past a write that did not happen.
    recent: OrderedDict[bytes, tuple[Any, JobEntry]] = OrderedDict()

    def entry_for(job_id: str, key: bytes) -> JobEntry:
        data = table.get(key)
        cached = recent.pop(key, None)
        if cached is not None and cached[0] is data:
            return cached[1]
        return _load_entry(job_id, data)

    def written(key: bytes, data: dict[str, Any], entry: JobEntry) -> None:
        recent[key] = (data, entry)
        while len(recent) > ENTRY_CACHE_JOBS:
            recent.popitem(last=False)

    async def correlate(stream: Any) -> AsyncIterator[dict[str, Any]]:
        async for events in stream.take_events(batch_size, within=batch_within_s):
            now = clock()
            added = 0
            emitted: list[str] = []
            for job_id, (items, partition) in _group_by_job(events).items():
                key = job_id.encode("utf-8")
                entry = entry_for(job_id, key)
                added += correlator.apply(entry, items, now, partition)
                if any(item.close for item in items) and correlator.is_quiet(entry, now):
                    for incident in _close_safely(correlator, entry, now):
                        await incidents_out.send(key=incident.incident_id.encode("utf-8"), value=incident_to_bytes(incident))
                        kind = "new" if incident.revision == 1 else "revision"
                        INCIDENTS_EMITTED.labels(kind).inc()
                        metrics.count_incident(incident)
                        emitted.append(f"{incident.incident_id}#{incident.revision}")
                data = entry.to_dict()
                table[key] = data
                written(key, data, entry)
            yield {"signals_added": added, "emitted": emitted}

    return app.agent(source, name=name)(correlate)


def _open_windows(table_items: Iterable[tuple[bytes | str, Any]], active_partitions: set[int] | None,
                  taken_at: dict[int, float] | None = None) -> Iterator[tuple[str, float | None]]:
    """(job id, last update) of each open window on partitions this worker owns.

    A window on a partition this worker took at `taken_at[partition]` counts as updated then at the
    earliest: a window restored from the changelog after a restart or a rebalance gets a whole quiet
    window for the match role to catch up on what arrived meanwhile, instead of closing at once on the
    signals from before (half a failure). Reads only the small bookkeeping fields of each entry.
    """
    for job_id, data in table_items:
        if not isinstance(data, dict) or not data.get("open"):
            continue
        partition = data.get("partition")
        if active_partitions is not None and partition not in active_partitions:
            continue
        last = data.get("last_update")
        floor = taken_at.get(partition) if taken_at and isinstance(partition, int) else None
        if floor is not None:
            last = floor if last is None else max(float(last), floor)
        yield (job_id.decode("utf-8") if isinstance(job_id, bytes) else job_id), (None if last is None else float(last))


def quiet_jobs(table_items: Iterable[tuple[bytes | str, Any]], now: float, quiet_window_s: float,
               active_partitions: set[int] | None, taken_at: dict[int, float] | None = None) -> list[str]:
    """Jobs with an open window and no new signal for `quiet_window_s`, on partitions this worker owns."""
    return [job for job, last in _open_windows(table_items, active_partitions, taken_at)
            if last is None or now - last >= quiet_window_s]


def next_quiet_at(table_items: Iterable[tuple[bytes | str, Any]], now: float, quiet_window_s: float,
                  active_partitions: set[int] | None, taken_at: dict[int, float] | None = None) -> float | None:
    """When the next open window (on partitions this worker owns) goes quiet, if none is quiet yet."""
    coming = [last + quiet_window_s for _job, last in _open_windows(table_items, active_partitions, taken_at)
              if last is not None and last + quiet_window_s > now]
    return min(coming, default=None)


def make_close_timer(
    app: Any,
    table_items: Callable[[], Iterable[tuple[bytes | str, Any]]],
    ticks_out: Any,
    *,
    quiet_window_s: float,
    interval_s: float,
    signals_topic: str | None,
    clock: Callable[[], float] = time.time,
) -> Callable[[], Any]:
    """A timer that asks the owner of each quiet job to close its window (one request per quiet spell).

    `table_items` lists the local table's (key, entry) pairs; `signals_topic` (when given) limits the
    requests to jobs on partitions this worker actively owns (standby copies are skipped)."""
    requested: dict[str, float] = {}
    wakeup: list[Any] = []  # the pending early run (an asyncio TimerHandle), at most one
    taken_at: dict[int, float] = {}  # partition -> when this worker was first seen owning it

    async def close_quiet_windows() -> None:
        now = clock()
        actives: set[int] | None = None
        if signals_topic is not None:
            actives = {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == signals_topic}
            for partition in actives - taken_at.keys():
                taken_at[partition] = now
            for partition in taken_at.keys() - actives:
                del taken_at[partition]
        items = list(table_items())
        for job_id in quiet_jobs(items, now, quiet_window_s, actives, taken_at):
            # Ask again only if the last request was not handled within a quiet window (e.g. a rebalance).
            if now - requested.get(job_id, 0.0) < max(quiet_window_s, interval_s * 3):
                continue
            requested[job_id] = now
            await ticks_out.send(key=job_id.encode("utf-8"), value=close_message(job_id, now))
        # A window that goes quiet before the next tick is asked to close when it does, not up to a
        # whole tick later (the tick only bounds how long the table goes unchecked).
        soonest = next_quiet_at(items, now, quiet_window_s, actives, taken_at)
        if soonest is not None and soonest - now < interval_s and not wakeup:
            loop = asyncio.get_running_loop()

            def run_early() -> None:
                wakeup.clear()
                task = loop.create_task(close_quiet_windows())
                task.add_done_callback(_log_failure)

            wakeup.append(loop.call_later(max(0.0, soonest - now) + 0.005, run_early))

    app.timer(interval_s, name="close_quiet_windows")(close_quiet_windows)
    return close_quiet_windows


def _log_failure(task: Any) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("early close_quiet_windows run failed", exc_info=task.exception())
