"""A bounded, crash-safe FIFO of byte records on disk: where the shipper keeps messages while Kafka
is slow or down, and where it finds them again after a restart.

Layout: a folder of segment files `00000001.seg`, ... Each record is
`length (4 bytes, big endian) | crc32 (4 bytes) | payload`. Records are appended to the newest
segment and read from the oldest; a segment is deleted once every record in it was popped. The read
position is saved in `cursor` (segment number and byte offset) on every pop, so a restart re-reads
at most the records that were being sent when it stopped (at-least-once). A torn record at the end
of a segment (the process died mid-write) fails its length or CRC check and is skipped.

Thread-safe: one lock around everything; the shipper's reader, batcher and sender threads share it.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from pathlib import Path
from typing import BinaryIO

_HEADER = struct.Struct(">II")
SEGMENT_BYTES = 8 * 1024 * 1024


class Spool:
    def __init__(self, directory: str | os.PathLike[str], max_bytes: int, *, segment_bytes: int = SEGMENT_BYTES,
                 fsync: bool = False) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.dropped = 0  # records refused because the spool was full
        self._lock = threading.Lock()
        self._cursor_path = self.dir / "cursor"
        segments = self._segments()
        self._read_seg, self._read_off = self._load_cursor(segments)
        # Always write into a new segment: a torn record left by a crash then sits at the end of
        # its segment, where the reader skips to the next one.
        self._write_seg = max(segments[-1] + 1 if segments else 1, self._read_seg)
        self._writer = open(self._seg_path(self._write_seg), "ab")  # noqa: SIM115 - closed in close()
        self._reader: tuple[int, BinaryIO] | None = None
        self._count = 0
        self._bytes = 0
        self._scan()

    # --- layout ------------------------------------------------------------------------------

    def _seg_path(self, number: int) -> Path:
        return self.dir / f"{number:08d}.seg"

    def _segments(self) -> list[int]:
        out = []
        for path in self.dir.glob("*.seg"):
            try:
                out.append(int(path.stem))
            except ValueError:
                continue
        return sorted(out)

    def _load_cursor(self, segments: list[int]) -> tuple[int, int]:
        try:
            seg_text, off_text = self._cursor_path.read_text().split()
            seg, off = int(seg_text), int(off_text)
        except (OSError, ValueError):
            return (segments[0] if segments else 1), 0
        if segments and seg < segments[0]:
            return segments[0], 0
        return seg, off

    def _save_cursor(self) -> None:
        tmp = self._cursor_path.with_suffix(".tmp")
        tmp.write_text(f"{self._read_seg} {self._read_off}\n")
        os.replace(tmp, self._cursor_path)

    def _scan(self) -> None:
        """Count what is pending (after a restart)."""
        for number in self._segments():
            if number < self._read_seg:
                self._seg_path(number).unlink(missing_ok=True)
                continue
            start = self._read_off if number == self._read_seg else 0
            for payload_len in self._record_lengths(number, start):
                self._count += 1
                self._bytes += payload_len + _HEADER.size

    def _record_lengths(self, number: int, start: int) -> list[int]:
        lengths = []
        with open(self._seg_path(number), "rb") as f:
            f.seek(start)
            while True:
                header = f.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    break
                length, crc = _HEADER.unpack(header)
                payload = f.read(length)
                if len(payload) < length or zlib.crc32(payload) != crc:
                    break
                lengths.append(length)
        return lengths

    # --- public ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def append(self, payload: bytes) -> bool:
        """Add a record at the end. False (and counted in `dropped`) when the spool is full."""
        size = len(payload) + _HEADER.size
        with self._lock:
            if self._bytes + size > self.max_bytes:
                self.dropped += 1
                return False
            if self._writer.tell() >= self.segment_bytes:
                self._writer.close()
                self._write_seg += 1
                self._writer = open(self._seg_path(self._write_seg), "ab")  # noqa: SIM115 - closed in close()
            self._writer.write(_HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
            self._writer.flush()
            if self.fsync:
                os.fsync(self._writer.fileno())
            self._count += 1
            self._bytes += size
            return True

    def peek(self) -> bytes | None:
        """The oldest record, or None when the spool is empty."""
        with self._lock:
            while self._count:
                record = self._read_at(self._read_seg, self._read_off)
                if record is not None:
                    return record
                if self._read_seg >= self._write_seg:
                    # A torn record at the end of the newest segment: nothing readable is left.
                    self._count = 0
                    self._bytes = 0
                    return None
                self._advance_segment()
            return None

    def peek_many(self, limit: int, max_bytes: int = 16 * 1024 * 1024) -> list[bytes]:
        """Up to `limit` of the oldest records (at least one when not empty), without removing them."""
        with self._lock:
            out: list[bytes] = []
            total = 0
            seg, off = self._read_seg, self._read_off
            while len(out) < min(limit, self._count) and seg <= self._write_seg:
                if not self._seg_path(seg).exists():
                    seg, off = seg + 1, 0
                    continue
                record = self._read_at(seg, off)
                if record is None:
                    seg, off = seg + 1, 0
                    continue
                if out and total + len(record) > max_bytes:
                    break
                out.append(record)
                total += len(record)
                off += _HEADER.size + len(record)
            return out

    def pop(self) -> None:
        """Remove the oldest record (after it was delivered)."""
        with self._lock:
            record = self._read_at(self._read_seg, self._read_off)
            while record is None and self._read_seg < self._write_seg:
                # The head is in a later segment (this one ended, or ends in a torn record).
                self._advance_segment()
                record = self._read_at(self._read_seg, self._read_off)
            if record is None:
                return
            self._read_off += _HEADER.size + len(record)
            self._count -= 1
            self._bytes -= _HEADER.size + len(record)
            if self._read_seg < self._write_seg and (self._count == 0 or self._at_segment_end()):
                self._advance_segment()
            self._save_cursor()

    def close(self) -> None:
        with self._lock:
            self._writer.close()
            self._close_reader()
            self._save_cursor()

    # --- reading -----------------------------------------------------------------------------

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader[1].close()
            self._reader = None

    def _file_for(self, number: int) -> BinaryIO:
        if self._reader is None or self._reader[0] != number:
            self._close_reader()
            self._reader = (number, open(self._seg_path(number), "rb"))  # noqa: SIM115 - closed in _close_reader
        return self._reader[1]

    def _read_at(self, number: int, offset: int) -> bytes | None:
        f = self._file_for(number)
        f.seek(offset)
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        length, crc = _HEADER.unpack(header)
        payload = f.read(length)
        if len(payload) < length or zlib.crc32(payload) != crc:
            return None
        return payload

    def _at_segment_end(self) -> bool:
        try:
            return self._read_off >= self._seg_path(self._read_seg).stat().st_size
        except FileNotFoundError:
            return True

    def _advance_segment(self) -> None:
        self._close_reader()
        self._seg_path(self._read_seg).unlink(missing_ok=True)
        self._read_seg += 1
        self._read_off = 0
