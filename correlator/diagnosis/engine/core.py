"""The correlation engine: signals in, incidents out. Pure: no I/O, the clock is passed in.

How the initiator is found (DESIGN.md, "Culprit logic"):
1. Order by event time corrected for per-host clock skew. Skew is estimated from shared anchors
   (NCCL watchdog timeouts of one collective fire at nearly the same true time on every rank) and,
   when the forwarder stamped them, from received times.
2. A signal whose class is explained by another class present in the window is collateral.
   The initiator is the earliest unexplained cause (or either-role) signal of the most confident tier.
3. With no cause at all (only timeouts), collective progress picks the suspect: the rank whose
   last completed collective lags, or the one rank missing from the timeout reports.
4. Sequence, absence and metric rules are resolved here, because they depend on other signals.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime

from correlator.diagnosis.engine.state import JobState
from correlator.diagnosis.engine.timeline import _iso, _Timeline, _timeline
from correlator.diagnosis.models import CollateralEntry, Evidence, Incident, Initiator, Signal
from correlator.diagnosis.rules import Rule, RuleSet

MAX_EVIDENCE = 12
_SEVERITY_RANK = {"info": 0, "low": 1, "medium": 2, "high": 3, "critical": 4}


def _same_process(a: Signal, b: Signal) -> bool:
    for field in ("rank", "pid", "local_rank"):
        va, vb = getattr(a, field), getattr(b, field)
        if va is not None and vb is not None:
            return bool(va == vb) and (a.host is None or b.host is None or a.host == b.host)
    return a.host is None or b.host is None or a.host == b.host


class Engine:
    # window_gap_s: a quiet gap this long starts a new incident window. It must exceed the longest
    # collective timeout (NCCL's default is 10 min, many jobs raise it to 30-60 min), or the timeouts a
    # failure causes would land in a window of their own, without their cause.
    def __init__(
        self,
        ruleset: RuleSet,
        *,
        quiet_window_s: float = 20.0,
        window_gap_s: float = 7200.0,
    ) -> None:
        self.ruleset = ruleset
        self.rules: dict[str, Rule] = ruleset.by_id()
        self.explains = ruleset.explains_by_class()
        self.quiet_window_s = quiet_window_s
        self.window_gap_s = window_gap_s

    # --- public -------------------------------------------------------------------------

    def diagnose(self, state: JobState, now: datetime | float | None = None) -> list[Incident]:
        """The job's incidents, primary first. `now` resolves absence rules (default: the latest event)."""
        now_t = now.timestamp() if isinstance(now, datetime) else now
        signals = list(state.signals)
        if not signals:
            return []
        identity = self._identity_map(signals)
        signals = [self._fill_identity(s, identity) for s in signals]
        timeline = _timeline(signals)
        world_size = self._world_size(signals)
        incidents: list[Incident] = []
        for index, window in enumerate(self._windows(signals, timeline)):
            incident = self._window_incident(state, window, index, timeline, world_size, now_t)
            if incident is not None:
                incidents.append(incident)
        incidents.sort(key=lambda i: (-_SEVERITY_RANK[i.severity], -i.confidence))
        return incidents

    def correlate(self, job_id: str, signals: Iterable[Signal], now: datetime | float | None = None) -> list[Incident]:
        state = JobState(job_id=job_id)
        state.add_all(signals)
        return self.diagnose(state, now)

    # --- identity and facts -------------------------------------------------------------

    @staticmethod
    def _identity_map(signals: Sequence[Signal]) -> dict[tuple[str, str, int], int]:
        """(host, "pid"|"local", n) -> rank: from NCCL init lines ("rank 5 nranks 8") written by a
        process, and from any line that names rank, host and local rank together."""
        mapping: dict[tuple[str, str, int], int] = {}
        for s in signals:
            if not s.host:
                continue
            if s.kind == "fact" and "comm_rank" in s.fields and s.pid is not None:
                mapping.setdefault((s.host, "pid", s.pid), int(s.fields["comm_rank"]))
            elif s.rank is not None and s.local_rank is not None:
                mapping.setdefault((s.host, "local", s.local_rank), s.rank)
        return mapping

    @staticmethod
    def _fill_identity(s: Signal, mapping: dict[tuple[str, str, int], int]) -> Signal:
        if s.rank is not None or not s.host:
            return s
        if s.pid is not None and (s.host, "pid", s.pid) in mapping:
            return s.model_copy(update={"rank": mapping[(s.host, "pid", s.pid)]})
        if s.local_rank is not None and (s.host, "local", s.local_rank) in mapping:
            return s.model_copy(update={"rank": mapping[(s.host, "local", s.local_rank)]})
        return s

    @staticmethod
    def _world_size(signals: Sequence[Signal]) -> int | None:
        sizes: list[int] = []
        for s in signals:
            f = s.fields
            if "world_size" in f:
                sizes.append(int(f["world_size"]))
            elif "nnodes" in f and "nproc_per_node" in f:
                sizes.append(int(f["nnodes"]) * int(f["nproc_per_node"]))
        return max(sizes) if sizes else None

    # --- windows --------------------------------------------------------------------------

    def _windows(self, signals: Sequence[Signal], timeline: _Timeline) -> list[list[Signal]]:
        ordered = sorted(signals, key=timeline.key)
        windows: list[list[Signal]] = [[]]
        last_t: float | None = None
        for s in ordered:
            t = timeline.t(s)
            if t is not None and last_t is not None and t - last_t > self.window_gap_s and s.kind == "match":
                windows.append([])
            windows[-1].append(s)
            if t is not None and s.kind == "match":
                last_t = t
        return [w for w in windows if w]

    # --- rule kinds that depend on other signals -----------------------------------------

    def _resolve_special(
        self, window: Sequence[Signal], timeline: _Timeline, now_t: float | None
    ) -> list[Signal]:
        matches: list[Signal] = []
        markers: dict[tuple[str, str], list[Signal]] = defaultdict(list)
        metric_obs: dict[str, list[Signal]] = defaultdict(list)
        for s in window:
            if s.kind == "fact":
                marker = s.fields.get("marker")
                if isinstance(marker, str):
                    markers[(s.rule_id, marker)].append(s)
                continue
            rule = self.rules.get(s.rule_id)
            if rule is not None and rule.metric is not None:
                metric_obs[s.rule_id].append(s)
                continue
            matches.append(s)
        latest = max((t for t in (timeline.t(s) for s in window) if t is not None), default=None)
        clock = now_t if now_t is not None else latest
        kept: list[Signal] = []
        for s in matches:
            rule = self.rules.get(s.rule_id)
            if rule is None:
                kept.append(s)
                continue
            t = timeline.t(s)
            if rule.sequence is not None:
                seq = rule.sequence
                ok = False
                for m in markers.get((rule.id, "after"), []):
                    tm = timeline.t(m)
                    if seq.same_process and not _same_process(m, s):
                        continue
                    if t is not None and tm is not None:
                        ok = ok or (0 <= t - tm <= seq.within_s)
                    else:
                        ok = ok or m.order < s.order
                if not ok:
                    continue
            if rule.absence is not None:
                ended = any(
                    (rule.absence.progress or _same_process(m, s)) and timeline.key(m) > timeline.key(s)
                    for m in markers.get((rule.id, "end"), [])
                )
                if ended or t is None or clock is None or clock - t < rule.absence.deadline_s:
                    continue
            kept.append(s)
        for rule_id, observations in metric_obs.items():
            kept.extend(self._metric_outliers(self.rules[rule_id], observations))
        # A sequence whose precondition held is the more specific reading of its line: SIGBUS right
        # after a checkpoint load says more than SIGBUS alone.
        by_sequence = {
            (s.file, s.order) for s in kept if (r := self.rules.get(s.rule_id)) is not None and r.sequence is not None
        }
        if by_sequence:
            kept = [
                s for s in kept
                if (s.file, s.order) not in by_sequence
                or ((r := self.rules.get(s.rule_id)) is not None and r.sequence is not None)
            ]
        return kept

    @staticmethod
    def _metric_outliers(rule: Rule, observations: Sequence[Signal]) -> list[Signal]:
        assert rule.metric is not None
        field = rule.metric.field
        per_rank: dict[object, list[tuple[float, Signal]]] = defaultdict(list)
        for s in observations:
            value = s.fields.get(field)
            if isinstance(value, (int, float)):
                per_rank[s.rank if s.rank is not None else s.host].append((float(value), s))
            elif isinstance(value, str) and value.lower() in ("nan", "inf", "-inf"):
                return [s]  # a non-finite value is abnormal by itself
        if len(per_rank) >= 2:
            peaks = {k: max(v, key=lambda p: p[0]) for k, v in per_rank.items()}
            for key, (value, s) in peaks.items():
                others = [p[0] for k, p in peaks.items() if k != key]
                base = statistics.median(others)
                if base > 0 and value > rule.metric.spike_ratio * base:
                    return [s]
            return []
        values = [p for v in per_rank.values() for p in v]
        if len(values) >= rule.metric.min_points:
            ordered = sorted(values, key=lambda p: p[1].order)
            base = statistics.median(v for v, _ in ordered[: max(1, len(ordered) // 2)])
            for value, s in ordered:
                if base > 0 and value > rule.metric.spike_ratio * base:
                    return [s]
        return []

    # --- the culprit ---------------------------------------------------------------------

    def _role(self, s: Signal) -> str:
        rule = self.rules.get(s.rule_id)
        return self.ruleset.role_of(rule) if rule is not None else s.role

    def _confidence(self, s: Signal) -> float:
        rule = self.rules.get(s.rule_id)
        return rule.confidence if rule is not None else 0.5

    def _explained(self, s: Signal, first_time: dict[str, tuple[float, int]], present: set[str]) -> str | None:
        """The class that explains `s` in this window, if any."""
        cls = s.class_ or ""
        for other in present:
            if other == cls or cls not in self.explains.get(other, set()):
                continue
            # Mutual explanation: the class seen first is the cause.
            if other in self.explains.get(cls, set()) and first_time[cls] <= first_time[other]:
                continue
            return other
        return None

    @staticmethod
    def _tier(confidence: float) -> int:
        return 2 if confidence >= 0.7 else 1 if confidence >= 0.45 else 0

    @staticmethod
    def _with_corroborated_identity(primary: Signal, matches: Sequence[Signal]) -> Signal:
        """Fill who-fields the initiating line lacks from the next line of the same class that has them.

        "Unexpected bus error encountered in worker" names nobody; the "DataLoader worker (pid 325) is
        killed by signal: Bus error" line right after it names the process.
        """
        fields = ("rank", "local_rank", "host", "pid", "gpu")
        if all(getattr(primary, f) is not None for f in fields):
            return primary
        for s in matches:
            if s is primary or s.class_ != primary.class_ or s.order < primary.order and s.file == primary.file:
                continue
            if any(getattr(primary, f) is not None and getattr(s, f) is not None and getattr(primary, f) != getattr(s, f)
                   for f in fields):
                continue  # a different process: not the same failure told twice
            update = {f: getattr(s, f) for f in fields if getattr(primary, f) is None and getattr(s, f) is not None}
            if update:
                return primary.model_copy(update=update)
        return primary

    def _progress_suspect(self, matches: Sequence[Signal], world_size: int | None) -> tuple[int | None, str, bool]:
        """(rank, reason, strong) of the rank whose collective progress lags, from watchdog facts."""
        completed: dict[int, int] = {}
        explicit = False
        seqs: dict[int, set[int]] = defaultdict(set)
        reporting: set[int] = set()
        for s in matches:
            if s.rank is None:
                continue
            f = s.fields
            if "completed" in f and isinstance(f["completed"], int):
                completed[s.rank] = min(completed.get(s.rank, f["completed"]), f["completed"])
                explicit = True
            elif "seq" in f and isinstance(f["seq"], int) and s.class_ == "nccl_timeout":
                seqs[s.rank].add(f["seq"])
            if s.class_ in ("nccl_timeout", "nccl_error"):
                reporting.add(s.rank)
        if not explicit and seqs and all(len(v) == 1 for v in seqs.values()):
            # Timeout sequence numbers alone are comparable only within one process group: trust a
            # lag of a few collectives, not a gap of thousands (different groups count separately).
            values_seen = [min(v) for v in seqs.values()]
            if max(values_seen) - min(values_seen) <= 8:
                completed = {r: min(v) - 1 for r, v in seqs.items()}
        if len(completed) >= 2:
            values = sorted(set(completed.values()))
            if len(values) >= 2:
                low = values[0]
                laggards = sorted(r for r, c in completed.items() if c == low)
                if len(laggards) == 1 or len(laggards) * 4 <= len(completed):
                    lead = max(completed.values())
                    return (
                        laggards[0],
                        f"rank {laggards[0]} last completed collective {low} while others reached {lead}",
                        True,
                    )
        all_ranks = {s.rank for s in matches if s.rank is not None}
        if reporting and len(reporting) >= 2:
            world = world_size or (max(all_ranks) + 1 if all_ranks else None)
            if world is not None:
                missing = sorted(set(range(world)) - reporting)
                if len(missing) == 1:
                    how = "world size from launch lines" if world_size else "world size inferred from the highest rank"
                    return (
                        missing[0],
                        f"rank {missing[0]} is the only rank of {world} missing from the timeout reports ({how})",
                        world_size is not None,
                    )
        return None, "", False

    def _window_incident(
        self,
        state: JobState,
        window: Sequence[Signal],
        index: int,
        timeline: _Timeline,
        world_size: int | None,
        now_t: float | None,
    ) -> Incident | None:
        matches = [s for s in self._resolve_special(window, timeline, now_t) if s.class_]
        if not matches or max(_SEVERITY_RANK[s.severity] for s in matches) == 0:
            return None
        matches.sort(key=timeline.key)
        first_time: dict[str, tuple[float, int]] = {}
        for s in matches:
            first_time.setdefault(s.class_ or "", timeline.key(s))
        present = set(first_time)
        explained_by = {id(s): self._explained(s, first_time, present) for s in matches}
        candidates = [
            s
            for s in matches
            if explained_by[id(s)] is None and self._role(s) in ("cause", "either") and s.severity != "info"
        ]
        suspect, suspect_reason, strong = self._progress_suspect(matches, world_size)
        victim_report = False
        if candidates:
            top = max(self._tier(self._confidence(s)) for s in candidates)
            primary = min((s for s in candidates if self._tier(self._confidence(s)) == top), key=timeline.key)
        else:
            # Only consequences were logged: name the class they show (the one nothing else present
            # explains, e.g. an NCCL remote error rather than the timeouts it caused), and the progress
            # suspect if any.
            victim_report = True
            pool = [s for s in matches if explained_by[id(s)] is None] or list(matches)
            top = max(self._tier(self._confidence(s)) for s in pool)
            primary = min((s for s in pool if self._tier(self._confidence(s)) == top), key=timeline.key)
        primary = self._with_corroborated_identity(primary, matches)
        return self._build(
            state, window, matches, primary, index, timeline, world_size, explained_by,
            victim_report, suspect, suspect_reason, strong,
        )

    def _build(
        self,
        state: JobState,
        window: Sequence[Signal],
        matches: Sequence[Signal],
        primary: Signal,
        index: int,
        timeline: _Timeline,
        world_size: int | None,
        explained_by: dict[int, str | None],
        victim_report: bool,
        suspect: int | None,
        suspect_reason: str,
        strong_suspect: bool,
    ) -> Incident:
        rule = self.rules.get(primary.rule_id)
        cls = primary.class_ or "unknown"
        t0 = timeline.t(primary)
        confidence = self._confidence(primary)
        if victim_report:
            if suspect is not None and strong_suspect and cls == "nccl_timeout":
                cls = "straggler_hang"
            if suspect is not None:
                initiator = Initiator(rank=suspect, ts=_iso(t0), rule=primary.rule_id, line=primary.line)
                confidence = min(confidence, 0.6 if strong_suspect else 0.45)
                reason = f"no failure line names a cause; {suspect_reason}"
            else:
                initiator = Initiator(ts=_iso(t0), rule=primary.rule_id, line=primary.line)
                confidence = min(confidence, 0.35)
                who = f"rank {primary.rank}" if primary.rank is not None else (primary.host or "a process")
                reason = (
                    f"only consequences were logged ({cls} reported by {who}); the process that failed first "
                    "is not in these logs or left no error line"
                )
        else:
            initiator = Initiator(
                rank=primary.rank,
                local_rank=primary.local_rank,
                host=primary.host,
                pid=primary.pid,
                gpu=primary.gpu,
                ts=_iso(t0),
                rule=primary.rule_id,
                line=primary.line,
            )
            others = [s for s in matches if s is not primary and explained_by[id(s)] is not None]
            if others:
                confidence = min(1.0, confidence + 0.05)
                n_ranks = len({s.rank for s in others if s.rank is not None})
                classes = sorted({s.class_ or "" for s in others})
                reason = (
                    f"{self._who(primary)} raised {cls} ({primary.rule_id}) first; it explains "
                    f"{', '.join(classes)} seen on {n_ranks or len(others)} other "
                    f"{'ranks' if n_ranks else 'lines'}"
                )
            else:
                reason = f"{self._who(primary)} raised {cls} ({primary.rule_id}); nothing else in the window explains it"
            unexplained_rivals = {
                s.class_ for s in matches
                if s is not primary and explained_by[id(s)] is None and s.class_ != cls
                and self._role(s) in ("cause", "either")
            }
            if unexplained_rivals:
                confidence *= 0.85
                reason += f"; other unexplained failures: {', '.join(sorted(c for c in unexplained_rivals if c))}"
        collateral = self._collateral(state, matches, primary)
        evidence = self._evidence(matches, primary, timeline)
        times = [t for t in (timeline.t(s) for s in window) if t is not None]
        title_cls = self.ruleset.classes.get(cls)
        title = f"{title_cls.title if title_cls else cls}"
        if initiator.rank is not None:
            title += f" on rank {initiator.rank}"
        if initiator.host:
            title += f" ({initiator.host})"
        severity = rule.severity if rule is not None else primary.severity
        if cls == "straggler_hang":
            severity = "high"
        return Incident(
            incident_id=incident_id(state.job_id, index),
            job_id=state.job_id,
            class_=cls,
            title=title,
            severity=severity,
            confidence=round(max(0.0, min(1.0, confidence)), 3),
            confidence_reason=reason,
            initiator=initiator,
            collateral=collateral,
            evidence=evidence,
            fix=list(rule.fix) if rule else [],
            verify=list(rule.verify) if rule else [],
            references=list(rule.references) if rule else [],
            window_start=_iso(min(times)) if times else None,
            window_end=_iso(max(times)) if times else None,
            rule_set_version=self.ruleset.version,
            rule_versions={s.rule_id: s.rule_version for s in matches},
            world_size=world_size,
            labels=dict(state.labels),
        )

    @staticmethod
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

    @staticmethod
    def _collateral(state: JobState, matches: Sequence[Signal], primary: Signal) -> list[CollateralEntry]:
        groups: dict[str, tuple[set[int], set[str], int]] = {}
        for s in matches:
            if s is primary:
                continue
            ranks, hosts, count = groups.get(s.class_ or "", (set(), set(), 0))
            if s.rank is not None:
                ranks.add(s.rank)
            if s.host:
                hosts.add(s.host)
            groups[s.class_ or ""] = (ranks, hosts, count + state.count(s))
        entries = [
            CollateralEntry(class_=cls, ranks=sorted(r), hosts=sorted(h), count=c)
            for cls, (r, h, c) in groups.items()
        ]
        entries.sort(key=lambda e: (-len(e.ranks), -e.count, e.class_))
        return entries

    @staticmethod
    def _evidence(matches: Sequence[Signal], primary: Signal, timeline: _Timeline) -> list[Evidence]:
        chosen: list[Signal] = [primary]
        seen = {(primary.class_, primary.rank, primary.host)}
        for s in matches:
            key = (s.class_, s.rank, s.host)
            if s is primary or key in seen:
                continue
            seen.add(key)
            chosen.append(s)
            if len(chosen) >= MAX_EVIDENCE:
                break
        return [
            Evidence(rank=s.rank, host=s.host, ts=_iso(timeline.t(s)), rule=s.rule_id, line=s.line) for s in chosen
        ]


def incident_id(job_id: str, window_index: int) -> str:
    """Deterministic: the same job and window give the same id on replay, restart or offline."""
    return hashlib.sha256(f"rootrank|{job_id}|{window_index}".encode()).hexdigest()[:20]
