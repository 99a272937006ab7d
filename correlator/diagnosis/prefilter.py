"""Which one-line JSON values of a batch can hit a rule, from one scan of the raw values.

Fluent Bit, Vector and Filebeat send one log line per Kafka message, as a JSON string inside an object:
`{"date":1733212345.1,"log":"[rank3]: iteration 812/ ...\\n","stream":"stderr"}`. Decoding every value
to scan its text costs more than everything else the match role does, and almost no value hits anything
but a routine (metric or progress) pattern. So the raw values of a batch are joined and scanned once, by
the matcher's patterns rewritten to see a JSON string's edges as line edges:

- `^` also accepts the `"` that opens the string and a `\\n` escape (the next line of a multi-line record),
  `$` the `"` that closes the string, after any `\\n` escapes (a Fluent Bit `log` ends with one);
  a `$` after `[^\n]*` is left alone: it already reaches the end of the value (`json_string_edges`, in
  `patterns.py` beside the matcher's other compile settings: the matcher compiles these expressions).

That scan finds a superset of the values whose decoded text hits: a value it does not report cannot hit,
and the values it reports are decoded and matched exactly, by the matcher's own databases. A value with
any other escape (`\\"`, `\\t`, `\\\\`, `\\uXXXX`, as in `\\u001b[31m` colour codes) could hide a match from
the raw scan, so it is not taken here (`one_line_json`): it is decoded before it is scanned.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import cast

import hyperscan
import simdjson

from correlator.diagnosis.framing import process_bytes
from correlator.diagnosis.matcher import Matcher
from ingest.decoders import DecodeError
from ingest.decoders.dispatch import TEXT_KEYS, decode_lines


def one_line_json(value: bytes) -> bool:
    """A JSON object on one line whose only escapes are `\\n`: the raw scan sees all of its text."""
    return (
        value[:2] == b'{"'
        and b"\n" not in value
        and value.count(b"\\") == value.count(b"\\n")
        and value.find(b'"rootrank"', 0, 4096) < 0  # a `rootrank ship` batch carries many lines
    )


# Fields of a forwarder's object that change from one line of a stream to the next (times, positions,
# journal cursors): left out of the bytes that say which stream a routine line belongs to.
_PER_LINE_FIELD = re.compile(
    rb'"(?:@timestamp|date|time|timestamp|ts|offset|_SOURCE_REALTIME_TIMESTAMP|_SOURCE_MONOTONIC_TIMESTAMP'
    rb'|__REALTIME_TIMESTAMP|__MONOTONIC_TIMESTAMP|__CURSOR|__SEQNUM)":(?:"[^"\n]*"|[^,}\]\n]*),?'
)
def _line_count(value: bytes) -> int:
    try:
        return len(decode_lines(value))
    except DecodeError:  # a value the decoder refuses is one line read, as the screen counts it
        return 1


# The keys the decoders take a line's text from, in their order (ingest/decoders/dispatch.py), as a string.
_TEXT_FIELDS = tuple(f'"{key}":"'.encode() for key in TEXT_KEYS)
# Larger values are decoded without a screen: a one-line record is far smaller, and a value this big is a
# `rootrank ship` batch (up to 256 KiB of lines, decoded column by column) or a message the decoder cuts.
SCREEN_MAX_VALUE_BYTES = 16 * 1024
_OTHER_ESCAPE = re.compile(rb"\\[^n]")  # any escape but \n (and a backslash escaped itself)
_INNER_NEWLINE = re.compile(rb'\\n(?!")')
_HEAD_BYTES = 16  # a text's first bytes that hold a rank prefix (`[rank12345]:`) whole


@dataclass
class Screened:
    """The outcome for one batch: `decode` are the positions to decode and match exactly (every value that
    is not one-line JSON among them); the `skipped` others were read and cannot give a signal."""

    decode: list[int]
    skipped: int = 0
    skipped_lines: int = 0


class JsonScreen:
    """Screens a batch of raw values with the matcher's `json_prefilter` database (one scan of the joined
    batch) and keeps, of the values whose only hits are routine (metric values, progress markers), those
    `SignalExtractor.from_texts` would keep from the whole batch: per routine pattern and stream, the
    latest progress line and the largest and smallest metric value. A routine line's stream is the bytes
    of its object around its text, without the per-line fields, and the process its prefixes name: never
    coarser than the record's (host, rank, file, stream) and the line's process, so nothing the extractor
    keeps is dropped; finer only costs a decode."""

    def __init__(self, matcher: Matcher, *, max_value_bytes: int) -> None:
        self.matcher = matcher
        self.max_value_bytes = max_value_bytes
        self.scratch: hyperscan.Scratch | None = None
        self.validator = simdjson.Parser()
        self._heads: dict[bytes, bytes] = {}  # a text's first _HEAD_BYTES -> the process bytes its rank prefix gives

    def screen(self, values: Sequence[bytes | None]) -> Screened:
        everything = Screened(list(range(len(values))))
        picked = self._one_line_json(values)
        if picked is None:
            return everything
        positions, raw, joined = picked
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:
            return everything  # the decoder sorts out (and dead-letters) the bad value
        broken = self._broken_json(raw, joined)
        starts = list(accumulate(map((1).__add__, map(len, raw)), initial=0))  # value k: starts[k] .. starts[k+1]-1
        routine_base = self.matcher.routine_base
        found: list[tuple[int, int]] = []  # (end, expression id) of each match, in buffer order
        add = found.append

        def on_match(expr_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            add((to, expr_id))

        database = self.matcher.json_prefilter()
        if self.scratch is None:
            self.scratch = hyperscan.Scratch(database)
        database.scan(joined, match_event_handler=on_match, scratch=self.scratch)
        # Each match's value, then the values with a hit that is not routine, and the others' routine hits.
        hard: set[int] = set()
        routine: dict[int, list[tuple[int, int]]] = {}
        value_at = [bisect_right(starts, to - 1) - 1 for to, _ in found]
        for at, (to, expr_id) in zip(value_at, found, strict=True):
            if expr_id < routine_base:
                hard.add(at)
            elif at in routine:
                routine[at].append((to, expr_id))
            else:
                routine[at] = [(to, expr_id)]
        chosen = broken | hard | self._routine_winners(joined, starts, {at: h for at, h in routine.items() if at not in hard})
        decode = set() if len(positions) == len(values) else set(range(len(values))).difference(positions)
        decode.update(positions[at] for at in chosen)
        skipped = len(positions) - len(chosen)
        return Screened(sorted(decode), skipped, skipped + self._extra_lines(joined, starts, raw, chosen))

    @staticmethod
    def _extra_lines(joined: bytes, starts: list[int], raw: Sequence[bytes], chosen: set[int]) -> int:
        """Lines of the skipped values beyond one each, as the decoder counts them: a value with a `\n`
        escape that does not just end its string (a multi-line record) is decoded to count its lines."""
        multi = {bisect_right(starts, m.start()) - 1 for m in _INNER_NEWLINE.finditer(joined)} - chosen
        return sum(_line_count(raw[at]) - 1 for at in multi)

    def _broken_json(self, raw: Sequence[bytes], joined: bytes) -> set[int]:
        """Positions of the values that are not valid JSON (the decoder dead-letters them with the reason).
        The whole batch is validated as one array by simdjson, which checks without building objects;
        value by value only when that fails."""
        try:
            document = self.validator.parse(b"[" + joined.replace(b"\n", b",") + b"]")
        except ValueError:
            pass
        else:
            del document  # the parser is reused: no proxy may outlive the call
            return set()
        broken: set[int] = set()
        for at, value in enumerate(raw):
            try:
                document = self.validator.parse(value)
            except ValueError:
                broken.add(at)
            else:
                del document
        return broken

    def _one_line_json(self, values: Sequence[bytes | None]) -> tuple[list[int], list[bytes], bytes] | None:
        """(positions, their values, the values joined), or None when no value is one-line JSON. The whole
        batch is checked at once first: forwarders send one shape."""
        n = len(values)
        limit = min(self.max_value_bytes, SCREEN_MAX_VALUE_BYTES)
        whole = cast("Sequence[bytes]", values) if n and None not in values else None  # no None: checked
        if whole is not None and max(map(len, whole)) <= limit:
            joined = b"\n".join(whole)
            # Whether each value is a JSON object is left to the validation (`_broken_json`): a value that is
            # not is decoded, as any other.
            # A `rootrank ship` batch is reported by the scan itself (Matcher.json_prefilter).
            if joined.count(b"\n") == n - 1:
                other = _OTHER_ESCAPE.search(joined)
                if other is None:
                    return list(range(n)), list(whole), joined
                # A few values with another escape (a traceback's quoted file names): those are decoded, the
                # rest screened, without a look at each value.
                starts = list(accumulate(map((1).__add__, map(len, whole)), initial=0))
                escaped = {bisect_right(starts, m.start()) - 1 for m in _OTHER_ESCAPE.finditer(joined, other.start())}
                positions = [i for i in range(n) if i not in escaped]
                if not positions:
                    return None
                raw = [whole[i] for i in positions]
                return positions, raw, b"\n".join(raw)
        positions = [i for i, v in enumerate(values) if v is not None and len(v) <= limit and one_line_json(v)]
        if not positions:
            return None
        raw = [v for i in positions if (v := values[i]) is not None]  # all of them: positions hold no None
        return positions, raw, b"\n".join(raw)

    def _routine_winners(self, scanned: bytes, starts: list[int], routine_only: dict[int, list[tuple[int, int]]]) -> set[int]:
        winners: set[int] = set()
        ats = list(routine_only)
        if not ats:
            return winners
        find, cut = scanned.find, scanned.__getitem__
        begins = [starts[at] for at in ats]
        ends = [starts[at + 1] - 1 for at in ats]
        # Each value's text: its opening and closing quote (lo, hi), and a `\n` escape in it, found for all the
        # values at once (one forwarder's values put their text under the same key).
        los = [-1] * len(ats)
        for key in _TEXT_FIELDS:
            missing = [k for k, lo in enumerate(los) if lo < 0]
            if not missing:
                break
            shift = len(key) - 1
            for k, lo in zip(missing, map(find, repeat(key), [begins[k] for k in missing], [ends[k] for k in missing]),
                             strict=True):
                if lo >= 0:
                    los[k] = lo + shift
        after = [lo + 1 for lo in los]
        his = list(map(find, repeat(b'"'), after, ends))
        newlines = list(map(find, repeat(b"\\n"), after, his))
        # A text's first bytes, when they are a prefix naming a rank (`[rank37]:`), say its process: looked at once
        # per distinct first bytes.
        firsts = list(map(cut, map(slice, after, map(min, map((_HEAD_BYTES).__add__, after), his))))
        heads = self._heads
        positions: list[int] = []
        bounds: list[tuple[int, int]] = []  # (opening quote, closing quote) of each line's text
        outsides: list[bytes] = []
        for k, at in enumerate(ats):
            lo, hi, newline = los[k], his[k], newlines[k]
            # The routine match in the text, and the text one line (a Fluent Bit `log` ends with a \n):
            # else the extractor decides.
            if lo < 0 or not lo < routine_only[at][0][0] - 1 <= hi or (newline >= 0 and newline != hi - 2):
                winners.add(at)
                continue
            positions.append(at)
            bounds.append((lo, hi))
            # The stream is the bytes around the text and the process the text's prefixes name (the
            # extractor folds per stream and process).
            process = heads.get(firsts[k])
            if process is None:
                process = process_bytes(scanned, lo + 1, hi)
                # Named by a prefix held whole in the first bytes: the same for the same first bytes.
                if process[:2] != b"\0\0" and len(process) <= len(firsts[k]) + 1:
                    if len(heads) > 1 << 16:
                        heads.clear()
                    heads[firsts[k]] = process
            outsides.append(cut(slice(begins[k], lo)) + cut(slice(hi + 1, ends[k])) + process)
        if not positions:
            return winners
        streams = _PER_LINE_FIELD.sub(b"", b"\n".join(outsides)).split(b"\n")
        if len(streams) != len(positions):  # a newline escape outside the text: one by one
            streams = [_PER_LINE_FIELD.sub(b"", outside) for outside in outsides]
        base = self.matcher.routine_base
        is_metric, value_of = self.matcher.routine_metric, self.matcher.routine_value
        progress: list[tuple[int, bytes]] = []  # (routine id, stream) of each progress hit, in buffer order
        progress_at: list[int] = []
        highest: dict[tuple[int, bytes], tuple[float, int]] = {}
        lowest: dict[tuple[int, bytes], tuple[float, int]] = {}
        for at, (lo, hi), stream in zip(positions, bounds, streams, strict=True):
            for _, rid in routine_only[at]:
                if not is_metric[rid - base]:
                    progress.append((rid, stream))
                    progress_at.append(at)
                    continue
                regex, name = value_of[rid - base]
                found = regex.search(scanned, lo + 1, hi) if regex is not None else None
                if found is None or found.group(name) is None:
                    winners.add(at)
                    continue
                try:
                    value = float(found.group(name))
                except ValueError:
                    value = math.inf
                if math.isnan(value):
                    value = math.inf  # as SignalExtractor.metric_value: abnormal by itself, kept
                pair = (rid, stream)
                high = highest.get(pair)
                if high is None or value >= high[0]:
                    highest[pair] = (value, at)
                low = lowest.get(pair)
                if low is None or value < low[0]:
                    lowest[pair] = (value, at)
        latest = dict(zip(progress, progress_at, strict=True))  # in buffer order: the last one is the latest
        winners.update(latest.values())
        winners.update(at for _, at in highest.values())
        winners.update(at for _, at in lowest.values())
        return winners
