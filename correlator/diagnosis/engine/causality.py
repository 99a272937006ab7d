"""Who explains whom: one signal explains another only by its own rule, before it, within a horizon, in the
same attempt of the job.

A node is one individual signal or one aggregate of collateral (its earliest line and time). The horizon
is how long a consequence can come after its cause: the rule's `explains_within_s`, else the process
group's collective timeout (logged by the watchdog as `Timeout(ms)`) plus the time the teardown takes,
else the default of the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from correlator.diagnosis.engine.keys import has_own_time
from correlator.diagnosis.engine.store import Aggregate
from correlator.diagnosis.models import SEVERITY_RANK, Signal
from correlator.diagnosis.rules import TIER_BOUNDARIES, Rule
from correlator.diagnosis.signals import REPORT

TEARDOWN_MARGIN_S = 900.0  # after a collective times out: the abort, the launcher's teardown, the exits
FABRIC_CLASS = "network_fabric_error"
LOCAL_FAULT_TAG = "local-fault"  # a rule whose line is about its writer's own hardware failing
LATE_DEATH_S = 60.0  # a death's own line after the consequences it caused (flush, launcher report, clock ahead)


@dataclass(eq=False)
class Node:
    signal: Signal  # an individual signal, or an aggregate's earliest sample
    t: float | None  # on the corrected clock; an aggregate's earliest time over its hosts
    attempt: int = 0
    aggregate: Aggregate | None = None
    t_last: float | None = None

    @property
    def cls(self) -> str:
        return self.signal.class_ or ""

    @property
    def order(self) -> int:
        return self.signal.order

    def key(self) -> tuple[float, int]:
        return (self.t if self.t is not None else float("inf"), self.signal.order)

    def ranks(self) -> set[int]:
        if self.aggregate is not None:
            return set(self.aggregate.ranks)
        return {self.signal.rank} if self.signal.rank is not None else set()

    def hosts(self) -> set[str]:
        if self.aggregate is not None:
            return {h for h in self.aggregate.hosts if h}
        return {self.signal.host} if self.signal.host else set()


def tier(confidence: float) -> int:
    high, middle = reversed(TIER_BOUNDARIES)
    return 2 if confidence >= high else 1 if confidence >= middle else 0


@dataclass
class Causality:
    rules: Mapping[str, Rule]
    roles: Mapping[str, str]  # rule id -> role (the rule's, else its class's)
    timeout_s: float  # the collective timeout of this attempt (logged, or the default)
    tolerance_s: float  # how far the corrected clocks may still disagree
    demoted: set[int] = field(default_factory=set)  # nodes (by id) read as consequences whatever their rule says

    def role(self, node: Node) -> str:
        if id(node) in self.demoted:
            return "collateral"
        return self.roles.get(node.signal.rule_id, node.signal.role)

    def demote_spread_fabric_errors(self, nodes: list[Node]) -> None:
        """A fabric error is a cause only where it is local: one host's link or NIC failing before anything
        died. When a rank dies, every peer whose connections ran to it sees its queue pairs fail (IB retry
        exceeded, remote errors) on its own host: errors of the fabric on several hosts, or after a death, are
        the death's consequences."""
        fabric = [n for n in nodes if n.cls == FABRIC_CLASS and n.aggregate is None]
        if not fabric:
            return
        first_on: dict[str, float] = {}  # host -> its first fabric error (not a NIC's own fault; inf: untimed)
        for n in fabric:
            if not self.local_fault(n) and self.role(n) != "collateral":  # not a flush
                t = n.t if n.t is not None else float("inf")
                for h in n.hosts():
                    first_on[h] = min(first_on.get(h, t), t)
        ordered = sorted(first_on.items(), key=lambda kv: kv[1])
        # One host's errors clearly before any other host's: the fault is there (the others see it later).
        leader = ordered[0][0] if len(ordered) == 1 or (
            len(ordered) > 1 and ordered[1][1] != float("inf") and ordered[1][1] - ordered[0][1] > self.tolerance_s
        ) else None
        # a process's own failure (not a launcher's report of an exit, which a fabric failure causes too)
        deaths = [n.t for n in nodes if n.aggregate is None and n.cls != FABRIC_CLASS and n.t is not None
                  and self.role(n) != "collateral" and SEVERITY_RANK.get(n.signal.severity, 2) > 1
                  and not n.signal.fields.get(REPORT)]
        reach = self.timeout_s + TEARDOWN_MARGIN_S  # how far apart a death and the errors it causes can be
        for n in fabric:
            near = [d for d in deaths if n.t is None or abs(d - n.t) <= reach]
            if self.local_fault(n):
                # a NIC's own fault stays its host's cause unless something had died before it
                if near and (n.t is None or n.t >= min(near) - self.tolerance_s):
                    self.demoted.add(id(n))
                continue
            # Errors a peer's connection reports: consequences of a death near them (whatever the clocks say: a
            # dying rank's peers see their queue pairs fail) and, with none, of the host that reported clearly first.
            if near or (len(first_on) > 1 and not (leader is not None and leader in n.hosts())):
                self.demoted.add(id(n))

    def local_fault(self, node: Node) -> bool:
        """A line about the writer's own hardware failing (its NIC's port error, its link down)."""
        rule = self.rules.get(node.signal.rule_id)
        return rule is not None and LOCAL_FAULT_TAG in rule.tags

    def confidence(self, node: Node) -> float:
        rule = self.rules.get(node.signal.rule_id)
        return rule.confidence if rule is not None else 0.5

    def can_explain(self, node: Node) -> bool:
        """Only a failure explains: a signal of a rule with `explains`, not info. (Collateral explains too,
        among consequences: a peer's "remote process exited" explains the teardown that follows it.)"""
        if node.signal.kind != "match":
            return False
        rule = self.rules.get(node.signal.rule_id)
        return rule is not None and bool(rule.explains) and SEVERITY_RANK.get(rule.severity, 2) > 0

    def horizon(self, cause: Node) -> float:
        rule = self.rules.get(cause.signal.rule_id)
        if rule is not None and rule.explains_within_s is not None:
            return rule.explains_within_s
        return self.timeout_s + TEARDOWN_MARGIN_S

    def explains(self, cause: Node, other: Node) -> bool:
        if cause is other or cause.attempt != other.attempt or not self.can_explain(cause):
            return False
        rule = self.rules[cause.signal.rule_id]
        # One failure of a class does not explain another of it, but a NIC's own fault does explain what its
        # peers' connections to it then report (the same class, seen from the other end).
        same_class = other.cls == cause.cls and not (id(other) in self.demoted and self.local_fault(cause))
        if same_class or other.cls not in rule.explains:
            return False
        if cause.t is None or other.t is None:
            # Untimed lines: order within one file is the only clock.
            return cause.signal.file != other.signal.file or cause.order <= other.order
        delay = other.t - cause.t
        if not has_own_time(cause.signal):
            # The cause's time is an earlier line's, a lower bound (a traceback in a rank's own file that printed
            # no time since its start): it happened then or later, so it explains what is not surely before it.
            return delay >= -self.lateness(cause, other)
        if not has_own_time(other.signal):
            # Its time is an earlier line's, a lower bound: it may have come after the cause even when that bound
            # is before it, but not by more than a horizon (an error an hour later explains nothing before it).
            same_file_before = cause.signal.file == other.signal.file and cause.order > other.order
            if same_file_before and self.lateness(cause, other) <= self.tolerance_s:
                return False  # below it in the same file: it came first (a death's own line may come later)
            return -self.horizon(cause) <= delay <= self.horizon(cause)
        return -self.lateness(cause, other) <= delay <= self.horizon(cause)

    def lateness(self, cause: Node, other: Node) -> float:
        """How much later than a consequence its cause's line may appear. The clocks' tolerance, and for a
        death (a failure that is not itself a consequence) seen before by a consequence (a peer's failure
        seen, a timeout, the launcher's teardown): `LATE_DEATH_S`. A peer's "connection closed" proves a
        process died before it, but the dead process's own line can come later: its traceback flushed after
        its peers' errors, its launcher's report of its exit a monitor interval later, its host's clock ahead."""
        if self.role(other) == "collateral" and self.role(cause) != "collateral":
            return max(self.tolerance_s, LATE_DEATH_S)
        return self.tolerance_s

    def explained_by(self, nodes: list[Node], explainers: list[Node]) -> dict[int, Node | None]:
        """For every node, the earliest explainer that explains it (None: nothing does). When two explain
        each other (a CUDA error and an NCCL error on one rank), the one that came first is the cause."""
        out: dict[int, Node | None] = {}
        for node in nodes:
            best: Node | None = None
            for cause in explainers:
                if not self.explains(cause, node):
                    continue
                if self.explains(node, cause) and node.key() <= cause.key():
                    continue
                if best is None or cause.key() < best.key():
                    best = cause
            out[id(node)] = best
        return out

    def after_the_cascade(self, candidate: Node, nodes: list[Node]) -> bool:
        """A candidate that comes after consequences it does not explain did not start them: a hardware
        error an hour after the job died, an exception raised while the job was already tearing down."""
        if candidate.t is None or not has_own_time(candidate.signal):
            return False  # an untimed line only has its file's time: too coarse to put it after anything
        for node in nodes:
            if node is candidate or node.t is None or self.role(node) != "collateral" or not has_own_time(node.signal):
                continue
            if node.attempt == candidate.attempt and node.t + self.tolerance_s < candidate.t \
                    and not self.explains(candidate, node):
                return True
        return False
