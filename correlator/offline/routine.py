"""Routine lines in bulk: metric values and progress markers, aggregated per process from the scan's hits.

Half the lines of a training log are step/loss/grad-norm lines and progress bars. The engine needs two
things from them, per process: the largest and the smallest value of each metric, and the latest
progress line (`JobState.progress`: did a process go on after a failure?). So no event is built per
line: each routine hit costs a few C-level calls (find its line, read its identity key, for a metric its
value) and a dict update; events and signals are built once per process and rule, for the winning lines.

Which process wrote a line: when the line starts with a bracketed prefix that names a rank
(`[rank37]:`, as torchrun's `--tee` and prefix templates write it), those bytes are the key, checked
once per distinct prefix with the identity parser; the rank is the engine's process key. Any other line
has its identity parsed (`parse_prefixes`, a few microseconds), which is what a log without launcher
prefixes costs.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from operator import add, sub

from correlator.diagnosis.matcher import Buffer, Hit, Matcher, trailing_numbers
from correlator.diagnosis.routine_fold import Peak, fold_peaks
from ingest.prefixes import Identity

METRIC_KEEP = 16
_VALUE_WINDOW = 96  # bytes before a metric match's end searched for its value (name, separators, number)
_KEY = 16  # a line's first bytes that key its process (a rank prefix `[rank12345]:` fits)

ProcessKey = object  # bytes (a rank-naming prefix) or a tuple (rank, host, pid, local_rank)
NO_IDENTITY: ProcessKey = (None, None, None, None)  # a line whose prefixes name no rank, host, pid or local rank
# The first bytes a line's identity can start with (`parse_prefixes`: a letter, a digit, `[`, `(`, a space, an
# ANSI escape; the diagnoser's rsyslog check: `<`; and any non-ASCII byte, which may begin a letter): 1. A line
# that starts with any other byte (`{'loss': ...`, `\r`, `|`, a tab) names nobody.
_MAY_NAME = bytes(int(chr(c).isascii() and (chr(c).isalnum() or chr(c) in "[( \x1b<")) or c >= 0x80 for c in range(256))
# A line's shape: its bytes with every ASCII digit made 0. The identity parser treats all digits alike (`\d`,
# `int`), so lines of one shape take the same path through it: if one names nobody, all do. Not a line that
# starts with `<`: an RFC 5424 syslog header is `<PRI>1 ` (its version, a literal 1), so those are parsed.
_SHAPE = bytes(0x30 if 0x30 <= c <= 0x39 else c for c in range(256))
_SHAPED = bytes(int(c != 0x3C) for c in range(256))  # the first bytes of lines whose shape tells
_SHAPES_KEPT = 1 << 16


@dataclass
class RoutineAggregate:
    """Per (routine id, process): the latest progress line's start, or a metric's [max, start of max, min].
    Regions of one file merge in file order (`merge`), in the parent or across forked scan processes."""

    progress: dict[tuple[int, ProcessKey], int] = field(default_factory=dict)
    metric: dict[tuple[int, ProcessKey], Peak] = field(default_factory=dict)
    lines: int = 0

    def merge(self, later: RoutineAggregate) -> None:
        self.progress.update(later.progress)  # the later region's line is the later one
        peaks = list(later.metric.values())
        fold_peaks(self.metric, list(later.metric), [p[0] for p in peaks], [p[1] for p in peaks], [p[2] for p in peaks])
        self.lines += later.lines


class RoutineAggregator:
    """Folds a region's routine hits into a RoutineAggregate. `identify` gives a line's identity (the
    diagnoser's memoized parser); one aggregator serves every region and file of a diagnoser."""

    def __init__(self, matcher: Matcher, identify: Callable[[str], Identity]) -> None:
        self.matcher = matcher
        self.identify = identify
        self._prefixes: dict[bytes, bytes | None] = {}  # a line's first bytes -> the rank prefix they start with
        self._named: dict[str, bool] = {}  # a prefix -> whether it is whole prefixes naming a rank
        self._anonymous: dict[bytes, bool] = {}  # a line's shape -> whether its lines name nobody

    def _rank_prefix(self, key: bytes) -> bytes | None:
        """The prefix naming a rank that `key` (a newline and the next _KEY bytes of the file) starts its
        line with, or None. Decided once per distinct key, with the identity parser."""
        known = self._prefixes.get(key, b"")
        if known != b"":
            return known
        if len(self._prefixes) > 1 << 18:
            self._prefixes.clear()
        text = key[1:].decode("utf-8", "replace")
        close = text.find("]")
        prefix = None
        if text.startswith("[") and close > 0 and not key.startswith(b"\n\n"):
            head = text[: close + 2] if text[close + 1 : close + 2] == ":" else text[: close + 1]
            named = self._named.get(head)
            if named is None:
                ident = self.identify(head + " x")
                named = self._named[head] = ident.rank is not None and ident.text.strip() == "x"
            prefix = head.encode("utf-8", "replace") if named else None
        self._prefixes[key] = prefix
        return prefix

    def _slow_key(self, buf: Buffer, start: int, hi: int) -> ProcessKey:
        end = buf.find(b"\n", start, hi)
        ident = self.identify(bytes(buf[start : hi if end < 0 else end]).decode("utf-8", "replace").rstrip("\r"))
        return (ident.rank, ident.host, ident.pid, ident.local_rank)

    def add(self, buf: Buffer, lo: int, hi: int, routine: dict[int, list[int]], acc: RoutineAggregate) -> None:
        """Fold `routine` (the routine hits over `buf[lo:hi]`, per routine id: end offsets in buffer order, as
        `Matcher.scan_grouped` gives them) into `acc`."""
        base, is_metric = self.matcher.routine_base, self.matcher.routine_metric
        for rid, ends in routine.items():
            if is_metric[rid - base]:
                self._add_metric(buf, lo, hi, rid - base, ends, acc)
            else:
                self._add_progress(buf, lo, hi, rid - base, ends, acc)
            acc.lines += len(ends)

    def _keys(self, buf: Buffer, lo: int, hi: int, ends: list[int]) -> tuple[list[int], list[ProcessKey]]:
        """Line starts and process keys of the lines ending at or containing `ends`, with C-level maps: the
        newline before each line and the _KEY bytes after it are the key when they start with a prefix naming
        a rank. The other lines' keys come from their identity (`_identities`)."""
        newlines = list(map(partial(buf.rfind, b"\n", max(lo - 1, 0)), ends))
        keys: list[ProcessKey] = list(map(buf.__getitem__, map(slice, newlines, map(add, newlines, repeat(1 + _KEY)))))
        starts = list(map(add, newlines, repeat(1)))
        first = 0
        while first < len(newlines) and newlines[first] < 0:  # the buffer's first line: no newline before it
            keys[first] = b"\n" + bytes(buf[0:_KEY])
            first += 1
        prefix = self._rank_prefix
        distinct = set(keys)
        if len(distinct) <= len(keys) // 2:  # prefixed lines: a rank's lines share a few keys, each asked once
            unnamed: list[int] = []
            bad = {key for key in distinct if prefix(key) is None}  # type: ignore[arg-type]  # every key is bytes here
        else:
            # Many keys of their own (lines with no launcher prefix: their first bytes are their message's):
            # only a key whose line starts with `[` can be a rank prefix, the others are not asked one by one.
            bracketed = list(map(bytes.startswith, keys, repeat(b"\n[")))  # type: ignore[arg-type]  # bytes, as above
            unnamed = list(compress(range(len(keys)), map(operator.not_, bracketed)))
            bad = {key for key in set(compress(keys, bracketed)) if prefix(key) is None}  # type: ignore[arg-type]  # bytes
        if bad:
            unnamed.extend(compress(range(len(keys)), map(bad.__contains__, keys)))
            unnamed.sort()
        if unnamed:
            for index, key in zip(unnamed, self._identities(buf, [starts[i] for i in unnamed], hi), strict=True):
                keys[index] = key
        return starts, keys

    def _identities(self, buf: Buffer, starts: list[int], hi: int) -> list[ProcessKey]:
        """The process keys of lines that start with no rank prefix: NO_IDENTITY for a line whose first byte
        cannot start an identity, or whose shape (`_SHAPE`) is known to name nobody; the parsed identity
        (`_slow_key`) of the others, one by one."""
        out: list[ProcessKey] = [NO_IDENTITY] * len(starts)
        firsts = bytes(map(buf.__getitem__, starts))
        ask = list(compress(range(len(starts)), firsts.translate(_MAY_NAME)))
        if not ask:
            return out
        if b"<" in firsts:  # syslog's header: parsed line by line (see _SHAPED)
            parse = set(compress(ask, map(operator.not_, map(_SHAPED.__getitem__, map(firsts.__getitem__, ask)))))
            for k in parse:
                out[k] = self._slow_key(buf, starts[k], hi)
            ask = [k for k in ask if k not in parse]
        line_starts = list(map(starts.__getitem__, ask))
        line_ends = list(map(partial(buf.find, b"\n"), line_starts, repeat(hi)))
        for k in range(len(line_ends) - 1, -1, -1):  # no newline after the region's last line
            if line_ends[k] >= 0:
                break
            line_ends[k] = hi
        shapes = list(map(bytes.translate, map(buf.__getitem__, map(slice, line_starts, line_ends)), repeat(_SHAPE)))
        known = self._anonymous
        if len(known) > _SHAPES_KEPT:
            known.clear()
        for shape in set(shapes).difference(known):
            known[shape] = self._names_nobody(shape)
        for k in compress(range(len(ask)), map(operator.not_, map(known.__getitem__, shapes))):
            out[ask[k]] = self._slow_key(buf, line_starts[k], hi)
        return out

    def _names_nobody(self, line: bytes) -> bool:
        """Whether a line (of this shape: any other digits give the same answer) names no rank, host, pid or
        local rank."""
        ident = self.identify(line.decode("utf-8", "replace").rstrip("\r"))
        return ident.rank is None and ident.host is None and ident.pid is None and ident.local_rank is None

    def _add_progress(self, buf: Buffer, lo: int, hi: int, r: int, ends: list[int], acc: RoutineAggregate) -> None:
        """Progress hits (of routine id base + `r`) end at their line's end: each process's latest line start."""
        starts, keys = self._keys(buf, lo, hi, ends)
        latest = dict(zip(keys, starts, strict=True))  # in buffer order: the last one stays
        acc.progress.update(zip(zip(repeat(r), latest), latest.values(), strict=True))

    def _add_metric(self, buf: Buffer, lo: int, hi: int, r: int, ends: list[int], acc: RoutineAggregate) -> None:
        """Metric hits (of routine id base + `r`), in bulk: line starts, keys and values with C-level maps,
        then one fold (`fold_peaks`) that keeps each process's largest and smallest value."""
        # A metric match may end on its line's newline: look for the line's start before that.
        starts, keys = self._keys(buf, lo, hi, list(map(sub, ends, repeat(1))))
        values = trailing_numbers(buf, ends, starts) if self.matcher.routine_trailing[r] else None
        if values is None:
            values = self._values(buf, hi, r, starts, ends)
        fold_peaks(acc.metric, list(zip(repeat(r), keys)), values, starts)

    def _values(self, buf: Buffer, hi: int, r: int, starts: list[int], ends: list[int]) -> list[float]:
        """Metric values one by one: the rule's value regex over the bytes before each match's end."""
        regex, name = self.matcher.routine_value[r]
        if regex is None:
            return [self._value(buf, start, hi, r) for start in starts]
        # The match ends at `to`, the value just before it: search the last _VALUE_WINDOW bytes only.
        windows = [max(s, to - _VALUE_WINDOW) for s, to in zip(starts, ends, strict=True)]
        found = list(map(partial(regex.search, buf), windows, ends))
        return [float(m.group(name)) if m is not None else self._value(buf, start, hi, r)
                for m, start in zip(found, starts, strict=True)]

    def _process(self, key: ProcessKey) -> ProcessKey:
        """A key as the process it names: a rank's prefix for the bytes keys, the identity tuple otherwise."""
        return self._rank_prefix(key) or key if isinstance(key, bytes) else key

    def _value(self, buf: Buffer, start: int, hi: int, r: int) -> float:
        """A metric value the bytes regex could not read: the rule's extractors on the decoded line."""
        matcher = self.matcher
        expr = matcher.exprs[matcher.routine_expand[r][0]]
        rule = matcher.rules[expr.rule_index]
        assert rule.metric is not None
        end = buf.find(b"\n", start, hi)
        text = bytes(buf[start : hi if end < 0 else end]).decode("utf-8", "replace")
        try:
            value = float(matcher.extract(expr.rule_index, text).get(rule.metric.field, "nan"))
        except ValueError:
            value = float("nan")
        return float("inf") if math.isnan(value) else value  # nan is abnormal by itself: keep it

    def winners(self, buf: Buffer, hi: int, acc: RoutineAggregate) -> list[tuple[Hit, float | None]]:
        """The lines the engine gets: every process's latest progress line per rule, and per metric rule
        the processes with the largest and the smallest peaks (METRIC_KEEP of each), as (hit, metric min);
        progress latest first (see `Diagnoser._routine_signals`)."""
        matcher = self.matcher
        latest: dict[tuple[int, ProcessKey], int] = {}
        for (r, raw_key), start in acc.progress.items():
            pkey = self._process(raw_key)
            for expr_id in matcher.routine_expand[r]:
                key = (matcher.exprs[expr_id].rule_index, pkey)
                if latest.get(key, -1) < start:
                    latest[key] = start
        peaks: dict[tuple[int, ProcessKey], Peak] = {}
        folded = list(acc.metric.values())
        fold_peaks(peaks, [(matcher.exprs[matcher.routine_expand[r][0]].rule_index, self._process(raw_key))
                           for r, raw_key in acc.metric],
                   [p[0] for p in folded], [p[1] for p in folded], [p[2] for p in folded])

        def line_end(start: int) -> int:
            end = buf.find(b"\n", start, hi)
            return hi if end < 0 else end

        out: list[tuple[Hit, float | None]] = [
            (Hit(start, line_end(start), rule_index, "end"), None)
            for (rule_index, _pkey), start in sorted(latest.items(), key=lambda kv: -kv[1])
        ]
        by_rule: dict[int, list[list[float]]] = {}
        for (rule_index, _pkey), entry in peaks.items():
            by_rule.setdefault(rule_index, []).append(entry)
        for rule_index, entries in by_rule.items():
            entries.sort(key=lambda e: (e[0], e[1]))
            kept = entries if len(entries) <= 2 * METRIC_KEEP else entries[:METRIC_KEEP] + entries[-METRIC_KEEP:]
            for high, at, low in sorted(kept, key=lambda e: e[1]):
                del high
                start = int(at)
                out.append((Hit(start, line_end(start), rule_index, "main"), low))
        return out
