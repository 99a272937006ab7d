"""`rootrank diagnose`: the streaming engine, run offline over files.

Plain-text logs are scanned in large chunks straight from disk (one hyperscan scan per chunk); only
the lines that hit a rule are decoded into events. JSON-lines files written by forwarders go through
the same decoders the streaming worker uses.
"""

from __future__ import annotations

import functools
import gc
import io
import mmap
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from correlator.diagnosis.engine import Engine, JobState
from correlator.diagnosis.engine.keys import sort_key
from correlator.diagnosis.framing import frame_line, identify_line, line_process, lines_before
from correlator.diagnosis.matcher import Buffer, Hit, Matcher
from correlator.diagnosis.models import Incident, Signal
from correlator.diagnosis.routine_fold import merge_metric_signals, metric_of
from correlator.diagnosis.rules import RuleSet, load_ruleset
from correlator.diagnosis.signals import SignalExtractor, best_hits_per_line
from correlator.offline.routine import RoutineAggregate, RoutineAggregator
from ingest.event import LogEvent
from ingest.order import file_key, first_line_of, line_order, message_position, record_key
from ingest.prefixes import (
    Identity,
    hosts_among,
    identity_from_path,
    sniff_srun_labels,
)

if TYPE_CHECKING:
    import multiprocessing.pool

    from _typeshed import WriteableBuffer

    from ingest.decoders import RawRecord

CHUNK_BYTES = 16 * 1024 * 1024
SNIFF_BYTES = 64 * 1024  # a plain file's first bytes, that tell binary data and forwarder JSON from a log
# With several scan processes (`jobs`), a plain file from PARALLEL_BYTES on is mapped and cut into regions of
# about size / (2 x jobs) (two regions a process, so one slower region does not leave a process idle), at
# least MIN_REGION_BYTES and at most CHUNK_BYTES; with one, regions of CHUNK_BYTES from CHUNK_BYTES on.
PARALLEL_BYTES = 8 * 1024 * 1024
MIN_REGION_BYTES = 2 * 1024 * 1024


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


_SYSLOG_FIRST = frozenset(b"<0123456789ADFJMNOS")  # what an rsyslog header starts with (a priority, a date, a month)


def _looks_syslog(head: bytes) -> bool:
    """rsyslog's output (RSYSLOG_FileFormat, the traditional format, RFC 5424): its first lines (up to five)
    all start with a syslog header. Such a file is read record by record with the rsyslog decoder, as the
    stream reads rsyslog's messages, so its messages are scanned without their headers."""
    stripped = head.lstrip()
    if not stripped or stripped[0] not in _SYSLOG_FIRST:
        return False
    from ingest.decoders import rsyslog  # only for a file that may be rsyslog's

    lines = [line for line in stripped[:65536].split(b"\n")[:6] if line.strip()][:5]
    if len(lines) > 1 and not head.rstrip(b"\r\n").endswith(lines[-1].rstrip(b"\r")):
        lines = lines[:-1]  # the head may end inside a line
    return bool(lines) and all(
        rsyslog.decode_syslog_lines([line.decode("utf-8", "replace").rstrip("\r")], None, 65536) for line in lines)


def _looks_like_records(head: bytes) -> bool:
    """A file a forwarder wrote, read record by record with its decoder: JSON lines, or rsyslog's text."""
    return _looks_json_lines(head) or _looks_syslog(head)


class Diagnoser:
    """Reusable: compiles the matcher once, diagnoses any number of path sets."""

    def __init__(self, ruleset: RuleSet | None = None, *, matcher: Matcher | None = None, jobs: int = 1) -> None:
        """`jobs`: processes that scan a large plain file's chunks at once (forked from this one, so
        only a caller that runs no other threads should ask for more than 1: the CLI does)."""
        self.jobs = max(1, jobs)
        self._hosts: frozenset[str] = frozenset()  # host-named files and folders of the paths being read
        self._year: int | None = None  # the year of the job's dated lines, for its year-less ones (glog, syslog)
        self.ruleset = ruleset or load_ruleset()
        self.matcher = matcher or Matcher(self.ruleset)
        self.extractor = SignalExtractor(self.ruleset, self.matcher)
        self.engine = Engine(self.ruleset)
        self.routine = RoutineAggregator(self.matcher, self._identify_routine)
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
        sources = list(iter_sources(paths, stats))
        self._hosts = hosts_among(source.name for source in sources)
        self._year = _job_year(sources)
        for source in sources:
            try:
                stream = source.open()
            except OSError as exc:
                stats.skipped.append(f"{source.name}: cannot open ({exc.strerror or exc})")
                continue
            try:
                signals.extend(self.signals_from_stream(source, stream, job_id, stats, progress))
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
        # The file's place among the job's files: from its name and first line, as the stream places it
        # (ingest/order.py); its lines' orders add their byte offsets (line index: JSON lines, rsyslog).
        order_base = line_order(source_key(source.name, head), 0)
        path_hints = identity_from_path(source.name, self._hosts) if source.name != "<stdin>" else {}
        if sniff_srun_labels(head[:SNIFF_BYTES].decode("utf-8", "replace").splitlines()) == "node":
            path_hints["srun_labels"] = "node"
        if _looks_like_records(head):
            return self.signals_from_json_lines(source, stream, head, job_id, order_base, stats, progress)
        if source.path is not None and self._mapped_from() <= (source.size or 0):
            try:
                mapped = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError, io.UnsupportedOperation):
                mapped = None  # not mappable (a FIFO, /proc): read it in chunks like a stream
            if mapped is not None:
                with mapped:
                    return self._signals_from_mapped(source, mapped, path_hints, job_id, order_base, stats, progress)
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
            signals, lines_hit, acc = self._scan_region(body, 0, len(body), base, source.name, path_hints, job_id, order_base)
            out.extend(signals)
            # A chunk is gone once scanned: its routine winners become signals now, merged per process below.
            routine.extend(self._routine_signals(body, len(body), acc, base, source.name, path_hints, job_id, order_base))
            stats.lines_hit += lines_hit + acc.lines
            base += len(body)
            stats.bytes += len(chunk)
            if progress:
                progress(len(chunk))
            chunk = nxt
        if carry:
            signals, lines_hit, acc = self._scan_region(carry, 0, len(carry), base, source.name, path_hints, job_id, order_base)
            out.extend(signals)
            routine.extend(self._routine_signals(carry, len(carry), acc, base, source.name, path_hints, job_id, order_base))
            stats.lines_hit += lines_hit + acc.lines
        out.extend(_merge_routine(routine))
        return out

    def _signals_from_mapped(
        self,
        source: Source,
        mapped: mmap.mmap,
        path_hints: dict[str, str | int],
        job_id: str,
        order_base: int,
        stats: DiagnoseStats,
        progress: Callable[[int], None] | None,
    ) -> list[Signal]:
        """A plain file, mapped: its regions are scanned in place (no copies), by `jobs` processes at once:
        this one and `jobs - 1` forked ones, this one taking every `jobs`-th region while they scan the others.
        Every offset is a file offset, so a traceback's owner is found across region edges."""
        regions = _regions(mapped, self.region_bytes(len(mapped)))
        tasks = [(str(source.path), lo, hi, source.name, path_hints, job_id, order_base) for lo, hi in regions]
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
            results[i] = self._scan_region(mapped, lo, hi, 0, source.name, path_hints, job_id, order_base)
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
        out.extend(self._routine_signals(mapped, len(mapped), routine, 0, source.name, path_hints, job_id, order_base))
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
        order_base: int,
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
            out.append(self.extractor.signal_for(event, hit, order_base + base + start, raw=raw,
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
        order_base: int,
    ) -> list[Signal]:
        """One signal per rule and process for routine lines: the latest progress line (latest first, so
        the engine's cap on markers per rule keeps the latest without evicting), the largest metric value
        with the smallest in `metric_min`."""
        progress: list[Signal] = []
        metric: list[Signal] = []
        for hit, low in self.routine.winners(body, hi, acc):
            event, raw, borrowed = self._event_for_line(body, hit, base, name, path_hints, job_id)
            signal = self.extractor.signal_for(event, hit, order_base + base + hit.start, raw=raw,
                                               time_borrowed=borrowed)
            if low is not None and "metric" in signal.fields:
                signal = signal.model_copy(update={"fields": {**signal.fields, "metric_min": low}})
                metric.append(signal)
            else:
                progress.append(signal)
        return _latest_first(progress) + metric

    def _identify_routine(self, raw: str) -> Identity:
        """A routine line's identity (the routine aggregator's line keys), with the job's year."""
        return _identify_line(raw, "auto", self._year)

    def _event_for_line(
        self, body: Buffer, hit: Hit, base: int, name: str, path_hints: dict[str, str | int], job_id: str
    ) -> tuple[LogEvent, str, bool]:
        """The line's event, its text as scanned, and whether its time was borrowed from an earlier line
        (correlator/diagnosis/framing.py: the same steps as the stream's)."""
        line = body[hit.start : hit.end].decode("utf-8", "replace")
        rule_index = hit.rule_index
        framed = frame_line(line, lambda: lines_before(body, hit.start),
                            lambda segment: self.matcher.matches(rule_index, segment),
                            srun_labels="node" if path_hints.get("srun_labels") == "node" else "auto", year=self._year)
        ident = framed.identity
        event = LogEvent(
            job_id=job_id,
            host=ident.host or _str_or_none(path_hints.get("host")),
            rank=ident.rank if ident.rank is not None else _int_or_none(path_hints.get("rank")),
            local_rank=ident.local_rank if ident.local_rank is not None else _int_or_none(path_hints.get("local_rank")),
            pid=ident.pid,
            gpu=ident.gpu,
            ts=framed.ts,
            attempt=_int_or_none(path_hints.get("attempt")),
            source="plain",
            file=name,
            offset=base + hit.start,
            line=ident.text,
        )
        return event, framed.raw, framed.borrowed

    def signals_from_json_lines(
        self,
        source: Source,
        stream: BinaryReader,
        head: bytes,
        job_id: str,
        order_base: int,
        stats: DiagnoseStats,
        progress: Callable[[int], None] | None,
    ) -> list[Signal]:
        from ingest.decoders import (  # the forwarders' formats: JSON lines and rsyslog text only
            DecodeError,
            decode_value,
        )

        out: list[Signal] = []
        records: list[RawRecord] = []
        positions: list[int] = []
        reader = io.BufferedReader(_Prepend(head, stream))
        for lineno, line in enumerate(reader):
            stats.bytes += len(line)
            if progress:
                progress(len(line))
            if not line.strip():
                continue
            try:
                decoded = decode_value(line.rstrip(b"\n"), year_hint=self._year)
            except DecodeError:
                stats.decode_errors += 1
                continue
            for index, record in enumerate(decoded):
                records.append(record)
                positions.append(record.offset if record.offset is not None else message_position(lineno, index))
            if len(records) >= 4096:
                out.extend(self._from_records(records, positions, job_id))
                records, positions = [], []
        if records:
            out.extend(self._from_records(records, positions, job_id))
        return out

    def _from_records(self, records: list[RawRecord], positions: list[int], job_id: str) -> list[Signal]:
        """Signals of a forwarder's records, as the stream makes them from its messages: the records' texts
        scanned as the forwarder sent them, events only for the lines that hit, each in the job of the
        given paths (whatever job the forwarder's fields name), ordered by its stream (ingest/order.py)."""
        from ingest.decoders import to_event

        events: dict[int, LogEvent] = {}

        def event_at(i: int) -> LogEvent:
            event = events.get(i)
            if event is None:
                event = to_event(records[i], default_job=job_id, offset=positions[i])
                if event.job_id != job_id:  # all given paths form one job
                    event = event.model_copy(update={"job_id": job_id})
                events[i] = event
            return event

        texts = [record.text for record in records]
        return self.extractor.from_texts(
            texts, event_at,
            lambda i: (records[i].host, records[i].rank, records[i].file, records[i].stream),
            lambda i: line_order(record_key(records[i].file, records[i].host), positions[i]),
            process_of=lambda i: line_process(texts[i]),
        )

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


def source_key(name: str, head: bytes) -> int:
    """A file's key (ingest/order.py) from its name and first bytes."""
    return file_key(name, first_line_of(head))


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


# Identity of one line (a syslog header, then prefixes): what the routine aggregator reads too.
_identify_line = identify_line


YEAR_SNIFF_BYTES = 64 * 1024


def _job_year(sources: Sequence[Source]) -> int | None:
    """The year of a job's first dated line, from the head of its files: year-less stamps (glog's I0928,
    syslog's Sep 28, c10d's [E0928) of the same job are in that year, not in whatever year it is now (a job
    from 2024 read in 2026 would otherwise put its kernel and agent lines two years after its own)."""
    for source in sources:
        if source.path is None:
            continue
        try:
            with source.path.open("rb") as fh:
                head = fh.read(YEAR_SNIFF_BYTES)
        except OSError:
            continue
        if head[:2] == b"\x1f\x8b" or looks_binary(head):
            continue
        for line in head.decode("utf-8", "replace").splitlines():
            ident = _identify_line(line[:512])
            if ident.ts is not None and ident.ts_has_date:
                return ident.ts.year
    return None


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
    path, lo, hi, name, path_hints, job_id, order_base = task
    assert _FORKED is not None
    mapped = _FORKED_MAPS.get(path)
    if mapped is None:
        with open(path, "rb") as fh:
            mapped = _FORKED_MAPS[path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return _FORKED._scan_region(mapped, lo, hi, 0, name, path_hints, job_id, order_base)
