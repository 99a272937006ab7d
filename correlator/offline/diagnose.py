"""`rootrank diagnose`: the streaming engine, run offline over files.

Plain-text logs are scanned in large chunks straight from disk (one hyperscan scan per chunk); only
the lines that hit a rule are decoded into events. JSON-lines files written by forwarders go through
the same decoders the streaming worker uses.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import io
import mmap
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from correlator.diagnosis.engine import Engine, JobState
from correlator.diagnosis.engine.keys import sort_key
from correlator.diagnosis.matcher import Buffer, Hit, Matcher
from correlator.diagnosis.models import Incident, Signal
from correlator.diagnosis.routine_fold import merge_metric_signals, metric_of
from correlator.diagnosis.rules import RuleSet, load_ruleset
from correlator.diagnosis.signals import SignalExtractor, best_hits_per_line
from correlator.offline.routine import RoutineAggregate, RoutineAggregator
from ingest.event import LogEvent
from ingest.multiline import is_continuation, split_glued
from ingest.prefixes import Identity, identity_from_path, parse_prefixes

if TYPE_CHECKING:
    import multiprocessing.pool

    from _typeshed import WriteableBuffer

CHUNK_BYTES = 16 * 1024 * 1024
SNIFF_BYTES = 64 * 1024  # a plain file's first bytes, that tell binary data and forwarder JSON from a log
# With several scan processes (`jobs`), a plain file from PARALLEL_BYTES on is mapped and cut into regions of
# about size / (2 x jobs) (two regions a process, so one slower region does not leave a process idle), at
# least MIN_REGION_BYTES and at most CHUNK_BYTES; with one, regions of CHUNK_BYTES from CHUNK_BYTES on.
PARALLEL_BYTES = 8 * 1024 * 1024
MIN_REGION_BYTES = 2 * 1024 * 1024
CONTINUATION_LOOKBACK = 64
_ORDER_STRIDE = 10**12  # orders of different files never interleave when no timestamps exist


class InputError(Exception):
    """A path that cannot be read; the message says what to do."""


@dataclass
class DiagnoseStats:
    files: int = 0
    bytes: int = 0
    lines_hit: int = 0
    signals: int = 0
    skipped: list[str] = field(default_factory=list)
    decode_errors: int = 0


class BinaryReader(Protocol):
    """What diagnose reads an input with: a file opened "rb", a gzip file, standard input's buffer."""

    def read(self, size: int = -1, /) -> bytes: ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...


@dataclass
class Source:
    name: str
    size: int | None
    open: Callable[[], BinaryReader]
    path: Path | None = None  # a plain file on disk: mapped and scanned in place, in parallel


def _open_file(path: Path) -> BinaryReader:
    return open(path, "rb")


def _open_gzip(path: Path) -> BinaryReader:
    import gzip  # only for compressed input

    return gzip.open(path, "rb")


def iter_sources(paths: Sequence[str], stats: DiagnoseStats) -> Iterator[Source]:
    for raw in paths:
        if raw == "-":
            yield Source("<stdin>", None, lambda: sys.stdin.buffer)
            continue
        path = Path(raw)
        if not path.exists():
            raise InputError(f"{raw}: no such file or directory")
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            if not files:
                stats.skipped.append(f"{raw}: folder has no files")
        else:
            files = [path]
        for f in files:
            if not os.access(f, os.R_OK):
                stats.skipped.append(f"{f}: not readable (permission denied)")
                continue
            size = f.stat().st_size
            if f.suffix == ".gz":
                yield Source(str(f), size, functools.partial(_open_gzip, f))
            else:
                yield Source(str(f), size, functools.partial(_open_file, f), f)


def looks_binary(head: bytes) -> bool:
    """What `diagnose` skips as binary, from a file's first bytes: a NUL, or under 85% text-like bytes."""
    if b"\0" in head[:8192]:
        return True
    sample = head[:8192]
    if not sample:
        return False
    text_like = sum(1 for b in sample if b >= 32 or b in (9, 10, 13, 27))
    return text_like / len(sample) < 0.85


def _looks_json_lines(head: bytes) -> bool:
    """Forwarder output, one JSON object a line: `{"` or `{}` first, as the decoders tell a JSON object. A
    dict a training script prints (`{'loss': 1.2, ...}`, HF Trainer's log) starts a plain log."""
    stripped = head.lstrip()
    if not stripped.startswith(b"{") or stripped[1:64].lstrip()[:1] not in (b'"', b"}"):
        return False
    return b"}\n" in head[:65536] or head.rstrip().endswith(b"}")


class Diagnoser:
    """Reusable: compiles the matcher once, diagnoses any number of path sets."""

    def __init__(self, ruleset: RuleSet | None = None, *, matcher: Matcher | None = None, jobs: int = 1) -> None:
        """`jobs`: processes that scan a large plain file's chunks at once (forked from this one, so
        only a caller that runs no other threads should ask for more than 1: the CLI does)."""
        self.jobs = max(1, jobs)
        self.ruleset = ruleset or load_ruleset()
        self.matcher = matcher or Matcher(self.ruleset)
        self.extractor = SignalExtractor(self.ruleset, self.matcher)
        self.engine = Engine(self.ruleset)
        self.routine = RoutineAggregator(self.matcher, _identify_line)
        self._pool: multiprocessing.pool.Pool | None = None  # the scan processes of one signals_from_paths call

    # --- reading ------------------------------------------------------------------------

    def signals_from_paths(
        self,
        paths: Sequence[str],
        job_id: str,
        stats: DiagnoseStats,
        progress: Callable[[int], None] | None = None,
    ) -> list[Signal]:
        try:
            signals = self._signals_of_sources(paths, job_id, stats, progress)
        finally:
            if self._pool is not None:  # the scan processes serve every file of the call, then go
                self._pool.terminate()
                self._pool = None
        stats.signals = len(signals)
        return signals

    def _signals_of_sources(self, paths: Sequence[str], job_id: str, stats: DiagnoseStats,
                            progress: Callable[[int], None] | None) -> list[Signal]:
        signals: list[Signal] = []
        for file_index, source in enumerate(iter_sources(paths, stats)):
            try:
                stream = source.open()
            except OSError as exc:
                stats.skipped.append(f"{source.name}: cannot open ({exc.strerror or exc})")
                continue
            try:
                signals.extend(self.signals_from_stream(source, stream, job_id, file_index, stats, progress))
            except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
                stats.skipped.append(f"{source.name}: read failed ({exc})")
            finally:
                if stream is not sys.stdin.buffer:
                    stream.close()
        return signals

    def signals_from_stream(
        self,
        source: Source,
        stream: BinaryReader,
        job_id: str,
        file_index: int,
        stats: DiagnoseStats,
        progress: Callable[[int], None] | None,
    ) -> list[Signal]:
        # A plain file is sniffed from its first SNIFF_BYTES (it may be mapped, not read); other input from
        # its first chunk. A file that starts like JSON with no line end in the sniff is told from its first
        # chunk, as before there was a sniff.
        head = stream.read(SNIFF_BYTES if source.path is not None else CHUNK_BYTES)
        if len(head) == SNIFF_BYTES and source.path is not None and head.lstrip()[:1] == b"{" and b"}\n" not in head:
            head += stream.read(CHUNK_BYTES - len(head))
        if looks_binary(head):
            stats.skipped.append(f"{source.name}: binary data, skipped")
            return []
        stats.files += 1
        path_hints = identity_from_path(source.name) if source.name != "<stdin>" else {}
        if _looks_json_lines(head):
            return self.signals_from_json_lines(source, stream, head, job_id, file_index, stats, progress)
        if source.path is not None and self._mapped_from() <= (source.size or 0):
            try:
                mapped = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError, io.UnsupportedOperation):
                mapped = None  # not mappable (a FIFO, /proc): read it in chunks like a stream
            if mapped is not None:
                with mapped:
                    return self._signals_from_mapped(source, mapped, path_hints, job_id, file_index, stats, progress)
        if source.path is not None and SNIFF_BYTES == len(head) < CHUNK_BYTES:
            head += stream.read(CHUNK_BYTES - len(head))  # the first chunk, as for any other input
        out: list[Signal] = []
        routine: list[Signal] = []
        carry = b""
        base = 0  # byte offset of `buf` in the file
        chunk = head
        while chunk:
            buf = carry + chunk
            cut = buf.rfind(b"\n") + 1
            nxt = stream.read(CHUNK_BYTES)
            if not nxt:
                cut = len(buf)
            body, carry = buf[:cut], buf[cut:]
            signals, lines_hit, acc = self._scan_region(body, 0, len(body), base, source.name, path_hints, job_id, file_index)
            out.extend(signals)
            # A chunk is gone once scanned: its routine winners become signals now, merged per process below.
            routine.extend(self._routine_signals(body, len(body), acc, base, source.name, path_hints, job_id, file_index))
            stats.lines_hit += lines_hit + acc.lines
            base += len(body)
            stats.bytes += len(chunk)
            if progress:
                progress(len(chunk))
            chunk = nxt
        if carry:
            signals, lines_hit, acc = self._scan_region(carry, 0, len(carry), base, source.name, path_hints, job_id, file_index)
            out.extend(signals)
            routine.extend(self._routine_signals(carry, len(carry), acc, base, source.name, path_hints, job_id, file_index))
            stats.lines_hit += lines_hit + acc.lines
        out.extend(_merge_routine(routine))
        return out

    def _signals_from_mapped(
        self,
        source: Source,
        mapped: mmap.mmap,
        path_hints: dict[str, str | int],
        job_id: str,
        file_index: int,
        stats: DiagnoseStats,
        progress: Callable[[int], None] | None,
    ) -> list[Signal]:
        """A plain file, mapped: its regions are scanned in place (no copies), by `jobs` processes at once:
        this one and `jobs - 1` forked ones, this one taking every `jobs`-th region while they scan the others.
        Every offset is a file offset, so a traceback's owner is found across region edges."""
        regions = _regions(mapped, self.region_bytes(len(mapped)))
        tasks = [(str(source.path), lo, hi, source.name, path_hints, job_id, file_index) for lo, hi in regions]
        results: list[tuple[list[Signal], int, RoutineAggregate] | None] = [None] * len(regions)
        theirs = [i for i in range(len(regions)) if i % self.jobs] if len(regions) > 1 else []
        pending = None
        if theirs:
            if self._pool is None:
                self.matcher.combined_database()  # built (or read from disk) once, before the processes fork
                self._pool = _fork_pool(self, self.jobs - 1)
            pending = self._pool.map_async(_scan_region_task, [tasks[i] for i in theirs], chunksize=1)
        for i in range(0, len(regions), self.jobs if theirs else 1):
            lo, hi = regions[i]
            results[i] = self._scan_region(mapped, lo, hi, 0, source.name, path_hints, job_id, file_index)
            if progress:
                progress(hi - lo)
        if pending is not None:
            for i, scanned in zip(theirs, pending.get(), strict=True):
                results[i] = scanned
                if progress:
                    progress(regions[i][1] - regions[i][0])
        out: list[Signal] = []
        routine = RoutineAggregate()
        for (lo, hi), result in zip(regions, results, strict=True):
            assert result is not None  # every region was scanned above
            signals, lines_hit, acc = result
            out.extend(signals)
            routine.merge(acc)
            stats.lines_hit += lines_hit + acc.lines
            stats.bytes += hi - lo
        # The whole file is mapped here: routine winners of every region are read from it once.
        out.extend(self._routine_signals(mapped, len(mapped), routine, 0, source.name, path_hints, job_id, file_index))
        return out

    def _mapped_from(self) -> int:
        """The size from which a plain file is mapped and scanned in regions (see PARALLEL_BYTES)."""
        return min(CHUNK_BYTES, PARALLEL_BYTES) if self.jobs > 1 else CHUNK_BYTES

    def region_bytes(self, size: int) -> int:
        """The size of the regions a mapped file of `size` bytes is scanned in (see PARALLEL_BYTES)."""
        if self.jobs <= 1:
            return CHUNK_BYTES
        return min(CHUNK_BYTES, max(MIN_REGION_BYTES, -(-size // (2 * self.jobs))))

    def _scan_region(
        self,
        body: Buffer,
        lo: int,
        hi: int,
        base: int,
        name: str,
        path_hints: dict[str, str | int],
        job_id: str,
        file_index: int,
    ) -> tuple[list[Signal], int, RoutineAggregate]:
        """Signals of the lines in `body[lo:hi]` that hit a failure rule, how many lines those are, and
        the region's routine lines aggregated per process; `base` + a position in `body` is the file offset."""
        acc = RoutineAggregate()
        # A region's hits are hundreds of thousands of small tuples: the cyclic collector would walk them
        # over and over while they are built, and none of them forms a cycle.
        collecting = gc.isenabled()
        gc.disable()
        try:
            main, routine_hits = self.matcher.scan_grouped(body, lo, hi)
            if routine_hits:
                self.routine.add(body, lo, hi, routine_hits, acc)
            del routine_hits
        finally:
            if collecting:
                gc.enable()
        if not main:
            return [], 0, acc
        hits = self.matcher.scan_buffer(body, lo, hi, raw=main)
        pairs = best_hits_per_line([(h.start, h) for h in hits], self.matcher.rules)
        out: list[Signal] = []
        lines_hit = 0
        cache: dict[int, tuple[LogEvent, str, bool]] = {}
        for start, hit in pairs:
            if start not in cache:
                lines_hit += 1
                cache[start] = self._event_for_line(body, hit, base, name, path_hints, job_id)
            event, raw, borrowed = cache[start]
            out.append(self.extractor.signal_for(event, hit, file_index * _ORDER_STRIDE + base + start, raw=raw,
                                                 time_borrowed=borrowed))
        return out, lines_hit, acc

    def _routine_signals(
        self,
        body: Buffer,
        hi: int,
        acc: RoutineAggregate,
        base: int,
        name: str,
        path_hints: dict[str, str | int],
        job_id: str,
        file_index: int,
    ) -> list[Signal]:
        """One signal per rule and process for routine lines: the latest progress line (latest first, so
        the engine's cap on markers per rule keeps the latest without evicting), the largest metric value
        with the smallest in `metric_min`."""
        progress: list[Signal] = []
        metric: list[Signal] = []
        for hit, low in self.routine.winners(body, hi, acc):
            event, raw, borrowed = self._event_for_line(body, hit, base, name, path_hints, job_id)
            signal = self.extractor.signal_for(event, hit, file_index * _ORDER_STRIDE + base + hit.start, raw=raw,
                                               time_borrowed=borrowed)
            if low is not None and "metric" in signal.fields:
                signal = signal.model_copy(update={"fields": {**signal.fields, "metric_min": low}})
                metric.append(signal)
            else:
                progress.append(signal)
        return _latest_first(progress) + metric

    def _identify(self, raw: str) -> Identity:
        """Identity of one line: a syslog header (host, time) when the file is rsyslog text, then prefixes.

        Memoized: looking back for a timestamp or a traceback's owner revisits the same lines.
        """
        return _identify_line(raw)

    def _event_for_line(
        self, body: Buffer, hit: Hit, base: int, name: str, path_hints: dict[str, str | int], job_id: str
    ) -> tuple[LogEvent, str, bool]:
        """The line's event, its text as scanned, and whether its time was borrowed from an earlier line."""
        raw = body[hit.start : hit.end].decode("utf-8", "replace").rstrip("\r")
        if "\r" in raw or "|" in raw:
            segments = split_glued(raw)
            if len(segments) > 1:
                rule_index = hit.rule_index
                raw = next((s for s in segments if self.matcher.matches(rule_index, s)), segments[-1])
        ident = self._identify(raw)
        if ident.rank is None and ident.host is None and ident.pid is None and ident.local_rank is None:
            ident = self._continued_identity(body, hit.start, ident)
        ts = ident.ts if ident.ts is not None else self._earlier_time(body, hit.start)
        event = LogEvent(
            job_id=job_id,
            host=ident.host or _str_or_none(path_hints.get("host")),
            rank=ident.rank if ident.rank is not None else _int_or_none(path_hints.get("rank")),
            local_rank=ident.local_rank if ident.local_rank is not None else _int_or_none(path_hints.get("local_rank")),
            pid=ident.pid,
            gpu=ident.gpu,
            ts=ts,
            attempt=_int_or_none(path_hints.get("attempt")),
            source="plain",
            file=name,
            offset=base + hit.start,
            line=ident.text,
        )
        return event, raw, ident.ts is None and ts is not None

    @staticmethod
    def _lines_before(body: Buffer, start: int) -> Iterator[str]:
        """The lines before offset `start`, closest first, at most CONTINUATION_LOOKBACK of them."""
        pos = start
        for _ in range(CONTINUATION_LOOKBACK):
            if pos <= 0:
                return
            prev_start = body.rfind(b"\n", 0, pos - 1) + 1
            yield body[prev_start : pos - 1].decode("utf-8", "replace")
            pos = prev_start

    def _earlier_time(self, body: Buffer, start: int) -> datetime | None:
        """An untimed line (a traceback's last line) happened at about the time of the closest timed line before it."""
        for prev in self._lines_before(body, start):
            ts = self._identify(prev).ts
            if ts is not None:
                return ts
        return None

    def _continued_identity(self, body: Buffer, start: int, ident: Identity) -> Identity:
        """A traceback's last line has no prefix: take the identity of the record it continues.

        Only a line that continues something (indented, a frame, or the exception after frames)
        inherits; a launcher's own line right after a rank's line does not.
        """
        end = body.find(b"\n", start)
        current_continues = is_continuation(body[start : end if end >= 0 else len(body)].decode("utf-8", "replace"))
        for n, prev in enumerate(self._lines_before(body, start)):
            if not prev.strip():
                break
            if n == 0 and not (current_continues or is_continuation(prev)):
                break
            prev_ident = self._identify(prev)
            if prev_ident.rank is not None or prev_ident.host is not None or prev_ident.pid is not None:
                return dataclasses.replace(
                    prev_ident,
                    text=ident.text,
                    ts=ident.ts or prev_ident.ts,
                    ts_has_date=ident.ts_has_date if ident.ts else prev_ident.ts_has_date,
                )
            if not is_continuation(prev):
                break
        return ident

    def signals_from_json_lines(
        self,
        source: Source,
        stream: BinaryReader,
        head: bytes,
        job_id: str,
        file_index: int,
        stats: DiagnoseStats,
        progress: Callable[[int], None] | None,
    ) -> list[Signal]:
        from ingest.decoders import (  # the forwarders' formats: JSON input only
            DecodeError,
            decode_value,
            to_event,
        )

        out: list[Signal] = []
        events: list[LogEvent] = []
        reader = io.BufferedReader(_Prepend(head, stream))
        for lineno, line in enumerate(reader):
            stats.bytes += len(line)
            if progress:
                progress(len(line))
            if not line.strip():
                continue
            try:
                records = decode_value(line.rstrip(b"\n"))
            except DecodeError:
                stats.decode_errors += 1
                continue
            events.extend(to_event(record, default_job=job_id, offset=lineno) for record in records)
            if len(events) >= 4096:
                out.extend(self._from_events(events, job_id, file_index))
                events = []
        if events:
            out.extend(self._from_events(events, job_id, file_index))
        return out

    def _from_events(self, events: list[LogEvent], job_id: str, file_index: int) -> list[Signal]:
        # All given paths form one job, whatever job the forwarder's fields name.
        same_job = [e if e.job_id == job_id else e.model_copy(update={"job_id": job_id}) for e in events]
        return self.extractor.from_events(same_job, order_base=file_index * _ORDER_STRIDE)

    # --- diagnosing ---------------------------------------------------------------------

    def diagnose(
        self,
        paths: Sequence[str],
        job_id: str | None = None,
        *,
        stats: DiagnoseStats | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[list[Incident], list[Signal]]:
        stats = stats or DiagnoseStats()
        job = job_id or default_job_id(paths)
        signals = self.signals_from_paths(paths, job, stats, progress)
        state = JobState(job_id=job)
        state.add_all(signals)
        return self.engine.diagnose(state), signals


class _Prepend(io.RawIOBase):
    """A stream that yields `head` first, then the rest of `stream` (the head was read to sniff the format)."""

    def __init__(self, head: bytes, stream: BinaryReader) -> None:
        self.head = memoryview(head)  # read from `at` on: a slice per read would copy the rest of the head
        self.at = 0
        self.rest = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        b = memoryview(buffer).cast("B")
        if self.at < len(self.head):
            n = min(len(b), len(self.head) - self.at)
            b[:n] = self.head[self.at : self.at + n]
            self.at += n
            return n
        data = self.rest.read(len(b))
        b[: len(data)] = data
        return len(data)


def default_jobs() -> int:
    """Scan processes for the CLI: one per CPU this process may run on, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


def default_job_id(paths: Sequence[str]) -> str:
    for raw in paths:
        if raw == "-":
            continue
        hints = identity_from_path(raw)
        if hints.get("job_id"):
            return str(hints["job_id"])
        name = Path(raw).name
        for suffix in (".gz", ".log", ".txt", ".out", ".jsonl", ".json"):
            name = name.removesuffix(suffix)
        return name or "job"
    return "stdin"


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


@functools.cache
def _default_diagnoser() -> Diagnoser:
    return Diagnoser()


def diagnose_paths(paths: list[str], job_id: str | None = None) -> list[Incident]:
    """Library entry point: the incidents of the job formed by `paths`, primary first."""
    incidents, _ = _default_diagnoser().diagnose(paths, job_id)
    return incidents


@functools.cache
def _decoders() -> ModuleType:
    """The forwarders' decoders, imported by the first line that may be an rsyslog line, not at start-up."""
    import ingest.decoders

    return ingest.decoders


@functools.lru_cache(maxsize=8192)
def _identify_line(raw: str) -> Identity:
    """Identity of one line (see Diagnoser._identify)."""
    host: str | None = None
    header_ts = None
    text = raw
    if raw[:1].isdigit() or raw[:1] == "<":
        decoders = _decoders()
        try:
            records = decoders.decode_value(raw.encode("utf-8", "replace"))
        except decoders.DecodeError:
            records = []
        if records and records[0].source == "rsyslog":
            host, header_ts, text = records[0].host, records[0].ts, records[0].text
    ident = parse_prefixes(text)
    if host is None and header_ts is None:
        return ident
    return dataclasses.replace(
        ident, host=ident.host or host, ts=ident.ts or header_ts,
        ts_has_date=ident.ts_has_date if ident.ts else header_ts is not None,
    )


def _latest_first(signals: list[Signal]) -> list[Signal]:
    """Progress markers in the engine's order, latest first: the job state keeps the latest few per rule,
    and fed in this order it never evicts one it kept (the per-process progress table sees them all)."""
    return sorted(signals, key=sort_key, reverse=True)


def _merge_routine(signals: list[Signal]) -> list[Signal]:
    """Routine signals of a file's chunks, one per rule, marker and process: the latest progress line,
    the largest metric value with the smallest of all in `metric_min` (what the job state keeps)."""
    progress: dict[tuple[object, ...], Signal] = {}
    metric: dict[tuple[object, ...], Signal] = {}
    for signal in signals:
        key = (signal.rule_id, signal.fields.get("marker"), signal.rank, signal.local_rank, signal.host, signal.pid)
        if "metric" not in signal.fields:
            current = progress.get(key)
            if current is None or signal.order > current.order:
                progress[key] = signal
            continue
        if metric_of(signal) is None:  # no number to compare: kept as it is
            metric.setdefault((*key, signal.order), signal)
            continue
        seen = metric.get(key)
        merged = None if seen is None else merge_metric_signals(seen, signal)
        metric[key] = signal if merged is None else merged[0]
    return _latest_first(list(progress.values())) + list(metric.values())


def _regions(buf: Buffer, size: int) -> list[tuple[int, int]]:
    """`buf` cut into pieces of about `size` bytes that end after a newline (or at the end)."""
    out: list[tuple[int, int]] = []
    lo, total = 0, len(buf)
    while lo < total:
        cut = buf.find(b"\n", min(lo + size, total) - 1)
        hi = total if cut < 0 else cut + 1
        out.append((lo, hi))
        lo = hi
    return out


# The diagnoser a forked scan process inherits, and the files it has mapped.
_FORKED: Diagnoser | None = None
_FORKED_MAPS: dict[str, mmap.mmap] = {}


def _fork_pool(diagnoser: Diagnoser, processes: int) -> multiprocessing.pool.Pool:
    """Processes forked from this one: they inherit the compiled rule set instead of loading it again."""
    import multiprocessing  # only for a file large enough to scan in several processes

    global _FORKED  # noqa: PLW0603 - what the forked scan processes inherit, set before the fork
    _FORKED = diagnoser
    return multiprocessing.get_context("fork").Pool(processes)


def _scan_region_task(
    task: tuple[str, int, int, str, dict[str, str | int], str, int],
) -> tuple[list[Signal], int, RoutineAggregate]:
    path, lo, hi, name, path_hints, job_id, file_index = task
    assert _FORKED is not None
    mapped = _FORKED_MAPS.get(path)
    if mapped is None:
        with open(path, "rb") as fh:
            mapped = _FORKED_MAPS[path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return _FORKED._scan_region(mapped, lo, hi, 0, name, path_hints, job_id, file_index)
