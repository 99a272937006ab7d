"""Where followed files resume (`Positions`, saved only over durable messages), and the files'
backlog when shipping started (`measure_backlog`, for the progress display)."""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ingest.ship.chunks import Source


class Positions:
    """Where each followed file's next unsent line starts; advanced in order, only over durable messages.

    Each file's entry: `inode`, `pos` (byte), `line` (number of the next line), `at` (when it last
    advanced, epoch seconds) and `kafka` ([partition, offset] of the last acknowledged message with its
    lines: whether the topic still holds them, ingest/ship/cluster.py)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self.saved: dict[str, dict[str, Any]] = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            self.saved = {}
        self._pending: dict[str, collections.deque[list[Any]]] = {}
        self._dirty = False

    def get(self, name: str) -> dict[str, Any] | None:
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
                previous = self.saved.get(name, {})
                position = {**queue.popleft()[1], "at": int(time.time())}
                if "kafka" in previous:
                    position["kafka"] = previous["kafka"]
                self.saved[name] = position
                self._dirty = True

    def acknowledged(self, name: str, partition: int, offset: int) -> None:
        """A message with lines of `name` is at (`partition`, `offset`) of the topic: the latest is kept."""
        with self._lock:
            entry = self.saved.get(name)
            if entry is None:
                return
            kafka = entry.get("kafka")
            if not isinstance(kafka, list) or kafka[0] != partition or kafka[1] < offset:
                entry["kafka"] = [partition, offset]
                self._dirty = True

    def forget(self, name: str) -> None:
        """Ship `name` from its start (--from-start, or the topic no longer holds what was shipped)."""
        with self._lock:
            if self.saved.pop(name, None) is not None:
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
