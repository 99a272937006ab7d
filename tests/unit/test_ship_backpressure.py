"""Backpressure in `rootrank ship`, without a broker: a file's lines wait for room instead of being
dropped (the parent's queue, and the sender with a full spool); a pipe's overflow still drops, loudly;
a stop while waiting leaves the saved position before what was not shipped."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from ingest.ship import readers as ship_readers
from ingest.ship.batcher import Batcher
from ingest.ship.chunks import Chunk, ChunkQueue, Source
from ingest.ship.options import ShipOptions, ShipStats
from ingest.ship.positions import Positions
from ingest.ship.readers import file_reader
from ingest.ship.sender import Message, Sender, _pack_message, _unpack_message
from ingest.ship.spool import Spool
from ingest.ship.wire_format import parse_batch


def _in_thread(fn: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, args=args, daemon=True)
    thread.start()
    return thread


def _wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# --- the parent's queue ------------------------------------------------------------------------------


def test_a_file_chunk_waits_for_room_and_never_spills(tmp_path: Path) -> None:
    queue = ChunkQueue(100, tmp_path / "overflow", 1 << 20)
    stop = threading.Event()
    assert queue.put_file(Chunk(0, b"a" * 80, None, end_pos=80), stop)
    second = _in_thread(queue.put_file, Chunk(0, b"b" * 80, None, end_pos=160), stop)
    time.sleep(0.3)
    assert second.is_alive() and queue.waits == 1  # waiting: no room in memory
    assert queue.get(0.1).data == b"a" * 80  # type: ignore[union-attr]
    second.join(5)
    assert not second.is_alive()
    assert queue.get(0.1).data == b"b" * 80  # type: ignore[union-attr]
    assert not (tmp_path / "overflow").exists() and queue.dropped_bytes == 0


def test_a_waiting_file_chunk_gives_up_when_stopped(tmp_path: Path) -> None:
    queue = ChunkQueue(100, tmp_path / "overflow", 1 << 20)
    stop = threading.Event()
    queue.put_file(Chunk(0, b"a" * 80, None), stop)
    result: list[bool] = []
    waiting = _in_thread(lambda: result.append(queue.put_file(Chunk(0, b"b" * 80, None), stop)))
    time.sleep(0.3)
    stop.set()
    waiting.join(5)
    assert result == [False]
    assert queue.put_file(Chunk(0, b"", None, eof=True), None)  # the end always goes in


def test_file_reader_waits_for_a_slow_consumer_and_loses_nothing(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ship_readers, "READ_CHUNK", 4096)
    data = b"".join(b"line %06d %s\n" % (i, b"z" * (i % 50)) for i in range(20_000))
    path = tmp_path / "rank0.log"
    path.write_bytes(data)
    queue = ChunkQueue(3 * 4096, tmp_path / "overflow", 4096)  # a few chunks in memory, a tiny overflow
    source = Source(id=0, name=str(path), file=str(path))
    reader = _in_thread(file_reader, path, source, queue, Positions(tmp_path / "positions.json"),
                        ShipOptions(), threading.Event())
    got: list[Chunk] = []
    while not (got and got[-1].eof):
        chunk = queue.get(1.0)
        if chunk is not None:
            got.append(chunk)
            if len(got) % 20 == 0:
                time.sleep(0.01)  # slower than the reader
    reader.join(5)
    assert b"".join(c.data for c in got) == data
    assert [c.end_pos for c in got[:-1]] == [*list(range(4096, len(data), 4096)), len(data)]
    assert queue.waits > 10 and queue.dropped_bytes == 0 and not (tmp_path / "overflow").exists()


def test_file_reader_stopped_while_waiting_ends_at_a_whole_line(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ship_readers, "READ_CHUNK", 1000)
    data = b"".join(b"line %d\n" % i for i in range(5000))
    path = tmp_path / "rank0.log"
    path.write_bytes(data)
    queue = ChunkQueue(2000, tmp_path / "overflow", 1 << 20)
    stop = threading.Event()
    source = Source(id=0, name=str(path), file=str(path))
    reader = _in_thread(file_reader, path, source, queue, Positions(tmp_path / "positions.json"), ShipOptions(), stop)
    _wait_for(lambda: queue.waits > 0)  # the queue is full: the reader waits
    stop.set()
    reader.join(5)
    assert not reader.is_alive()
    got = []
    while (chunk := queue.get(0.01)) is not None:
        got.append(chunk)
    assert got[-1].eof and got[-1].end_pos is None
    shipped = b"".join(c.data for c in got)
    assert shipped.endswith(b"\n") and data.startswith(shipped) and len(shipped) < len(data)
    assert got[-2].end_pos == len(shipped)  # the position after the last whole line


def test_a_pipe_overflow_drop_is_loud_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queue = ChunkQueue(100, tmp_path / "overflow", 300)
    for _ in range(10):
        queue.put(Chunk(0, b"x" * 39 + b"\n", time.time()))  # 40 bytes, one line each
    queue.close()
    err = capsys.readouterr().err
    assert err.count("DROPPED") == 1 and "raise --spool-max-mib" in err  # said once, at the first drop
    assert queue.dropped_chunks > 0 and queue.dropped_lines == queue.dropped_chunks
    assert queue.dropped_bytes == 40 * queue.dropped_chunks


# --- the sender: a full spool -------------------------------------------------------------------------


class Future:
    """Done at once (acknowledged, or failed with `error`), or held until the test fails it."""

    def __init__(self, error: BaseException | None = None, held: bool = False) -> None:
        self.error = error
        self.held = held
        self.errbacks: list[tuple[Any, tuple[Any, ...]]] = []

    def add_callback(self, fn: Any, *args: Any) -> None:
        if not self.held and self.error is None:
            fn(*args, None)

    def add_errback(self, fn: Any, *args: Any) -> None:
        if self.held:
            self.errbacks.append((fn, args))
        elif self.error is not None:
            fn(*args, self.error)

    def fail(self, error: BaseException) -> None:
        self.held, self.error = False, error
        for fn, args in self.errbacks:
            fn(*args, error)

    def get(self, timeout: float) -> None:
        if self.held or self.error is not None:
            raise self.error or TimeoutError("delivery timed out")


class SwitchProducer:
    """A broker that is down until `up` is set. Down: send() raises (its buffer is full), or, with
    `hold`, takes the message, whose delivery fails when the test says (as after a send timeout)."""

    def __init__(self, hold: bool = False) -> None:
        self.up = threading.Event()
        self.hold = hold
        self.held: list[Future] = []
        self.sent: list[bytes] = []

    def send(self, topic: str, *, key: bytes, value: bytes, timestamp_ms: int) -> Future:
        if self.up.is_set():
            self.sent.append(value)
            return Future()
        if self.hold:
            self.held.append(Future(held=True))
            return self.held[-1]
        raise TimeoutError("buffer full")

    def fail_held(self) -> None:
        held, self.held = self.held, []
        for future in held:
            future.fail(TimeoutError("delivery timed out"))

    def flush(self, timeout: float) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass


def _sender(tmp_path: Path, spool_bytes: int, producer: SwitchProducer) -> tuple[Sender, ShipStats]:
    class TestSender(Sender):
        def _make_producer(self) -> Any:
            return producer

    stats = ShipStats()
    return TestSender(ShipOptions(), Spool(tmp_path / "spool", spool_bytes), stats), stats


def _message(seq: int, durable: list[int], *, wait: bool = True, size: int = 1000) -> Message:
    return Message(seq, b"k", b"v" * size, 0, 10, durable.append, 100, wait)


RECORD = len(_pack_message(_message(0, []))) + 8  # one message in the spool, with its record header


def test_a_files_message_waits_for_room_in_the_spool_then_is_durable(tmp_path: Path) -> None:
    producer = SwitchProducer()
    sender, stats = _sender(tmp_path, 2 * RECORD, producer)
    durable: list[int] = []
    for seq in (1, 2):
        sender.submit(_message(seq, durable))  # Kafka down: spooled
    third = _in_thread(sender.submit, _message(3, durable))
    time.sleep(0.5)
    assert third.is_alive()  # the spool is full: waiting, neither dropped nor durable
    assert durable == [1, 2] and stats.dropped_lines == 0 and stats.waited_messages == 1
    producer.up.set()  # Kafka is back: the spool drains, the waiting message goes on
    third.join(10)
    assert not third.is_alive()
    sender.close(5.0)
    assert sorted(durable) == [1, 2, 3] and len(producer.sent) == 3
    assert (stats.acked_messages, stats.dropped_messages, stats.deferred_messages) == (3, 0, 0)
    assert stats.backlog_acked_bytes == 300  # the progress display's count: all of it acknowledged


def test_a_pipes_message_is_still_dropped_when_the_spool_is_full(tmp_path: Path) -> None:
    sender, stats = _sender(tmp_path, RECORD, SwitchProducer())
    durable: list[int] = []
    sender.submit(_message(1, durable, wait=False))
    sender.submit(_message(2, durable, wait=False))  # does not wait: a wrapped command must not block
    sender.close(0.2)
    assert (stats.spooled_messages, stats.dropped_messages, stats.dropped_lines) == (1, 1, 10)


def test_failed_deliveries_with_a_full_spool_are_kept_and_sent_later(tmp_path: Path) -> None:
    producer = SwitchProducer(hold=True)
    sender, stats = _sender(tmp_path, RECORD, producer)
    _wait_for(lambda: sender._healthy)  # the producer is up and the spool empty: messages go straight to it
    durable: list[int] = []
    for seq in range(1, 6):
        sender.submit(_message(seq, durable))
    assert durable == [] and len(producer.held) == 5  # in flight
    producer.fail_held()  # the broker went away: every delivery fails
    # The first failed message went to the spool, the others are kept: not durable, not dropped.
    assert durable == [1] and len(sender._retry) == 4 and stats.dropped_lines == 0
    producer.up.set()
    _wait_for(lambda: len(durable) == 5)
    sender.close(5.0)
    assert sorted(durable) == [1, 2, 3, 4, 5] and sorted(producer.sent) == [b"v" * 1000] * 5
    assert (stats.acked_messages, stats.dropped_messages, stats.deferred_messages) == (5, 0, 0)
    assert stats.backlog_acked_bytes == 500


def test_stop_while_waiting_defers_and_the_position_stays_before(tmp_path: Path) -> None:
    """The batcher blocks on a full spool; told to stop, it leaves the rest for the next run: the
    saved position is exactly after the last line that is in the spool."""
    producer = SwitchProducer()
    sender, stats = _sender(tmp_path, 8 * 1024, producer)
    positions = Positions(tmp_path / "positions.json")
    data = b"".join(b"line %05d %s\n" % (i, b"q" * 40) for i in range(3000))
    chunks = [Chunk(0, data[i : i + 4096], None, end_pos=min(i + 4096, len(data)), inode=9)
              for i in range(0, len(data), 4096)]
    chunks.append(Chunk(0, b"", None, eof=True))
    sources = {0: Source(id=0, name="/logs/rank0.log", file="/logs/rank0.log")}

    class ListQueue:
        def get(self, timeout: float) -> Chunk | None:
            return chunks.pop(0) if chunks else None

    batcher = Batcher(ShipOptions(job_id="job", host="node-a", batch_max_bytes=2048), sources,
                      ListQueue(), sender, positions, stats)  # type: ignore[arg-type]
    running = _in_thread(batcher.run, threading.Event())
    _wait_for(lambda: stats.waited_messages > 0)
    time.sleep(0.2)
    assert running.is_alive()  # waiting for room, not dropping
    sender.stop_waiting()
    running.join(10)
    assert not running.is_alive()
    sender._stop.set()
    sender._drainer.join(5)
    positions.save()
    saved = orjson.loads((tmp_path / "positions.json").read_bytes())["/logs/rank0.log"]
    spooled = [orjson.loads(_unpack_message(raw).value) for raw in sender.spool.peek_many(10_000)]
    # The lines in the spool from the start without a gap: the saved position never goes past them
    # (it may lag: a message cut mid-chunk carries the position of the chunk before; and a later,
    # smaller message may have fit in the spool too; the next run sends those lines again).
    covered = 0
    for batch in sorted(spooled, key=lambda b: b["offset"]):
        if batch["offset"] == covered:
            covered += len(parse_batch(batch).lines)
    assert 0 < saved["line"] <= covered < 3000
    assert saved["pos"] == data.index(b"line %05d" % saved["line"]) and saved["inode"] == 9
    assert stats.deferred_lines > 0 and stats.dropped_lines == 0
    assert stats.deferred_lines + sum(len(parse_batch(b).lines) for b in spooled) == 3000  # each line: spooled or deferred
