"""The readers: a pipe (stdin, a wrapped command's stdout/stderr) passed through and queued, and a
file read from its saved position and, with --follow, tailed across rotation and truncation."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

from ingest.ship.chunks import Chunk, ChunkQueue, Source
from ingest.ship.options import ShipOptions
from ingest.ship.positions import Positions, resume_position

log = logging.getLogger("rootrank.ship")

READ_CHUNK = 1024 * 1024
F_SETPIPE_SZ = 1031  # Linux: grow a pipe's buffer so a burst from the child fits while we are busy
PIPE_BYTES = 1024 * 1024


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
        if passing and passthrough_fd is not None:
            passing = _write_all(passthrough_fd, data)
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
