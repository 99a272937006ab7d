"""The shipper's batching, without a broker: the sender finds none, so every message lands in the
disk spool, where the test reads it back and decodes it as the worker would."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson

from ingest.decoders import decode_value
from ingest.ship.batcher import Batcher
from ingest.ship.chunks import Chunk, Source
from ingest.ship.options import ShipOptions, ShipStats
from ingest.ship.positions import Positions
from ingest.ship.sender import Sender, _unpack_message
from ingest.ship.spool import Spool
from ingest.ship.wire_format import parse_batch

T = 1773480413.0


class ListQueue:
    """The batcher's input: chunks handed over in order."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = list(chunks)

    def get(self, timeout: float) -> Chunk | None:
        return self.chunks.pop(0) if self.chunks else None


def run_batcher(tmp_path: Path, chunks: list[Chunk], sources: dict[int, Source], positions: Positions | None = None,
                **options: object) -> list[dict[str, object]]:
    opts = ShipOptions(kafka={"bootstrap_servers": "127.0.0.1:9", "bootstrap_timeout_ms": 200}, job_id="job",
                       host="node-a", **options)  # type: ignore[arg-type]
    spool = Spool(tmp_path / "spool", 1 << 30)
    stats = ShipStats()
    sender = Sender(opts, spool, stats)
    Batcher(opts, sources, ListQueue(chunks), sender, positions, stats).run(threading.Event())
    sender._stop.set()
    sender._drainer.join(5)
    return [orjson.loads(_unpack_message(raw).value) for raw in spool.peek_many(10_000)]


def test_lines_across_chunks_keep_their_numbers(tmp_path: Path) -> None:
    sources = {0: Source(id=0, name="stdout", stream="stdout", pid=42)}
    chunks = [
        Chunk(0, b"first line\nsecond ", T + 0),
        Chunk(0, b"line\r\n\nfourth line\nno newline at the end", T + 1),
        Chunk(0, b"", T + 2, eof=True),
    ]
    (batch,) = run_batcher(tmp_path, chunks, sources)
    assert (batch["job_id"], batch["host"], batch["pid"], batch["offset"]) == ("job", "node-a", 42, 0)
    records = decode_value(orjson.dumps(batch))
    assert [(r.offset, r.text, r.stream) for r in records] == [
        (0, "first line", "stdout"), (1, "second line", "stdout"), (3, "fourth line", "stdout"),
        (4, "no newline at the end", "stdout")]
    # A line's time is when its end was read.
    assert [r.ts.timestamp() if r.ts else None for r in records] == [T + 0, T + 1, T + 1, T + 2]


def test_batches_stay_under_the_size_bound(tmp_path: Path) -> None:
    sources = {0: Source(id=0, name="stdin")}
    data = b"".join(b"line %05d %s\n" % (i, b"x" * 80) for i in range(3000))
    chunks = [Chunk(0, data[i : i + 65536], None) for i in range(0, len(data), 65536)]
    batches = run_batcher(tmp_path, [*chunks, Chunk(0, b"", None, eof=True)], sources, batch_max_bytes=16 * 1024)
    assert len(batches) > 10
    assert all(len(orjson.dumps(b)) < 20 * 1024 for b in batches)
    numbered = [(b["offset"] + i, text) for b in batches for i, (_, _, text) in enumerate(parse_batch(b).lines)]  # type: ignore[arg-type]
    assert numbered == [(i, f"line {i:05d} {'x' * 80}") for i in range(3000)]


def test_file_position_advances_only_over_durable_messages(tmp_path: Path) -> None:
    positions = Positions(tmp_path / "positions.json")
    sources = {0: Source(id=0, name="/logs/rank0.log", file="/logs/rank0.log")}
    chunks = [Chunk(0, b"a\nb\npartial", None, end_pos=11, inode=7), Chunk(0, b"", None, eof=True)]
    run_batcher(tmp_path, chunks, sources, positions)
    positions.save()
    # Spooled = durable. The file ended without a newline: its last line counts as read.
    saved = orjson.loads((tmp_path / "positions.json").read_bytes())
    assert saved["/logs/rank0.log"].pop("at") > 0  # when it advanced: what `ship` says of a file shipped before
    assert saved == {"/logs/rank0.log": {"inode": 7, "pos": 11, "line": 3}}


def test_positions_commit_in_order() -> None:
    positions = Positions(Path("/nonexistent/positions.json"))
    positions.expect("f", 1, {"pos": 10})
    positions.expect("f", 2, {"pos": 20})
    positions.durable("f", 2)
    assert positions.get("f") is None  # 1 is not durable yet: 20 would skip its lines after a crash
    positions.durable("f", 1)
    assert {k: v for k, v in (positions.get("f") or {}).items() if k != "at"} == {"pos": 20}


def test_a_resumed_file_numbers_its_lines_from_where_it_stopped_with_its_files_key(tmp_path: Path) -> None:
    """A second run resumes after the 3 lines the first shipped: its batch says line 3 onwards, with the context
    a look back needs and the file's key from its first line (the place diagnose gives the file among the
    job's), as one run shipping the whole file would. (Off: the forked shipping process numbered the lines
    of a resumed run from 0, and keyed the file by the line it resumed at.)"""
    from ingest.order import file_key
    from ingest.ship.positions import measure_backlog
    from ingest.ship.runner import _resume_numbering

    log = tmp_path / "rank0.log"
    lines = ["2026-03-14 09:00:00,000 started", "a", "b", "Traceback (most recent call last):", "  frame", "Err: x"]
    log.write_text("\n".join(lines) + "\n")
    first = len("\n".join(lines[:3])) + 1
    positions = Positions(tmp_path / "positions.json")
    positions.saved[str(log)] = {"inode": log.stat().st_ino, "pos": first, "line": 3}
    sources = {0: Source(id=0, name=str(log), file=str(log))}
    _resume_numbering(sources, positions, measure_backlog(sources, positions))
    key = file_key(str(log), lines[0])
    assert sources[0].next_line == 3 and sources[0].key == key
    rest = log.read_bytes()[first:]
    (batch,) = run_batcher(tmp_path, [Chunk(0, rest, None, end_pos=len(log.read_bytes()), inode=log.stat().st_ino),
                                      Chunk(0, b"", None, eof=True)], sources)
    assert batch["offset"] == 3 and batch["file_key"] == key
    assert parse_batch(batch).lines[0][2] == "Traceback (most recent call last):"
    assert parse_batch(batch).context == ["2026-03-14 09:00:00,000 started", "a", "b"]
