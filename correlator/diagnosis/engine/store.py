"""The signals the engine keeps of one job, in a size that does not grow with its lines.

A job of 4,096 ranks that fails prints tens of thousands of failure lines, nearly all of them the same
few consequences (a watchdog timeout and a teardown per rank). The store keeps:
- **causes individually**: signals of cause and either roles, repeats on one process collapsed to a
  count; each rule keeps at most its earliest `_PER_RULE[role]` processes, the rest fold into the
  rule's aggregate, so a cause that arrives after most of the collateral is still kept;
- **collateral as aggregates** per (rule, process group, attempt): a rank bitmap, a count, first and
  last time, the earliest time per host, a few sample lines;
- **markers** (sequence preconditions, absence ends, progress lines) the latest `MAX_MARKERS_PER_RULE`
  per rule and marker, and **metric peaks** per process, of the `MAX_METRIC_PROCESSES` processes with the
  highest and the lowest peaks per rule.
When `MAX_SIGNALS` is reached, collateral is summarised before any cause is dropped, and what was dropped
is counted by class (`dropped`), so the incident can say so.

The store sits on the job's facts (`JobFacts`): an aggregate is keyed by the attempt a signal belongs to,
which the restarts seen so far decide.
"""

from __future__ import annotations

from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from correlator.diagnosis.engine.facts import JobFacts
from correlator.diagnosis.engine.keys import dedupe_key, pg_of, sample_key, sort_key, time_of
from correlator.diagnosis.engine.rankset import RankSet
from correlator.diagnosis.models import SEVERITY_RANK, Signal
from correlator.diagnosis.routine_fold import merge_metric_signals

MAX_SIGNALS = 512  # individual signals (causes, markers, metric peaks) per job
MAX_AGGREGATES = 128
MAX_SAMPLES = 3
MAX_HOSTS_PER_AGGREGATE = 64
MAX_METRIC_PROCESSES = 64  # per metric rule: the processes with the highest and the lowest peaks
MAX_MARKERS_PER_RULE = 32  # per rule and marker: the latest
_PER_RULE = {"collateral": 4, "either": 32, "cause": 64}  # matches kept individually per rule, by role


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
                latest = max(self.hosts, key=lambda h: -1e300 if (seen := self.hosts[h]) is None else seen)
                del self.hosts[latest]
        elif t is not None and ((seen := self.hosts[host]) is None or t < seen):
            self.hosts[host] = t
        # The earliest lines in a total order, so the samples (and the line that stands for the cascade)
        # are the same whichever order the lines arrived in: a file read offline or a stream after a rebalance.
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append(signal)
            self.samples.sort(key=sample_key)
        elif sample_key(signal) < sample_key(self.samples[-1]):
            self.samples[-1] = signal
            self.samples.sort(key=sample_key)

class SignalLookup:
    """What the store derives from `signals` to add one without a scan; never serialized, never compared.

    - `index`: dedupe key -> position in `signals` (None: rebuilt on next use, after a deletion);
    - `floors`: (rule id, marker) -> the earliest sort key of that rule's full set of markers when it was
      read: a new marker no later is refused without a scan. Markers are only replaced by later ones or
      added while it holds; any deletion forgets every floor.

    It is held by a `functools.cached_property` of the store, which pydantic supports on models (kept in
    the instance's `__dict__`: not a field, not dumped, left out of `==`), and read at the cost of a plain
    attribute. A `PrivateAttr` would do the same, but every read of one goes through
    `BaseModel.__getattr__` after a failed ordinary lookup: 1.4 us against 26 ns, which was a fifth of
    adding a 326 MB log's signals. `of` is the list it was built for: read for any other list (a copy of
    the state given other signals with `model_copy(update=...)` shares this object), it is rebuilt first.
    """

    __slots__ = ("floors", "index", "of")

    def __init__(self) -> None:
        self.of: list[Signal] | None = None
        self.index: dict[str, int] | None = None
        self.floors: dict[tuple[str, object], tuple[float, int]] = {}


class SignalStore(JobFacts):
    """The kept signals, the aggregates and the drop counts of one job (fields of `JobState`)."""

    model_config = ConfigDict(extra="ignore")

    signals: list[Signal] = Field(default_factory=list)
    repeats: dict[str, int] = Field(default_factory=dict)
    aggregates: dict[str, Aggregate] = Field(default_factory=dict)
    dropped: dict[str, int] = Field(default_factory=dict)

    @cached_property
    def _lookup(self) -> SignalLookup:
        return SignalLookup()

    def keep(self, signal: Signal) -> bool:
        """Keep what the engine needs of `signal` (its facts are noted apart: `JobFacts.note_facts`); True
        when the kept signals changed in a way that can change the diagnosis."""
        if signal.kind == "fact":
            return "marker" in signal.fields and self._add_marker(signal)
        if "metric" in signal.fields:
            return self._add_metric(signal)
        if signal.role == "collateral":
            return self._add_collateral(signal)
        return self._add_individual(signal)

    def count(self, signal: Signal) -> int:
        return 1 + self.repeats.get(dedupe_key(signal), 0)

    # --- individual signals ---------------------------------------------------------------

    def _key_index(self) -> dict[str, int]:
        lookup = self._lookup
        index = lookup.index
        if lookup.of is not self.signals:
            lookup.of, lookup.floors, index = self.signals, {}, None
        if index is None or len(index) != len(self.signals):
            index = lookup.index = {dedupe_key(s): i for i, s in enumerate(self.signals)}
        return index

    def _add_individual(self, signal: Signal) -> bool:
        """Causes, either-role matches and markers: one entry per process (repeats counted), the better line
        kept (a marker's latest, a match's earliest); each rule its earliest `_PER_RULE[role]` processes."""
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
        floors = self._lookup.floors
        if which is None:
            floors.clear()
        else:
            floors.pop(which, None)

    def _delete(self, position: int) -> None:
        """The one way a kept signal leaves `signals`: positions after it move down one in the key index
        (rebuilt on its next use when it does not hold the signal), and every marker floor is forgotten (the
        set it was read from changed). Moving the positions costs a pass over ints; a rebuild, a key made of
        each kept signal's fields, which a job of many ranks paid on every progress marker it replaced."""
        removed = self.signals.pop(position)
        lookup = self._lookup
        index = lookup.index
        key = dedupe_key(removed) if index is not None and lookup.of is self.signals else None
        if index is not None and key is not None and index.get(key) == position:
            del index[key]
            lookup.index = {k: i - 1 if i > position else i for k, i in index.items()}
        else:
            lookup.index = None
        self._forget_floors()

    def _evict(self, position: int) -> None:
        """Fold the signal at `position` into its rule's aggregate (with its repeats)."""
        signal = self.signals[position]
        key = dedupe_key(signal)
        self._fold(signal, 1 + self.repeats.pop(key, 0))
        self._delete(position)

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
            self._delete(weakest)
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
            floors = self._lookup.floors
            floor = floors.get(which)
            new_key = sort_key(signal)
            if floor is not None and new_key <= floor:
                return False  # no later than the earliest of a full set: a marker fed latest first costs no scan
            # A scan of the kept signals, not an index of each rule's positions: such an index, kept in step
            # with every eviction, made 12,288 markers of 4,096 processes slower (1.16 against 0.91 s).
            peers = [i for i, s in enumerate(self.signals) if s.rule_id == signal.rule_id
                     and s.fields.get("marker") == marker]
            if len(peers) >= MAX_MARKERS_PER_RULE:
                earliest = min(peers, key=lambda i: sort_key(self.signals[i]))
                earliest_key = sort_key(self.signals[earliest])
                if new_key <= earliest_key:
                    floors[which] = earliest_key
                    return False
                self.repeats.pop(dedupe_key(self.signals[earliest]), None)
                self._delete(earliest)
        return self._add_individual(signal)

    # --- aggregates -----------------------------------------------------------------------

    def _aggregate_key(self, signal: Signal) -> str:
        # By its own host's restarts only, so the same lines fold the same whatever order hosts arrive in;
        # the aggregate's attempt is decided again, by every restart known, when the job is diagnosed.
        return f"{signal.rule_id}|{pg_of(signal) or ''}|{self.attempt_by_own_restarts(signal)}"

    def _fold(self, signal: Signal, repeats: int) -> None:
        key = self._aggregate_key(signal)
        aggregate = self.aggregates.get(key)
        if aggregate is None:
            if len(self.aggregates) >= MAX_AGGREGATES:
                self._drop(signal)
                return
            aggregate = self.aggregates[key] = Aggregate(
                rule_id=signal.rule_id, class_=signal.class_, severity=signal.severity, role=signal.role,
                pg=pg_of(signal), attempt=self.attempt_by_own_restarts(signal),
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
            self._delete(middle)
        return self._append(signal, key)
