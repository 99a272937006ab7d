"""Messages to Kafka (acks=all), or to the disk spool while Kafka cannot take them; the spool's drain."""

from __future__ import annotations

import collections
import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import RetryCallState, Retrying, stop_when_event_set, wait_exponential

from ingest.ship.options import ShipOptions, ShipStats
from ingest.ship.spool import Spool
from ingest.ship.wire_format import MAX_BATCH_BYTES

log = logging.getLogger("rootrank.ship")


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
        import lz4  # noqa: F401 - only whether it is installed

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
        self._last_problem = ""  # the drain's last failure, said once
        self._wake = threading.Event()
        self._stop = threading.Event()
        # Told where each acknowledged message landed (key, partition, offset): the positions remember it.
        self.on_kafka_ack: Callable[[bytes, int, int], None] | None = None
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

    def _on_ack(self, message: Message, metadata: Any) -> None:
        with self._lock:
            self._in_flight -= 1
        self._acked(message, metadata)

    def _acked(self, message: Message, metadata: Any) -> None:
        with self._lock:
            self.stats.acked_messages += 1
            self.stats.acked_lines += message.lines
            self.stats.backlog_acked_bytes += message.backlog_bytes
        if message.on_durable:
            message.on_durable(message.seq)
        self._landed(message, metadata)

    def _landed(self, message: Message, metadata: Any) -> None:
        on_ack = self.on_kafka_ack
        partition, offset = getattr(metadata, "partition", None), getattr(metadata, "offset", None)
        if on_ack is not None and isinstance(partition, int) and isinstance(offset, int) and offset >= 0:
            on_ack(message.key, partition, offset)

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
            for message, future in zip(window, futures, strict=True):
                self._acked(message, future.get(timeout=self.options.send_timeout_s + 5))
                done += 1
        finally:
            if done < len(window):
                with self._spool_lock:
                    self._retry.extendleft(reversed(window[done:]))

    def _drain_loop(self) -> None:
        """Send the spool until closed. While Kafka fails, the next try waits 0.2 s, doubling up to 5 s,
        back to 0.2 s after a window is sent; closing ends the wait at once."""
        retrying = Retrying(
            sleep=self._wait_unless_closed,
            stop=stop_when_event_set(self._stop),
            wait=wait_exponential(multiplier=0.2, max=5.0),
            after=self._kafka_failed,
            retry_error_callback=lambda _state: None,  # closed while Kafka was failing: the spool keeps the rest
        )
        while not self._stop.is_set():
            retrying(self._send_spool_window)

    def _wait_unless_closed(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _send_spool_window(self) -> None:
        """Create the producer, then send the spool head-first, one window (waiting while the spool is
        empty); pop each once acknowledged. A successful window marks the producer healthy again."""
        while not self._stop.is_set():
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
            for message, future in zip(window, futures, strict=True):
                metadata = future.get(timeout=self.options.send_timeout_s + 5)
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
                self._landed(message, metadata)
            self._healthy = True
            self._notify_space()
            if self._last_problem:
                log.warning("Kafka is taking messages again; %d still spooled", len(self.spool))
                self._last_problem = ""
            return

    def _kafka_failed(self, retry_state: RetryCallState) -> None:
        """Any failure of the drain keeps the spool; the problem is said once, not on every retry."""
        self._healthy = False
        exc = retry_state.outcome.exception() if retry_state.outcome is not None else None
        problem = f"{type(exc).__name__}: {exc}"
        if problem != self._last_problem:
            log.warning("Kafka not taking messages (%s); spooling, retrying", problem)
            self._last_problem = problem

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
