"""Backlog progress for `rootrank ship --file ...`: how much of what the files held when shipping
started Kafka has acknowledged, at what rate, and when it will be done.

It lives in the shipping process (the one that holds the Sender and sees the acks) and costs the
hot path nothing: the batcher tags each message with the backlog bytes it carries, the ack callback
adds them to a counter in ShipStats, and a timer thread here reads the counters twice a second.

Modes (`progress_mode`): a rich bar when stderr is a terminal; with `--progress always` and stderr
not a terminal (a log file, a pipe), a plain one-line status every few seconds, no escape codes.
Either way, once the backlog is acknowledged one line says so ("caught up") and the display ends;
with --follow, shipping goes on live.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

AUTO_MIN_BYTES = 32 << 20  # --progress auto: a bar only for backlogs larger than this
TICK_S = 0.5  # how often the timer thread reads the counters (and redraws the bar)
RATE_WINDOW_S = 30.0  # rate and ETA over the last this many seconds

PREFIX = "rootrank ship: "


def progress_mode(choice: str, is_terminal: bool, backlog_bytes: int | None) -> str | None:
    """"bar", "plain" or None. No backlog (a wrapped command, stdin): None whatever the choice."""
    if backlog_bytes is None or choice == "never":
        return None
    if choice == "always":
        return "bar" if is_terminal else "plain"
    if choice == "auto":
        return "bar" if is_terminal and backlog_bytes > AUTO_MIN_BYTES else None
    raise ValueError(f"progress: auto, always or never, not {choice!r}")


@dataclass(frozen=True)
class Counters:
    """What the display reads from ShipStats at one tick."""

    acked: int  # backlog bytes acknowledged by Kafka
    dropped: int  # backlog bytes in messages dropped because the spool was full (never coming)
    lines: int  # lines put into messages
    spooled: int  # lines that went through the disk spool

    @classmethod
    def read(cls, stats: Any) -> Counters:
        return cls(stats.backlog_acked_bytes, stats.backlog_dropped_bytes, stats.lines, stats.spooled_lines)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def status_line(c: Counters, total: int, rate: float | None) -> str:
    """One plain status line: acknowledged bytes of the backlog, rate, ETA, lines sent and spooled."""
    done = min(c.acked + c.dropped, total)
    percent = 100.0 * c.acked / total if total else 100.0
    if done >= total:
        eta = "0:00:00"
    elif rate:
        eta = format_duration((total - done) / rate)
    else:
        eta = "?"
    speed = f"{format_bytes(rate)}/s" if rate is not None else "? B/s"
    dropped = f", {c.dropped} bytes dropped (spool full)" if c.dropped else ""
    return (f"{PREFIX}backlog {c.acked}/{total} bytes acknowledged ({percent:.1f}%, {format_bytes(c.acked)} of "
            f"{format_bytes(total)}), {speed}, ETA {eta}; {c.lines} lines sent, {c.spooled} spooled{dropped}")


def caught_up_line(c: Counters, total: int, elapsed_s: float, follow: bool) -> str:
    rate = c.acked / elapsed_s if elapsed_s > 0 else 0.0
    dropped = f", {c.dropped} bytes dropped (spool full)" if c.dropped else ""
    return (f"{PREFIX}backlog caught up: {c.acked}/{total} bytes acknowledged ({format_bytes(c.acked)}) in "
            f"{format_duration(elapsed_s)}, {format_bytes(rate)}/s; {c.lines} lines sent, {c.spooled} spooled"
            f"{dropped}" + ("; following live" if follow else ""))


class RateMeter:
    """Bytes per second over a sliding window of (time, counter) samples."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, t: float, value: int) -> None:
        self._samples.append((t, value))
        while len(self._samples) > 2 and t - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, v0), (t1, v1) = self._samples[0], self._samples[-1]
        return (v1 - v0) / (t1 - t0) if t1 > t0 else None


class BacklogProgress:
    """The display thread. `start()` once shipping starts; `stop()` after the sender closed."""

    def __init__(self, stats: Any, total: int, mode: str, *, interval_s: float = 5.0, follow: bool = False,
                 stream: TextIO | None = None) -> None:
        self.stats = stats
        self.total = total
        self.mode = mode
        self.interval_s = max(0.1, interval_s)
        self.follow = follow
        self.stream = stream if stream is not None else sys.stderr
        self.finished = False  # the backlog was acknowledged and said so
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._meter = RateMeter()
        self._bar: Any = None
        self._task: Any = None
        self._swapped: list[tuple[logging.StreamHandler[Any], Any]] = []

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._started = time.monotonic()
        self._meter.add(self._started, 0)
        if self.mode == "bar":
            self._start_bar()
        self._thread = threading.Thread(target=self._loop, name="ship-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the display; says where the backlog got to unless it already said "caught up"."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if not self.finished:
            c = Counters.read(self.stats)
            if c.acked + c.dropped >= self.total:
                self._finish(c)
            else:
                self._end_bar()
                self._meter.add(time.monotonic(), c.acked)
                self._say(status_line(c, self.total, self._meter.rate()))

    # --- the timer thread -----------------------------------------------------------------------------

    def _loop(self) -> None:
        next_line = self._started + self.interval_s
        while not self._stop.wait(TICK_S):
            c = Counters.read(self.stats)
            now = time.monotonic()
            self._meter.add(now, c.acked)
            if c.acked + c.dropped >= self.total:
                self._finish(c)
                return
            if self._bar is not None:
                self._bar.update(self._task, completed=c.acked, lines=c.lines, spooled=c.spooled)
                self._bar.refresh()
            elif now >= next_line:
                self._say(status_line(c, self.total, self._meter.rate()))
                next_line = now + self.interval_s

    def _finish(self, c: Counters) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=c.acked, lines=c.lines, spooled=c.spooled)
        self._end_bar()
        self._say(caught_up_line(c, self.total, time.monotonic() - self._started, self.follow))
        self.finished = True

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(line, file=self.stream, flush=True)

    # --- the rich bar ---------------------------------------------------------------------------------

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        original = sys.stderr
        self._bar = Progress(
            TextColumn("backlog"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
            TextColumn("{task.fields[lines]:,} lines, {task.fields[spooled]:,} spooled"),
            console=Console(file=self.stream), transient=True, auto_refresh=False,  # redrawn by our tick
        )
        self._task = self._bar.add_task("backlog", total=self.total or None, lines=0, spooled=0)
        self._bar.start()
        # Rich moved sys.stderr above the bar; our log lines (Kafka outages) go there too.
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is original and sys.stderr is not original:
                self._swapped.append((handler, handler.setStream(sys.stderr)))

    def _end_bar(self) -> None:
        if self._bar is None:
            return
        bar, self._bar = self._bar, None
        with contextlib.suppress(Exception):
            bar.refresh()
        bar.stop()
        for handler, stream in self._swapped:
            handler.setStream(stream)
        self._swapped.clear()
