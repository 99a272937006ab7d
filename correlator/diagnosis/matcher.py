"""All rule patterns in one hyperscan database, scanned over whole buffers.

The hot path never scans per pattern or per line: callers hand over one buffer (a file chunk,
or a batch of lines joined with newlines) and get back (line, expression) hits. Named groups
and `extract` regexes run in Python only on the few lines that hit.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import threading
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

import hyperscan

from correlator.diagnosis.patterns import cache_dir, pattern_flags
from correlator.diagnosis.rules import Rule, RuleSet

ExprRole = Literal["main", "after", "end"]
# What the matcher scans: bytes, or an mmap of a whole file (diagnose scans regions of it in place).
Buffer = bytes | mmap.mmap

FREQUENT_CAP = 1024
SAMPLE_BLOCKS = 1024
SAMPLE_EVERY = 4
SAMPLE_MIN_BLOCK = 4096
SAMPLE_EXACT_BELOW = 1 << 20


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


class Matcher:
    """Compiled once per rule set (and cached on disk by the rule set's content hash)."""

    def __init__(self, ruleset: RuleSet, *, use_cache: bool = True) -> None:
        self.ruleset = ruleset
        self.rules: list[Rule] = [lr.rule for lr in ruleset.rules]
        self.exprs: list[Expr] = []
        main: list[tuple[int, bytes, int]] = []
        sampled: list[tuple[int, bytes, int]] = []
        for index, rule in enumerate(self.rules):
            groups: list[tuple[ExprRole, list[str]]] = [("main", rule.patterns)]
            if rule.sequence is not None:
                groups.append(("after", rule.sequence.after))
            if rule.absence is not None:
                groups.append(("end", rule.absence.end))
            for role, pats in groups:
                for pattern in pats:
                    frequent = (role == "end" and rule.absence is not None and rule.absence.progress) or (
                        rule.metric is not None and role == "main"
                    )
                    target = sampled if frequent else main
                    target.append((len(self.exprs), pattern.encode("utf-8"), pattern_flags(rule.caseless)))
                    self.exprs.append(Expr(index, role))
        self._frequent: list[bool] = [e.role == "end" for e in self.exprs]
        self._extractors: list[list[re.Pattern[str]]] = [self._compile_extractors(r) for r in self.rules]
        self.db = self._load_or_compile(main, use_cache)
        # Metric observations (a grad norm per step per rank) and progress markers (the "end" of
        # absence rules: a loss line) can be on most lines of a log. They are sampled: at most one
        # hit per pattern per sample block, found with SINGLEMATCH, which keeps both the scan
        # and the Python callbacks off the hot path. Failure signatures are never sampled.
        self.sampled_db = (
            self._load_or_compile([(i, p, f | hyperscan.HS_FLAG_SINGLEMATCH) for i, p, f in sampled], use_cache)
            if sampled else None
        )
        # Buffers below SAMPLE_EXACT_BELOW (a streaming batch, a small log) are scanned exactly.
        self.routine_db = self._load_or_compile(sampled, use_cache) if sampled else None
        self._local = threading.local()

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
            b"\0".join(patterns) + repr((ids, flags)).encode() + hyperscan.__version__.encode()
        ).hexdigest()[:20]
        path = cache_dir() / f"hs-{key}.db"
        if use_cache and path.exists():
            try:
                db = hyperscan.loadb(path.read_bytes(), hyperscan.HS_MODE_BLOCK)
                db.scratch = hyperscan.Scratch(db)  # a deserialized database comes without scratch space
                return db
            except Exception:
                pass  # a stale or torn cache file is rebuilt below
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(expressions=patterns, ids=ids, flags=flags)
        if use_cache:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_bytes(hyperscan.dumpb(db))
                tmp.replace(path)
            except OSError:
                pass  # a read-only home only costs the compile time
        return db

    def scan_raw(self, buf: Buffer, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
        """(end offset in `buf`, expression id) for every match in `buf[lo:hi]` (metric patterns: sampled
        per block). Safe to call from several threads at once: each scan uses its own scratch space."""
        hi = len(buf) if hi is None else hi
        hits: list[tuple[int, int]] = []
        if hi <= lo:
            return hits
        scratch = self._scratch()
        view = memoryview(buf)[lo:hi]  # no copy: hyperscan reads the caller's buffer (bytes or mmap)

        def on_match(expr_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            hits.append((lo + to, expr_id))

        self.db.scan(view, match_event_handler=on_match, scratch=scratch[0])  # type: ignore[type-var]
        if self.routine_db is not None and hi - lo < SAMPLE_EXACT_BELOW:
            self.routine_db.scan(view, match_event_handler=on_match, scratch=scratch[1])  # type: ignore[type-var]
        elif self.sampled_db is not None:
            self._scan_sampled(buf, lo, hi, view, hits, scratch[2])
        view.release()
        return hits

    def _scratch(self) -> tuple[hyperscan.Scratch, hyperscan.Scratch | None, hyperscan.Scratch | None]:
        """Scratch space for the three databases, one set per thread (hyperscan releases the GIL while
        it scans, so diagnose scans the next chunk on another thread)."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = (
                hyperscan.Scratch(self.db),
                hyperscan.Scratch(self.routine_db) if self.routine_db is not None else None,
                hyperscan.Scratch(self.sampled_db) if self.sampled_db is not None else None,
            )
            self._local.scratch = scratch
        return scratch

    def _scan_sampled(
        self, buf: Buffer, lo: int, hi: int, view: memoryview, hits: list[tuple[int, int]],
        scratch: hyperscan.Scratch | None,
    ) -> None:
        assert self.sampled_db is not None
        size = hi - lo
        # Blocks of about 1/SAMPLE_BLOCKS of the buffer; every SAMPLE_EVERY-th block is scanned, and
        # the last one always (the latest progress of each rank is what absence rules ask about).
        block = max(SAMPLE_MIN_BLOCK, size // SAMPLE_BLOCKS)
        tail_start = max(lo, buf.rfind(b"\n", lo, max(lo, hi - block)) + 1)
        start = lo
        index = 0
        while start < hi:
            end = buf.find(b"\n", min(start + block, hi), hi)
            end = hi if end < 0 else end
            if index % SAMPLE_EVERY == 0 or end >= tail_start:
                def on_match(
                    expr_id: int, _from: int, to: int, _flags: int, _ctx: object, base: int = start
                ) -> None:
                    hits.append((base + to, expr_id))

                self.sampled_db.scan(  # type: ignore[type-var]
                    view[start - lo : end - lo], match_event_handler=on_match, scratch=scratch
                )
            start = end + 1
            index += 1

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
        for item in raw:
            if is_frequent[item[1]]:
                frequent.setdefault(item[1], []).append(item)
            else:
                plain.append(item)
        for expr_id, items in frequent.items():
            if len(items) > frequent_cap:
                role = self.exprs[expr_id].role
                if role == "end":
                    items = items[-frequent_cap:]
            plain.extend(items)
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

    def scan_joined(self, buf: bytes) -> list[tuple[int, Hit]]:
        """Hits for lines joined with newlines, none holding one itself: (line index, hit). A hit's
        index is the number of newlines before it, counted on from the previous hit (hits come in
        buffer order), so no per-line offsets are built."""
        out: list[tuple[int, Hit]] = []
        index = previous = 0
        for hit in self.scan_buffer(buf):
            index += buf.count(b"\n", previous, hit.start)
            previous = hit.start
            out.append((index, hit))
        return out

    def extract(self, rule_index: int, text: str) -> dict[str, str]:
        """Named groups of the rule's patterns and `extract` regexes found in one line."""
        fields: dict[str, str] = {}
        for compiled in self._extractors[rule_index]:
            m = compiled.search(text)
            if m:
                for name, value in m.groupdict().items():
                    if value is not None and name not in fields:
                        fields[name] = value
        return fields

    def matches(self, rule_index: int, text: str) -> bool:
        """Whether one line matches the rule's main patterns (used by rule tests, not the hot path)."""
        return any(
            h.rule_index == rule_index and h.role == "main" for h in self.scan_buffer(text.encode("utf-8"))
        )
