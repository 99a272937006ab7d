"""The shipper's disk spool: FIFO across segments and restarts, bounded, torn writes skipped."""

from __future__ import annotations

from pathlib import Path

from ingest.ship.spool import Spool


def drain(spool: Spool) -> list[bytes]:
    out = []
    while (record := spool.peek()) is not None:
        out.append(record)
        spool.pop()
    return out


def test_fifo_across_segments_and_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10_000, segment_bytes=64)
    for i in range(30):
        assert spool.append(b"rec%03d" % i)
    assert len(spool) == 30 and len(list(tmp_path.glob("*.seg"))) > 3
    assert spool.peek() == b"rec000"
    assert spool.peek_many(5) == [b"rec%03d" % i for i in range(5)]  # peeking removes nothing
    for _ in range(10):
        spool.pop()
    spool.close()

    reopened = Spool(tmp_path, 10_000, segment_bytes=64)
    assert len(reopened) == 20
    reopened.append(b"after restart")
    assert drain(reopened) == [b"rec%03d" % i for i in range(10, 30)] + [b"after restart"]


def test_pop_after_a_restart_whose_head_is_in_a_new_segment(tmp_path: Path) -> None:
    """A restart writes into a new segment; the cursor sits at the end of the old one."""
    spool = Spool(tmp_path, 10_000)
    spool.append(b"old")
    spool.pop()
    spool.close()
    reopened = Spool(tmp_path, 10_000)
    reopened.append(b"new-1")
    reopened.append(b"new-2")
    assert reopened.peek_many(10) == [b"new-1", b"new-2"]
    reopened.pop()
    assert reopened.peek_many(10) == [b"new-2"]
    reopened.pop()
    assert len(reopened) == 0 and reopened.peek() is None


def test_torn_record_is_skipped_and_later_records_kept(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10_000)
    spool.append(b"whole")
    spool.close()
    (segment,) = sorted(tmp_path.glob("*.seg"))
    with segment.open("ab") as f:
        f.write(b"\x00\x00\x00\x20torn")  # a crash in the middle of a write
    reopened = Spool(tmp_path, 10_000)
    reopened.append(b"after crash")
    assert drain(reopened) == [b"whole", b"after crash"]


def test_bounded(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=40)
    assert spool.append(b"x" * 20)
    assert not spool.append(b"y" * 20)
    assert spool.dropped == 1 and drain(spool) == [b"x" * 20]
