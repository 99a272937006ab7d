"""Turn events into signals: one hyperscan scan per batch, extraction only on the lines that hit."""

from __future__ import annotations

import math
import operator
import re
from bisect import bisect_left
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from itertools import accumulate, combinations, compress, pairwise, repeat
from operator import sub

from correlator.diagnosis.matcher import FREQUENT_CAP, ExprRole, Hit, Matcher, trailing_numbers
from correlator.diagnosis.models import MAX_EVIDENCE_LINE, Signal
from correlator.diagnosis.routine_fold import Peak, fold_peaks
from correlator.diagnosis.rules import GENERIC_CLASSES, HINT_TAG, Rule, RuleSet
from ingest.event import LogEvent

# Fields a rule may extract that describe *who* failed; they override the identity of the line's writer
# (a launcher line "local_rank: 5 (pid: 2630) failed" is written by the agent, about local rank 5).
IDENTITY_FIELDS = ("rank", "local_rank", "pid", "gpu", "host")
TIME_BORROWED = "time_borrowed"  # field of a signal whose line had no time: `ts` is an earlier line's (a lower bound)
DEFAULT_GROUPS = (0, "0", "default_pg")
REPORT_TAG = "failure-report"  # a rule whose lines are a launcher's summary of failed processes, not a failure
REPORT = "report"  # field of a signal of such a rule


def _coerce(value: str) -> str | int | float:
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


def best_hits_per_line(hits: Sequence[tuple[int, Hit]], rules: Sequence[Rule]) -> list[tuple[int, Hit]]:
    """Keep, per line, every fact/marker hit but only the most specific signature hit: a specific class over a
    generic one, then the most confident.

    One line is one failure: "watchdog thread terminated with exception: CUDA error: an illegal memory
    access" is an illegal memory access, not also an NCCL timeout.
    """
    best: dict[int, tuple[int, Hit]] = {}
    out: list[tuple[int, Hit]] = []
    for index, hit in hits:
        rule = rules[hit.rule_index]
        # A sequence/absence hit only counts if the engine later finds its precondition; if it
        # competed here it could evict the plain signature of the same line and then be dropped,
        # leaving the line with no signal at all. So it rides along instead of competing.
        if hit.role != "main" or rule.kind != "signature" or rule.sequence is not None or rule.absence is not None:
            out.append((index, hit))
            continue
        current = best.get(index)
        if current is None or _rank(rule) > _rank(rules[current[1].rule_index]):
            best[index] = (index, hit)
    out.extend(best.values())
    out.sort(key=lambda pair: (pair[0], pair[1].rule_index))
    return out


def _rank(rule: Rule) -> tuple[bool, float]:
    return (rule.class_ not in GENERIC_CLASSES, rule.confidence)


# A run of fewer lines gains nothing from a tail scan over its own per-line matches.
MIN_RUN_LINES = 16


def _encode_lines(texts: Sequence[str], runs: Sequence[tuple[int, int]],
                  known: Mapping[tuple[int, int], str] | None = None) -> tuple[bytes, list[tuple[int, int]]] | None:
    """The texts joined with newlines as UTF-8, and each run's byte range in it ([start of its first line,
    start of the line after it)); None if a text holds a newline or cannot be encoded. `known`: line
    ranges whose joined text the caller has already (a shipped batch arrives joined)."""
    if not texts:
        return None
    cuts = sorted({0, len(texts), *(edge for run in runs for edge in run)})
    parts: list[bytes] = []
    at: dict[int, int] = {0: 0}
    offset = 0
    try:
        for lo, hi in pairwise(cuts):
            joined = known.get((lo, hi)) if known else None
            if joined is None:
                joined = "\n".join(texts[lo:hi])
                if joined.count("\n") != hi - lo - 1:
                    return None
            part = joined.encode("utf-8")
            parts.append(part)
            offset += len(part) + 1
            at[hi] = offset
    except UnicodeEncodeError:  # lone surrogates
        return None
    buf = parts[0] if len(parts) == 1 else b"\n".join(parts)
    return buf, [(at[lo], min(at[hi], len(buf))) for lo, hi in runs]


def _line_numbers(buf: bytes, newlines: list[int]) -> list[int]:
    """The line number of each line given by the offset of the newline before it (-1 for the first line;
    ascending), with the newlines counted once over the buffer."""
    cuts = list(map(operator.add, newlines, repeat(1)))
    return list(accumulate(map(buf.count, repeat(b"\n"), [0, *cuts[:-1]], cuts)))


class SignalExtractor:
    def __init__(self, ruleset: RuleSet, matcher: Matcher | None = None) -> None:
        self.ruleset = ruleset
        self.matcher = matcher or Matcher(ruleset)
        self.rules = self.matcher.rules
        self._roles = [ruleset.role_of(rule) for rule in self.rules]
        self._plans: dict[tuple[int, ...], tuple[list[Hit], list[Hit]]] = {}
        self._value_regexes: dict[int, list[tuple[re.Pattern[str], str]]] = {}

    def signal_for(self, event: LogEvent, hit: Hit, order: int, *, raw: str | None = None,
                   time_borrowed: bool = False) -> Signal:
        """`raw` is the line as it was scanned (prefixes included), used for extraction when given.
        `time_borrowed`: the line has no time of its own; its `ts` is an earlier line's, a lower bound."""
        rule = self.rules[hit.rule_index]
        text = event.line
        identity: dict[str, object] = {
            "host": event.host,
            "rank": event.rank,
            "local_rank": event.local_rank,
            "pid": event.pid,
            "gpu": event.gpu,
        }
        fields: dict[str, str | int | float] = {}
        if hit.role == "main":
            extracted = self.matcher.extract(hit.rule_index, raw if raw is not None else text)
            if "blame_rank" in extracted:
                # The line reports another rank as the one that diverged ("but Rank 7 is running ...").
                fields["reporter_rank"] = _coerce(extracted.pop("rank", "")) if "rank" in extracted else ""
                if event.rank is not None and not fields["reporter_rank"]:
                    fields["reporter_rank"] = event.rank
                extracted["rank"] = extracted.pop("blame_rank")
                identity.update({"local_rank": None, "pid": None, "gpu": None})
            self_rank = extracted.pop("self_rank", None)
            named = _coerce(extracted["rank"]) if "rank" in extracted else None
            if named is not None and named != event.rank:
                # The line names another process than its writer (a launcher's report, a peer's hint): the
                # writer's own local rank, pid and GPU are not that process's; a hint's writer is not even on
                # the named rank's host.
                identity.update({f: None for f in ("local_rank", "pid", "gpu") if f not in extracted})
                if HINT_TAG in rule.tags and "host" not in extracted:
                    identity["host"] = None
            for name, value in extracted.items():
                if name in IDENTITY_FIELDS:
                    identity[name] = value if name in ("gpu", "host") else _coerce(value)
                else:
                    fields[name] = _coerce(value)
            if self_rank is not None:
                self._place_self_rank(_coerce(self_rank), identity, fields)
            if identity["rank"] is None and fields.get("pg") in DEFAULT_GROUPS and isinstance(fields.get("pg_rank"), int):
                # A rank within the default process group is the global rank.
                identity["rank"] = fields["pg_rank"]
            if rule.metric is not None and rule.metric.field in fields:
                fields["metric"] = rule.metric.field
        else:
            fields["marker"] = hit.role
            if hit.role == "end" and rule.absence is not None and rule.absence.progress:
                fields["progress"] = 1
        if rule.kind == "fact" and rule.fact is not None:
            fields["fact"] = rule.fact
        if REPORT_TAG in rule.tags:
            fields[REPORT] = 1
        if time_borrowed:
            fields[TIME_BORROWED] = 1
        if event.truncated or len(text) > MAX_EVIDENCE_LINE:
            # The line was cut (by the forwarder, the decoder, or to the evidence cap just below).
            fields["truncated"] = 1
        is_fact = rule.kind == "fact" or hit.role != "main"
        # Who-fields a rule extracted are text or numbers as the line wrote them: validated into the
        # signal's types here (a rank "3" becomes 3), as every field is.
        return Signal.model_validate({
            "job_id": event.job_id,
            "rule_id": rule.id,
            "rule_version": rule.version,
            "kind": "fact" if is_fact else "match",
            "class_": rule.class_,
            "role": self._roles[hit.rule_index],
            "severity": rule.severity,
            "ts": event.ts,
            "received_ts": event.received_ts,
            "source": event.source,
            "file": event.file,
            "order": order,
            "attempt": event.attempt,
            "line": text[:MAX_EVIDENCE_LINE],
            "fields": fields,
            **identity,
        })

    @staticmethod
    def _place_self_rank(self_rank: object, identity: dict[str, object], fields: dict[str, str | int | float]) -> None:
        """The `[Rank N]` a process writes of itself (c10d's log prefix) is its rank *in the process group*
        of the line: the global rank only in the default group. The launcher's `[rankN]:` prefix is the
        global rank and wins; without one, N is the global rank unless the line names another group."""
        if not isinstance(self_rank, int):
            return
        pg = fields.get("pg")
        if "pg_rank" not in fields and (identity["rank"] is not None or (pg is not None and pg not in DEFAULT_GROUPS)):
            fields["pg_rank"] = self_rank
        if identity["rank"] is None and (pg is None or pg in DEFAULT_GROUPS):
            identity["rank"] = self_rank

    def is_routine(self, hit: Hit) -> bool:
        """Progress markers and metric values: lines a healthy job prints every step."""
        rule = self.rules[hit.rule_index]
        if hit.role == "end":
            return rule.absence is not None and rule.absence.progress
        return hit.role == "main" and rule.metric is not None

    def metric_value(self, hit: Hit, text: str) -> float:
        """The metric's value on a line the rule hit; nan, inf or none at all is inf (abnormal by itself: kept)."""
        return self._metric_of_line(hit.rule_index, text)

    def _scan_texts(self, texts: Sequence[str]) -> list[tuple[int, Hit]]:
        """`Matcher.scan_lines` over the texts, encoded once as one joined buffer: (line index, hit)."""
        if not texts:
            return []
        joined = "\n".join(texts)
        if joined.count("\n") == len(texts) - 1:
            try:
                return self.matcher.scan_joined(joined.encode("utf-8"))
            except UnicodeEncodeError:  # lone surrogates: encoded line by line with replacement below
                pass
        return self.matcher.scan_lines([t.encode("utf-8", "replace") for t in texts])

    def from_texts(
        self,
        texts: Sequence[str],
        event_at: Callable[[int], LogEvent],
        stream_of: Callable[[int], Hashable],
        order_of: Callable[[int], int],
        runs: Sequence[tuple[int, int]] = (),
        known: Mapping[tuple[int, int], str] | None = None,
        frame: Callable[[int, Hit], tuple[LogEvent, str, bool]] | None = None,
        process_of: Callable[[int], Hashable] | None = None,
    ) -> list[Signal]:
        """Scan a batch of raw lines once; build events only for the lines that hit.

        Routine hits (progress markers, metric values) collapse per rule and stream within the batch:
        the latest progress line, the largest value (the smallest rides along as `metric_min`). The
        job state keeps the same per process, so this only saves work. A routine hit on a line nothing
        else hit costs no Hit object (`_routine_lines`): half the lines of a training log are such.
        `runs`: ranges [lo, hi) of lines that share one `stream_of` (a shipped batch's), whose latest
        progress lines are found by scanning their tails (`Matcher.scan_routine`). `known`: line ranges
        whose texts the caller has joined already (each is "\n".join(texts[lo:hi]), no text holding "\n").
        `frame(i, hit)`: line i's event, its text as the rule matched it and whether its time is borrowed,
        for lines of a file (correlator/diagnosis/framing.py), in place of `event_at`; the first hit of a
        line frames it, as `rootrank diagnose` does.
        """
        routine: dict[tuple[int, ExprRole, Hashable], Peak] = {}  # (rule, role, stream) -> its peak: `fold_peaks`
        capped = not runs  # lines that come with their streams' runs get every progress line looked at
        runs = [run for run in runs if run[1] - run[0] >= MIN_RUN_LINES]
        if process_of is not None:
            stream_alone = stream_of

            def stream_and_process(i: int) -> Hashable:
                return (stream_alone(i), process_of(i))

            stream_of = stream_and_process
        encoded = _encode_lines(texts, runs, known)
        if encoded is None:
            indexed = self._scan_texts(texts)
        else:
            buf, byte_runs = encoded
            main_raw, _ = self.matcher.scan_split(buf, routine=False)
            # a run's lines share one stream but not one process: per-process folding reads them line by line
            by_runs = process_of is None
            metric_raw, routine_raw = self.matcher.scan_routine_apart(buf, byte_runs if by_runs else [])
            indexed = self.matcher.scan_joined(buf, raw=main_raw)
            hard = {i for i, _ in indexed}
            if metric_raw:  # most of a training log's routine hits: folded in bulk first
                metric_left = self._metric_hits_in_bulk(buf, metric_raw, {hit.start - 1 for _, hit in indexed},
                                                        stream_of, runs if by_runs else (),
                                                        byte_runs if by_runs else [], routine)
                if metric_left:
                    routine_raw = sorted([*routine_raw, *metric_left])
            indexed.extend(self._routine_lines(buf, routine_raw, hard, texts, stream_of, routine,
                                               runs if by_runs else (), capped=capped))
            indexed.sort(key=lambda pair: (pair[0], pair[1].rule_index))
        framed: dict[int, tuple[LogEvent, str, bool]] = {}

        def signal_at(index: int, hit: Hit) -> Signal:
            if frame is None:
                return self.signal_for(event_at(index), hit, order_of(index), raw=texts[index])
            done = framed.get(index)
            if done is None:
                done = framed[index] = frame(index, hit)
            event, raw, borrowed = done
            return self.signal_for(event, hit, order_of(index), raw=raw, time_borrowed=borrowed)

        out: list[Signal] = []
        keys: list[tuple[int, ExprRole, Hashable]] = []
        values: list[float] = []
        lines: list[int] = []
        for index, hit in best_hits_per_line(indexed, self.rules):
            if not self.is_routine(hit):
                out.append(signal_at(index, hit))
                continue
            keys.append((hit.rule_index, hit.role, stream_of(index)))
            values.append(self.metric_value(hit, texts[index]) if hit.role == "main" else float(index))
            lines.append(index)
        fold_peaks(routine, keys, values, lines)
        for (rule_index, role, _stream), (_value, at, low) in sorted(routine.items(), key=lambda kv: kv[1][1]):
            index = int(at)  # in line order
            signal = signal_at(index, Hit(0, 0, rule_index, role))
            if "metric" in signal.fields:
                signal = signal.model_copy(update={"fields": {**signal.fields, "metric_min": low}})
            out.append(signal)
        return out

    def _routine_plan(self, members: tuple[int, ...]) -> tuple[list[Hit], list[Hit]]:
        """What a line with these routine expressions gives, as `best_hits_per_line` would keep it: (every
        hit once per rule and role, for a line other rules hit too; the hits kept on a line nothing else
        hit: every progress marker and the most specific metric)."""
        plan = self._plans.get(members)
        if plan is None:
            exprs, rules = self.matcher.exprs, self.rules
            hits: list[Hit] = []
            kept: list[Hit] = []
            best: Hit | None = None
            for expr_id in members:
                expr = exprs[expr_id]
                if any(h.rule_index == expr.rule_index and h.role == expr.role for h in hits):
                    continue
                hit = Hit(0, 0, expr.rule_index, expr.role)
                hits.append(hit)
                rule = rules[expr.rule_index]
                if expr.role == "main" and rule.kind == "signature" and rule.sequence is None and rule.absence is None:
                    if best is None or _rank(rule) > _rank(rules[best.rule_index]):
                        best = hit  # one failure per line: the most specific metric rule
                else:
                    kept.append(hit)
            if best is not None:
                kept.append(best)
            plan = self._plans[members] = (hits, kept)
        return plan

    def _routine_lines(self, buf: bytes, routine_raw: Sequence[tuple[int, int]], hard_lines: set[int],
                       texts: Sequence[str], stream_of: Callable[[int], Hashable],
                       routine: dict[tuple[int, ExprRole, Hashable], Peak],
                       runs: Sequence[tuple[int, int]] = (), *, capped: bool = True) -> list[tuple[int, Hit]]:
        """Fold the routine hits of lines no other rule hit into `routine`, as `best_hits_per_line` and the
        loop of `from_texts` would: per line, one metric hit (the best rule) and every progress marker.
        Routine hits on the other lines are returned as Hits, for the ordinary path. `runs`: line ranges
        of one stream each (the stream is asked once per run). `capped`: see below."""
        matcher = self.matcher
        base, expand = matcher.routine_base, matcher.routine_expand
        passed: list[tuple[int, Hit]] = []
        keys: list[tuple[int, ExprRole, Hashable]] = []  # the routine lines' observations, folded at the end
        values: list[float] = []
        lines: list[int] = []
        run_at = 0
        run_key: Hashable = None
        run_keyed = -1

        def stream_at(at: int) -> Hashable:
            nonlocal run_at, run_key, run_keyed
            while run_at < len(runs) and runs[run_at][1] <= at:
                run_at += 1
            if run_at < len(runs) and runs[run_at][0] <= at:
                if run_keyed != run_at:
                    run_key, run_keyed = stream_of(at), run_at
                return run_key
            return stream_of(at)

        def fold(at: int, members: tuple[int, ...]) -> None:
            hits, kept = self._routine_plan(members)
            if at in hard_lines:
                passed.extend((at, hit) for hit in hits)
                return
            stream = stream_at(at)
            for hit in kept:
                keys.append((hit.rule_index, hit.role, stream))
                values.append(self._metric_of_line(hit.rule_index, texts[at]) if hit.role == "main" else float(at))
                lines.append(at)

        # Capped, as Matcher.scan_buffer: of a progress marker only the latest FREQUENT_CAP hits per buffer
        # count (a buffer of one-line messages can hold a step line of every rank). Lines that came with
        # their runs are not capped: a long run reports a progress id once, and a cap would drop whole
        # processes from a batch of many processes' messages, short ones included.
        is_metric = matcher.routine_metric
        counts: dict[int, int] = {}
        skip: set[int] = set()
        for k in range(len(routine_raw) - 1 if capped else -1, -1, -1):
            rid = routine_raw[k][1]
            if not is_metric[rid - base]:
                seen_of_rid = counts.get(rid, 0)
                if seen_of_rid >= FREQUENT_CAP:
                    skip.add(k)
                else:
                    counts[rid] = seen_of_rid + 1
        index = previous = 0
        line: int | None = None
        members: tuple[int, ...] = ()
        for k, (to, rid) in enumerate(routine_raw):
            if skip and k in skip:
                continue
            probe = to - 1 if to > 0 and buf[to - 1] == 10 else to  # a match that ends on the newline
            index += buf.count(b"\n", previous, probe)
            previous = probe
            if line is not None and index != line:
                fold(line, members)
                members = ()
            line = index
            members = expand[rid - base] if not members else members + expand[rid - base]
        if line is not None:
            fold(line, members)
        fold_peaks(routine, keys, values, lines)
        return passed

    def _metric_hits_in_bulk(self, buf: bytes, metric_raw: Mapping[int, list[int]], hard: set[int],
                             stream_of: Callable[[int], Hashable], runs: Sequence[tuple[int, int]],
                             byte_runs: Sequence[tuple[int, int]],
                             routine: dict[tuple[int, ExprRole, Hashable], Peak]) -> list[tuple[int, int]]:
        """Fold the metric hits (`Matcher.scan_routine_apart`: end offsets per routine id) that need no per-line
        judgement into `routine` with C-level maps, as `_routine_lines` would, and return the others as (end
        offset, routine id) for it. Folded here: hits of a metric pattern whose value is the number its match
        ends with (`trailing_numbers`), on lines no other rule and no other metric pattern hit (one metric a
        line: `best_hits_per_line` chooses between rules), the first of its pattern on its line (the rule's
        regex reads the first). The value of each is the one the rule's regex reads
        (`test_metric_values_read_in_bulk_equal_the_rules_value_regex`); a value of any other shape sends its
        pattern's hits to `_routine_lines`. A line is known here by the offset of the newline before it
        (-1 for the first); `hard` holds those of the lines other rules hit; `byte_runs` are `runs` in bytes."""
        matcher = self.matcher
        base = matcher.routine_base
        left: list[tuple[int, int]] = []
        ends_of: dict[int, list[int]] = {}
        lines_of: dict[int, list[int]] = {}
        before = partial(buf.rfind, b"\n", 0)
        for rid, reported in metric_raw.items():
            ends = sorted(reported)
            # A match may end on its line's newline: the line's is the newline before its last byte.
            lines = list(map(before, map(sub, ends, repeat(1))))
            if hard:
                on_hard = list(map(hard.__contains__, lines))
                if any(on_hard):
                    left.extend(zip(compress(ends, on_hard), repeat(rid)))
                    soft = list(map(operator.not_, on_hard))
                    ends, lines = list(compress(ends, soft)), list(compress(lines, soft))
            ends_of[rid], lines_of[rid] = ends, lines
        if len(ends_of) > 1:  # a line two metric patterns hit is judged line by line
            shared = {line for a, b in combinations([set(lines) for lines in lines_of.values()], 2) for line in a & b}
            if shared:
                for rid, lines in lines_of.items():
                    mine = list(map(shared.__contains__, lines))
                    left.extend(zip(compress(ends_of[rid], mine), repeat(rid)))
                    other = list(map(operator.not_, mine))
                    ends_of[rid], lines_of[rid] = list(compress(ends_of[rid], other)), list(compress(lines, other))
        main: ExprRole = "main"
        keys: list[tuple[int, ExprRole, Hashable]] = []
        highs: list[float] = []
        ats: list[int] = []  # line numbers
        lows: list[float] = []
        for rid, kept in ends_of.items():
            ends, lines = kept, lines_of[rid]
            if not matcher.routine_trailing[rid - base]:
                left.extend(zip(ends, repeat(rid)))
                continue
            if len(set(lines)) < len(lines):  # the first hit of the pattern on each line; the rest read nothing new
                first = dict(zip(reversed(lines), reversed(ends), strict=True))
                ends, lines = sorted(first.values()), sorted(first)
            found = trailing_numbers(buf, ends)
            if found is None:
                left.extend(zip(ends, repeat(rid)))
                continue
            rule_index = matcher.exprs[matcher.routine_expand[rid - base][0]].rule_index
            winners: list[tuple[int, float, int, float]] = []  # a run's: (its first line, high, where, low)
            outside: list[int] = []
            at = 0
            for (line_lo, _), (lo, hi) in zip(runs, byte_runs, strict=True):  # a run's values, at C speed
                a = bisect_left(lines, lo - 1, at)
                b = bisect_left(lines, hi - 1, a)
                outside.extend(range(at, a))
                if b > a:
                    some = found[a:b]
                    high = max(some)
                    winners.append((line_lo, high, lines[a + some.index(high)], min(some)))
                at = b
            outside.extend(range(at, len(lines)))
            # A line is its newline offset here; the fold keeps line numbers: newlines counted in one pass.
            if winners:
                numbers = _line_numbers(buf, [where for _, _, where, _ in winners])
                keys.extend((rule_index, main, stream_of(line_lo)) for line_lo, _, _, _ in winners)
                highs.extend(high for _, high, _, _ in winners)
                ats.extend(numbers)
                lows.extend(low for _, _, _, low in winners)
            if outside:  # lines in no run: their streams asked one by one
                if len(outside) < len(lines):
                    found, lines = list(map(found.__getitem__, outside)), list(map(lines.__getitem__, outside))
                numbers = _line_numbers(buf, lines)
                keys.extend(zip(repeat(rule_index), repeat(main), map(stream_of, numbers)))
                highs.extend(found)
                ats.extend(numbers)
                lows.extend(found)
        fold_peaks(routine, keys, highs, ats, lows)
        return left

    def _metric_of_line(self, rule_index: int, text: str) -> float:
        """`metric_value`, from the rule's regexes that have the metric's group (the first that gives it)."""
        regexes = self._value_regexes.get(rule_index)
        if regexes is None:
            rule = self.rules[rule_index]
            assert rule.metric is not None
            regexes = self._value_regexes[rule_index] = self.matcher.field_regexes(rule_index, rule.metric.field)
        for regex, group in regexes:
            m = regex.search(text)
            if m is not None:
                raw = m.group(group)
                if raw is not None:
                    try:
                        value = float(raw)
                    except ValueError:
                        return math.inf
                    return math.inf if math.isnan(value) else value
        return math.inf

    def from_events(self, events: Sequence[LogEvent], *, order_base: int = 0) -> list[Signal]:
        return self.from_texts(
            [event.line for event in events],
            events.__getitem__,
            lambda i: (events[i].host, events[i].rank, events[i].local_rank, events[i].pid, events[i].file),
            lambda i: order_base + (i if (offset := events[i].offset) is None else offset),
        )
