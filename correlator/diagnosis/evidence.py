"""Edge matching for `rootrank ship --evidence-only`: run the matcher in the shipper, send only evidence.

Per stream (one rank's log, one pipe of a wrapped command) the filter keeps:
- every line that hits a signature, fact, sequence or absence-start rule, with `context` lines
  before and after it (what an engineer reads around the error);
- metric observations (grad norm per step) that set a new highest or lowest value of their rule in the
  stream, or are not finite, alone: what the engine keeps of a series (each process's peak and its
  lowest value), so spike rules judge the same values, without a line per step;
- a heartbeat every `heartbeat_s` seconds of shipping and at the end of the stream: the latest
  progress marker (a training step / a completed collective, the "end" of absence rules) and the
  last line read, each with its real line number, unless already sent. The batch header carries
  the stream's identity (job, host, rank, pid), so absence ("this rank stopped logging") and lag
  ("this rank's collectives are behind") still work on the worker.

Every selected line keeps its number in its stream: the shipper sends each run of consecutive lines
as one ship-format batch with its own `offset`, so the worker sees the same events (same order, same
positions) as if the whole file had been shipped, only fewer of them. Full-log and evidence-only
shippers can feed the same job. The filter is pure (no I/O): `select` and `heartbeat` return runs.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from correlator.diagnosis.matcher import Matcher

Run = tuple[int, list[str]]  # (line number of the first line, consecutive lines)


@dataclass
class _StreamState:
    before: collections.deque[tuple[int, str]]
    after_left: int = 0
    sent_upto: int = -1  # highest line number sent
    last_line: tuple[int, str] | None = None
    last_progress: tuple[int, str] | None = None
    last_heartbeat: float = 0.0
    read_since_heartbeat: int = 0
    extremes: dict[int, tuple[float, float]] | None = None  # metric rule -> (lowest, highest) value sent


def _runs(numbered: Sequence[tuple[int, str]]) -> list[Run]:
    out: list[Run] = []
    for number, text in numbered:
        if out and out[-1][0] + len(out[-1][1]) == number:
            out[-1][1].append(text)
        else:
            out.append((number, [text]))
    return out


class EvidenceFilter:
    def __init__(self, matcher: Matcher, *, context: int = 5, heartbeat_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.matcher = matcher
        self.context = max(0, context)
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        rules = matcher.rules
        self._is_metric = [rule.metric is not None for rule in rules]
        self._is_progress = [rule.absence is not None and bool(rule.absence.progress) for rule in rules]
        self.streams_by_key: dict[str, _StreamState] = {}
        # Counters, read by the shipper's /metrics (correlator.stream.metrics.ShipStatsCollector).
        self.lines_read = 0
        self.bytes_read = 0
        self.lines_matched = 0
        self.lines_selected = 0
        self.heartbeats = 0

    def _state(self, key: str) -> _StreamState:
        state = self.streams_by_key.get(key)
        if state is None:
            state = self.streams_by_key[key] = _StreamState(
                before=collections.deque(maxlen=self.context or 1), last_heartbeat=self.clock())
        return state

    def _classify(self, state: _StreamState, texts: Sequence[str]) -> tuple[set[int], set[int], int | None]:
        """(lines with evidence hits, metric-only lines worth sending, last progress line) by index in `texts`."""
        evidence: set[int] = set()
        metric: set[int] = set()
        progress: int | None = None
        hits = self.matcher.scan_lines([t.encode("utf-8", "replace") for t in texts])
        for index, hit in hits:
            if hit.role == "end" and self._is_progress[hit.rule_index]:
                progress = index if progress is None or index > progress else progress
            elif hit.role == "main" and self._is_metric[hit.rule_index]:
                if self._extreme(state, hit.rule_index, texts[index]):
                    metric.add(index)
            else:
                evidence.add(index)
        return evidence, metric - evidence, progress

    def _extreme(self, state: _StreamState, rule_index: int, text: str) -> bool:
        """Whether a metric line sets a new lowest or highest value of its rule in the stream (or has no finite
        value): the values the engine keeps of a process's series."""
        value = self._metric_value(rule_index, text)
        if value is None or not math.isfinite(value):
            return True
        extremes = state.extremes if state.extremes is not None else {}
        state.extremes = extremes
        low_high = extremes.get(rule_index)
        if low_high is not None and low_high[0] <= value <= low_high[1]:
            return False
        extremes[rule_index] = (value, value) if low_high is None else (min(low_high[0], value), max(low_high[1], value))
        return True

    def _metric_value(self, rule_index: int, text: str) -> float | None:
        rule = self.matcher.rules[rule_index]
        if rule.metric is None:
            return None
        for regex, group in self.matcher.field_regexes(rule_index, rule.metric.field):
            m = regex.search(text)
            if m is not None and m.group(group) is not None:
                try:
                    return float(m.group(group))
                except ValueError:
                    return None
        return None

    def select(self, key: str, first: int, texts: Sequence[str]) -> list[Run]:
        """The runs of lines to send out of `texts` (numbered from `first` in stream `key`)."""
        state = self._state(key)
        self.lines_read += len(texts)
        self.bytes_read += sum(len(t) + 1 for t in texts)
        state.read_since_heartbeat += len(texts)
        evidence, metric, progress = self._classify(state, texts)
        self.lines_matched += len(evidence) + len(metric)
        chosen: list[tuple[int, str]] = []

        def take(number: int, text: str) -> None:
            if number > state.sent_upto:
                chosen.append((number, text))
                state.sent_upto = number

        for index, text in enumerate(texts):
            number = first + index
            if index in evidence:
                if self.context:
                    for before in state.before:
                        take(*before)
                    state.before.clear()
                take(number, text)
                state.after_left = self.context
            elif state.after_left > 0:
                if text.strip():
                    state.after_left -= 1
                take(number, text)
            elif index in metric:
                take(number, text)
            elif self.context and text.strip():
                state.before.append((number, text))
            if text.strip():
                state.last_line = (number, text)
        if progress is not None:
            state.last_progress = (first + progress, texts[progress])
        self.lines_selected += len(chosen)
        return _runs(chosen)

    def heartbeat(self, key: str, *, final: bool = False) -> list[Run]:
        """The stream's heartbeat, when due (or `final`, at the end of the stream): runs to send."""
        state = self.streams_by_key.get(key)
        if state is None:
            return []
        now = self.clock()
        if not final and (now - state.last_heartbeat < self.heartbeat_s or not state.read_since_heartbeat):
            return []
        state.last_heartbeat = now
        state.read_since_heartbeat = 0
        chosen: list[tuple[int, str]] = []
        for item in sorted({x for x in (state.last_progress, state.last_line) if x is not None}):
            if item[0] > state.sent_upto:
                chosen.append(item)
                state.sent_upto = item[0]
        if chosen:
            self.heartbeats += 1
            self.lines_selected += len(chosen)
        return _runs(chosen)

    def keys(self) -> list[str]:
        return list(self.streams_by_key)


def evidence_lines(matcher: Matcher, lines: Sequence[str], *, context: int = 5, chunk_lines: int = 4096) -> list[Run]:
    """What `--evidence-only` sends of a whole file (read in chunks like the shipper), final heartbeat included."""
    filt = EvidenceFilter(matcher, context=context, heartbeat_s=float("inf"))
    runs: list[Run] = []
    for start in range(0, len(lines), chunk_lines):
        runs.extend(filt.select("file", start, lines[start : start + chunk_lines]))
    runs.extend(filt.heartbeat("file", final=True))
    return _runs([(n + i, t) for n, run in runs for i, t in enumerate(run)])
