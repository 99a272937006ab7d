"""Where an incident's evidence lines are: the file `diagnose` read each one from, and its line number.

The incident carries the lines themselves (the JSON contract has no file or line number); each signal
carries its `order`, which `Diagnoser` makes from the file's key (its name and first line: ingest/order.py)
and the line's position in it: the byte offset of a plain-text line, the line index of a JSON-lines or
rsyslog file (forwarder messages). This module turns an order back into (file, line number), reading the
files again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing

from correlator.diagnosis.models import Incident, Signal
from correlator.offline.diagnose import (
    CHUNK_BYTES,
    BinaryReader,
    DiagnoseStats,
    _looks_like_records,
    iter_sources,
    source_key,
)
from ingest.order import key_of_order, line_order, message_position, position_of_order, record_key

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
    by_file: dict[int, list[int]] = defaultdict(list)
    for order in set(orders):
        by_file[key_of_order(order)].append(order)
    found: dict[int, tuple[str, int]] = {}
    for source in iter_sources(paths, DiagnoseStats()):
        if not by_file or source.name == "<stdin>":
            continue
        try:
            with closing(source.open()) as stream:
                head = stream.read(CHUNK_BYTES)  # as much as `diagnose` sniffs the format from
                if _looks_like_records(head):
                    found.update(_records_lines(source.name, head, stream, by_file))
                    continue
                key = source_key(source.name, head)
                members = by_file.pop(key, None)  # the first file of a key: as `diagnose` read them, in order
                if members is None:
                    continue
                positions = sorted(position_of_order(o) for o in members)
                for position, line in _count_lines(head, stream, positions):
                    found[line_order(key, position)] = (source.name, line)
        except (OSError, EOFError):
            continue  # gone or unreadable since: no location, the evidence line itself is still shown
    return found


def _records_lines(name: str, head: bytes, stream: BinaryReader,
                   by_file: dict[int, list[int]]) -> Iterator[tuple[int, tuple[str, int]]]:
    """A forwarder's file (JSON lines, rsyslog): its records ordered as `diagnose` ordered them (by the stream
    each names, ingest/order.py), read again to find the wanted orders' lines."""
    from ingest.decoders import DecodeError, decode_value

    wanted = {o for members in by_file.values() for o in members}
    data, lineno = head, 0
    carry = b""
    while (data or carry) and wanted:
        lines = (carry + data).split(b"\n")
        carry = lines.pop() if data else b""  # the last line may go on in the next read
        for line in lines:
            if line.strip():
                try:
                    records = decode_value(line)
                except DecodeError:
                    records = []
                for index, record in enumerate(records):
                    position = record.offset if record.offset is not None else message_position(lineno, index)
                    order = line_order(record_key(record.file, record.host), position)
                    if order in wanted:
                        wanted.discard(order)
                        yield order, (name, lineno + 1)
            lineno += 1
        data = stream.read(_READ) if data else b""


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
