"""What the lines say about the job, beside the failures: the facts the engine keeps in small tables.

- collective progress per process group (`GroupProgress`: members, sizes, each rank's counters, the
  collective each rank issued, who reported a timeout), read by `progress.py` to name a lagging or a
  mismatched rank when only consequences were logged;
- identity: host:pid, host and local rank, host and GPU bus id to global rank (from NCCL's init lines of
  the job-wide communicator, and from lines that name both), read by `identity.py`;
- restarts, each on every host's own clock (`Restart`), and relaunches no launcher line records: they
  split the job into attempts (`attempt_of`);
- completions and each process's latest progress line (`Mark`): did the job or a process go on after a
  failure (recovery);
- the anchors that align host clocks (events every host saw at one true moment) and each host's smallest
  receive lag, read by `timeline.py`.

Every table has a bound (`MAX_*`): a 4,096-rank job's facts stay a few hundred kilobytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from correlator.diagnosis.engine.keys import has_own_time, is_anonymous, node_of, pg_of, process_key, time_of
from correlator.diagnosis.engine.rankset import RankSet
from correlator.diagnosis.models import Signal
from correlator.diagnosis.signals import DEFAULT_GROUPS, REPORT
from ingest.prefixes import identity_from_path

MAX_PROCESSES = 8192  # identity and progress entries
MAX_ANCHORS = 16
MAX_HOSTS_PER_ANCHOR = 1024
MAX_VALUES_PER_COUNTER = 32
MAX_UNNAMED_COLLECTIVES = 64  # failed collectives of groups no line names (each holds a report per rank)
MAX_PROCESS_GROUPS = 2048  # a 4,096-rank job with tensor-parallel groups of 8 has 513 per attempt
MAX_RESTARTS = 256
RESTART_CLUSTER_S = 120.0  # every agent of one restart logs it within this long
RELAUNCH_MIN_S = 60.0  # a process's default group created again this long after the first time: a new run
INFERRED_RESTART_AFTER_S = 0.001  # a restart inferred from a worker-failed report starts just after the report


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
    # host -> its first report, on its own clock (the earliest hosts only): which group reported first is
    # decided on the corrected clock, not by a host whose clock runs ahead
    first_by_host: dict[str, float] = Field(default_factory=dict)
    global_of: dict[str, int] = Field(default_factory=dict)  # rank within the group -> global rank

    def note_report(self, t: float, host: str | None) -> None:
        self.first_ts = t if self.first_ts is None else min(self.first_ts, t)
        note_first(self.first_by_host, host or "", t)


FIRST_HOSTS_KEPT = 64


def note_first(first_by_host: dict[str, float], host: str, t: float) -> None:
    """Keep each host's earliest time, for the FIRST_HOSTS_KEPT hosts whose earliest times are the smallest."""
    known = first_by_host.get(host)
    if known is not None:
        if t < known:
            first_by_host[host] = t
        return
    if len(first_by_host) < FIRST_HOSTS_KEPT:
        first_by_host[host] = t
        return
    latest = max(first_by_host, key=first_by_host.__getitem__)
    if t < first_by_host[latest]:
        del first_by_host[latest]
        first_by_host[host] = t


class UnnamedCollective(BaseModel):
    """One failed collective (SeqNum, OpType, element counts) as reported by watchdog lines that name no process
    group but give the writer's rank within it (`[rank485]:... [Rank 1] Watchdog caught ...`, torch < 2.3):
    global rank -> (its rank within the group, the report's time, its host). Which group it was is inferred
    later."""

    model_config = ConfigDict(extra="ignore")

    reports: dict[int, tuple[int, float | None, str]] = Field(default_factory=dict)
    timeout_ms: int | None = None


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



@dataclass(frozen=True)
class Onset:
    """A consequence line of a process (a peer's death seen, a timeout, the launcher's SIGTERM): when and where.
    Who wrote it is the process key it is kept under."""

    t: float | None  # the line's own time (None: it had none of its own)
    file: str | None
    order: int

    @classmethod
    def of(cls, signal: Signal) -> Onset:
        return cls(time_of(signal) if has_own_time(signal) else None, signal.file, signal.order)

    def before(self, other: Onset) -> bool:
        """Surely earlier: by both lines' own times (one process's lines read one host's clock), else in the same
        file above it. Own times win over a file's order: a traceback flushed after the launcher's teardown
        line in the same console was still written before it."""
        if self.t is not None and other.t is not None and self.t != other.t:
            return self.t < other.t
        if self.file is not None and self.file == other.file:
            return self.order < other.order
        return False


# An onset as stored: (time, index of its file in `onset_files`, order); a process keeps its first and latest.
StoredOnset = tuple[float | None, int, int]


class JobFacts(BaseModel):
    """The facts' tables of one job (fields of `JobState`, serialized with it)."""

    model_config = ConfigDict(extra="ignore")

    groups: dict[str, GroupProgress] = Field(default_factory=dict)
    # "attempt:seq|op|numel_in|numel_out" -> its reports, for watchdog lines that name no group (see progress.py)
    unnamed: dict[str, UnnamedCollective] = Field(default_factory=dict)
    # "node|p<pid>" / "node|l<local>" / "node|b<bus>" -> rank; the node is the line's host, else its file's
    # (`keys.file_node`: a console, or a --log-dir tree)
    identity: dict[str, int] = Field(default_factory=dict)
    # identity keys that two lines tied to different ranks (two hostless launchers, each with its local rank 1):
    # they say nothing
    conflicts: list[str] = Field(default_factory=list)
    local_of: dict[str, int] = Field(default_factory=dict)  # "node|p<pid>" -> local rank (a launcher's report)
    # node -> the highest local rank seen on it (the launchers that wrote local ranks or pids)
    nodes: dict[str, int] = Field(default_factory=dict)
    local_is_rank: bool = True  # no line has tied a local rank to another global rank
    ranks_seen: RankSet = Field(default_factory=RankSet)  # every global rank a line wrote or named
    # process key -> its first and its latest consequence line (the first of each attempt is one of them when
    # a victim's failures end with its death, as they do)
    # (a 4,096-rank cascade keeps one of these per rank: stored compactly, files by index)
    onsets: dict[str, tuple[StoredOnset, StoredOnset]] = Field(default_factory=dict)
    onset_files: list[str | None] = Field(default_factory=list)
    # where a launcher reported its workers failed (torchelastic's `failed (exitcode: N) local_rank: ...`): a
    # restart, when the workers of the same node log progress after it
    worker_failures: list[Mark] = Field(default_factory=list)
    worker_failure_hosts: list[str] = Field(default_factory=list)  # the node of each (its host, "" for none)
    latest_on_node: dict[str, Mark] = Field(default_factory=dict)  # node -> its latest progress line
    world_size: int | None = None
    restarts: list[Restart] = Field(default_factory=list)
    inits: dict[str, float] = Field(default_factory=dict)  # "r<rank>" -> its first default-group init line's time
    completions: list[Mark] = Field(default_factory=list)
    progress: dict[str, Mark] = Field(default_factory=dict)  # process key -> its latest progress line
    anchors: dict[str, dict[str, float]] = Field(default_factory=dict)  # shared event -> host -> first time
    receive_lag: dict[str, float] = Field(default_factory=dict)  # host -> smallest event-minus-receive time

    # --- attempts -------------------------------------------------------------------------

    def attempt_of(self, signal: Signal) -> int:
        """The attempt a signal belongs to: its own (from a log path or a field), else by the restarts seen
        so far: those before it in time, or, for untimed lines, before it in the same file."""
        if signal.attempt is not None:
            return signal.attempt
        return self.attempt_at(time_of(signal), signal.host, signal.file, signal.order)

    def attempt_of_mark(self, mark: Mark, host: str | None = None) -> int:
        """A line's attempt: its file's own (torchrun's --log-dir `attempt_N/`), else by the restarts."""
        attempt = identity_from_path(mark.file).get("attempt") if mark.file else None
        return attempt if isinstance(attempt, int) else self.attempt_at(mark.t, host, mark.file, mark.order)

    def attempt_by_own_restarts(self, signal: Signal) -> int:
        """The attempt of a signal by the restart lines its own host logged (untimed: those before it in its
        file; not a restart inferred from other lines): what folding a collateral line into an aggregate may
        rely on. Another host's restart line, or the progress a restart is inferred from, may reach the state
        before or after this line (files read in any order, partitions read at their own pace); this host's
        own comes before its later lines, in its stream."""
        if signal.attempt is not None:
            return signal.attempt
        t = time_of(signal)
        host = signal.host or ""
        attempt = 0
        for restart in self.restarts:
            if restart.inferred:
                continue  # inferred from progress lines, which may reach the state after this line
            own = restart.hosts.get(host) if t is not None else None
            if (own is not None and t is not None and own <= t) or (
                t is None and restart.file == signal.file and restart.order is not None and restart.order < signal.order
            ):
                attempt = restart.restart_count if restart.restart_count is not None else attempt + 1
        return attempt

    def attempt_at(self, t: float | None, host: str | None = None, file: str | None = None,
                   order: int | None = None) -> int:
        attempt = 0
        for restart in self.restarts:
            if restart.before(t, host, file, order):
                attempt = restart.restart_count if restart.restart_count is not None else attempt + 1
        return attempt

    # --- facts ----------------------------------------------------------------------------

    def note_facts(self, signal: Signal) -> bool:
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
        changed |= self._note_who(signal)
        if signal.kind == "match" and signal.role == "collateral" and not f.get(REPORT):
            changed |= self._note_onset(signal)
        fact = f.get("fact")
        if fact == "restart":
            changed |= self._note_restart(t, f.get("restart_count"), signal)
        elif fact == "worker_failed":
            changed |= self._note_worker_failure(signal)
        elif fact == "completion" and len(self.completions) < MAX_RESTARTS:
            self.completions.append(Mark.of(signal))
            changed = True
        if self._is_progress(signal):
            last = f.get("last_ts")
            mark = Mark.of(signal, float(last) if isinstance(last, (int, float)) else None)
            changed |= self._note_progress(process_key(signal), mark)
            changed |= self._note_node_progress(signal, mark)
        elif isinstance(f.get("ran_ms"), int) and has_own_time(signal) and t is not None:
            # A watchdog's "ran for N milliseconds": the process issued that collective N ms before, so it was
            # alive and in step then, whatever it had logged before (an OOM it caught and retried). Compared
            # by time only (file None): the line itself may well follow a failure that came after the enqueue.
            key = process_key(signal)
            if not is_anonymous(key):
                changed |= self._note_progress(key, Mark(t=t - int(f["ran_ms"]) / 1000.0))
        if (signal.rank is not None or "pg_rank" in f) and ("pg" in f or "seq" in f or "enqueued" in f):
            changed |= self._note_collective(signal, t)
        return changed

    def _note_progress(self, key: str, mark: Mark) -> bool:
        current = self.progress.get(key)
        if (current is None and len(self.progress) < MAX_PROCESSES) or (
            current is not None and mark.after(current.t, current.file, current.order)
        ):
            self.progress[key] = mark
            return True
        return False

    @staticmethod
    def _is_progress(signal: Signal) -> bool:
        f = signal.fields
        return "metric" in f or (f.get("marker") == "end" and f.get("progress") == 1) or f.get("fact") == "progress"

    def _note_who(self, signal: Signal) -> bool:
        """Identity from lines that name two of rank, local rank and pid on one node: a launcher's tee
        prefix with c10d's rank prefix (`[default1]:[rank5]:`), its failure summary (`rank : 5 (local_rank:
        1)`), its report of a local rank's pid (`failed (exitcode: -6) local_rank: 1 (pid: 4410)`)."""
        node = node_of(signal)
        rank, local, pid = signal.rank, signal.local_rank, signal.pid
        changed = False
        if local is not None or pid is not None:
            if node not in self.nodes and len(self.nodes) < MAX_PROCESSES:
                self.nodes[node] = -1
                changed = True
            if local is not None and node in self.nodes and local > self.nodes[node]:
                self.nodes[node] = local
        if rank is not None:
            if rank not in self.ranks_seen:
                self.ranks_seen.add(rank)
                changed = True
            if local is not None:
                changed |= self._remember(f"{node}|l{local}", rank)
                if local != rank and self.local_is_rank:
                    self.local_is_rank = False
                    changed = True
            if pid is not None:
                changed |= self._remember(f"{node}|p{pid}", rank)
        elif local is not None and pid is not None:
            key = f"{node}|p{pid}"
            if key not in self.local_of and len(self.local_of) < MAX_PROCESSES:
                self.local_of[key] = local
                changed = True
        return changed

    # --- restarts no launcher line records ----------------------------------------------------

    @staticmethod
    def _node_key(host: str | None, file: str | None) -> str:
        """A launcher's node: its host, else its file (one launcher's console)."""
        return f"h:{host}" if host else f"f:{file or ''}"

    def _note_worker_failure(self, signal: Signal) -> bool:
        if len(self.worker_failures) >= MAX_RESTARTS:
            return False
        mark = Mark.of(signal)
        node = self._node_key(signal.host, signal.file)
        self.worker_failures.append(mark)
        self.worker_failure_hosts.append(node)
        latest = self.latest_on_node.get(node)
        return latest is not None and self._restart_between(mark, latest, signal)

    def _note_node_progress(self, signal: Signal, mark: Mark) -> bool:
        node = self._node_key(signal.host, signal.file)
        latest = self.latest_on_node.get(node)
        if latest is not None and not mark.after(latest.t, latest.file, latest.order):
            return False
        if latest is None and len(self.latest_on_node) >= MAX_PROCESSES:
            return False
        self.latest_on_node[node] = mark
        changed = False
        for failure, where in zip(self.worker_failures, self.worker_failure_hosts, strict=True):
            if where == node:
                changed |= self._restart_between(failure, mark, signal)
        return changed

    def _restart_between(self, failure: Mark, progress: Mark, signal: Signal) -> bool:
        """torchelastic restarts a failed worker group without a line at the default log level: its workers'
        progress after its report that they failed is the next attempt. The restart is at the report."""
        if not progress.after(failure.t, failure.file, failure.order):
            return False
        if failure.t is None and progress.file != failure.file:
            return False
        if any(r.file == failure.file and r.order == failure.order for r in self.restarts):
            return False
        reporter = signal.model_copy(update={"file": failure.file, "order": failure.order})
        # The report ends the failed attempt: the next one starts just after it (`Restart.before` counts a line at
        # the restart's own time as after it).
        start = failure.t + INFERRED_RESTART_AFTER_S if failure.t is not None else None
        return self._note_restart(start, None, reporter, inferred=True)

    def _note_onset(self, signal: Signal) -> bool:
        key = process_key(signal)
        onset = Onset.of(signal)
        kept = self.onsets.get(key)
        if kept is None:
            if len(self.onsets) >= MAX_PROCESSES:
                return False
            stored = self._store_onset(onset)
            self.onsets[key] = (stored, stored)
            return True
        first, last = self.onset(kept[0]), self.onset(kept[1])
        new_first = onset.before(first) or (first.t is None and onset.t is not None)
        new_last = last.before(onset)
        if not (new_first or new_last):
            return False
        stored = self._store_onset(onset)
        self.onsets[key] = (stored if new_first else kept[0], stored if new_last else kept[1])
        return True

    def _store_onset(self, onset: Onset) -> StoredOnset:
        try:
            index = self.onset_files.index(onset.file)
        except ValueError:
            index = len(self.onset_files)
            self.onset_files.append(onset.file)
        return (onset.t, index, onset.order)

    def onset(self, stored: StoredOnset) -> Onset:
        t, index, order = stored
        return Onset(t, self.onset_files[index] if 0 <= index < len(self.onset_files) else None, order)

    def _remember(self, key: str, rank: int) -> bool:
        known = self.identity.get(key)
        if known is None:
            if len(self.identity) < MAX_PROCESSES:
                self.identity[key] = rank
                return True
            return False
        if known != rank and key not in self.conflicts and len(self.conflicts) < MAX_PROCESSES:
            self.conflicts.append(key)
            return True
        return False

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
        self.ranks_seen.add(rank)
        if signal.pid is not None:
            self.identity[f"{signal.host}|p{signal.pid}"] = rank
        bus = f.get("bus_id")
        if isinstance(bus, (str, int)):
            self.identity[f"{signal.host}|b{normalize_bus_id(str(bus))}"] = rank
        comm = f.get("comm_id")
        t = time_of(signal)
        if comm is not None and signal.host and t is not None:
            self._anchor(f"init:{comm}", signal.host, t)
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
            # not say which (a watchdog line without the PG prefix). Kept by the collective it reports.
            return self._note_unnamed(signal, int(f["pg_rank"]), signal.rank, t)
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
                group.note_report(t, signal.host)
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

    def _note_unnamed(self, signal: Signal, pg_rank: int, rank: int, t: float | None) -> bool:
        f = signal.fields
        if signal.kind != "match" or signal.class_ not in ("nccl_timeout", "nccl_error") or not isinstance(
            f.get("seq"), int
        ):
            return False
        key = f"{self.attempt_of(signal)}:{f['seq']}|{f.get('op', '')}|{f.get('numel_in', '')}|{f.get('numel_out', '')}"
        collective = self.unnamed.get(key)
        if collective is None:
            if len(self.unnamed) >= MAX_UNNAMED_COLLECTIVES:
                return False
            collective = self.unnamed[key] = UnnamedCollective()
        if len(collective.reports) >= MAX_PROCESSES or rank in collective.reports:
            return False  # one report per rank (its watchdog prints the work three times)
        collective.reports[rank] = (pg_rank, t, signal.host or "")
        if isinstance(f.get("timeout_ms"), int):
            collective.timeout_ms = max(collective.timeout_ms or 0, int(f["timeout_ms"]))
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

    def note_clock(self, signal: Signal) -> None:
        host = signal.host
        if not host or signal.ts is None:
            return
        t = signal.ts.timestamp()
        if signal.received_ts is not None and (host in self.receive_lag or len(self.receive_lag) < MAX_PROCESSES):
            lag = t - signal.received_ts.timestamp()
            self.receive_lag[host] = min(self.receive_lag.get(host, lag), lag)
        if signal.kind == "match" and signal.class_ == "launcher_teardown":
            self._anchor("teardown", host, t)
        # training steps: from the step lines the state keeps, when the job is diagnosed (timeline.job_anchors)

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
