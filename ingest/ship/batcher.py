"""Chunks -> lines -> ship-format messages, one open batch per source, handed to the Sender."""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from ingest.multiline import lookback_needs
from ingest.order import file_key
from ingest.ship.chunks import Chunk, Source, srun_labels_of
from ingest.ship.options import ShipOptions, ShipStats, host_from_path
from ingest.ship.positions import BacklogFile, Positions
from ingest.ship.sender import Message, Sender
from ingest.ship.wire_format import CONTEXT_LINES, MAX_BATCH_BYTES, encode_batch, encode_batches


class Chunks(Protocol):
    """Where the batcher takes its chunks from: the readers' queue (ChunkQueue), or the frames a wrapped
    command's shipper process receives (FrameQueue)."""

    def get(self, timeout: float) -> Chunk | None: ...


@dataclass(slots=True)
class _BacklogTrack:
    inode: int | None
    pos: int
    remaining: int


@dataclass
class _Batch:
    lines: list[tuple[float | None, str | None, str]] = field(default_factory=list)
    size: int = 0
    first_line: int = 0
    started: float = 0.0
    position: dict[str, int] | None = None
    context: list[str] = field(default_factory=list)  # the stream's lines right before `first_line`


class Batcher:
    """Chunks -> lines -> messages, one open batch per source; flushes on size and on linger time."""

    def __init__(self, options: ShipOptions, sources: dict[int, Source], queue: Chunks, sender: Sender,
                 positions: Positions | None, stats: ShipStats, backlog: dict[int, BacklogFile] | None = None) -> None:
        self.options = options
        # Per file with a backlog: its inode and the position credited so far, and the rest of its backlog.
        self._backlog = {sid: _BacklogTrack(b.inode, b.start, b.bytes) for sid, b in (backlog or {}).items()
                         if b.bytes > 0}
        self.sources = sources
        self.queue = queue
        self.sender = sender
        self.positions = positions
        self.stats = stats
        self._batches: dict[int, _Batch] = {}
        self._seq = 0
        self._open_sources = set(sources)
        # Lines of a file are tagged with a host only when told (--host): a file may be a copy or on a shared
        # file system, so the machine reading it says nothing about who wrote its lines (their prefixes
        # and their path may, as they do for `rootrank diagnose`). A wrapped command and stdin run here.
        self._host = options.host or socket.gethostname()
        self._hosts: dict[int, str | None] = {}  # per source: --host, else --host-from dir|stem for files
        self._in_run = False  # adding an evidence-only run: its lines go in as they are
        # The lines around the texts being added (the stream's recent lines, then the texts) and the line
        # number of the first: where a new batch's context comes from.
        self._window: tuple[int, list[str]] = (0, [])

    def run(self, stop: threading.Event) -> None:
        """Until every source ended (or `stop` is set and the queue is empty)."""
        while self._open_sources:
            chunk = self.queue.get(timeout=self._next_deadline())
            if chunk is not None:
                self._take(chunk)
            elif stop.is_set():
                break
            self._flush_old()
        for source_id in list(self._batches):
            self._flush(source_id)

    def _next_deadline(self) -> float:
        if not self._batches:
            return 0.5
        oldest = min(b.started for b in self._batches.values())
        return max(0.01, oldest + self.options.linger_s - time.monotonic())

    def _take(self, chunk: Chunk) -> None:
        """Split a chunk into lines once, in C (decode + split), and hand them to the open batch.

        Blank lines are shipped too (the worker skips them), so a line's number is its batch's
        `offset` plus its index, with no per-line work here; "\r" of CRLF is left to the decoder.
        """
        source = self.sources[chunk.source_id]
        data = source.carry + chunk.data if source.carry else chunk.data
        cut = data.rfind(b"\n")
        if chunk.eof:
            body, source.carry, complete = data, b"", bool(data)
        elif cut < 0:
            body, source.carry, complete = b"", data, False
        else:
            body, source.carry, complete = data[:cut], data[cut + 1 :], True
        if chunk.inode is not None:
            source.inode = chunk.inode
        if chunk.end_pos is not None:
            source.pos = chunk.end_pos - len(source.carry)
        elif chunk.eof:
            source.pos += len(data)  # the stream ended: its unterminated last line was read too
        if complete:
            texts = body.decode("utf-8", "replace").split("\n")
            if source.fresh:
                source.key, source.fresh = file_key(source.file or source.name, texts[0]), False
                source.srun_labels = srun_labels_of(texts)
            self._window = (source.next_line - len(source.recent), source.recent + texts)
            self._add_texts(source, texts, chunk.read_ts)
            source.recent = self._window[1][-CONTEXT_LINES:]
        elif chunk.end_pos is not None and source.id in self._batches:
            self._batches[source.id].position = self._position(source)
        if chunk.eof:
            # A stream ended (end_pos None), or one generation of a rotated/truncated file did.
            if self.options.line_filter is not None:
                self._add_runs(source, self.options.line_filter.heartbeat(source.name, final=True), chunk.read_ts)
            self._flush(source.id)
            source.recent = []  # a stream's end, or one generation of a file's: the next lines start afresh
            source.key, source.fresh = None, True
            if chunk.end_pos is None:
                self._open_sources.discard(source.id)

    def _position(self, source: Source) -> dict[str, int] | None:
        if source.file is None or source.inode is None:
            return None
        return {"inode": source.inode, "pos": source.pos, "line": source.next_line}

    def _add_texts(self, source: Source, texts: list[str], read_ts: float | None) -> None:
        if self.options.line_filter is not None and not self._in_run:
            first = source.next_line
            self._add_runs(source, self.options.line_filter.select(source.name, first, texts), read_ts)
            source.next_line = first + len(texts)
            if source.id in self._batches:
                self._batches[source.id].position = self._position(source)
            elif self._backlog:  # no message carries these lines: their backlog bytes are done
                position = self._position(source)
                if position is not None:
                    self.sender.credit_backlog(self._backlog_credit(source.id, position))
            return
        max_bytes = self.options.batch_max_bytes
        # Running size of the lines (characters + JSON overhead): where each batch must end.
        ends = list(itertools.accumulate(map(operator.add, map(len, texts), itertools.repeat(24)), initial=0))
        start = 0
        while start < len(texts):
            batch = self._batches.get(source.id)
            if batch is None:
                batch = _Batch(first_line=source.next_line, started=time.monotonic(),
                               context=self._context_before(source.next_line))
                self._batches[source.id] = batch
            room = max_bytes - batch.size
            stop = bisect.bisect_right(ends, ends[start] + room, lo=start + 1) - 1
            if stop <= start:
                if batch.lines:  # full: ship it and start the next one with this line
                    self._flush(source.id)
                    continue
                stop = start + 1  # one line larger than a batch: alone (encode_batches cuts it)
            segment = texts[start:stop]
            batch.lines.extend([(read_ts, source.stream, text) for text in segment])
            batch.size += ends[stop] - ends[start]
            source.next_line += len(segment)
            self.stats.lines += len(segment)
            start = stop
            if batch.size >= max_bytes:
                self._flush(source.id)
        batch = self._batches.get(source.id)
        if batch is not None:
            batch.position = self._position(source)

    def _context_before(self, line: int) -> list[str]:
        """The stream's lines right before line number `line` (at most CONTEXT_LINES), from the window."""
        first, lines = self._window
        end = line - first
        return lookback_needs(lines[max(0, end - CONTEXT_LINES) : max(0, end)])

    def _add_runs(self, source: Source, runs: list[tuple[int, list[str]]], read_ts: float | None) -> None:
        """Evidence-only: each run of consecutive lines keeps its line numbers (a gap ends the batch)."""
        end = source.next_line
        self._in_run = True
        try:
            for first, texts in runs:
                batch = self._batches.get(source.id)
                if batch is not None and batch.first_line + len(batch.lines) != first:
                    self._flush(source.id)
                source.next_line = first
                self._add_texts(source, texts, read_ts)
        finally:
            self._in_run = False
            source.next_line = max(end, source.next_line)

    def _heartbeats(self) -> None:
        for source_id in self._open_sources:
            source = self.sources[source_id]
            runs = self.options.line_filter.heartbeat(source.name)
            if runs:
                self._add_runs(source, runs, None)
                self._flush(source_id)

    def _flush_old(self) -> None:
        if self.options.line_filter is not None:
            self._heartbeats()
        now = time.monotonic()
        for source_id, batch in list(self._batches.items()):
            if now - batch.started >= self.options.linger_s:
                self._flush(source_id)

    def _backlog_credit(self, source_id: int, position: dict[str, int]) -> int:
        """Backlog bytes between the last credited position of this file and `position`: what a
        message ending there completes. Counted in file order, up to the file's backlog."""
        track = self._backlog.get(source_id)
        if track is None or track.remaining <= 0:
            return 0
        inode, pos = position["inode"], position["pos"]
        # A new generation (rotated) or a truncated file: its bytes count from its start.
        delta = pos - track.pos if inode == track.inode and pos >= track.pos else pos
        track.inode, track.pos = inode, pos
        credit = min(delta, track.remaining)
        track.remaining -= credit
        return credit

    def _host_of(self, source: Source) -> str | None:
        """The host a source's lines are tagged with: --host; for a file, its path's part named by --host-from
        dir|stem, else none (its lines and path say it); for a wrapped command or stdin, this machine."""
        if source.id not in self._hosts:
            if self.options.host or source.file is None:
                self._hosts[source.id] = self._host
            else:
                self._hosts[source.id] = host_from_path(source.name, self.options.host_from)
        return self._hosts[source.id]

    def key_of(self, source: Source) -> bytes:
        """The Kafka key of a source's messages: one file's lines stay in one partition, in order."""
        return f"{self.options.job_id or ''}|{self._host}|{source.name}".encode()

    def _flush(self, source_id: int) -> None:
        batch = self._batches.pop(source_id, None)
        if batch is None or not batch.lines:
            return
        source = self.sources[source_id]
        o = self.options
        host = self._host_of(source)
        shipper = None if host else self._host
        values = [encode_batch(
            batch.lines, job_id=o.job_id, host=host, rank=o.rank, local_rank=o.local_rank,
            pid=source.pid, attempt=o.attempt, file=source.file, labels=o.labels, offset=batch.first_line,
            context=batch.context, shipper=shipper, file_key=source.key, srun_labels=source.srun_labels,
        )]
        if len(values[0]) > MAX_BATCH_BYTES:  # a few very long lines: split to stay under the limit
            values = encode_batches(
                batch.lines, job_id=o.job_id, host=host, rank=o.rank, local_rank=o.local_rank,
                pid=source.pid, attempt=o.attempt, file=source.file, labels=o.labels, offset=batch.first_line,
                context=batch.context, shipper=shipper, file_key=source.key, srun_labels=source.srun_labels,
            )
        key = self.key_of(source)
        now_ms = int(time.time() * 1000)
        backlog_bytes = self._backlog_credit(source_id, batch.position) if batch.position and self._backlog else 0
        for index, value in enumerate(values):
            self._seq += 1
            seq = self._seq
            on_durable = None
            if self.positions is not None and batch.position is not None and index == len(values) - 1:
                self.positions.expect(source.name, seq, batch.position)
                on_durable = functools.partial(self.positions.durable, source.name)
            lines = len(batch.lines) if len(values) == 1 else (len(batch.lines) if index == 0 else 0)
            self.sender.submit(Message(seq, key, value, now_ms, lines, on_durable,
                                       backlog_bytes if index == len(values) - 1 else 0, source.file is not None))
