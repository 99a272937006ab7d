"""`rootrank ship`: send log lines to Kafka from files, stdin, or a wrapped command.

    rootrank ship --job J --file rank0.log --follow      follow files (rotation-aware, resumes)
    some_command 2>&1 | rootrank ship --job J             read stdin
    rootrank ship --job J --rank 3 -- python train.py     wrap a command

Design, from the wrapped process's point of view: it must never wait for us. Its stdout/stderr
are read by one thread per pipe in large chunks, written straight through to our stdout/stderr,
and handed to a bounded in-memory queue that spills to a disk file when the batcher falls behind;
nothing on that path waits for the network (past that file's bound, output is dropped, and said
so loudly). A batcher thread splits chunks into lines and packs
them into messages (ship_format: identity once per message, each line `[ts, stream, text]`,
bounded by size and by a linger time). Messages go to Kafka with acks=all and compression; while
Kafka is down or slow they go to a bounded disk spool that a drain thread sends, in order, when
the broker is back, also after a restart of the shipper. Positions of followed files are saved
only once the lines before them are acknowledged by Kafka or safe in the spool, so a restart
resumes without losing a line (and re-sends at most a few, which the worker recognises by the
batch's stable line offsets).

Files are different: they are already on disk, so nothing of theirs is ever dropped. Backpressure
instead, end to end: when the spool is full and Kafka is not taking messages, the batcher waits
to submit a file's message; it stops taking chunks, the frame reader stops reading the pipe, the
parent's forwarder blocks writing it, the in-memory queue fills, and the file readers wait for
room (never spilling to disk). On SIGINT/SIGTERM the parent tells the shipping process through a
control pipe; a message still waiting then is left out ("deferred"): its file's saved position
stays before it, so the next run reads it again.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import fcntl
import gc
import hashlib
import itertools
import logging
import operator
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ingest.ship.spool import Spool
from ingest.ship.wire_format import MAX_BATCH_BYTES, encode_batch

log = logging.getLogger("rootrank.ship")

READ_CHUNK = 1024 * 1024
F_SETPIPE_SZ = 1031  # Linux: grow a pipe's buffer so a burst from the child fits while we are busy
PIPE_BYTES = 1024 * 1024


@dataclass
class ShipOptions:
    kafka: dict[str, Any] = field(default_factory=lambda: {"bootstrap_servers": "127.0.0.1:9092"})
    topic: str = "rootrank.logs"
    job_id: str | None = None
    host: str | None = None  # default: this machine's name
    rank: int | None = None
    local_rank: int | None = None
    attempt: int | None = None  # default: TORCHELASTIC_RESTART_COUNT when set
    labels: dict[str, str] = field(default_factory=dict)
    batch_max_bytes: int = 256 * 1024
    linger_s: float = 0.5
    compression: str = "auto"  # auto | gzip | lz4 | snappy | zstd | none
    idempotence: bool = True
    state_dir: Path = Path(".rootrank-ship")
    spool_max_bytes: int = 1024 * 1024 * 1024
    queue_max_bytes: int = 64 * 1024 * 1024
    drain_timeout_s: float = 30.0
    follow: bool = False
    tee: bool = False
    poll_s: float = 0.2
    send_timeout_s: float = 30.0
    # Edge matching (--evidence-only): an object with select(key, first_line, texts) -> [(first_line, texts)]
    # and heartbeat(key, final=bool) -> runs (correlator.diagnosis.evidence.EvidenceFilter); None ships every line.
    line_filter: Any = None
    # Called once in the shipping process with (ShipStats, line_filter): e.g. starts a /metrics server.
    on_start: Callable[[Any, Any], None] | None = None
    # Backlog progress on stderr when shipping files (ingest.ship.progress): auto | always | never.
    progress: str = "never"
    progress_interval_s: float = 5.0  # between plain status lines (stderr not a terminal)


@dataclass
class ShipStats:
    lines: int = 0
    messages: int = 0
    acked_messages: int = 0
    acked_lines: int = 0
    spooled_messages: int = 0
    dropped_messages: int = 0
    dropped_lines: int = 0
    pending_messages: int = 0  # still in the spool at exit (sent by the next run)
    spooled_lines: int = 0
    # Files' backlog (their bytes from the starting positions to their sizes when shipping started):
    # bytes acknowledged by Kafka, and bytes in messages dropped because the spool was full (none
    # since files' messages wait for room instead; kept for the display's arithmetic).
    backlog_acked_bytes: int = 0
    backlog_dropped_bytes: int = 0
    # Files' messages that waited for room in the spool (backpressure), and those still waiting when
    # the shipper stopped: not shipped by this run, their saved positions before them (the next run does).
    waited_messages: int = 0
    deferred_messages: int = 0
    deferred_lines: int = 0


# --- sources and chunks -------------------------------------------------------------------------


@dataclass
class Source:
    """One stream of lines: a followed file, stdin, or one pipe of the wrapped command."""

    id: int
    name: str  # file path, "stdin", "stdout" or "stderr"
    stream: str | None = None
    file: str | None = None
    pid: int | None = None
    carry: bytes = b""
    next_line: int = 0  # line number (in this stream) of the next line
    # Followed files: where the next unsent line starts, and which inode that is in.
    inode: int | None = None
    pos: int = 0


@dataclass(slots=True)
class Chunk:
    source_id: int
    data: bytes
    read_ts: float | None  # None: bytes that were in the file before we started (time unknown)
    end_pos: int | None = None  # file position after `data`
    inode: int | None = None
    eof: bool = False  # end of this stream (or of one file generation): the carry is a last line


_CHUNK_HEADER = struct.Struct(">HdqQ?")


def _pack_chunk(chunk: Chunk) -> bytes:
    return _CHUNK_HEADER.pack(
        chunk.source_id,
        chunk.read_ts if chunk.read_ts is not None else -1.0,
        chunk.end_pos if chunk.end_pos is not None else -1,
        chunk.inode or 0,
        chunk.eof,
    ) + chunk.data


def _unpack_chunk(raw: bytes) -> Chunk:
    source_id, ts, end_pos, inode, eof = _CHUNK_HEADER.unpack_from(raw)
    return Chunk(source_id, raw[_CHUNK_HEADER.size :], None if ts < 0 else ts, None if end_pos < 0 else end_pos,
                 inode or None, eof)


class ChunkQueue:
    """FIFO between the readers and the batcher (in the parent: the forwarder to the shipping process).

    Two ways in. `put`, for pipes (a wrapped command's output, stdin), never blocks: past
    `max_bytes` in memory, chunks go to a disk file (and keep going there until the batcher caught
    up, to stay in order); past that file's bound (--spool-max-mib) they are dropped, counted, and
    said on stderr at once. `put_file`, for files, waits for room in memory instead: a file keeps
    its lines on disk anyway, so reading it simply pauses while the shipper is behind."""

    def __init__(self, max_bytes: int, overflow_dir: Path, overflow_max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: collections.deque[Chunk] = collections.deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._overflow_dir = overflow_dir
        self._overflow_max = overflow_max_bytes
        self._overflow: Spool | None = None
        self.dropped_bytes = 0
        self.dropped_chunks = 0
        self.dropped_lines = 0  # newlines in the dropped bytes: about the lines lost
        self.waits = 0  # times a file reader waited for room
        self._consumer_gone = False  # the forwarder failed (the shipping process is gone): nobody makes room

    def _overflowing(self) -> bool:
        return self._overflow is not None and len(self._overflow) > 0

    def put(self, chunk: Chunk) -> None:
        with self._lock:
            if not self._overflowing() and self._bytes + len(chunk.data) <= self.max_bytes:
                self._items.append(chunk)
                self._bytes += len(chunk.data)
            else:
                if self._overflow is None:
                    self._overflow = Spool(self._overflow_dir, self._overflow_max)
                if not self._overflow.append(_pack_chunk(chunk)):
                    self._drop(chunk)
            self._not_empty.notify()

    def _drop(self, chunk: Chunk) -> None:
        first = not self.dropped_chunks
        self.dropped_bytes += len(chunk.data)
        self.dropped_chunks += 1
        self.dropped_lines += chunk.data.count(b"\n")
        if first:
            with contextlib.suppress(OSError, ValueError):
                print(f"rootrank ship: WARNING: shipping fell behind and the overflow file in {self._overflow_dir} "
                      f"is full (--spool-max-mib {self._overflow_max / 2**20:g}): output is being DROPPED, not "
                      "shipped, until it catches up; raise --spool-max-mib (disk permitting) or make Kafka faster",
                      file=sys.stderr, flush=True)

    def put_file(self, chunk: Chunk, stop: threading.Event | None, poll_s: float = 0.2) -> bool:
        """Queue a file's chunk in memory, waiting (in steps of `poll_s`) while the queue is full.
        False, the chunk not queued, once `stop` is set while waiting. `stop` None: no wait, over the
        bound if need be (one chunk, when a reader ends)."""
        with self._lock:
            waited = False
            while stop is not None and (self._overflowing()
                                        or self._bytes and self._bytes + len(chunk.data) > self.max_bytes):
                if stop.is_set() or self._consumer_gone:
                    return False
                if not waited:
                    self.waits += 1
                    waited = True
                self._not_full.wait(poll_s)
            self._items.append(chunk)
            self._bytes += len(chunk.data)
            self._not_empty.notify()
            return True

    def get(self, timeout: float) -> Chunk | None:
        with self._lock:
            if not self._items and not self._overflowing():
                self._not_empty.wait(timeout)
            if self._items:
                chunk = self._items.popleft()
                self._bytes -= len(chunk.data)
                self._not_full.notify_all()
                return chunk
            if self._overflowing():
                assert self._overflow is not None
                raw = self._overflow.peek()
                self._overflow.pop()
                if not len(self._overflow):
                    self._not_full.notify_all()
                return _unpack_chunk(raw) if raw is not None else None
            return None

    def consumer_gone(self) -> None:
        """Nobody will take chunks any more: a file reader waiting for room gives up."""
        with self._lock:
            self._consumer_gone = True
            self._not_full.notify_all()

    def close(self) -> None:
        if self._overflow is not None:
            self._overflow.close()


# --- messages, the sender and the spool -----------------------------------------------------------


@dataclass(slots=True)
class Message:
    seq: int
    key: bytes
    value: bytes
    timestamp_ms: int
    lines: int
    on_durable: Callable[[int], None] | None = None
    backlog_bytes: int = 0  # of the files' backlog, the bytes this message completes (progress display)
    # A file's lines: with the spool full, wait for room (backpressure) instead of dropping them.
    wait: bool = False


_SPOOL_HEADER = struct.Struct(">qIH")


def _pack_message(message: Message) -> bytes:
    return _SPOOL_HEADER.pack(message.timestamp_ms, message.lines, len(message.key)) + message.key + message.value


def _unpack_message(raw: bytes) -> Message:
    ts, lines, key_len = _SPOOL_HEADER.unpack_from(raw)
    start = _SPOOL_HEADER.size
    return Message(-1, raw[start : start + key_len], raw[start + key_len :], ts, lines)


def _compression(name: str) -> str | None:
    if name == "none":
        return None
    if name != "auto":
        return name
    try:
        import lz4  # noqa: F401

        return "lz4"
    except ImportError:
        return "gzip"


class Sender:
    """Messages to Kafka, or to the disk spool while Kafka cannot take them; a thread drains the spool.

    New messages go straight to the producer whenever it is healthy, also while the spool is
    still being drained: order between messages does not matter downstream (every line carries
    its stream's line number and its time), and a backlog must not slow the live stream.

    With the spool full, a pipe's message is dropped (counted, said); a file's message (`wait`)
    waits in `submit` until the spool has room or Kafka takes messages again, which holds the
    batcher and, through the pipe from the parent, the file readers (backpressure). A file's
    message whose delivery failed while the spool was full stays in memory (`_retry`) until the
    drain thread spools or sends it. Either way a file's message is durable (its position may be
    saved) only once acknowledged or spooled, never when it could not be.
    """

    def __init__(self, options: ShipOptions, spool: Spool, stats: ShipStats) -> None:
        self.options = options
        self.spool = spool
        self.stats = stats
        self._producer: Any = None
        self._lock = threading.Lock()
        self._healthy = False  # the producer exists and its last delivery worked
        self._in_flight = 0
        # Backlog bytes of the messages this run spooled, in spool order (the drain credits them when
        # acknowledged); the records already spooled by an earlier run carry none.
        self._spool_lock = threading.Lock()
        self._spooled_backlog: collections.deque[int] = collections.deque()
        self._foreign_spooled = len(spool)
        self._retry: collections.deque[Message] = collections.deque()  # under _spool_lock
        self._space = threading.Condition()  # notified when the spool got room or Kafka takes messages
        self._stopping = threading.Event()  # the parent is stopping: a waiting file message gives up
        self._said_waiting = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._drainer = threading.Thread(target=self._drain_loop, name="ship-drain", daemon=True)
        self._drainer.start()

    # --- producer ------------------------------------------------------------------------------

    def _make_producer(self) -> Any:
        from kafka import KafkaProducer

        config: dict[str, Any] = {
            "acks": "all",
            "compression_type": _compression(self.options.compression),
            "enable_idempotence": self.options.idempotence,
            "linger_ms": 5,
            "batch_size": max(16384, self.options.batch_max_bytes + 4096),
            "max_request_size": max(1024 * 1024, 2 * MAX_BATCH_BYTES),
            # send() must not stall the batcher for long when the broker is gone: spool instead.
            "max_block_ms": 2000,
            # An unacknowledged message goes to the spool after `send_timeout_s` (the producer
            # retries on its own until then; Kafka wants delivery >= linger + request timeout).
            "delivery_timeout_ms": int(self.options.send_timeout_s * 1000),
            "request_timeout_ms": max(500, int(self.options.send_timeout_s * 1000) - 10),
            "bootstrap_timeout_ms": 5000,
            "client_id": f"rootrank-ship-{socket.gethostname()}",
        }
        config.update(self.options.kafka)  # connection and security (and any override the caller knows about)
        return KafkaProducer(**config)

    # --- sending ---------------------------------------------------------------------------------

    def submit(self, message: Message) -> None:
        self.stats.messages += 1
        waited = False
        while True:
            if self._healthy and self._send(message):
                return
            if self._to_spool(message):
                return
            # A file's message, the spool full and Kafka not taking messages: wait (backpressure).
            if not waited:
                waited = True
                self.stats.waited_messages += 1
                if not self._said_waiting:
                    self._said_waiting = True
                    log.warning("spool full (%d bytes) and Kafka not taking messages (yet): reading the files "
                                "waits for it (no line is dropped)", self.spool.max_bytes)
            if self._stopping.is_set():
                self._defer(message)
                return
            with self._space:
                self._space.wait(0.2)

    def _send(self, message: Message) -> bool:
        try:
            future = self._producer.send(self.options.topic, key=message.key, value=message.value,
                                         timestamp_ms=message.timestamp_ms)
        except Exception as exc:  # noqa: BLE001 - buffer full, no metadata: the broker is not taking messages
            log.debug("send failed (%s); spooling", exc)
            self._unhealthy()
            return False
        with self._lock:
            self._in_flight += 1
        future.add_callback(self._on_ack, message)
        future.add_errback(self._on_error, message)
        return True

    def _on_ack(self, message: Message, _metadata: Any) -> None:
        with self._lock:
            self._in_flight -= 1
        self._acked(message)

    def _acked(self, message: Message) -> None:
        with self._lock:
            self.stats.acked_messages += 1
            self.stats.acked_lines += message.lines
            self.stats.backlog_acked_bytes += message.backlog_bytes
        if message.on_durable:
            message.on_durable(message.seq)

    def _on_error(self, message: Message, exc: BaseException) -> None:
        log.debug("delivery failed (%s); spooling", exc)
        self._unhealthy()
        if not self._to_spool(message):  # a file's message, the spool full: kept, sent by the drain thread
            with self._spool_lock:
                self._retry.append(message)
        with self._lock:  # only now: close() must not see it neither in flight nor kept
            self._in_flight -= 1

    def _unhealthy(self) -> None:
        self._healthy = False
        self._wake.set()

    def _notify_space(self) -> None:
        with self._space:
            self._space.notify_all()

    def stop_waiting(self) -> None:
        """The parent is stopping (SIGINT/SIGTERM, or gone): a file's message still waiting for room
        in the spool gives up; it is deferred to the next run, which reads it again."""
        self._stopping.set()
        self._notify_space()

    def _defer(self, message: Message) -> None:
        # Not durable: its file's saved position stays before it.
        with self._lock:
            self.stats.deferred_messages += 1
            self.stats.deferred_lines += message.lines

    def credit_backlog(self, nbytes: int) -> None:
        """Backlog bytes that no message carries (evidence-only: lines that were not selected)."""
        with self._lock:
            self.stats.backlog_acked_bytes += nbytes

    def _spool_append(self, message: Message) -> bool:
        """Into the spool, with its bookkeeping; the caller holds _spool_lock. False: the spool is full."""
        if not self.spool.append(_pack_message(message)):
            return False
        self._spooled_backlog.append(message.backlog_bytes)
        self.stats.spooled_messages += 1
        self.stats.spooled_lines += message.lines
        return True

    def _to_spool(self, message: Message) -> bool:
        """True when done with the message: spooled, or (a pipe's message, the spool full) dropped.
        False: a file's message and the spool is full; nothing happened, the caller keeps it."""
        # One lock: the batcher and the producer's callbacks both spool, and the backlog bytes
        # beside the spool must stay in the spool's order.
        with self._spool_lock:
            spooled = self._spool_append(message)
            if not spooled and not message.wait:
                self.stats.dropped_messages += 1
                self.stats.dropped_lines += message.lines
                self.stats.backlog_dropped_bytes += message.backlog_bytes
        self._wake.set()
        if not spooled:
            if message.wait:
                return False
            log.warning("spool full (%d bytes): dropped a message of %d lines", self.spool.max_bytes, message.lines)
        # Durable: spooled, or (a pipe's message, which has no position) knowingly dropped.
        if message.on_durable:
            message.on_durable(message.seq)
        return True

    def _send_retries(self) -> None:
        """Files' messages kept after a failed delivery: into the spool as far as it has room now,
        the rest straight to Kafka, a window at a time (any failure: back where they were)."""
        moved: list[Message] = []
        with self._spool_lock:
            while self._retry and self._spool_append(self._retry[0]):
                moved.append(self._retry.popleft())
            window = [self._retry.popleft() for _ in range(min(64, len(self._retry)))]
        for message in moved:
            if message.on_durable:
                message.on_durable(message.seq)
        done = 0
        try:
            futures = [self._producer.send(self.options.topic, key=m.key, value=m.value, timestamp_ms=m.timestamp_ms)
                       for m in window]
            for message, future in zip(window, futures):
                future.get(timeout=self.options.send_timeout_s + 5)
                self._acked(message)
                done += 1
        finally:
            if done < len(window):
                with self._spool_lock:
                    self._retry.extendleft(reversed(window[done:]))

    def _drain_loop(self) -> None:
        """Create the producer, then send the spool head-first, a window at a time; pop each once
        acknowledged. A successful window marks the producer healthy again."""
        backoff = 0.2
        last_problem = ""
        while not self._stop.is_set():
            try:
                if self._producer is None:
                    self._producer = self._make_producer()
                if self._retry:
                    self._send_retries()
                window = [_unpack_message(raw) for raw in self.spool.peek_many(64)]
                if not window:
                    self._healthy = True
                    self._notify_space()
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                futures = [
                    self._producer.send(self.options.topic, key=m.key, value=m.value, timestamp_ms=m.timestamp_ms)
                    for m in window
                ]
                for message, future in zip(window, futures):
                    future.get(timeout=self.options.send_timeout_s + 5)
                    with self._spool_lock:
                        self.spool.pop()
                        if self._foreign_spooled:
                            self._foreign_spooled -= 1
                            backlog_bytes = 0
                        else:
                            backlog_bytes = self._spooled_backlog.popleft() if self._spooled_backlog else 0
                    self._notify_space()  # room for a file's message waiting in submit
                    with self._lock:
                        self.stats.acked_messages += 1
                        self.stats.acked_lines += message.lines
                        self.stats.backlog_acked_bytes += backlog_bytes
                self._healthy = True
                self._notify_space()
                backoff = 0.2
                if last_problem:
                    log.warning("Kafka is taking messages again; %d still spooled", len(self.spool))
                    last_problem = ""
            except Exception as exc:  # noqa: BLE001 - any failure: back off, keep the spool, retry
                self._healthy = False
                problem = f"{type(exc).__name__}: {exc}"
                if problem != last_problem:  # say it once, not on every retry
                    log.warning("Kafka not taking messages (%s); spooling, retrying", problem)
                    last_problem = problem
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    # --- ending ----------------------------------------------------------------------------------

    def close(self, timeout_s: float) -> None:
        """Send what is in flight and in the spool for up to `timeout_s`; the rest stays spooled."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._producer is not None:
                with contextlib.suppress(Exception):
                    self._producer.flush(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            with self._lock:
                idle = self._in_flight == 0
            if idle and not len(self.spool) and not self._retry:
                break
            self._wake.set()
            time.sleep(0.05)
        self._stop.set()
        self._wake.set()
        self._drainer.join(timeout=max(1.0, self.options.send_timeout_s + 5))
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.close(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        # Files' messages still kept after failed deliveries: spooled if there is room, else deferred.
        with self._spool_lock:
            left = list(self._retry)
            self._retry.clear()
        for message in left:
            with self._spool_lock:
                spooled = self._spool_append(message)
            if spooled and message.on_durable:
                message.on_durable(message.seq)
            elif not spooled:
                self._defer(message)
        self.stats.pending_messages = len(self.spool)
        self.spool.close()


# --- positions of followed files --------------------------------------------------------------------


class Positions:
    """Where each followed file's next unsent line starts; advanced in order, only over durable messages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self.saved: dict[str, dict[str, int]] = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            self.saved = {}
        self._pending: dict[str, collections.deque[list[Any]]] = {}
        self._dirty = False

    def get(self, name: str) -> dict[str, int] | None:
        return self.saved.get(name)

    def expect(self, name: str, seq: int, position: dict[str, int]) -> None:
        with self._lock:
            self._pending.setdefault(name, collections.deque()).append([seq, position, False])

    def durable(self, name: str, seq: int) -> None:
        with self._lock:
            queue = self._pending.get(name)
            if not queue:
                return
            for item in queue:
                if item[0] == seq:
                    item[2] = True
                    break
            while queue and queue[0][2]:
                self.saved[name] = queue.popleft()[1]
                self._dirty = True

    def save(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            data = orjson.dumps(self.saved)
            self._dirty = False
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)


def resume_position(saved: dict[str, int] | None, inode: int, size: int) -> int | None:
    """Where a followed file resumes: its saved position, if saved for this inode and not past its end."""
    if saved and saved.get("inode") == inode and saved.get("pos", 0) <= size:
        return int(saved.get("pos", 0))
    return None


@dataclass
class BacklogFile:
    """One file's backlog when shipping started: from where it starts (resumes) to its size then."""

    inode: int | None
    start: int = 0
    size: int = 0

    @property
    def bytes(self) -> int:
        return max(0, self.size - self.start)


def measure_backlog(sources: dict[int, Source], positions: Positions) -> dict[int, BacklogFile]:
    """The backlog of every file source, from the positions a restart resumes at (as file_reader does)."""
    out: dict[int, BacklogFile] = {}
    for source in sources.values():
        if source.file is None:
            continue
        try:
            st = os.stat(source.file)
        except OSError:
            out[source.id] = BacklogFile(None)
            continue
        start = resume_position(positions.get(source.name), st.st_ino, st.st_size) or 0
        out[source.id] = BacklogFile(st.st_ino, start, st.st_size)
    return out


# --- the batcher --------------------------------------------------------------------------------------


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


class Batcher:
    """Chunks -> lines -> messages, one open batch per source; flushes on size and on linger time."""

    def __init__(self, options: ShipOptions, sources: dict[int, Source], queue: ChunkQueue, sender: Sender,
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
        self._host = options.host or socket.gethostname()

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
            self._add_texts(source, body.decode("utf-8", "replace").split("\n"), chunk.read_ts)
        elif chunk.end_pos is not None and source.id in self._batches:
            self._batches[source.id].position = self._position(source)
        if chunk.eof:
            # A stream ended (end_pos None), or one generation of a rotated/truncated file did.
            if self.options.line_filter is not None:
                self._add_runs(source, self.options.line_filter.heartbeat(source.name, final=True), chunk.read_ts)
            self._flush(source.id)
            if chunk.end_pos is None:
                self._open_sources.discard(source.id)

    def _position(self, source: Source) -> dict[str, int] | None:
        if source.file is None or source.inode is None:
            return None
        return {"inode": source.inode, "pos": source.pos, "line": source.next_line}

    def _add_texts(self, source: Source, texts: list[str], read_ts: float | None) -> None:
        if self.options.line_filter is not None and not getattr(self, "_in_run", False):
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
                batch = _Batch(first_line=source.next_line, started=time.monotonic())
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

    def _flush(self, source_id: int) -> None:
        batch = self._batches.pop(source_id, None)
        if batch is None or not batch.lines:
            return
        source = self.sources[source_id]
        o = self.options
        values = [encode_batch(
            batch.lines, job_id=o.job_id, host=self._host, rank=o.rank, local_rank=o.local_rank,
            pid=source.pid, attempt=o.attempt, file=source.file, labels=o.labels, offset=batch.first_line,
        )]
        if len(values[0]) > MAX_BATCH_BYTES:  # a few very long lines: split to stay under the limit
            from ingest.ship.wire_format import encode_batches

            values = encode_batches(
                batch.lines, job_id=o.job_id, host=self._host, rank=o.rank, local_rank=o.local_rank,
                pid=source.pid, attempt=o.attempt, file=source.file, labels=o.labels, offset=batch.first_line,
            )
        key = f"{o.job_id or ''}|{self._host}|{source.name}".encode()
        now_ms = int(time.time() * 1000)
        backlog_bytes = self._backlog_credit(source_id, batch.position) if batch.position and self._backlog else 0
        for index, value in enumerate(values):
            self._seq += 1
            seq = self._seq
            on_durable = None
            if self.positions is not None and batch.position is not None and index == len(values) - 1:
                self.positions.expect(source.name, seq, batch.position)
                name = source.name
                positions = self.positions
                on_durable = lambda s, name=name, positions=positions: positions.durable(name, s)
            lines = len(batch.lines) if len(values) == 1 else (len(batch.lines) if index == 0 else 0)
            self.sender.submit(Message(seq, key, value, now_ms, lines, on_durable,
                                       backlog_bytes if index == len(values) - 1 else 0, source.file is not None))


# --- readers -----------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> bool:
    """Pass bytes through; False once the other side is gone (then we only ship)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            time.sleep(0.001)
            continue
        except (BrokenPipeError, OSError):
            return False
        view = view[n:]
    return True


def pipe_reader(fd: int, source: Source, queue: ChunkQueue, passthrough_fd: int | None) -> None:
    """Read a pipe until EOF: pass every chunk through first, then queue it. Never waits on Kafka."""
    passing = passthrough_fd is not None
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    while True:
        try:
            data = os.read(fd, READ_CHUNK)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            break
        if passing:
            passing = _write_all(passthrough_fd, data)  # type: ignore[arg-type]
        queue.put(Chunk(source.id, data, time.time()))
    queue.put(Chunk(source.id, b"", time.time(), eof=True))


def file_reader(path: Path, source: Source, queue: ChunkQueue, positions: Positions, options: ShipOptions,
                stop: threading.Event) -> None:
    """Read a file from its saved position; with `follow`, keep reading across rotation and truncation.

    While the shipper is behind (the queue full), reading waits: the file keeps the lines meanwhile.
    Stopped (SIGINT/SIGTERM) with more to read, it ends at the last whole line of the chunk in hand;
    the next run resumes from the position saved for what was shipped."""
    saved = positions.get(source.name)
    f: BinaryIO | None = None
    while f is None:
        try:
            f = open(path, "rb")  # noqa: SIM115 - kept open across rotations, closed below
        except FileNotFoundError:
            if not options.follow or stop.is_set():
                log.warning("%s: no such file", path)
                queue.put_file(Chunk(source.id, b"", None, eof=True), None)
                return
            stop.wait(options.poll_s)
    st = os.fstat(f.fileno())
    pos = 0
    resume = resume_position(saved, st.st_ino, st.st_size)
    if saved and resume is not None:
        pos = resume
        source.next_line = int(saved.get("line", 0))
        f.seek(pos)
    inode = st.st_ino
    backlog_end = st.st_size  # bytes written before we started: their time is unknown
    while True:
        data = f.read(READ_CHUNK)
        if data:
            live = pos >= backlog_end
            start, pos = pos, pos + len(data)
            read_ts = time.time() if live else None
            if not stop.is_set() and queue.put_file(Chunk(source.id, data, read_ts, end_pos=pos, inode=inode), stop):
                continue
            # Stopping: the whole lines of this chunk (so no line is cut in two), then the end.
            cut = data.rfind(b"\n") + 1
            if cut:
                queue.put_file(Chunk(source.id, data[:cut], read_ts, end_pos=start + cut, inode=inode), None)
            break
        if not options.follow or stop.is_set():
            break
        try:
            st = os.stat(path)
        except FileNotFoundError:  # rotated away, the new one not created yet
            stop.wait(options.poll_s)
            continue
        if st.st_ino != inode:
            # Rotated: the old generation is read to its end; its last partial line is a line.
            queue.put_file(Chunk(source.id, b"", time.time(), end_pos=pos, inode=inode, eof=True), None)
            f.close()
            f = open(path, "rb")  # noqa: SIM115 - the new generation, closed below
            inode, pos, backlog_end = os.fstat(f.fileno()).st_ino, 0, 0
            continue
        if st.st_size < pos:  # truncated in place (copytruncate)
            queue.put_file(Chunk(source.id, b"", time.time(), end_pos=pos, inode=inode, eof=True), None)
            f.seek(0)
            pos, backlog_end = 0, 0
            continue
        stop.wait(options.poll_s)
    f.close()
    queue.put_file(Chunk(source.id, b"", None, eof=True), None)


# --- running ---------------------------------------------------------------------------------------------


def _state_key(options: ShipOptions, files: Sequence[str], command: Sequence[str]) -> str:
    basis = orjson.dumps([options.job_id, options.rank, options.topic, sorted(str(Path(f).resolve()) for f in files),
                          list(command[:1])])
    return hashlib.sha1(basis).hexdigest()[:12]


@contextlib.contextmanager
def _locked_dir(base: Path, name: str) -> Iterator[Path]:
    """A state folder only this process uses (a second shipper with the same inputs gets its own)."""
    base.mkdir(parents=True, exist_ok=True)
    candidates = [base / name, base / f"{name}-{os.getpid()}"]
    for path in candidates:
        path.mkdir(parents=True, exist_ok=True)
        lock = open(path / "lock", "w")  # noqa: SIM115 - held for the whole run
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        try:
            yield path
        finally:
            lock.close()
        return
    raise RuntimeError(f"no free state folder under {base}")


def run_ship(options: ShipOptions, *, files: Sequence[str] = (), command: Sequence[str] = ()) -> int:
    """Ship until the input ends (or, following files, until SIGINT/SIGTERM). Returns the exit code:
    the wrapped command's, else 0 (1 when lines of a pipe were dropped because the spool or the
    overflow file was full; files are never dropped: reading them waits instead)."""
    if options.attempt is None and os.environ.get("TORCHELASTIC_RESTART_COUNT", "").isdigit():
        options.attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # Hand the GIL over quickly, so the pipe readers run as soon as the child writes.
    sys.setswitchinterval(0.001)
    # Batches are millions of short-lived tuples and no cycles: collecting them is pure overhead.
    gc.set_threshold(200_000, 50, 100)
    with _locked_dir(Path(options.state_dir), _state_key(options, files, command)) as state:
        return _run(options, state, list(files), list(command))


# Parent -> shipping process: one frame per chunk (or a source's pid, once the command started).
_FRAME = struct.Struct(">BHdqQ?qI")
_FRAME_CHUNK, _FRAME_PID = 0, 1


def _forward_frames(fd: int, queue: ChunkQueue, open_sources: int) -> None:
    """Parent side: chunks to the shipping process, until every source ended. Blocking writes are
    fine here: pipe readers never wait for this thread, the queue (and its disk overflow) absorbs;
    file readers do wait once the queue is full, which is the backpressure on files."""
    try:
        with os.fdopen(fd, "wb", buffering=READ_CHUNK) as pipe:
            while open_sources:
                chunk = queue.get(timeout=0.5)
                if chunk is None:
                    continue
                pipe.write(_FRAME.pack(_FRAME_CHUNK, chunk.source_id,
                                       chunk.read_ts if chunk.read_ts is not None else -1.0,
                                       chunk.end_pos if chunk.end_pos is not None else -1, chunk.inode or 0,
                                       chunk.eof, 0, len(chunk.data)))
                pipe.write(chunk.data)
                pipe.flush()  # chunks are already large; followed files must not wait for more
                if chunk.eof and chunk.end_pos is None:
                    open_sources -= 1
    except OSError as exc:  # the shipping process is gone: file readers must not wait for room forever
        log.error("the shipping process is gone (%s): stopped reading", exc)
        queue.consumer_gone()


def _send_pid(fd: int, source_id: int, pid: int) -> None:
    os.write(fd, _FRAME.pack(_FRAME_PID, source_id, -1.0, -1, 0, False, pid, 0))


class _FrameQueue:
    """Shipping-process side: frames from the parent as chunks, with backpressure (bounded)."""

    def __init__(self, fd: int, sources: dict[int, Source]) -> None:
        import queue as queue_mod

        self._queue: queue_mod.Queue[Chunk] = queue_mod.Queue(maxsize=32)
        self._empty = queue_mod.Empty
        self._sources = sources
        self._thread = threading.Thread(target=self._read, args=(fd,), name="ship-frames", daemon=True)
        self._thread.start()

    def _read(self, fd: int) -> None:
        ended: set[int] = set()
        with os.fdopen(fd, "rb", buffering=READ_CHUNK) as pipe:
            while True:
                header = pipe.read(_FRAME.size)
                if len(header) < _FRAME.size:
                    break
                kind, source_id, ts, end_pos, inode, eof, pid, length = _FRAME.unpack(header)
                data = pipe.read(length) if length else b""
                if kind == _FRAME_PID:
                    self._sources[source_id].pid = pid
                    continue
                chunk = Chunk(source_id, data, None if ts < 0 else ts, None if end_pos < 0 else end_pos,
                              inode or None, eof)
                self._queue.put(chunk)
                if eof and chunk.end_pos is None:
                    ended.add(source_id)
        # The parent is gone (or done): end every stream it did not end, so the batcher finishes.
        for source_id in self._sources:
            if source_id not in ended:
                self._queue.put(Chunk(source_id, b"", None, eof=True))

    def get(self, timeout: float) -> Chunk | None:
        try:
            return self._queue.get(timeout=timeout)
        except self._empty:
            return None


def _start_progress(options: ShipOptions, stats: ShipStats, backlog: dict[int, BacklogFile] | None) -> Any:
    """The backlog display (ingest.ship.progress), started, or None: it lives here, where the acks are."""
    from ingest.ship.progress import BacklogProgress, progress_mode

    total = sum(b.bytes for b in backlog.values()) if backlog is not None else None
    try:
        is_terminal = sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        is_terminal = False
    mode = progress_mode(options.progress, is_terminal, total)
    if mode is None or total is None:
        return None
    progress = BacklogProgress(stats, total, mode, interval_s=options.progress_interval_s, follow=options.follow)
    progress.start()
    return progress


def _watch_control(fd: int, sender: Sender) -> None:
    """Shipping-process side of the control pipe: a byte (the parent is stopping) or its end (the
    parent is gone): a file's message waiting for room in the spool gives up (see Sender.stop_waiting)."""
    with contextlib.suppress(OSError):
        os.read(fd, 1)
    sender.stop_waiting()


def _shipping_process(fd: int, options: ShipOptions, state: Path, sources: dict[int, Source],
                      backlog: dict[int, BacklogFile] | None = None, control_fd: int | None = None) -> int:
    """The forked process that batches and sends, at low CPU priority: the wrapped command (and the
    parent that passes its output through) always come first."""
    with contextlib.suppress(OSError):
        os.nice(10)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # It stops when the parent's stream ends, after draining (bounded by drain_timeout_s).
        signal.signal(signum, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # never holds the parent's stdout open (a `| tee` downstream sees EOF in time)
    os.close(devnull)
    stats = ShipStats()
    spool = Spool(state / "spool", options.spool_max_bytes)
    positions = Positions(state / "positions.json")
    sender = Sender(options, spool, stats)
    if control_fd is not None:
        threading.Thread(target=_watch_control, args=(control_fd, sender), name="ship-control", daemon=True).start()
    frames = _FrameQueue(fd, sources)
    batcher = Batcher(options, sources, frames, sender, positions, stats, backlog)  # type: ignore[arg-type]
    if options.on_start is not None:
        options.on_start(stats, options.line_filter)
    progress = _start_progress(options, stats, backlog)
    saver_stop = threading.Event()

    def save_positions() -> None:
        while not saver_stop.wait(1.0):
            positions.save()

    threading.Thread(target=save_positions, name="ship-positions", daemon=True).start()
    try:
        batcher.run(threading.Event())
    finally:
        sender.close(options.drain_timeout_s)
        saver_stop.set()
        positions.save()
        if progress is not None:
            progress.stop()
    print(
        f"rootrank ship: {stats.lines} lines in {stats.messages} messages; "
        f"{stats.acked_messages} acknowledged, {stats.spooled_messages} went through the spool, "
        f"{stats.pending_messages} still spooled in {state / 'spool'}"
        + (f", {stats.waited_messages} waited for room in the spool (reading the files paused)"
           if stats.waited_messages else "")
        + (f", {stats.deferred_lines} lines left for the next run (the spool was full when stopped; "
           "their files' saved positions are before them)" if stats.deferred_messages else "")
        + (f", {stats.dropped_lines} lines dropped (spool full)" if stats.dropped_lines else ""),
        file=sys.stderr, flush=True,
    )
    if stats.dropped_lines:
        print(f"rootrank ship: ERROR: {stats.dropped_lines} lines in {stats.dropped_messages} messages were NOT shipped: "
              f"Kafka was not taking messages and the spool in {state / 'spool'} was full "
              f"(--spool-max-mib {options.spool_max_bytes / 2**20:g}); raise --spool-max-mib (disk permitting) "
              "or check the broker", file=sys.stderr, flush=True)
    return 1 if stats.dropped_lines else 0


def _run(options: ShipOptions, state: Path, files: list[str], command: list[str]) -> int:
    """Two processes: this one reads the inputs (and passes a wrapped command's output through);
    a forked, lower-priority one batches and sends. Only chunks cross, through a pipe."""
    sources: dict[int, Source] = {}

    def add_source(**kw: Any) -> Source:
        source = Source(id=len(sources), **kw)
        sources[source.id] = source
        return source

    if command:
        for name in ("stdout", "stderr"):
            add_source(name=name, stream=name)
    elif files:
        for path in files:
            add_source(name=str(Path(path).resolve()), file=path)
    else:
        add_source(name="stdin")

    positions = Positions(state / "positions.json")  # read-only here: where followed files resume
    # Files: their backlog, measured before any is read (the shipping process shows its progress).
    backlog = measure_backlog(sources, positions) if files else None

    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    # Parent -> shipping process, beside the frames (which may be blocked by backpressure): one byte
    # when stopping; its end when the parent is gone.
    control_read, control_write = os.pipe()
    os.set_blocking(control_write, False)  # written from a signal handler: never waits
    shipper_pid = os.fork()
    if shipper_pid == 0:  # the shipping process
        code = 1
        try:
            os.close(write_end)
            os.close(control_write)
            code = _shipping_process(read_end, options, state, sources, backlog, control_read)
        except BaseException:
            log.exception("shipping process failed")
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(read_end)
    os.close(control_read)
    try:
        return _read_inputs(options, state, sources, positions, files, command, write_end, shipper_pid,
                            control_write)
    finally:
        os.close(control_write)


def _read_inputs(options: ShipOptions, state: Path, sources: dict[int, Source], positions: Positions,
                 files: list[str], command: list[str], write_end: int, shipper_pid: int, control_write: int) -> int:
    """The parent's side of `_run`, once the shipping process is forked: read, forward, wait for it."""
    queue = ChunkQueue(options.queue_max_bytes, state / "overflow", options.spool_max_bytes)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    child: subprocess.Popen[bytes] | None = None
    if command:
        try:
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            print(f"rootrank ship: cannot run {command[0]}: {exc}", file=sys.stderr)
            for source in sources.values():
                queue.put(Chunk(source.id, b"", None, eof=True))
            _forward_frames(write_end, queue, len(sources))
            os.waitpid(shipper_pid, 0)
            return 127
        assert child.stdout is not None and child.stderr is not None
        for source, pipe, out_fd in ((sources[0], child.stdout, 1), (sources[1], child.stderr, 2)):
            source.pid = child.pid
            _send_pid(write_end, source.id, child.pid)
            threads.append(threading.Thread(target=pipe_reader, args=(pipe.fileno(), source, queue, out_fd),
                                            name=f"ship-{source.name}", daemon=True))
    elif files:
        for source in sources.values():
            threads.append(threading.Thread(target=file_reader,
                                            args=(Path(source.file or ""), source, queue, positions, options, stop),
                                            name=f"ship-file-{source.id}", daemon=True))
    else:
        threads.append(threading.Thread(target=pipe_reader,
                                        args=(sys.stdin.fileno(), sources[0], queue, 1 if options.tee else None),
                                        name="ship-stdin", daemon=True))
    forwarder = threading.Thread(target=_forward_frames, args=(write_end, queue, len(sources)),
                                 name="ship-forward", daemon=True)

    def forward(signum: int, _frame: Any) -> None:
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)
        else:
            stop.set()
            with contextlib.suppress(OSError):  # full (it was told already), or closed
                os.write(control_write, b"s")

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        if signum == signal.SIGINT and child is not None:
            # The terminal already sends Ctrl-C to the whole foreground group, the child included.
            previous[signum] = signal.signal(signum, signal.SIG_IGN)
        else:
            previous[signum] = signal.signal(signum, forward)
    for thread in threads:
        thread.start()
    forwarder.start()
    code = 0
    try:
        if child is not None:
            code = child.wait()
            if code < 0:
                code = 128 - code  # killed by a signal: report it like a shell does
        for thread in [*threads, forwarder]:
            while thread.is_alive():
                thread.join(0.2)
        _, status = os.waitpid(shipper_pid, 0)
    finally:
        stop.set()
        queue.close()
        for restored, handler in previous.items():
            signal.signal(restored, handler)
    shipper_failed = os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0 or os.WIFSIGNALED(status)
    if queue.dropped_chunks:
        what = "the command's output" if command else "standard input"
        print(f"rootrank ship: ERROR: {queue.dropped_bytes} bytes (about {queue.dropped_lines} lines, in "
              f"{queue.dropped_chunks} chunks) of {what} were NOT shipped: shipping fell behind and the overflow "
              f"file in {state / 'overflow'} was full (--spool-max-mib "
              f"{options.spool_max_bytes / 2**20:g}); raise --spool-max-mib (disk permitting) or make Kafka faster",
              file=sys.stderr, flush=True)
    if code == 0 and (shipper_failed or queue.dropped_bytes):
        return 1
    return code
