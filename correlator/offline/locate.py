"""Where an incident's evidence lines are: the file `diagnose` read each one from, and its line number.

The incident carries the lines themselves (the JSON contract has no file or line number); each signal
carries its `order`, which `Diagnoser` makes from the file's index among the sources and the line's
position in it: the byte offset of a plain-text line, the line index of a JSON-lines file (forwarder
messages). This module turns an order back into (file, line number), reading the files again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing

from correlator.diagnosis.models import Incident, Signal
from correlator.offline.diagnose import (
    _ORDER_STRIDE,
    CHUNK_BYTES,
    BinaryReader,
    DiagnoseStats,
    _looks_json_lines,
    iter_sources,
)

_READ = 4 << 20


def evidence_signals(incident: Incident, signals: Sequence[Signal]) -> list[Signal | None]:
    """For each evidence line of `incident`, the signal it was drawn from (the engine copies a signal's
    rule, line, rank and host into its evidence; the rank may be one the engine resolved from the job's
    identity tables, which the line's own signal does not carry); the earliest in the files when the same
    line recurs."""
    first: dict[tuple[str, str, int | None, str | None], Signal] = {}
    for s in signals:
        for key in ((s.rule_id, s.line, s.rank, s.host), (s.rule_id, s.line, None, s.host), (s.rule_id, s.line, None, None)):
            if key not in first or s.order < first[key].order:
                first[key] = s
    out: list[Signal | None] = []
    for e in incident.evidence:
        keys = ((e.rule, e.line, e.rank, e.host), (e.rule, e.line, None, e.host), (e.rule, e.line, None, None))
        out.append(next((first[k] for k in keys if k in first), None))
    return out


def line_numbers(paths: Sequence[str], orders: Iterable[int]) -> dict[int, tuple[str, int]]:
    """(file name as `iter_sources` gives it, 1-based line number) for each signal order of a diagnosis of
    `paths`; orders whose file cannot be read again are left out."""
    sources = list(iter_sources(paths, DiagnoseStats()))
    by_file: dict[int, list[int]] = defaultdict(list)
    for order in set(orders):
        by_file[order // _ORDER_STRIDE].append(order)
    found: dict[int, tuple[str, int]] = {}
    for index, members in by_file.items():
        if index >= len(sources) or sources[index].name == "<stdin>":
            continue
        source = sources[index]
        try:
            with closing(source.open()) as stream:
                head = stream.read(CHUNK_BYTES)  # as much as `diagnose` sniffs the format from
                if _looks_json_lines(head):
                    found.update((o, (source.name, o % _ORDER_STRIDE + 1)) for o in members)
                    continue
                for order, line in _count_lines(head, stream, sorted(o % _ORDER_STRIDE for o in members)):
                    found[index * _ORDER_STRIDE + order] = (source.name, line)
        except (OSError, EOFError):
            continue  # gone or unreadable since: no location, the evidence line itself is still shown
    return found


def _count_lines(head: bytes, stream: BinaryReader, offsets: list[int]) -> Iterator[tuple[int, int]]:
    """(offset, 1-based number of the line that holds it) for sorted byte offsets of a text stream."""
    base, newlines, data = 0, 0, head  # newlines: those before data[done]
    pending = iter(offsets)
    offset = next(pending, None)
    while offset is not None and data:
        done = 0
        while offset is not None and offset < base + len(data):
            newlines += data.count(b"\n", done, offset - base)
            done = offset - base
            yield offset, newlines + 1
            offset = next(pending, None)
        newlines += data.count(b"\n", done)
        base += len(data)
        data = stream.read(_READ)
