"""All rule patterns in one hyperscan database, scanned over whole buffers.

The hot path never scans per pattern or per line: callers hand over one buffer (a file chunk,
or a batch of lines joined with newlines) and get back (line, expression) hits. Named groups
and `extract` regexes run in Python only on the few lines that hit.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import operator
import os
import re
import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import Literal

import hyperscan

from correlator.diagnosis.patterns import HYPERSCAN_VERSION, cache_dir, json_string_edges, pattern_flags
from correlator.diagnosis.rules import Rule, RuleSet, cached_database, store_databases

ExprRole = Literal["main", "after", "end"]
# What the matcher scans: bytes, or an mmap of a whole file (diagnose scans regions of it in place).
Buffer = bytes | mmap.mmap
# hyperscan's match callback: (expression id, from, to, flags, context) -> True to stop the scan
MatchHandler = Callable[[int, int, int, int, object], bool | None]
# scan_routine's databases: the metric expressions', and per progress id (its line's, its first match's)
RunDatabases = tuple[hyperscan.Database | None, dict[int, tuple[hyperscan.Database, hyperscan.Database]]]

FREQUENT_CAP = 1024
# A metric pattern that ends with its value as a plain number, then one byte that cannot continue it or the
# line's end (every metric rule's shape): the value is the last run of number bytes before the match's end,
# read in bulk (`trailing_numbers`), not by the rule's regex line by line.
TRAILING_NUMBER = r"[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)(?:[^0-9.e]|$)"
# Every byte that cannot be part of such a number becomes a space, so the value is the last word.
_NUMBER_WORDS = bytes(c if c in b"0123456789.eE+-" else 0x20 for c in range(256))
NUMBER_WINDOW = 64  # bytes before a match's end that hold its value; a longer "number" is read by the regex
# From this size on, scan_split scans a buffer once with both databases' expressions in one database:
# about 12% less than the two scans on a training log; below it, the two databases already loaded do.
COMBINED_SCAN_BYTES = 1 << 20
SHIP_BATCH_KEY = b'"rootrank"'


@dataclass(frozen=True, slots=True)
class Expr:
    rule_index: int
    role: ExprRole


@dataclass(frozen=True, slots=True)
class Hit:
    """A line that matched an expression. `start`/`end` are byte offsets of the line in the buffer."""

    start: int
    end: int
    rule_index: int
    role: ExprRole



def _scan(db: hyperscan.Database, data: memoryview, on_match: MatchHandler, scratch: hyperscan.Scratch) -> None:
    """`db.scan` over a view of the caller's buffer (bytes or an mmap), without a copy. hyperscan reads any
    buffer; its stubs say str or bytes."""
    db.scan(data, match_event_handler=on_match, scratch=scratch)  # type: ignore[type-var]  # see the docstring


class Matcher:
    """Compiled once per rule set (and cached on disk by the rule set's content hash)."""

    def __init__(self, ruleset: RuleSet, *, use_cache: bool = True) -> None:
        self.ruleset = ruleset
        self.rules: list[Rule] = [lr.rule for lr in ruleset.rules]
        self.exprs: list[Expr] = []
        self._new_databases: dict[str, bytes] = {}  # compiled or read from hs-*.db: added to the rule set's cache
        main: list[tuple[int, bytes, int]] = []
        # Routine patterns (metric values, progress end markers) go to a database of their own, scanned
        # exactly. The progress markers of several rules share patterns ("'loss': [0-9]", "iteration N/ M |"):
        # each distinct pattern set becomes one expression that reports a line once, at its end
        # (`(?:a|b|c)[^\n]*$`), so a training-step line costs one callback, not one per pattern and rule.
        progress: dict[tuple[str, bool], list[int]] = {}  # (pattern, caseless) -> expr ids (one per rule)
        metric: list[tuple[int, str, bool]] = []  # (expr id, pattern, caseless)
        self._end_expr: dict[int, int] = {}  # rule index -> its first "end" expr id
        for index, rule in enumerate(self.rules):
            groups: list[tuple[ExprRole, list[str]]] = [("main", rule.patterns)]
            if rule.sequence is not None:
                groups.append(("after", rule.sequence.after))
            if rule.absence is not None:
                groups.append(("end", rule.absence.end))
            for role, pats in groups:
                for pattern in pats:
                    expr_id = len(self.exprs)
                    self.exprs.append(Expr(index, role))
                    if role == "end" and rule.absence is not None and rule.absence.progress:
                        first = self._end_expr.setdefault(index, expr_id)
                        members = progress.setdefault((pattern, rule.caseless), [])
                        if first not in members:
                            members.append(first)
                    elif rule.metric is not None and role == "main":
                        metric.append((expr_id, pattern, rule.caseless))
                    else:
                        main.append((expr_id, pattern.encode("utf-8"), pattern_flags(rule.caseless)))
        self._frequent: list[bool] = [e.role == "end" for e in self.exprs]
        # compiled per rule on its first hit: a small log hits a handful of the rules, and compiling
        # them all was most of a one-line diagnosis
        self._extractors: dict[int, list[re.Pattern[str]]] = {}
        self.db = self._load_or_compile(main, use_cache)
        self.use_cache = use_cache
        self.main_expressions = main  # (id, pattern, flags): what `db` was compiled from
        self.json_prefilter_db: hyperscan.Database | None = None  # built on first use (json_prefilter)
        self.combined_db: hyperscan.Database | None = None  # built on first use (combined_database)
        # Routine ids start after the expression ids, so scan_raw's output says which database hit.
        self.routine_base = len(self.exprs)
        self.routine_expand: list[tuple[int, ...]] = []  # routine id - base -> the expr ids it stands for
        self.routine_metric: list[bool] = []  # routine id - base -> a metric pattern (else progress)
        self.routine_value: list[tuple[re.Pattern[bytes] | None, str]] = []  # metric: value regex, field
        self.routine_trailing: list[bool] = []  # metric: its value is the number its match ends with
        routine: list[tuple[int, bytes, int]] = []
        self.routine_metrics = len(metric)  # routine ids base .. base + routine_metrics - 1: metric patterns
        for expr_id, pattern, caseless in metric:
            rule = self.rules[self.exprs[expr_id].rule_index]
            assert rule.metric is not None
            routine.append((self.routine_base + len(self.routine_expand), pattern.encode("utf-8"),
                            pattern_flags(caseless)))
            self.routine_expand.append((expr_id,))
            self.routine_metric.append(True)
            value_regex = _value_regex(pattern, rule.metric.field, caseless)
            self.routine_value.append((value_regex, rule.metric.field))
            self.routine_trailing.append(value_regex is not None and value_regex.pattern.endswith(
                f"(?P<{rule.metric.field}>{TRAILING_NUMBER}".encode()))
        by_members: dict[tuple[tuple[int, ...], bool], list[str]] = {}
        for (pattern, caseless), members in progress.items():
            by_members.setdefault((tuple(members), caseless), []).append(pattern)
        # per progress id: (the expression as in the routine database, the same without its line tail)
        self.progress_expressions: dict[int, tuple[tuple[int, bytes, int], tuple[int, bytes, int]]] = {}
        for (member_ids, caseless), patterns in by_members.items():
            rid = self.routine_base + len(self.routine_expand)
            either = "(?:" + "|".join(f"(?:{p})" for p in patterns) + ")"
            line = (rid, (either + "[^\n]*$").encode("utf-8"), pattern_flags(caseless))
            routine.append(line)
            self.progress_expressions[rid] = (
                line, (rid, either.encode("utf-8"), pattern_flags(caseless) | hyperscan.HS_FLAG_SINGLEMATCH))
            self.routine_expand.append(member_ids)
            self.routine_metric.append(False)
            self.routine_value.append((None, ""))
            self.routine_trailing.append(False)
        self.routine_db = self._load_or_compile(routine, use_cache) if routine else None
        self.routine_expressions = routine
        # For scan_routine's runs, built on first use: the metric patterns alone, and per progress id a
        # database that reports each line and one that reports the first match only.
        self._run_databases: RunDatabases | None = None
        self._local = threading.local()
        if use_cache:
            store_databases(ruleset, self._new_databases)

    @staticmethod
    def _compile_extractors(rule: Rule) -> list[re.Pattern[str]]:
        out: list[re.Pattern[str]] = []
        for pattern in [*rule.patterns, *rule.extract]:
            try:
                compiled = re.compile(pattern, re.IGNORECASE if rule.caseless else 0)
            except re.error:
                continue  # hyperscan-only syntax: matching still works, extraction skips it
            if compiled.groupindex:
                out.append(compiled)
        return out

    def _load_or_compile(self, exprs: list[tuple[int, bytes, int]], use_cache: bool) -> hyperscan.Database:
        ids = [i for i, _, _ in exprs]
        patterns = [p for _, p, _ in exprs]
        flags = [f for _, _, f in exprs]
        key = hashlib.sha256(
            b"\0".join(patterns) + repr((ids, flags)).encode() + HYPERSCAN_VERSION.encode()
        ).hexdigest()[:20]
        blob = cached_database(self.ruleset, key) if use_cache else None
        if blob is not None:
            try:
                db = hyperscan.loadb(blob, hyperscan.HS_MODE_BLOCK)
                db.scratch = hyperscan.Scratch(db)
                return db
            except hyperscan.error:
                pass  # compiled below, and stored again
        path = cache_dir() / f"hs-{key}.db"
        if use_cache and path.exists():
            try:
                blob = path.read_bytes()
                db = hyperscan.loadb(blob, hyperscan.HS_MODE_BLOCK)
                db.scratch = hyperscan.Scratch(db)  # a deserialized database comes without scratch space
                self._new_databases[key] = blob
                return db
            except (OSError, hyperscan.error):
                pass  # a stale or torn cache file is rebuilt below
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(expressions=patterns, ids=ids, flags=flags)
        if use_cache:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                blob = hyperscan.dumpb(db)
                self._new_databases[key] = blob
                tmp.write_bytes(blob)
                tmp.replace(path)
            except OSError:
                pass  # a read-only home only costs the compile time
        return db

    def scan_raw(self, buf: Buffer, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
        """(end offset in `buf`, id) for every match in `buf[lo:hi]`: expression ids from the main database,
        routine ids (>= `routine_base`) from the routine one. Safe to call from several threads at once:
        each scan uses its own scratch space."""
        hits, routine = self.scan_split(buf, lo, hi)
        hits.extend(routine)
        return hits

    def scan_split(self, buf: Buffer, lo: int = 0, hi: int | None = None, *,
                   main: bool = True, routine: bool = True) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The main database's matches and the routine database's, apart (a database not asked for gives
        none): (end offset, id) each, in buffer order. A progress id's end offset is its line's end; a
        metric id's is the match's end."""
        hi = len(buf) if hi is None else hi
        hits: list[tuple[int, int]] = []
        routine_hits: list[tuple[int, int]] = []
        if hi <= lo:
            return hits, routine_hits
        base = self.routine_base
        add_main, add_routine = hits.append, routine_hits.append

        def on_match(expr_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            (add_main if expr_id < base else add_routine)((lo + to, expr_id))

        self._scan_with(self._databases_for(hi - lo, main, routine), buf, lo, hi, on_match)
        return hits, routine_hits

    def _databases_for(self, size: int, main: bool = True, routine: bool = True) -> list[hyperscan.Database]:
        """The databases a scan of `size` bytes for these expression sets runs: from COMBINED_SCAN_BYTES on,
        when both are asked for, the one database of both."""
        if main and routine and size >= COMBINED_SCAN_BYTES and (combined := self.combined_database()) is not None:
            return [combined]
        return [db for db, wanted in ((self.db, main), (self.routine_db, routine)) if db is not None and wanted]

    def _scan_with(self, databases: list[hyperscan.Database], buf: Buffer, lo: int, hi: int,
                   on_match: MatchHandler) -> None:
        view = memoryview(buf)[lo:hi]  # no copy: hyperscan reads the caller's buffer (bytes or mmap)
        try:
            for db in databases:
                _scan(db, view, on_match, self._scratch_for(db))
        finally:
            view.release()

    def scan_grouped(self, buf: Buffer, lo: int = 0, hi: int | None = None) -> tuple[list[tuple[int, int]], dict[int, list[int]]]:
        """Both databases' matches in `buf[lo:hi]`: the main ones as (end offset, id), sorted; the routine
        ones grouped per routine id, their end offsets in buffer order (offsets are positions in `buf`).
        Routine hits are about half a training log's lines: an offset appended to its id's list costs less
        than a tuple per hit split by id afterwards."""
        hi = len(buf) if hi is None else hi
        found: list[list[int]] = [[] for _ in range(self.routine_base + len(self.routine_expand))]
        if hi > lo:
            appenders = [ends.append for ends in found]

            def on_match(expr_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
                appenders[expr_id](to)

            self._scan_with(self._databases_for(hi - lo), buf, lo, hi, on_match)
        base = self.routine_base
        main = sorted((lo + to, expr_id) for expr_id in range(base) if found[expr_id] for to in found[expr_id])
        routine = {rid: list(map(operator.add, found[rid], repeat(lo))) if lo else found[rid]
                   for rid in range(base, len(found)) if found[rid]}
        return main, routine

    def scan_routine(self, buf: bytes, runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The routine matches `scan_split` gives, (end offset, routine id) in buffer order, except that in
        each of `runs` a progress id reports only its last line. A run is a byte range [lo, hi) of whole
        lines of one stream, of which the extractor keeps the latest progress line only, and a training
        log is mostly step lines: a run's progress costs a scan of its tail and a presence check, not a
        callback per line. Outside the runs every match is reported."""
        metric, progress = self.scan_routine_apart(buf, runs)
        progress.extend((to, rid) for rid, ends in metric.items() for to in ends)
        progress.sort()
        return progress

    def scan_routine_apart(self, buf: bytes, runs: Sequence[tuple[int, int]]) -> tuple[dict[int, list[int]],
                                                                                       list[tuple[int, int]]]:
        """What `scan_routine` gives, the metric ids' matches apart: their end offsets per routine id, in buffer
        order (a metric line costs an offset appended, not a tuple); the progress ids' as (end offset, id),
        sorted."""
        metric: dict[int, list[int]] = {}
        out: list[tuple[int, int]] = []
        if self.routine_db is None:
            return metric, out
        found: list[list[int]] = [[] for _ in range(self.routine_metrics)]
        appenders = [ends.append for ends in found]
        base, metrics = self.routine_base, self.routine_metrics
        add = out.append

        def from_offset(offset: int) -> MatchHandler:
            def on_match(expr_id: int, _from: int, to: int, _flags: int, _context: object) -> None:
                add((offset + to, expr_id))

            return on_match

        def on_metric(expr_id: int, _from: int, to: int, _flags: int, _context: object) -> None:
            appenders[expr_id - base](to)

        view = memoryview(buf)
        try:
            if not runs:
                def on_any(expr_id: int, _from: int, to: int, _flags: int, _context: object) -> None:
                    if expr_id - base < metrics:
                        appenders[expr_id - base](to)
                    else:
                        add((to, expr_id))

                assert self.routine_db is not None
                _scan(self.routine_db, view, on_any, self._scratch_for(self.routine_db))
            else:
                metric_db, progress_dbs = self._databases_for_runs()
                if metric_db is not None:
                    _scan(metric_db, view, on_metric, self._scratch_for(metric_db))
                gaps: list[tuple[int, int]] = []
                at = 0
                for lo, hi in runs:
                    if lo > at:
                        gaps.append((at, lo))
                    at = hi
                if at < len(buf):
                    gaps.append((at, len(buf)))
                for db, _first in progress_dbs.values():
                    for lo, hi in gaps:
                        _scan(db, view[lo:hi], from_offset(lo), self._scratch_for(db))
                for rid, (db, first) in progress_dbs.items():
                    for lo, hi in runs:
                        last = self._last_match(view, buf, lo, hi, db, first)
                        if last is not None:
                            add((last, rid))
        finally:
            view.release()
        out.sort()
        return {base + r: ends for r, ends in enumerate(found) if ends}, out

    def _last_match(self, view: memoryview, buf: bytes, lo: int, hi: int,
                    db: hyperscan.Database, first: hyperscan.Database) -> int | None:
        """The end offset of the last line of buf[lo:hi] that `db` reports, or None: scans of growing
        tails (each from a line start), after the first empty one a check that the rest matches at all."""
        found: list[int] = []

        def on_line(_id: int, _from: int, to: int, _flags: int, _context: object) -> None:
            found.append(to)

        def on_first(_id: int, _from: int, to: int, _flags: int, _ctx: object) -> bool:
            found.append(to)
            return True  # stop: one is enough

        size, top, checked = 4096, hi, False
        while top > lo:
            start = lo if top - size <= lo else max(lo, buf.rfind(b"\n", lo, top - size) + 1)
            _scan(db, view[start:top], on_line, self._scratch_for(db))
            if found:
                return start + found[-1]
            if not checked and start > lo:
                with contextlib.suppress(hyperscan.ScanTerminated):  # on_first stops it at its first match
                    _scan(first, view[lo:start], on_first, self._scratch_for(first))
                if not found:
                    return None
                found.clear()
                checked = True
            top, size = start, size * 4
        return None

    def _databases_for_runs(self) -> tuple[hyperscan.Database | None, dict[int, tuple[hyperscan.Database, hyperscan.Database]]]:
        if self._run_databases is None:
            metric = [e for e in self.routine_expressions if e[0] not in self.progress_expressions]
            self._run_databases = (
                self._load_or_compile(metric, self.use_cache) if metric else None,
                {rid: (self._load_or_compile([line], self.use_cache), self._load_or_compile([first], self.use_cache))
                 for rid, (line, first) in self.progress_expressions.items()},
            )
        return self._run_databases

    def _scratch_for(self, db: hyperscan.Database) -> hyperscan.Scratch:
        """This thread's scratch space for one of the matcher's databases (hyperscan releases the GIL while it
        scans, so callers may scan on several threads)."""
        spaces: dict[int, hyperscan.Scratch] | None = getattr(self._local, "spaces", None)
        if spaces is None:
            spaces = self._local.spaces = {}
        scratch = spaces.get(id(db))
        if scratch is None:
            scratch = spaces[id(db)] = hyperscan.Scratch(db)
        return scratch

    def json_prefilter(self) -> hyperscan.Database:
        """Every expression of both databases (same ids) in the form `patterns.json_string_edges` gives
        it, for scanning raw one-line JSON values: built on first use, cached on disk like the others."""
        if self.json_prefilter_db is None:
            exprs = [(i, json_string_edges(p), f) for i, p, f in [*self.main_expressions, *self.routine_expressions]]
            # A `rootrank ship` batch (many lines in one value) must be decoded: its key reports it as a
            # hit (any main id counts as one; ids need not be unique).
            exprs.append((0, SHIP_BATCH_KEY, 0))
            self.json_prefilter_db = self._load_or_compile(exprs, self.use_cache)
        return self.json_prefilter_db

    def combined_database(self) -> hyperscan.Database | None:
        """Both databases' expressions (same ids) in one database, for large buffers (`COMBINED_SCAN_BYTES`):
        built on first use, cached on disk like the others; None without routine expressions."""
        if self.combined_db is None and self.routine_db is not None:
            self.combined_db = self._load_or_compile([*self.main_expressions, *self.routine_expressions], self.use_cache)
        return self.combined_db

    def scan_buffer(
        self, buf: Buffer, lo: int = 0, hi: int | None = None, *, frequent_cap: int = FREQUENT_CAP,
        raw: list[tuple[int, int]] | None = None,
    ) -> list[Hit]:
        """Matches in the newline-separated `buf[lo:hi]`, one Hit per (line, rule, role), in buffer
        order; offsets are positions in `buf`. `raw` is the result of `scan_raw` over the same range,
        when the caller already scanned it (on another thread).

        Progress markers ("end" of absence rules) can hit every training-step line. Per buffer only
        the latest `frequent_cap` are kept: absence rules ask "did this rank progress after the start".
        """
        hi = len(buf) if hi is None else hi
        if raw is None:
            raw = self.scan_raw(buf, lo, hi)
        frequent: dict[int, list[tuple[int, int]]] = {}
        plain: list[tuple[int, int]] = []
        is_frequent = self._frequent
        base, expand = self.routine_base, self.routine_expand
        if any(item[1] >= base for item in raw):
            raw = [(to, e) for to, rid in raw for e in (expand[rid - base] if rid >= base else (rid,))]
        for item in raw:
            if is_frequent[item[1]]:
                frequent.setdefault(item[1], []).append(item)
            else:
                plain.append(item)
        for expr_id, items in frequent.items():
            capped = len(items) > frequent_cap and self.exprs[expr_id].role == "end"
            plain.extend(items[-frequent_cap:] if capped else items)
        seen: set[tuple[int, int, str]] = set()
        out: list[Hit] = []
        exprs = self.exprs
        for to, expr_id in plain:
            expr = exprs[expr_id]
            probe = to - 1 if to > lo and buf[to - 1] == 10 else to  # a match that ends on the newline
            start = buf.rfind(b"\n", lo, max(probe, lo)) + 1 if probe > lo else lo
            start = max(start, lo)
            key = (start, expr.rule_index, expr.role)
            if key in seen:
                continue
            seen.add(key)
            end = buf.find(b"\n", probe, hi)
            out.append(Hit(start, hi if end < 0 else end, expr.rule_index, expr.role))
        out.sort(key=lambda h: (h.start, h.rule_index))
        return out

    def scan_lines(self, lines: Sequence[bytes]) -> list[tuple[int, Hit]]:
        """Hits for a batch of lines, joined and scanned once: (line index, hit)."""
        if not lines:
            return []
        buf = b"\n".join(lines)
        if buf.count(b"\n") == len(lines) - 1:
            return self.scan_joined(buf)
        # A line holds a newline itself: index by the lines' start offsets.
        starts = [0, *accumulate(len(line) + 1 for line in lines)]
        return [(bisect_right(starts, hit.start) - 1, hit) for hit in self.scan_buffer(buf)]

    def scan_joined(self, buf: bytes, *, raw: list[tuple[int, int]] | None = None) -> list[tuple[int, Hit]]:
        """Hits for lines joined with newlines, none holding one itself: (line index, hit). A hit's
        index is the number of newlines before it, counted on from the previous hit (hits come in
        buffer order), so no per-line offsets are built. `raw`: as for `scan_buffer`."""
        out: list[tuple[int, Hit]] = []
        index = previous = 0
        for hit in self.scan_buffer(buf, raw=raw):
            index += buf.count(b"\n", previous, hit.start)
            previous = hit.start
            out.append((index, hit))
        return out

    def extract(self, rule_index: int, text: str) -> dict[str, str]:
        """Named groups of the rule's patterns and `extract` regexes found in one line."""
        fields: dict[str, str] = {}
        compiled_list = self._extractors.get(rule_index)
        if compiled_list is None:
            compiled_list = self._extractors[rule_index] = self._compile_extractors(self.rules[rule_index])
        for compiled in compiled_list:
            m = compiled.search(text)
            if m:
                for name, value in m.groupdict().items():
                    if value is not None and name not in fields:
                        fields[name] = value
        return fields

    def field_regexes(self, rule_index: int, name: str) -> list[tuple[re.Pattern[str], str]]:
        """The rule's regexes that have the group `name`, in the order `extract` tries them."""
        compiled_list = self._extractors.get(rule_index)
        if compiled_list is None:
            compiled_list = self._extractors[rule_index] = self._compile_extractors(self.rules[rule_index])
        return [(compiled, name) for compiled in compiled_list if name in compiled.groupindex]

    def matches(self, rule_index: int, text: str) -> bool:
        """Whether one line matches the rule's main patterns (used by rule tests, not the hot path)."""
        return any(
            h.rule_index == rule_index and h.role == "main" for h in self.scan_buffer(text.encode("utf-8"))
        )


def trailing_numbers(buf: Buffer, ends: Sequence[int], starts: Sequence[int] | None = None) -> list[float] | None:
    """The number each metric match (ending at `ends`) ends with, read in bulk with C-level maps (see
    TRAILING_NUMBER); `starts`, when given, bound each window (its line's start). None when one of them is not
    a plain number or too long for the window (a terminator that is a sign, say): the caller then reads them
    one by one with the rule's regex."""
    lows = map(operator.sub, ends, repeat(NUMBER_WINDOW))
    windows = map(buf.__getitem__, map(slice, map(max, starts, lows) if starts is not None else map(max, lows, repeat(0)),
                                         ends))
    try:
        numbers = list(map(operator.itemgetter(-1), map(bytes.rsplit, map(bytes.translate, windows, repeat(_NUMBER_WORDS)),
                                                         repeat(None), repeat(1))))
        if max(map(len, numbers), default=0) >= NUMBER_WINDOW - 8:
            return None
        return list(map(float, numbers))
    except (IndexError, ValueError):
        return None


def _value_regex(pattern: str, field: str, caseless: bool) -> re.Pattern[bytes] | None:
    """A metric pattern as a bytes regex whose group `field` is the value (None: Python cannot compile it,
    and the value is read by the rule's extractors instead)."""
    try:
        compiled = re.compile(pattern.encode("utf-8"), re.IGNORECASE if caseless else 0)
    except re.error:
        return None
    return compiled if field in compiled.groupindex else None
