"""Loaded (through PYTHONPATH) only by the processes of a host whose clock the lab skews with libfaketime.

libfaketime 0.9.10 (Debian 12) mishandles clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) when it is told
not to fake the monotonic clock: it hands the kernel a negative time and Python 3.11's time.sleep raises
`OSError: [Errno 22] Invalid argument` (wolfcw/libfaketime#426). The monotonic clock must stay real (or
every timed wait of the job hangs), so time.sleep is re-implemented on select(), which libfaketime leaves
alone. Nothing else changes: the wall clock the job logs with is the skewed one.
"""

import select
import time


def _sleep(secs, _monotonic=time.monotonic, _select=select.select):
    if secs < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = _monotonic() + secs
    while True:
        left = deadline - _monotonic()
        if left <= 0:
            return
        _select([], [], [], left)


time.sleep = _sleep
