"""The pipe from the reading parent to the forked shipping process: chunks (and pids) as frames."""

from __future__ import annotations

import logging
import os
import struct
import threading
from queue import Empty, Queue

from ingest.ship.chunks import Chunk, ChunkQueue, Source
from ingest.ship.readers import READ_CHUNK

log = logging.getLogger("rootrank.ship")


# Parent -> shipping process: one frame per chunk (or a source's pid, once the command started).
_FRAME = struct.Struct(">BHdqQ?qI")
_FRAME_CHUNK, _FRAME_PID = 0, 1


def forward_frames(fd: int, queue: ChunkQueue, open_sources: int) -> None:
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


def send_pid(fd: int, source_id: int, pid: int) -> None:
    os.write(fd, _FRAME.pack(_FRAME_PID, source_id, -1.0, -1, 0, False, pid, 0))


class FrameQueue:
    """Shipping-process side: frames from the parent as chunks, with backpressure (bounded)."""

    def __init__(self, fd: int, sources: dict[int, Source]) -> None:
        self._queue: Queue[Chunk] = Queue(maxsize=32)
        self._sources = sources
        threading.Thread(target=self._read, args=(fd,), name="ship-frames", daemon=True).start()

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
        except Empty:
            return None
