"""What the engine keeps about one job between batches, in a size that does not grow with its lines.

A job of 4,096 ranks that fails prints tens of thousands of failure lines, nearly all of them the same
few consequences (a watchdog timeout and a teardown per rank). The state keeps:
- **causes individually**: signals of cause and either roles, repeats on one process collapsed to a
  count; each rule keeps at most its earliest `_PER_RULE[role]` processes, the rest fold into the
  rule's aggregate, so a cause that arrives after most of the collateral is still kept;
- **collateral as aggregates** per (rule, process group, attempt): a rank bitmap, a count, first and
  last time, the earliest time per host, a few sample lines;
- **facts in their own small tables**: collective progress per process group, identity (host:pid,
  local rank and GPU bus id to rank), restarts, completions, the latest progress per process and the
  anchors that align host clocks.
Every table has a bound. When one is reached, collateral is summarised before any cause is dropped,
and what was dropped is counted by class (`dropped`), so the incident can say so.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from correlator.diagnosis.engine.rankset import RankSet
from correlator.diagnosis.models import SEVERITY_RANK, Signal
from correlator.diagnosis.routine_fold import merge_metric_signals
from correlator.diagnosis.signals import DEFAULT_GROUPS, TIME_BORROWED

MAX_SIGNALS = 512  # individual signals (causes, markers, metric peaks) per job
MAX_AGGREGATES = 128
MAX_SAMPLES = 3
MAX_HOSTS_PER_AGGREGATE = 64
MAX_PROCESSES = 8192  # identity and progress entries
MAX_ANCHORS = 16
MAX_HOSTS_PER_ANCHOR = 1024
MAX_VALUES_PER_COUNTER = 32
MAX_PROCESS_GROUPS = 2048  # a 4,096-rank job with tensor-parallel groups of 8 has 513 per attempt
MAX_RESTARTS = 256
MAX_METRIC_PROCESSES = 64
MAX_MARKERS_PER_RULE = 32  # per metric rule: the highest and the lowest peaks
RESTART_CLUSTER_S = 120.0  # every agent of one restart logs it within this long
RELAUNCH_MIN_S = 60.0  # a process's default group created again this long after the first time: a new run
_PER_RULE = {"collateral": 4, "either": 32, "cause": 64}


def time_of(signal: Signal) -> float | None:
    ts = signal.ts or signal.received_ts
    return ts.timestamp() if ts is not None else None


def has_own_time(signal: Signal) -> bool:
    """The line carried its time (or a forwarder stamped it); not one borrowed from an earlier line."""
    return time_of(signal) is not None and not signal.fields.get(TIME_BORROWED)


def sort_key(signal: Signal) -> tuple[float, int]:
    t = time_of(signal)
    return (t if t is not None else float("inf"), signal.order)


def sample_key(signal: Signal) -> tuple[float, str, int, str]:
    """The order of an aggregate's sample lines, total and the same offline and streamed: a line's own time
    (not one borrowed from an earlier line offline, nor a forwarder's receive time when streamed), then who
    wrote it and its text."""
    own = signal.ts.timestamp() if signal.ts is not None and not signal.fields.get(TIME_BORROWED) else float("inf")
    return (own, signal.host or "", -1 if signal.rank is None else signal.rank, signal.line)


def process_key(signal: Signal) -> str:
    """Who wrote or is named by a signal, as precisely as it says."""
    if signal.rank is not None:
        return f"r{signal.rank}"
    if signal.host and signal.pid is not None:
        return f"{signal.host}|p{signal.pid}"
    if signal.host and signal.local_rank is not None:
        return f"{signal.host}|l{signal.local_rank}"
    if signal.pid is not None:
        return f"p{signal.pid}"
    return f"f:{signal.file or ''}|{signal.host or ''}"


def dedupe_key(signal: Signal) -> str:
    marker = signal.fields.get("marker", "")
    return "|".join(
        str(v)
        for v in (signal.rule_id, signal.kind, marker, signal.rank, signal.local_rank, signal.host, signal.pid,
                  signal.gpu, signal.attempt)
    )


def pg_of(signal: Signal) -> str | None:
    pg = signal.fields.get("pg")
    return None if pg is None or pg == "" else str(pg)


class Aggregate(BaseModel):
    """Repeats of one collateral rule in one process group: who, how many, when, and a few lines."""

    model_config = ConfigDict(extra="ignore")

    rule_id: str
    class_: str | None = None
    severity: str = "medium"
    role: str = "collateral"
    pg: str | None = None
    attempt: int = 0
    ranks: RankSet = Field(default_factory=RankSet)
    hosts: dict[str, float | None] = Field(default_factory=dict)  # host -> earliest raw time there
    host_count: int = 0
    count: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    samples: list[Signal] = Field(default_factory=list)

    def add(self, signal: Signal, repeats: int = 1) -> None:
        t = time_of(signal)
        self.count += repeats
        if signal.rank is not None:
            self.ranks.add(signal.rank)
        if t is not None:
            self.first_ts = t if self.first_ts is None else min(self.first_ts, t)
            self.last_ts = t if self.last_ts is None else max(self.last_ts, t)
        host = signal.host or ""
        if host not in self.hosts:
            self.host_count += 1
            self.hosts[host] = t
            if len(self.hosts) > MAX_HOSTS_PER_AGGREGATE:
                # The earliest hosts say when the cascade began; the latest ones say nothing more.
                latest = max(self.hosts, key=lambda h: -1e300 if self.hosts[h] is None else self.hosts[h])  # type: ignore[operator]
                del self.hosts[latest]
        elif t is not None and (self.hosts[host] is None or t < self.hosts[host]):  # type: ignore[operator]
            self.hosts[host] = t
        # The earliest lines in a total order, so the samples (and the line that stands for the cascade)
        # are the same whichever order the lines arrived in: a file read offline or a stream after a rebalance.
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append(signal)
            self.samples.sort(key=sample_key)
        elif sample_key(signal) < sample_key(self.samples[-1]):
            self.samples[-1] = signal
            self.samples.sort(key=sample_key)


class CounterValues(BaseModel):
    """Values of one progress counter across ranks: value -> the ranks that reported it."""

    model_config = ConfigDict(extra="ignore")

    values: dict[str, RankSet] = Field(default_factory=dict)

    def add(self, value: int, rank: int) -> None:
        key = str(value)
        if key not in self.values:
            self.values[key] = RankSet()
            if len(self.values) > MAX_VALUES_PER_COUNTER:
                # Laggards have the smallest values and the leaders the largest: the middle goes.
                ordered = sorted(self.values, key=int)
                del self.values[ordered[len(ordered) // 2]]
                if key not in self.values:
                    return
        self.values[key].add(rank)

    def per_rank(self) -> dict[int, int]:
        """Each rank's largest reported value (the furthest it said it got)."""
        out: dict[int, int] = {}
        for key in sorted(self.values, key=int, reverse=True):
            for rank in self.values[key]:
                out.setdefault(rank, int(key))
        return out


class GroupProgress(BaseModel):
    """What the watchdog lines of one process group say, per rank."""

    model_config = ConfigDict(extra="ignore")

    pg: str
    size: int | None = None
    members: RankSet = Field(default_factory=RankSet)
    reporters: RankSet = Field(default_factory=RankSet)
    enqueued: CounterValues = Field(default_factory=CounterValues)
    completed: CounterValues = Field(default_factory=CounterValues)
    failed_seq: CounterValues = Field(default_factory=CounterValues)
    # "seq|op|numel_in|numel_out" -> ranks: one collective as each rank issued it
    collectives: dict[str, RankSet] = Field(default_factory=dict)
    timeout_ms: int | None = None
    first_ts: float | None = None
    global_of: dict[str, int] = Field(default_factory=dict)  # rank within the group -> global rank


class Mark(BaseModel):
    """Where a line stood: its time when it had one, else its file and position."""

    model_config = ConfigDict(extra="ignore")

    t: float | None = None
    file: str | None = None
    order: int = 0

    @classmethod
    def of(cls, signal: Signal, t: float | None = None) -> Mark:
        return cls(t=time_of(signal) if t is None else t, file=signal.file, order=signal.order)

    def after(self, t: float | None, file: str | None, order: int, margin_s: float = 0.0) -> bool:
        if self.t is not None and t is not None:
            return self.t > t + margin_s
        return self.file == file and self.order > order


class Restart(BaseModel):
    """One restart of the job, as every agent logged it: on each host's own clock, so a host's lines are
    split at its own restart line."""

    model_config = ConfigDict(extra="ignore")

    ts: float | None = None  # the earliest host's time
    restart_count: int | None = None
    hosts: dict[str, float] = Field(default_factory=dict)
    # where an untimed restart line stood: lines after it in the same file are of the next attempt
    file: str | None = None
    order: int | None = None
    inferred: bool = False  # from a process creating its default group again, not from a launcher's line

    def before(self, t: float | None, host: str | None, file: str | None, order: int | None) -> bool:
        """Whether a line at (t, host) or (file, order) came after this restart."""
        if t is not None and self.ts is not None:
            return self.hosts.get(host or "", self.ts) <= t
        return self.file == file and self.order is not None and order is not None and self.order < order


class JobState(BaseModel):
    """Everything the engine keeps about one job; serializable for a faust Table (changelog-backed)."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    signals: list[Signal] = Field(default_factory=list)
    repeats: dict[str, int] = Field(default_factory=dict)
    aggregates: dict[str, Aggregate] = Field(default_factory=dict)
    groups: dict[str, GroupProgress] = Field(default_factory=dict)
    identity: dict[str, int] = Field(default_factory=dict)  # "host|p<pid>" / "host|l<local>" / "host|b<bus>" -> rank
    world_size: int | None = None
    restarts: list[Restart] = Field(default_factory=list)
    inits: dict[str, float] = Field(default_factory=dict)  # "r<rank>" -> its first default-group init line's time
    completions: list[Mark] = Field(default_factory=list)
    progress: dict[str, Mark] = Field(default_factory=dict)  # process key -> its latest progress line
    anchors: dict[str, dict[str, float]] = Field(default_factory=dict)  # shared event -> host -> first time
    receive_lag: dict[str, float] = Field(default_factory=dict)  # host -> smallest event-minus-receive time
    dropped: dict[str, int] = Field(default_factory=dict)
    last_update: float | None = None
    # Streaming bookkeeping: what was emitted, so a restart or a replay does not emit twice.
    emitted: dict[str, str] = Field(default_factory=dict)
    revisions: dict[str, int] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    _index: dict[str, int] | None = PrivateAttr(default=None)
    # (rule id, marker) -> the earliest sort key of that rule's full set of markers when read: a new marker
    # no later is refused without a scan. Any deletion forgets every floor. The dict is replaced, never
    # changed in place, so a copy of the state does not share changes.
    _marker_floors: dict[tuple[str, object], tuple[float, int]] = PrivateAttr(default_factory=dict)

    # --- adding -------------------------------------------------------------------------

    def add(self, signal: Signal, now: float | None = None) -> bool:
        """Add one signal; True when the state changed in a way that can change the diagnosis."""
        if now is not None:
            self.last_update = now
        self._note_clock(signal)
        facts_changed = self._note_facts(signal)
        if signal.kind == "fact" and "marker" not in signal.fields:
            return facts_changed
        if signal.kind == "fact":
            return self._add_marker(signal) or facts_changed
        if "metric" in signal.fields:
            return self._add_metric(signal) or facts_changed
        if signal.kind == "match" and signal.role == "collateral":
            return self._add_collateral(signal) or facts_changed
        return self._add_individual(signal) or facts_changed

    def add_all(self, signals: Iterable[Signal], now: float | None = None) -> None:
        for signal in signals:
            self.add(signal, now)

    def count(self, signal: Signal) -> int:
        return 1 + self.repeats.get(dedupe_key(signal), 0)

    def attempt_of(self, signal: Signal) -> int:
        """The attempt a signal belongs to: its own (from a log path or a field), else by the restarts seen
        so far: those before it in time, or, for untimed lines, before it in the same file."""
        if signal.attempt is not None:
            return signal.attempt
        return self.attempt_at(time_of(signal), signal.host, signal.file, signal.order)

    def attempt_at(self, t: float | None, host: str | None = None, file: str | None = None,
                   order: int | None = None) -> int:
        attempt = 0
        for restart in self.restarts:
            if restart.before(t, host, file, order):
                attempt = restart.restart_count if restart.restart_count is not None else attempt + 1
        return attempt

    # --- individual signals ---------------------------------------------------------------

    def _private(self) -> dict[str, Any]:
        """Pydantic's dict of private attributes (`self._index` goes through BaseModel.__getattr__: slow)."""
        private = self.__pydantic_private__
        assert private is not None
        return private

    def _key_index(self) -> dict[str, int]:
        private = self._private()
        index: dict[str, int] | None = private["_index"]
        if index is None or len(index) != len(self.signals):
            index = private["_index"] = {dedupe_key(s): i for i, s in enumerate(self.signals)}
        return index

    def _add_individual(self, signal: Signal) -> bool:
        key = dedupe_key(signal)
        index = self._key_index()
        position = index.get(key)
        if position is not None:
            self.repeats[key] = self.repeats.get(key, 0) + 1
            existing = self.signals[position]
            later_wins = signal.fields.get("marker") == "end"
            better = sort_key(signal) > sort_key(existing) if later_wins else sort_key(signal) < sort_key(existing)
            if better:
                self.signals[position] = signal
                return True
            return False
        if signal.kind == "match":
            same_rule = [i for i, s in enumerate(self.signals) if s.rule_id == signal.rule_id and s.kind == "match"]
            limit = _PER_RULE.get(signal.role, _PER_RULE["either"])
            if len(same_rule) >= limit:
                latest = max(same_rule, key=lambda i: sort_key(self.signals[i]))
                if sort_key(signal) >= sort_key(self.signals[latest]):
                    self._fold(signal, 1)
                    return True
                self._evict(latest)
        return self._append(signal, key)

    def _append(self, signal: Signal, key: str) -> bool:
        """Keep `signal` individually, making room (or counting it dropped) at the bound."""
        if len(self.signals) >= MAX_SIGNALS and not self._make_room(signal):
            self._drop(signal)
            return False
        self._key_index()[key] = len(self.signals)
        self.signals.append(signal)
        if "marker" in signal.fields:
            self._forget_floors((signal.rule_id, signal.fields["marker"]))
        return True

    def _forget_floors(self, which: tuple[str, object] | None = None) -> None:
        """Forget one (rule id, marker)'s floor, or every floor (None: a signal was deleted)."""
        private = self._private()
        floors = private["_marker_floors"]
        if floors and (which is None or which in floors):
            private["_marker_floors"] = {} if which is None else {k: v for k, v in floors.items() if k != which}

    def _evict(self, position: int) -> None:
        """Fold the signal at `position` into its rule's aggregate (with its repeats)."""
        signal = self.signals[position]
        key = dedupe_key(signal)
        self._fold(signal, 1 + self.repeats.pop(key, 0))
        del self.signals[position]
        self._index = None
        self._forget_floors()

    def _make_room(self, incoming: Signal) -> bool:
        """Summarise before dropping: the rule with the most individual signals gives up its latest one;
        a cause is only evicted for a cause of a higher severity."""
        counts: dict[str, list[int]] = {}
        for i, s in enumerate(self.signals):
            if s.kind == "match":
                counts.setdefault(s.rule_id, []).append(i)
        if not counts:
            return False
        _rule, positions = max(counts.items(), key=lambda kv: len(kv[1]))
        if len(positions) == 1 and self.signals[positions[0]].role == "cause":
            weakest = min(
                (i for i, s in enumerate(self.signals) if s.kind == "match"),
                key=lambda i: (SEVERITY_RANK[self.signals[i].severity], -sort_key(self.signals[i])[0]),
            )
            if SEVERITY_RANK[self.signals[weakest].severity] >= SEVERITY_RANK[incoming.severity]:
                return False
            self._drop(self.signals[weakest])
            del self.signals[weakest]
            self._index = None
            self._forget_floors()
            return True
        self._evict(max(positions, key=lambda i: sort_key(self.signals[i])))
        return True

    def _drop(self, signal: Signal) -> None:
        cls = signal.class_ or signal.rule_id
        self.dropped[cls] = self.dropped.get(cls, 0) + 1

    def _add_marker(self, signal: Signal) -> bool:
        """Sequence preconditions and absence end markers: the latest few per rule and marker."""
        marker = signal.fields.get("marker")
        key = dedupe_key(signal)
        if key not in self._key_index():
            which = (signal.rule_id, marker)
            private = self._private()
            floor = private["_marker_floors"].get(which)
            new_key = sort_key(signal)
            if floor is not None and new_key <= floor:
                return False  # no later than the earliest of a full set: a marker fed latest first costs no scan
            peers = [i for i, s in enumerate(self.signals) if s.rule_id == signal.rule_id
                     and s.fields.get("marker") == marker]
            if len(peers) >= MAX_MARKERS_PER_RULE:
                earliest = min(peers, key=lambda i: sort_key(self.signals[i]))
                earliest_key = sort_key(self.signals[earliest])
                if new_key <= earliest_key:
                    private["_marker_floors"] = {**private["_marker_floors"], which: earliest_key}
                    return False
                self.repeats.pop(dedupe_key(self.signals[earliest]), None)
                del self.signals[earliest]
                self._index = None
                self._forget_floors()
        return self._add_individual(signal)

    # --- aggregates -----------------------------------------------------------------------

    def _aggregate_key(self, signal: Signal) -> str:
        return f"{signal.rule_id}|{pg_of(signal) or ''}|{self.attempt_of(signal)}"

    def _fold(self, signal: Signal, repeats: int) -> None:
        key = self._aggregate_key(signal)
        aggregate = self.aggregates.get(key)
        if aggregate is None:
            if len(self.aggregates) >= MAX_AGGREGATES:
                self._drop(signal)
                return
            aggregate = self.aggregates[key] = Aggregate(
                rule_id=signal.rule_id, class_=signal.class_, severity=signal.severity, role=signal.role,
                pg=pg_of(signal), attempt=self.attempt_of(signal),
            )
        aggregate.add(signal, repeats)

    def _add_collateral(self, signal: Signal) -> bool:
        self._fold(signal, 1)
        return True

    # --- metrics --------------------------------------------------------------------------

    def _add_metric(self, signal: Signal) -> bool:
        """A metric keeps, per process, its largest value (the smallest in `metric_min`); per rule only the
        processes with the highest and the lowest peaks, which is what a spike on one rank is judged by."""
        field = str(signal.fields["metric"])
        key = dedupe_key(signal)
        index = self._key_index()
        position = index.get(key)
        new = signal.fields.get(field)
        if position is not None:
            self.repeats[key] = self.repeats.get(key, 0) + 1
            merged = merge_metric_signals(self.signals[position], signal)
            if merged is None:
                return False
            self.signals[position], won = merged
            return won
        peers = [i for i, s in enumerate(self.signals) if s.rule_id == signal.rule_id]
        if len(peers) >= MAX_METRIC_PROCESSES:
            def value(i: int) -> float:
                v = self.signals[i].fields.get(field)
                return float(v) if isinstance(v, (int, float)) else float("inf")
            peers.sort(key=value)
            middle = peers[len(peers) // 2]
            if isinstance(new, (int, float)) and value(peers[0]) < float(new) < value(peers[-1]):
                return False  # neither a new high nor a new low
            self.repeats.pop(dedupe_key(self.signals[middle]), None)
            del self.signals[middle]
            self._forget_floors()
            self._index = None
        return self._append(signal, key)

    # --- facts ----------------------------------------------------------------------------

    def _note_facts(self, signal: Signal) -> bool:
        """Tables fed by fields of any signal: identity, world size, progress, restarts, collectives."""
        f = signal.fields
        changed = False
        t = time_of(signal)
        size = f.get("world_size")
        if not isinstance(size, int) and isinstance(f.get("nnodes"), int) and isinstance(f.get("nproc_per_node"), int):
            size = int(f["nnodes"]) * int(f["nproc_per_node"])
        if isinstance(size, int) and "comm_rank" not in f and (self.world_size is None or size > self.world_size):
            self.world_size = size
            changed = True
        if signal.host and "comm_rank" in f and isinstance(f["comm_rank"], int):
            changed |= self._note_identity(signal)
        if signal.host and signal.rank is not None and signal.kind == "match":
            if signal.local_rank is not None:
                self._remember(f"{signal.host}|l{signal.local_rank}", signal.rank)
            if signal.pid is not None:
                self._remember(f"{signal.host}|p{signal.pid}", signal.rank)
        fact = f.get("fact")
        if fact == "restart":
            changed |= self._note_restart(t, f.get("restart_count"), signal)
        elif fact == "completion" and len(self.completions) < MAX_RESTARTS:
            self.completions.append(Mark.of(signal))
            changed = True
        if self._is_progress(signal):
            last = f.get("last_ts")
            mark = Mark.of(signal, float(last) if isinstance(last, (int, float)) else None)
            key = process_key(signal)
            current = self.progress.get(key)
            if current is None and len(self.progress) < MAX_PROCESSES or current is not None and mark.after(
                current.t, current.file, current.order
            ):
                self.progress[key] = mark
                changed = True
        if (signal.rank is not None or "pg_rank" in f) and ("pg" in f or "seq" in f or "enqueued" in f):
            changed |= self._note_collective(signal, t)
        return changed

    @staticmethod
    def _is_progress(signal: Signal) -> bool:
        f = signal.fields
        return "metric" in f or f.get("marker") == "end" and f.get("progress") == 1 or f.get("fact") == "progress"

    def _remember(self, key: str, rank: int) -> None:
        if key in self.identity or len(self.identity) < MAX_PROCESSES:
            self.identity.setdefault(key, rank)

    def _note_identity(self, signal: Signal) -> bool:
        """NCCL's init line: host:pid and the GPU's bus id -> rank, but only from the job-wide communicator
        (the rank of a sub-communicator, e.g. a tensor-parallel group, is not the global rank)."""
        f = signal.fields
        nranks = f.get("world_size")
        if isinstance(nranks, int) and (self.world_size is None or nranks > self.world_size):
            self.world_size = nranks
        if not isinstance(nranks, int) or nranks < (self.world_size or 0):
            return False
        rank = int(f["comm_rank"])
        if signal.pid is not None:
            self.identity[f"{signal.host}|p{signal.pid}"] = rank
        bus = f.get("bus_id")
        if isinstance(bus, (str, int)):
            self.identity[f"{signal.host}|b{normalize_bus_id(str(bus))}"] = rank
        comm = f.get("comm_id")
        if comm is not None and signal.host and time_of(signal) is not None:
            self._anchor(f"init:{comm}", signal.host, time_of(signal))  # type: ignore[arg-type]
        return True

    def _note_restart(self, t: float | None, restart_count: object, signal: Signal, inferred: bool = False) -> bool:
        """One restart is logged by every agent within seconds: those lines are one restart."""
        count = restart_count if isinstance(restart_count, int) else None
        for restart in self.restarts:
            if count is not None and restart.restart_count is not None:
                same = restart.restart_count == count
            elif t is not None and restart.ts is not None:
                same = abs(restart.ts - t) <= RESTART_CLUSTER_S
            else:
                same = restart.file == signal.file and restart.order == signal.order
            if same:
                if t is not None:
                    restart.ts = t if restart.ts is None else min(restart.ts, t)
                    host = signal.host or ""
                    if len(restart.hosts) < MAX_HOSTS_PER_ANCHOR:
                        restart.hosts[host] = min(restart.hosts.get(host, t), t)
                if restart.restart_count is None and count is not None:
                    restart.restart_count = count
                restart.inferred = restart.inferred and inferred
                return False
        if len(self.restarts) >= MAX_RESTARTS:
            return False
        hosts = {signal.host or "": t} if t is not None else {}
        self.restarts.append(Restart(ts=t, restart_count=count, hosts=hosts, file=signal.file, order=signal.order,
                                     inferred=inferred))
        self.restarts.sort(key=lambda r: (r.ts if r.ts is not None else float("inf"), r.order or 0))
        return True

    def _note_collective(self, signal: Signal, t: float | None) -> bool:
        f = signal.fields
        if pg_of(signal) is None and isinstance(f.get("pg_rank"), int) and signal.rank is not None \
                and f["pg_rank"] != signal.rank:
            # Its rank in some group differs from its global rank: not the default group, and the line does
            # not say which (a watchdog line without the PG prefix; the same process's next line names it).
            return False
        pg = pg_of(signal) or "0"
        if pg in DEFAULT_GROUPS and isinstance(f.get("pg_size"), int) and signal.rank is not None and t is not None:
            self._note_relaunch(signal, t)
        key = f"{self.attempt_of(signal)}:{pg}"
        group = self.groups.get(key)
        if group is None:
            reports = signal.kind == "match" and signal.class_ in ("nccl_timeout", "nccl_error")
            if len(self.groups) >= MAX_PROCESS_GROUPS and not (reports and self._evict_quiet_group()):
                return False
            group = self.groups[key] = GroupProgress(pg=pg)
        pg_rank = f.get("pg_rank")
        rank = signal.rank
        if rank is not None and isinstance(pg_rank, int) and len(group.global_of) < MAX_PROCESSES:
            group.global_of[str(pg_rank)] = rank
        elif rank is None and isinstance(pg_rank, int):
            rank = group.global_of.get(str(pg_rank))
        if rank is None:
            return False  # a rank within a group whose global ranks are not known
        group.members.add(rank)
        size = f.get("pg_size")
        if isinstance(size, int):
            group.size = max(group.size or 0, size)
        if signal.kind == "match" and signal.class_ in ("nccl_timeout", "nccl_error"):
            group.reporters.add(rank)
            if t is not None:
                group.first_ts = t if group.first_ts is None else min(group.first_ts, t)
        for name in ("enqueued", "completed"):
            if isinstance(f.get(name), int):
                getattr(group, name).add(int(f[name]), rank)
        seq = f.get("seq")
        if isinstance(seq, int):
            group.failed_seq.add(seq, rank)
            op = f.get("op")
            if op is not None:
                shape = f"{seq}|{op}|{f.get('numel_in', '')}|{f.get('numel_out', '')}"
                if shape in group.collectives or len(group.collectives) < MAX_VALUES_PER_COUNTER:
                    group.collectives.setdefault(shape, RankSet()).add(rank)
            if signal.host and t is not None and signal.class_ == "nccl_timeout":
                self._anchor(f"wd:{pg}:{seq}", signal.host, t)
        timeout = f.get("timeout_ms")
        if isinstance(timeout, int):
            group.timeout_ms = max(group.timeout_ms or 0, timeout)
        return True

    def _note_relaunch(self, signal: Signal, t: float) -> None:
        """A process creates the default process group once per run: the same global rank creating it again
        later was launched again (a Slurm requeue, a re-submitted job, an agent restart whose own line is not
        in the logs). That is a restart, at the host's second init line, unless one is known in between."""
        key = f"r{signal.rank}"
        first = self.inits.get(key)
        if first is None:
            if len(self.inits) < MAX_PROCESSES:
                self.inits[key] = t
            return
        early, late = (first, t) if t >= first else (t, first)
        self.inits[key] = early
        if late - early < RELAUNCH_MIN_S or any(
            not r.inferred and r.ts is not None and early < r.ts <= late for r in self.restarts
        ):
            return  # the launcher logged this restart: its own line splits the host
        self._note_restart(late, None, signal, inferred=True)  # joins the same relaunch seen on other hosts

    def _evict_quiet_group(self) -> bool:
        """Room for a group that reports a failure: the first-known group nobody reported in goes (its
        members only mattered had it timed out)."""
        quiet = next((key for key, group in self.groups.items() if not group.reporters), None)
        if quiet is None:
            return False
        del self.groups[quiet]
        return True

    # --- clocks ---------------------------------------------------------------------------

    def _note_clock(self, signal: Signal) -> None:
        host = signal.host
        if not host or signal.ts is None:
            return
        t = signal.ts.timestamp()
        if signal.received_ts is not None and (host in self.receive_lag or len(self.receive_lag) < MAX_PROCESSES):
            lag = t - signal.received_ts.timestamp()
            self.receive_lag[host] = min(self.receive_lag.get(host, lag), lag)
        if signal.kind == "match" and signal.class_ == "launcher_teardown":
            self._anchor("teardown", host, t)
        step = signal.fields.get("step")
        if isinstance(step, int) and "metric" in signal.fields:
            self._anchor(f"step:{step}", host, t)

    def _anchor(self, key: str, host: str, t: float) -> None:
        hosts = self.anchors.get(key)
        if hosts is None:
            if len(self.anchors) >= MAX_ANCHORS:
                smallest = min(self.anchors, key=lambda k: len(self.anchors[k]))
                if len(self.anchors[smallest]) > 1:
                    return
                del self.anchors[smallest]
            hosts = self.anchors[key] = {}
        if host in hosts:
            hosts[host] = min(hosts[host], t)
        elif len(hosts) < MAX_HOSTS_PER_ANCHOR:
            hosts[host] = t



def normalize_bus_id(bus: str) -> str:
    """'0000:4b:00.0', '4b:00', NCCL's '4b000' -> '4b:00' (bus and device, hex, lower case)."""
    text = bus.strip().lower()
    if ":" in text:
        parts = text.split(".")[0].split(":")
        if len(parts) >= 2:
            return f"{int(parts[-2], 16):02x}:{int(parts[-1], 16):02x}"
        return text
    try:
        value = int(text, 16)
    except ValueError:
        return text
    # NCCL prints busId as bus << 12 | device << 4 | function, in hex without separators
    return f"{(value >> 12) & 0xFF:02x}:{(value >> 4) & 0xFF:02x}" if value > 0xFFF else f"{value:02x}:00"
