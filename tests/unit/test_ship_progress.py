"""Backlog progress of `rootrank ship --file`: which display, the status line, the backlog total
(also after a restart), the bytes each message completes, and the acknowledged-bytes counter through
the direct and the spooled paths. No broker: fakes stand in for the producer."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from ingest.ship import progress as ship_progress
from ingest.ship.batcher import Batcher
from ingest.ship.chunks import Chunk, Source
from ingest.ship.options import ShipOptions, ShipStats
from ingest.ship.positions import BacklogFile, Positions, measure_backlog
from ingest.ship.progress import (
    AUTO_MIN_BYTES,
    BacklogProgress,
    Counters,
    RateMeter,
    caught_up_line,
    format_bytes,
    progress_mode,
    status_line,
)
from ingest.ship.runner import _start_progress
from ingest.ship.sender import Message, Sender, _pack_message
from ingest.ship.spool import Spool

MiB = 1 << 20


# --- which display ------------------------------------------------------------------------------------


@pytest.mark.parametrize("choice,terminal,backlog,want", [
    ("auto", False, 10 * AUTO_MIN_BYTES, None),  # not a terminal: no display, however large
    ("auto", True, AUTO_MIN_BYTES, None),  # a terminal, a small backlog
    ("auto", True, AUTO_MIN_BYTES + 1, "bar"),
    ("always", True, 0, "bar"),
    ("always", False, 1, "plain"),  # a log file or a pipe: plain lines, no escape codes
    ("never", True, 10 * AUTO_MIN_BYTES, None),
    ("always", True, None, None),  # wrapping a command or reading stdin: no backlog, no display
    ("always", False, None, None),
])
def test_progress_mode(choice: str, terminal: bool, backlog: int | None, want: str | None) -> None:
    assert progress_mode(choice, terminal, backlog) == want


def test_no_display_in_command_mode_even_with_always() -> None:
    assert _start_progress(ShipOptions(progress="always"), ShipStats(), None) is None


def test_auto_picks_no_display_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal
    backlog = {0: BacklogFile(1, 0, 10 * AUTO_MIN_BYTES)}
    assert _start_progress(ShipOptions(progress="auto"), ShipStats(), backlog) is None


# --- the status line ---------------------------------------------------------------------------------


def test_status_line() -> None:
    line = status_line(Counters(acked=2 * MiB, dropped=0, lines=20_000, spooled=300), 5 * MiB, rate=0.5 * MiB)
    assert line == ("rootrank ship: backlog 2097152/5242880 bytes acknowledged (40.0%, 2.00 MiB of 5.00 MiB), "
                    "512.00 KiB/s, ETA 0:00:06; 20000 lines sent, 300 spooled")
    assert "\x1b" not in line


def test_status_line_before_any_rate_and_with_drops() -> None:
    line = status_line(Counters(acked=0, dropped=1000, lines=0, spooled=0), 3 * 1024**3, rate=None)
    assert "0/3221225472 bytes acknowledged (0.0%, 0 B of 3.00 GiB), ? B/s, ETA ?" in line
    assert line.endswith(", 1000 bytes dropped (spool full)")


def test_eta_over_an_hour_and_a_finished_backlog() -> None:
    assert "ETA 2:46:40" in status_line(Counters(0, 0, 0, 0), 10_000 * MiB, rate=MiB)
    assert "ETA 0:00:00" in status_line(Counters(5, 0, 0, 0), 5, rate=None)
    assert "(100.0%" in status_line(Counters(0, 0, 0, 0), 0, rate=None)  # an empty backlog is done


def test_caught_up_line() -> None:
    line = caught_up_line(Counters(acked=5 * MiB, dropped=0, lines=40_000, spooled=0), 5 * MiB, 2.0, follow=True)
    assert line == ("rootrank ship: backlog caught up: 5242880/5242880 bytes acknowledged (5.00 MiB) in 0:00:02, "
                    "2.50 MiB/s; 40000 lines sent, 0 spooled; following live")
    assert not caught_up_line(Counters(1, 0, 1, 0), 1, 1.0, follow=False).endswith("following live")


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 5 * MiB + MiB // 2, 7 * 1024**4)] == [
        "0 B", "1023 B", "1.00 KiB", "5.50 MiB", "7168.00 GiB"]


def test_rate_over_a_sliding_window() -> None:
    meter = RateMeter(window_s=10.0)
    assert meter.rate() is None
    meter.add(0.0, 0)
    meter.add(1.0, 100)  # fast at first
    assert meter.rate() == 100.0
    for t in range(2, 40):
        meter.add(float(t), 100 + (t - 1) * 10)  # then slow: the window forgets the fast start
    assert meter.rate() == pytest.approx(10.0)


# --- the backlog total -----------------------------------------------------------------------------


def _file_sources(*paths: Path) -> dict[int, Source]:
    return {i: Source(id=i, name=str(p.resolve()), file=str(p)) for i, p in enumerate(paths)}


def test_backlog_is_counted_from_the_positions_a_restart_resumes_at(tmp_path: Path) -> None:
    resumed, rotated, truncated, fresh = (tmp_path / n for n in ("resumed.log", "rotated.log", "truncated.log",
                                                                  "fresh.log"))
    for path, size in ((resumed, 10_000), (rotated, 3000), (truncated, 500), (fresh, 700)):
        path.write_bytes(b"x" * (size - 1) + b"\n")
    sources = _file_sources(resumed, rotated, truncated, fresh, tmp_path / "missing.log")
    sources[5] = Source(id=5, name="stdin")  # not a file: no backlog
    saved = {
        sources[0].name: {"inode": os.stat(resumed).st_ino, "pos": 4000, "line": 12},  # same file: resumes
        sources[1].name: {"inode": os.stat(rotated).st_ino + 12345, "pos": 2000, "line": 3},  # another file now
        sources[2].name: {"inode": os.stat(truncated).st_ino, "pos": 900, "line": 3},  # shorter than saved
    }
    (tmp_path / "positions.json").write_bytes(orjson.dumps(saved))
    backlog = measure_backlog(sources, Positions(tmp_path / "positions.json"))
    assert {sid: (b.start, b.size, b.bytes) for sid, b in backlog.items()} == {
        0: (4000, 10_000, 6000), 1: (0, 3000, 3000), 2: (0, 500, 500), 3: (0, 700, 700), 4: (0, 0, 0)}
    assert sum(b.bytes for b in backlog.values()) == 10_200


# --- bytes per message --------------------------------------------------------------------------------


class ListQueue:
    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = list(chunks)

    def get(self, timeout: float) -> Chunk | None:
        return self.chunks.pop(0) if self.chunks else None


class RecordingSender:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.credited = 0

    def submit(self, message: Message) -> None:
        self.messages.append(message)

    def credit_backlog(self, nbytes: int) -> None:
        self.credited += nbytes


def _file_chunks(data: bytes, start: int, inode: int, chunk: int = 50_000) -> list[Chunk]:
    """As file_reader makes them: from `start`, with the file position after each."""
    return [Chunk(0, data[i : i + chunk], None, end_pos=min(i + chunk, len(data)), inode=inode)
            for i in range(start, len(data), chunk)]


def _run(chunks: list[Chunk], backlog: dict[int, BacklogFile], **options: Any) -> RecordingSender:
    sources = {0: Source(id=0, name="/logs/rank0.log", file="/logs/rank0.log")}
    sender = RecordingSender()
    opts = ShipOptions(job_id="job", host="node-a", **options)
    Batcher(opts, sources, ListQueue([*chunks, Chunk(0, b"", None, eof=True)]), sender, None,  # type: ignore[arg-type]
            ShipStats(), backlog).run(threading.Event())
    return sender


def test_messages_carry_the_backlog_bytes_they_complete(tmp_path: Path) -> None:
    data = b"".join(b"line %06d %s\n" % (i, b"y" * (i % 150)) for i in range(20_000))
    start = data.index(b"\n", 300_000) + 1  # resumed after a restart
    backlog_end = data.index(b"\n", 1_200_000) + 1  # what the file held when shipping started
    live = data + b"".join(b"live %d\n" % i for i in range(5000))  # appended while shipped
    sender = _run(_file_chunks(live, start, inode=7), {0: BacklogFile(7, start, backlog_end)},
                  batch_max_bytes=16 * 1024)
    credits = [m.backlog_bytes for m in sender.messages]
    assert len(credits) > 50 and sum(credits) == backlog_end - start  # the live bytes are not backlog
    assert any(credits) and all(c >= 0 for c in credits)
    # The first messages carry the backlog, the live ones none.
    assert credits[-1] == 0 and sender.credited == 0


def test_unterminated_last_line_and_rotation_are_counted(tmp_path: Path) -> None:
    gen1 = b"".join(b"gen1 %d\n" % i for i in range(1000)) + b"no newline at the end"
    chunks = [*_file_chunks(gen1, 0, inode=1), Chunk(0, b"", None, end_pos=len(gen1), inode=1, eof=True)]
    gen2 = b"".join(b"gen2 %d\n" % i for i in range(1000))
    chunks += _file_chunks(gen2, 0, inode=2)  # rotated in while the backlog was shipped
    sender = _run(chunks, {0: BacklogFile(1, 0, len(gen1) + 100)})
    assert sum(m.backlog_bytes for m in sender.messages) == len(gen1) + 100


class ErrorsOnly:
    """Evidence-only stand-in: selects the lines with ERROR, no heartbeats."""

    def select(self, key: str, first_line: int, texts: list[str]) -> list[tuple[int, list[str]]]:
        return [(first_line + i, [t]) for i, t in enumerate(texts) if "ERROR" in t]

    def heartbeat(self, key: str, final: bool = False) -> list[tuple[int, list[str]]]:
        return []


def test_evidence_only_counts_the_lines_it_does_not_send() -> None:
    data = b"".join(b"%s %d\n" % (b"ERROR" if i % 3000 == 0 else b"fine", i) for i in range(10_000))
    sender = _run(_file_chunks(data, 0, inode=3, chunk=20_000), {0: BacklogFile(3, 0, len(data))},
                  line_filter=ErrorsOnly())
    assert 0 < len(sender.messages) <= 4
    assert sum(m.backlog_bytes for m in sender.messages) + sender.credited == len(data)


# --- acknowledged bytes, directly and through the spool ----------------------------------------------


class Future:
    def add_callback(self, fn: Any, *args: Any) -> None:
        fn(*args, None)

    def add_errback(self, fn: Any, *args: Any) -> None:
        pass

    def get(self, timeout: float) -> None:
        return None


class FakeProducer:
    def send(self, topic: str, **kw: Any) -> Future:
        return Future()

    def flush(self, timeout: float) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass


class FakeSender(Sender):
    def _make_producer(self) -> Any:
        return FakeProducer()


def _message(seq: int, backlog_bytes: int) -> Message:
    return Message(seq, b"k", b'{"lines":[]}', 0, 10, None, backlog_bytes)


def test_acked_backlog_bytes_through_the_producer_and_the_spool(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 1 << 30)
    for seq in (1, 2):  # left by an earlier run: already counted then, not part of this backlog
        spool.append(_pack_message(_message(seq, 0)))
    stats = ShipStats()
    sender = FakeSender(ShipOptions(), spool, stats)
    sender._to_spool(_message(3, 1000))  # Kafka was down: spooled, acknowledged when drained
    sender._to_spool(_message(4, 2000))
    sender.credit_backlog(5)
    deadline = time.monotonic() + 10
    while (len(spool) or not sender._healthy) and time.monotonic() < deadline:
        time.sleep(0.02)
    sender.submit(_message(5, 400))  # healthy again: straight to the producer
    sender.close(5.0)
    assert stats.backlog_acked_bytes == 3405
    assert (stats.acked_messages, stats.spooled_messages, stats.spooled_lines) == (5, 2, 20)


def test_full_spool_counts_dropped_backlog_bytes(tmp_path: Path) -> None:
    stats = ShipStats()
    sender = Sender(ShipOptions(kafka={"bootstrap_servers": "127.0.0.1:9", "bootstrap_timeout_ms": 200}),
                    Spool(tmp_path / "spool", 10), stats)
    try:
        sender._to_spool(_message(1, 777))
    finally:
        sender._stop.set()
        sender._drainer.join(5)
    assert (stats.backlog_dropped_bytes, stats.backlog_acked_bytes, stats.dropped_lines) == (777, 0, 10)


# --- the display thread ---------------------------------------------------------------------------


def test_plain_display_prints_status_lines_then_caught_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ship_progress, "TICK_S", 0.02)
    stats = ShipStats()
    out = io.StringIO()
    progress = BacklogProgress(stats, 1000, "plain", interval_s=0.1, follow=True, stream=out)
    progress.start()
    for acked in (100, 400, 700):
        stats.backlog_acked_bytes = acked
        stats.lines += 10
        time.sleep(0.25)
    stats.backlog_acked_bytes = 1000
    deadline = time.monotonic() + 5
    while not progress.finished and time.monotonic() < deadline:
        time.sleep(0.02)
    progress.stop()  # already said "caught up": nothing more
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2, lines  # status lines every 0.1 s while it worked, then "caught up"
    assert all(line.startswith("rootrank ship: backlog ") and "\x1b" not in line for line in lines)
    assert lines[-1].startswith("rootrank ship: backlog caught up: 1000/1000 bytes acknowledged")
    assert lines[-1].endswith("following live")
    seen = [int(line.split(" bytes acknowledged")[0].rsplit(" ", 1)[1].split("/")[0]) for line in lines[:-1]]
    assert seen == sorted(seen) and seen[0] >= 100 and seen[-1] <= 700


def test_stopping_before_the_backlog_is_done_says_where_it_got(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ship_progress, "TICK_S", 0.02)
    stats = ShipStats(lines=50, spooled_lines=7)
    stats.backlog_acked_bytes = 250
    out = io.StringIO()
    progress = BacklogProgress(stats, 1000, "plain", interval_s=60, stream=out)
    progress.start()
    time.sleep(0.1)
    progress.stop()
    (line,) = out.getvalue().splitlines()
    assert "backlog 250/1000 bytes acknowledged (25.0%" in line and line.endswith("50 lines sent, 7 spooled")


def test_bar_display_ends_with_a_plain_caught_up_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ship_progress, "TICK_S", 0.02)
    stats = ShipStats()
    out = io.StringIO()
    progress = BacklogProgress(stats, 10 * MiB, "bar", stream=out)
    progress.start()
    stats.backlog_acked_bytes = 5 * MiB
    time.sleep(0.1)
    stats.backlog_acked_bytes = 10 * MiB
    deadline = time.monotonic() + 5
    while not progress.finished and time.monotonic() < deadline:
        time.sleep(0.02)
    progress.stop()
    assert out.getvalue().splitlines()[-1].startswith(
        "rootrank ship: backlog caught up: 10485760/10485760 bytes acknowledged (10.00 MiB)")
