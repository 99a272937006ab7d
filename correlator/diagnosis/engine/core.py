"""The correlation engine: a job's state in, its incidents out. Pure: no I/O, the clock is passed in.

How the initiator is found (README, "How the initiator is chosen"):
1. One clock: host offsets from shared events (timeline.py); lines without a time take their file's.
2. Attempts: restarts split the job; each attempt is diagnosed on its own, the last failing one first.
3. Windows: within an attempt, a quiet gap longer than `window_gap_s` starts a new incident.
4. Causality per signal (causality.py): a signal explains another only by its own rule's `explains`,
   before it, within a horizon, in the same attempt. Failures the process survived (it went on
   logging progress, or training completed) explain nothing and become a recovered warning.
5. The initiator is the earliest unexplained cause of the most confident tier that did not come after
   consequences it cannot explain. With no such cause, collective progress per process group names the
   suspect (progress.py): a collective mismatch, the rank whose enqueued counter lags, or the one member
   missing from the timeout reports.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from correlator.diagnosis.engine.causality import LATE_DEATH_S, Causality, Node, tier
from correlator.diagnosis.engine.facts import GroupProgress, Mark, Onset
from correlator.diagnosis.engine.identity import (
    IdentityResolver,
    corroborated,
    fill_identity,
    is_failure_report,
    named_by_reports,
)
from correlator.diagnosis.engine.incident import Choice, IncidentBuilder, incident_id
from correlator.diagnosis.engine.keys import (
    has_own_time,
    is_anonymous,
    process_key,
    sort_key,
    time_of,
    who_of_key,
)
from correlator.diagnosis.engine.progress import (
    Suspect,
    hang_suspect,
    inferred_missing,
    mismatch_suspect,
    missing_reporter,
    unnamed_groups,
    with_unnamed,
)
from correlator.diagnosis.engine.sequence_absence_metric import (
    progress_order,
    resolve_sequence_absence_metric,
    same_process,
)
from correlator.diagnosis.engine.state import JobState
from correlator.diagnosis.engine.timeline import Clock, Timeline, build_timeline, estimate_clock, job_anchors
from correlator.diagnosis.engine.victims import first_consequences, victims
from correlator.diagnosis.models import SEVERITY_RANK, Incident, Signal
from correlator.diagnosis.rules import GENERIC_CLASSES, HINT_TAG, Rule, RuleSet

SAME_PROCESS_RECOVERY_S = 1.0  # a progress line this long after a failure, from the same process
ANONYMOUS_RECOVERY_S = 60.0  # the same, when neither line names its process (other ranks' steps in flight)
AFTER_COMPLETION_S = 600.0  # a failure this long after training completed is not the job's (a final save is quicker)
TRACEBACK_S = 60.0  # lines of one traceback on one process
MAX_RECOVERED_PER_WINDOW = 3
# Consequences a rank reports while it waits for a peer (or loses it): the rank that reports none of them while
# every other does is the one they waited for.
WAITING_CLASSES = frozenset({"nccl_timeout", "nccl_error", "straggler_hang"})


@dataclass(frozen=True)
class JobView:
    """What one diagnosis reads the job's state through: its identity resolved, its clock, each process's first
    consequences and latest progress under the engine's names for them."""

    state: JobState
    resolver: IdentityResolver
    timeline: Timeline
    onsets: dict[str, list[tuple[int, Onset]]]
    progress: dict[str, Mark]


class Engine:
    # window_gap_s: a quiet gap this long starts a new incident window. It must exceed the longest
    # collective timeout (NCCL's default is 10 min, many jobs raise it to 30-60 min), or the timeouts a
    # failure causes would land in a window of their own, without their cause.
    def __init__(
        self,
        ruleset: RuleSet,
        *,
        window_gap_s: float = 7200.0,
        default_timeout_s: float = 1800.0,
    ) -> None:
        self.ruleset = ruleset
        self.rules: dict[str, Rule] = ruleset.by_id()
        self.roles = {rule_id: ruleset.role_of(rule) for rule_id, rule in self.rules.items()}
        self.tags = {rule_id: frozenset(rule.tags) for rule_id, rule in self.rules.items()}
        self.window_gap_s = window_gap_s
        self.default_timeout_s = default_timeout_s
        self.builder = IncidentBuilder(ruleset)
        # Silent corruption is survived by definition (training goes on, on wrong numbers): going on after it
        # does not make it a recovered warning.
        self.silent = frozenset(slug for slug, c in ruleset.classes.items() if c.category == "sdc")

    # --- public -------------------------------------------------------------------------

    def diagnose(self, state: JobState, now: datetime | float | None = None) -> list[Incident]:
        """The job's incidents, the one that ended the job first. `now` resolves absence rules (default:
        the latest event)."""
        now_t = now.timestamp() if isinstance(now, datetime) else now
        if not state.signals and not state.aggregates:
            return []
        clock = estimate_clock(job_anchors(state), state.receive_lag)
        resolver = IdentityResolver(state)
        signals = [self._with_attempt(fill_identity(s, resolver), state) for s in state.signals]
        timeline = build_timeline(signals, clock)
        # sequence preconditions from the whole job (a save torn in one attempt fails the next one's load)
        earlier = [s for s in signals if s.fields.get("marker") == "after"]
        aggregates = [self._aggregate_node(key, state, clock) for key in sorted(state.aggregates)]
        for key, node in zip(sorted(state.aggregates), aggregates, strict=True):
            # the attempt by every restart now known (the key holds the one known when its first line came)
            node.attempt = state.attempt_of(min(state.aggregates[key].samples, key=sort_key))
        by_attempt: dict[int, tuple[list[Signal], list[Node]]] = defaultdict(lambda: ([], []))
        for s in signals:
            by_attempt[s.attempt or 0][0].append(s)
        for node in aggregates:
            by_attempt[node.attempt][1].append(node)
        view = JobView(state, resolver, timeline, first_consequences(state, resolver),
                       resolved_progress(state, resolver))
        incidents: list[Incident] = []
        for attempt in sorted(by_attempt):
            attempt_signals, attempt_aggregates = by_attempt[attempt]
            for window, window_aggregates in self._windows(attempt_signals, attempt_aggregates, timeline):
                incidents.extend(self._window_incidents(view, attempt, window, window_aggregates, now_t, earlier))
        incidents = _survived_by_restart(state, _distinct_ids(state.job_id, incidents))
        incidents.sort(key=_primary_order)
        return incidents

    def correlate(self, job_id: str, signals: Iterable[Signal], now: datetime | float | None = None) -> list[Incident]:
        state = JobState(job_id=job_id)
        state.add_all(signals)
        return self.diagnose(state, now)

    # --- attempts, nodes and windows -------------------------------------------------------

    @staticmethod
    def _with_attempt(signal: Signal, state: JobState) -> Signal:
        """The signal with its attempt, by every restart now known."""
        attempt = state.attempt_of(signal)
        return signal if signal.attempt == attempt else signal.model_copy(update={"attempt": attempt})

    @staticmethod
    def _aggregate_node(key: str, state: JobState, clock: Clock) -> Node:
        aggregate = state.aggregates[key]
        firsts = [clock.correct(t, host) for host, t in aggregate.hosts.items() if t is not None]
        t_first = min((t for t in firsts if t is not None), default=clock.correct(aggregate.first_ts, None))
        sample = aggregate.samples[0]
        sample_host = sample.host or ""
        t_last = clock.correct(aggregate.last_ts, sample_host) if aggregate.last_ts is not None else None
        return Node(sample, t_first, aggregate.attempt or 0, aggregate, t_last)

    def _windows(
        self, signals: Sequence[Signal], aggregates: Sequence[Node], timeline: Timeline
    ) -> list[tuple[list[Signal], list[Node]]]:
        """The attempt's failures cut where nothing failed for `window_gap_s`. Only failures with a time of their
        own cut and hold windows; a line whose time is borrowed from an earlier line (a lower bound: it happened
        then or later) joins the first window that had not ended by then, and an untimed line the last."""
        # (time, order), then signals before aggregates at the same key
        events: list[tuple[tuple[float, int], int, Signal | Node]] = [(timeline.key(s), 0, s) for s in signals]
        events += [(node.key(), 1, node) for node in aggregates]
        events.sort(key=lambda e: (e[0], e[1]))
        windows: list[tuple[list[Signal], list[Node]]] = [([], [])]
        ends: list[float | None] = [None]
        borrowed: list[tuple[float, Signal]] = []
        for (t, _order), _kind, item in events:
            is_match = isinstance(item, Node) or item.kind == "match"
            if isinstance(item, Signal) and t != float("inf") and not has_own_time(item):
                borrowed.append((t, item))
                continue
            timed = t != float("inf")
            last_t = ends[-1]
            if timed and last_t is not None and t - last_t > self.window_gap_s and is_match:
                windows.append(([], []))
                ends.append(None)
            if isinstance(item, Node):
                windows[-1][1].append(item)
            else:
                windows[-1][0].append(item)
            if timed and is_match:
                end = item.t_last if isinstance(item, Node) and item.t_last is not None else t
                ends[-1] = max(last_t or end, end)
        for t, signal in borrowed:
            at = next((i for i, end in enumerate(ends) if end is None or end >= t), len(windows) - 1)
            windows[at][0].append(signal)
        return [w for w in windows if w[0] or w[1]]

    # --- one window ---------------------------------------------------------------------

    def _window_incidents(
        self,
        view: JobView,
        attempt: int,
        window: Sequence[Signal],
        aggregates: Sequence[Node],
        now_t: float | None,
        earlier: Sequence[Signal] = (),
    ) -> list[Incident]:
        state, timeline = view.state, view.timeline
        resolved = resolve_sequence_absence_metric(self.rules, window, timeline, now_t, earlier)
        matches = [s for s in resolved if s.class_]
        nodes = [Node(s, timeline.t(s), attempt) for s in matches] + list(aggregates)
        if not nodes or max(SEVERITY_RANK.get(n.signal.severity, 2) for n in nodes) == 0:
            return []
        groups = {k.split(":", 1)[1]: g for k, g in state.groups.items() if k.split(":", 1)[0] == str(attempt)}
        causality = Causality(self.rules, self.roles, self._timeout_s(groups), _tolerance(timeline.clock))
        recovered = {id(n): reason for n in nodes
                     if (reason := self._recovery(n, state, view.progress, attempt))}
        fallen = victims(nodes, view.onsets)
        causality.demote_spread_fabric_errors([n for n in nodes if id(n) not in recovered and id(n) not in fallen])
        explainers = [n for n in nodes if id(n) not in recovered and id(n) not in fallen and causality.can_explain(n)]
        explained = causality.explained_by(nodes, explainers)
        candidates = [
            n for n in nodes
            if n.aggregate is None and explained[id(n)] is None and id(n) not in recovered and id(n) not in fallen
            and causality.role(n) in ("cause", "either") and n.signal.severity != "info"
        ]
        pool = [c for c in candidates if not causality.after_the_cascade(c, nodes)]
        pool = _specific_over_generic(pool, self.rules)
        reports = [fill_identity(r, view.resolver) for r in _failure_reports(nodes, self.tags)]
        live = [n for n in nodes if id(n) not in recovered]
        incidents: list[Incident] = []
        if pool:
            consequences = {id(e) for e in explained.values() if e is not None}
            top = max(tier(causality.confidence(c)) for c in pool)
            # Within the tier: a cause that explains what followed before one that explains nothing, then time.
            primary = min((c for c in pool if tier(causality.confidence(c)) == top),
                          key=lambda c: (id(c) not in consequences, c.key()))
            primary = most_accused(first_in_training(primary, pool), nodes)
            signal, note = named_by_reports(corroborated(primary.signal, matches), reports)
            if signal.rank is None and signal.host is None and signal.pid is None:
                signal, note = self._by_elimination(signal, note, nodes, causality, state)
            choice = Choice(primary=primary, signal=signal, identity_note=note)
            incidents.append(self.builder.build(state, attempt, nodes, explained, causality, choice, timeline))
        elif live and any(SEVERITY_RANK.get(n.signal.severity, 2) > 1 for n in live):
            groups_seen = with_unnamed(groups, unnamed_groups(state.unnamed, attempt))
            choice = self._victim_choice(live, explained, causality, groups_seen, state.world_size, reports,
                                         state.ranks_seen, timeline.clock.correct, fallen)
            incidents.append(self.builder.build(state, attempt, nodes, explained, causality, choice, timeline))
        incidents.extend(self._recovered_incidents(state, attempt, nodes, recovered, causality, timeline))
        return incidents

    def _recovered_incidents(
        self, state: JobState, attempt: int, nodes: list[Node], recovered: dict[int, str], causality: Causality,
        timeline: Timeline,
    ) -> list[Incident]:
        """One warning per failure the job went on after (class and process), the first few."""
        seen: set[tuple[str, str]] = set()
        out: list[Incident] = []
        for node in sorted((n for n in nodes if id(n) in recovered), key=Node.key):
            if causality.role(node) not in ("cause", "either") or node.signal.severity == "info":
                continue
            key = (node.cls, process_key(node.signal))
            if key in seen:
                continue
            seen.add(key)
            choice = Choice(primary=node, signal=node.signal, recovered=recovered[id(node)])
            out.append(self.builder.build(state, attempt, [node], {}, causality, choice, timeline))
            if len(out) >= MAX_RECOVERED_PER_WINDOW:
                break
        return out

    def _victim_choice(
        self,
        nodes: list[Node],
        explained: dict[int, Node | None],
        causality: Causality,
        groups: dict[str, GroupProgress],
        world_size: int | None,
        reports: list[Signal],
        known_ranks: Iterable[int] = (),
        correct: Callable[[float | None, str | None], float | None] = lambda t, _host: t,
        fallen: Mapping[int, object] | None = None,
    ) -> Choice:
        """Only consequences were logged: the class they show (the one nothing else present explains, e.g.
        an NCCL remote error rather than the timeouts it caused) and the suspect collective progress names."""
        failed = [n for n in nodes if n.signal.severity != "info"] or nodes  # a note is never the class shown
        # a victim's own failure came after the consequence its process logged: downstream, not the class shown
        fallen = fallen or {}
        shown = ([n for n in failed if explained[id(n)] is None and id(n) not in fallen]
                 or [n for n in failed if explained[id(n)] is None] or failed)
        top = max(tier(causality.confidence(n)) for n in shown)
        primary = min((n for n in shown if tier(causality.confidence(n)) == top), key=Node.key)
        suspect: Suspect | None = mismatch_suspect(groups) or hang_suspect(groups, world_size, correct)
        if suspect is None:
            reporters: set[int] = set()
            for n in nodes:
                if n.cls in WAITING_CLASSES and causality.role(n) == "collateral":
                    reporters |= n.ranks()
            suspect = missing_reporter(reporters, set(known_ranks), world_size)
            if suspect is None and world_size is None:
                suspect = inferred_missing(reporters)
        signal, note = primary.signal, ""
        if suspect is None and primary.aggregate is None:
            signal, note = named_by_reports(primary.signal, reports)
        return Choice(primary=primary, signal=signal, victims_only=True, suspect=suspect, identity_note=note)

    @staticmethod
    def _by_elimination(signal: Signal, note: str, nodes: list[Node], causality: Causality,
                        state: JobState) -> tuple[Signal, str]:
        """A death whose line names nobody (glibc's abort message in an unprefixed console) belongs to the one
        rank of the job that logged no consequence while every other did: the others lost it."""
        reporters: set[int] = set()
        for n in nodes:
            if n.cls in WAITING_CLASSES and causality.role(n) == "collateral":
                reporters |= n.ranks()
        suspect = missing_reporter(reporters, set(state.ranks_seen), state.world_size, at_least=1)
        if suspect is None or not suspect.strong:
            return signal, note
        told = f"rank {suspect.rank} by elimination: {suspect.reason}"
        return signal.model_copy(update={"rank": suspect.rank}), f"{note}; {told}" if note else told

    def _timeout_s(self, groups: dict[str, GroupProgress]) -> float:
        logged = [g.timeout_ms for g in groups.values() if g.timeout_ms]
        return max(logged) / 1000.0 if logged else self.default_timeout_s

    # --- recovery -----------------------------------------------------------------------

    def _recovery(self, node: Node, state: JobState, progress_of: dict[str, Mark], attempt: int) -> str:
        """Why the job went on after this failure ('' when it did not): the same process logged progress
        later in the same attempt, or training completed."""
        s = node.signal
        if node.aggregate is not None or self.roles.get(s.rule_id) == "collateral" or node.cls in self.silent:
            return ""
        raw = time_of(s)
        for done in state.completions:
            done_attempt = state.attempt_of_mark(done, s.host)
            if raw is not None and done.t is not None and raw - done.t > AFTER_COMPLETION_S and done_attempt == attempt:
                return f"it came {(raw - done.t) / 60:.0f} min after training completed: not the job's failure"
            if done.after(raw, s.file, s.order) and done_attempt >= attempt:
                # the job finished: a failure before it was survived, by the process or by a restart
                later = done_attempt > attempt
                return "the job restarted and training completed after it" if later else "training completed after it"
        if _restarted_after(state, s):
            return ""  # the attempt ended in a restart the job did not complete after: not survived
        key = process_key(s)
        progress = progress_of.get(key)
        if progress is None:
            return ""
        anonymous = is_anonymous(key)
        if anonymous and (raw is None or progress.t is None):
            return ""  # lines that name no process and carry no time: another rank's bar may still be drawing
        margin = ANONYMOUS_RECOVERY_S if anonymous else SAME_PROCESS_RECOVERY_S
        if progress.after(raw, s.file, s.order, margin):
            who = "the job" if anonymous else "the same process"
            when = f" {progress.t - raw:.0f} s" if progress.t is not None and raw is not None else ""
            went_on = "logged progress" if anonymous else "went on (logged progress, or entered a collective)"
            return f"{who} {went_on}{when} after it"
        return ""


def resolved_progress(state: JobState, resolver: IdentityResolver) -> dict[str, Mark]:
    """Each process's latest progress line, keyed as the engine names the process (its global rank when the
    job's identity tables place the local rank or pid the line was kept under)."""
    out: dict[str, Mark] = {}
    for raw, mark in state.progress.items():
        node, rank, local, pid = who_of_key(raw)
        key = raw
        if rank is None and node is not None:
            resolved = resolver.rank_of(node, local, pid)
            key = raw if resolved is None else f"r{resolved}"
        known = out.get(key)
        if known is None or mark.after(known.t, known.file, known.order):
            out[key] = mark
    return out


def first_in_training(primary: Node, pool: Sequence[Node]) -> Node:
    """Among failures of the primary's class whose lines give the training step (a non-finite loss on several
    ranks), the one at the lowest step came first whatever the hosts' clocks say: the all-reduce spreads one
    rank's NaN to every rank at the next step."""
    step = primary.signal.fields.get("step")
    if not isinstance(step, int):
        return primary
    same = [c for c in pool if c.cls == primary.cls and isinstance(c.signal.fields.get("step"), int)]
    return min(same, key=lambda c: (progress_order(c.signal)[0], c.key()))


def most_accused(primary: Node, nodes: Sequence[Node]) -> Node:
    """When the primary is one rank's accusation of another ("Rank 1 is running ..., but Rank 2 is running
    ..."), the others' lines of the same kind vote: the rank that the most distinct reporters name is the odd
    one out (the accused rank accuses whichever peer it compared itself with). Ties keep the earliest."""
    if "reporter_rank" not in primary.signal.fields or primary.signal.rank is None:
        return primary
    votes: dict[int, set[object]] = defaultdict(set)
    first: dict[int, Node] = {}
    for n in sorted(nodes, key=Node.key):
        s = n.signal
        if n.aggregate is not None or s.rule_id != primary.signal.rule_id or s.rank is None:
            continue
        votes[s.rank].add(s.fields.get("reporter_rank"))
        first.setdefault(s.rank, n)
    best = max(votes, key=lambda rank: (len(votes[rank]), -first[rank].key()[0], -first[rank].order))
    return first[best] if len(votes[best]) > len(votes.get(primary.signal.rank, ())) else primary


def _survived_by_restart(state: JobState, incidents: list[Incident]) -> list[Incident]:
    """Failures of an attempt that the job restarted from and then completed were survived (the restart is how
    it survived them): they are recovered warnings, whatever they were."""
    finished = [state.attempt_of_mark(done) for done in state.completions]
    last = max(finished, default=-1)
    return [
        incident.model_copy(update={
            "recovered": True, "severity": "low",
            "confidence_reason": incident.confidence_reason
            + f"; the job restarted (attempt {last}) and training completed: survived"})
        if incident.attempt < last and not incident.recovered else incident
        for incident in incidents
    ]


def _distinct_ids(job_id: str, incidents: list[Incident]) -> list[Incident]:
    """The same failure of the same process twice in one attempt (windows hours apart) gets the next id."""
    seen: dict[str, int] = {}
    out: list[Incident] = []
    for incident in sorted(incidents, key=lambda i: (i.window_start or "", i.incident_id)):
        repeat = seen.get(incident.incident_id, 0)
        seen[incident.incident_id] = repeat + 1
        renumbered = incident.model_copy(update={"incident_id": incident_id(
            job_id, incident.attempt, incident.class_, incident.initiator, repeat)}) if repeat else incident
        out.append(renumbered)
    return out


def _failure_reports(nodes: list[Node], tags: dict[str, frozenset[str]]) -> list[Signal]:
    """Launchers' reports of failed processes. An aggregate of reports stands for more processes than its
    samples show: it makes the reports ambiguous, so none is used."""
    out: list[Signal] = []
    for n in nodes:
        rule_tags = tags.get(n.signal.rule_id, frozenset())
        if n.aggregate is None:
            if is_failure_report(n.signal, rule_tags):
                out.append(n.signal)
            continue
        samples = [s for s in n.aggregate.samples if is_failure_report(s, rule_tags)]
        if samples and n.aggregate.count > len(n.aggregate.samples):
            return []
        out.extend(samples)
    return out


def _restarted_after(state: JobState, signal: Signal) -> bool:
    t = time_of(signal)
    return any(
        not restart.before(t, signal.host, signal.file, signal.order)
        and ((t is not None and restart.ts is not None) or restart.file == signal.file)
        for restart in state.restarts
    )


def _tolerance(clock: Clock) -> float:
    """How far two corrected clocks may still disagree."""
    return 2.0 if clock.offsets and "shared event" in clock.method else 10.0


def _specific_over_generic(pool: list[Node], rules: Mapping[str, Rule]) -> list[Node]:
    """One traceback tells one failure, by its most precise line: a generic exception class is a last resort,
    never the class when a specific failure of the same process is in the same traceback (chained exceptions
    print the generic wrapper last), and a rule's line yields to the classes it names in `yields_to` (a
    wrapper's message, "Weights only load failed", and the reason printed under it, "Unsupported operand")."""
    out = []
    for c in pool:
        rule = rules.get(c.signal.rule_id)
        yields = set(rule.yields_to) if rule is not None else set()
        window = TRACEBACK_S
        if c.cls in GENERIC_CLASSES:
            yields = {o.cls for o in pool if o.cls not in GENERIC_CLASSES}
        if rule is not None and HINT_TAG in rule.tags and c.signal.rank is not None:
            # A peer's report that names the culprit ("Rank 6 failed to pass monitoredBarrier") says who, not
            # what: the named rank's own failure, when it logged one, says what.
            yields = {o.cls for o in pool if o is not c and o.signal.rank == c.signal.rank}
            window = LATE_DEATH_S
        if yields and any(
            o is not c and o.cls in yields and same_process(c.signal, o.signal)
            and (c.t is None or o.t is None or abs(c.t - o.t) <= window)
            for o in pool
        ):
            continue
        out.append(c)
    return out


def _primary_order(incident: Incident) -> tuple[int, int, int, int, float]:
    """The incident that ended the job first: failed before recovered, the last attempt that failed, an
    incident with consequences before a lone line, then severity and confidence."""
    cascade = 1 if incident.collateral else 0
    return (
        1 if incident.recovered else 0,
        -incident.attempt,
        -cascade,
        -SEVERITY_RANK[incident.severity],
        -incident.confidence,
    )
