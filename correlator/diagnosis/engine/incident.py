"""An incident from a window's choice: initiator, confidence with its reason, collateral, evidence, a stable id."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from correlator.diagnosis.engine.causality import Causality, Node
from correlator.diagnosis.engine.keys import time_of
from correlator.diagnosis.engine.progress import Suspect
from correlator.diagnosis.engine.state import JobState
from correlator.diagnosis.engine.timeline import Timeline, iso
from correlator.diagnosis.models import CollateralEntry, Evidence, Incident, Initiator, Signal
from correlator.diagnosis.rules import RuleSet

MAX_EVIDENCE = 12


@dataclass
class Choice:
    """What the engine decided for one window."""

    primary: Node
    signal: Signal  # the primary's signal with who-fields filled from corroborating lines or reports
    victims_only: bool = False
    suspect: Suspect | None = None
    identity_note: str = ""
    recovered: str = ""  # why the job went on after it ('' when it did not)


class IncidentBuilder:
    def __init__(self, ruleset: RuleSet) -> None:
        self.ruleset = ruleset
        self.rules = ruleset.by_id()

    def build(
        self,
        state: JobState,
        attempt: int,
        nodes: list[Node],
        explained: dict[int, Node | None],
        causality: Causality,
        choice: Choice,
        timeline: Timeline,
    ) -> Incident:
        primary, signal = choice.primary, choice.signal
        rule = self.rules.get(signal.rule_id)
        cls = primary.cls or "unknown"
        t0 = primary.t
        confidence = causality.confidence(primary)
        suspect = choice.suspect
        if choice.recovered:
            initiator = _initiator(signal, t0)
            reason = f"{_who(signal)} raised {cls} ({signal.rule_id}), and {choice.recovered}: a recovered warning"
            confidence = min(confidence, 0.5)
        elif choice.victims_only:
            if suspect is not None and suspect.mismatch:
                cls = "collective_mismatch"
            elif suspect is not None and suspect.strong and cls in ("nccl_timeout", "nccl_error"):
                cls = "straggler_hang"
            if suspect is not None:
                initiator = Initiator(rank=suspect.rank, ts=iso(t0), rule=signal.rule_id, line=signal.line)
                confidence = min(confidence, 0.75 if suspect.mismatch else 0.6 if suspect.strong else 0.45)
                reason = f"no failure line names a cause; {suspect.reason}"
            else:
                initiator = _initiator(signal, t0) if choice.identity_note else Initiator(
                    ts=iso(t0), rule=signal.rule_id, line=signal.line)
                confidence = min(confidence, 0.35)
                reason = (
                    f"only consequences were logged ({cls} reported by {_who(primary.signal)}); the process that "
                    "failed first is not in these logs or left no error line"
                )
        else:
            initiator = _initiator(signal, t0)
            consequences = [n for n in nodes if n is not primary and explained.get(id(n)) is not None]
            if consequences:
                confidence = min(1.0, confidence + 0.05)
                ranks = set().union(*(n.ranks() for n in consequences)) - {initiator.rank}
                classes = sorted({n.cls for n in consequences})
                reason = (
                    f"{_who(signal)} raised {cls} ({signal.rule_id}) first; it explains {', '.join(classes)} seen on "
                    f"{len(ranks) or len(consequences)} other {'rank(s)' if ranks else 'line(s)'}"
                )
            else:
                reason = f"{_who(signal)} raised {cls} ({signal.rule_id}); nothing else in the window explains it"
            rivals = sorted({
                n.cls for n in nodes
                if n is not primary and n.aggregate is None and explained.get(id(n)) is None and n.cls != cls
                and causality.role(n) in ("cause", "either") and n.signal.severity not in ("info", "low")
            })
            if rivals:
                confidence *= 0.85
                reason += f"; other unexplained failures: {', '.join(rivals)}"
        if choice.identity_note:
            reason += f"; {choice.identity_note}"
        if state.dropped:
            reason += f"; {sum(state.dropped.values())} signal(s) beyond the job's state bound were not kept"
        severity = rule.severity if rule is not None else signal.severity
        if cls in ("straggler_hang", "collective_mismatch") and choice.victims_only:
            severity = "high"
        if choice.recovered:
            severity = "low"
        title = self._title(cls, signal, initiator)
        times = [t for n in nodes for t in (n.t, n.t_last) if t is not None]
        return Incident(
            incident_id=incident_id(state.job_id, attempt, cls, initiator),
            job_id=state.job_id,
            class_=cls,
            title=title,
            severity=severity,
            confidence=round(max(0.0, min(1.0, confidence)), 3),
            confidence_reason=reason,
            initiator=initiator,
            collateral=self._collateral(state, nodes, primary),
            evidence=self._evidence(nodes, primary, signal),
            fix=list(rule.fix) if rule else [],
            verify=list(rule.verify) if rule else [],
            references=list(rule.references) if rule else [],
            window_start=iso(min(times)) if times else None,
            window_end=iso(max(times)) if times else None,
            rule_set_version=self.ruleset.version,
            rule_versions={n.signal.rule_id: n.signal.rule_version for n in nodes},
            world_size=state.world_size,
            labels=dict(state.labels),
            attempt=attempt,
            recovered=bool(choice.recovered),
            clock=timeline.clock.method,
            dropped=dict(state.dropped),
        )

    def _title(self, cls: str, signal: Signal, initiator: Initiator) -> str:
        """What failed, where: the rule's own title names the failure ("GPU has fallen off the bus"), the
        class title when the initiator was inferred."""
        failure_class = self.ruleset.classes.get(cls)
        rule = self.rules.get(signal.rule_id)
        name = rule.title if rule is not None and rule.class_ == cls else (failure_class.title if failure_class else cls)
        if initiator.rank is not None:
            name += f" on rank {initiator.rank}"
        if initiator.host:
            name += f" ({initiator.host})"
        return name

    @staticmethod
    def _collateral(state: JobState, nodes: list[Node], primary: Node) -> list[CollateralEntry]:
        groups: dict[str, tuple[set[int], set[str], int]] = {}
        for n in nodes:
            if n is primary:
                continue
            ranks, hosts, count = groups.get(n.cls, (set(), set(), 0))
            ranks |= n.ranks()
            hosts |= n.hosts()
            count += n.aggregate.count if n.aggregate is not None else state.count(n.signal)
            groups[n.cls] = (ranks, hosts, count)
        entries = [
            CollateralEntry(class_=cls, ranks=sorted(r), hosts=sorted(h), count=c)
            for cls, (r, h, c) in groups.items()
        ]
        entries.sort(key=lambda e: (-len(e.ranks), -e.count, e.class_))
        return entries

    @staticmethod
    def _evidence(nodes: list[Node], primary: Node, signal: Signal) -> list[Evidence]:
        chosen: list[tuple[Signal, float | None]] = [(signal, primary.t)]
        seen = {(primary.cls, signal.rank, signal.host)}
        for n in sorted(nodes, key=Node.key):
            samples = n.aggregate.samples if n.aggregate is not None else [n.signal]
            for s in samples:
                key = (n.cls, s.rank, s.host)
                if n is primary or key in seen:
                    continue
                seen.add(key)
                chosen.append((s, n.t if s is n.signal else None))
                break
            if len(chosen) >= MAX_EVIDENCE:
                break
        return [Evidence(rank=s.rank, host=s.host, ts=iso(t if t is not None else time_of(s)), rule=s.rule_id,
                         line=s.line) for s, t in chosen]


def _initiator(signal: Signal, t: float | None) -> Initiator:
    return Initiator(
        rank=signal.rank, local_rank=signal.local_rank, host=signal.host, pid=signal.pid, gpu=signal.gpu,
        ts=iso(t), rule=signal.rule_id, line=signal.line,
    )


def _who(s: Signal) -> str:
    parts = []
    if s.rank is not None:
        parts.append(f"rank {s.rank}")
    elif s.local_rank is not None:
        parts.append(f"local rank {s.local_rank}")
    if s.host:
        parts.append(f"on {s.host}")
    if s.gpu is not None and s.rank is None:
        parts.append(f"GPU {s.gpu}")
    if s.pid is not None and s.rank is None:
        parts.append(f"pid {s.pid}")
    return " ".join(parts) or "a process"


def incident_id(job_id: str, attempt: int, cls: str, initiator: Initiator, repeat: int = 0) -> str:
    """From the job, the attempt and the initiating failure (class and who), not from a window's position or a
    time (the same line can carry its own time offline and only a forwarder's receive time when streamed):
    a replay, a restart or `diagnose` give the same id, and a late line revises the incident it belongs to
    instead of renumbering the others. `repeat` counts earlier incidents of the same attempt, class and who
    (the same failure again, hours later)."""
    who = (
        f"r{initiator.rank}" if initiator.rank is not None
        else f"{initiator.host or ''}|{initiator.pid if initiator.pid is not None else ''}|{initiator.local_rank or ''}"
    )
    return hashlib.sha256(f"rootrank|{job_id}|{attempt}|{cls}|{who}|{repeat}".encode()).hexdigest()[:20]
