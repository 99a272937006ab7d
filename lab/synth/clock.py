"""Time stamps as the libraries print them.

Every function takes a *display* epoch: the true time of the event plus the skew of the host whose
clock stamped it (and plus the job's time-zone offset for the formats that print local time).
"""

from __future__ import annotations

import time

_MON = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DOW = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _split(t: float) -> tuple[time.struct_time, float]:
    sec = int(t // 1)
    return time.gmtime(sec), t - sec


def py_asctime(t: float) -> str:
    """logging's default %(asctime)s: 2024-03-05 12:34:56,789"""
    g, f = _split(t)
    return time.strftime("%Y-%m-%d %H:%M:%S", g) + f",{int(f * 1000):03d}"


def py_asctime_dot(t: float) -> str:
    g, f = _split(t)
    return time.strftime("%Y-%m-%d %H:%M:%S", g) + f".{int(f * 1000):03d}"


def seconds(t: float) -> str:
    """2024-03-05 12:34:56"""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(t)))


def micro(t: float) -> str:
    """2024-03-05 12:34:56.789012 (Megatron's datetime.now())"""
    g, f = _split(t)
    return time.strftime("%Y-%m-%d %H:%M:%S", g) + f".{int(f * 1e6):06d}"


def us_date(t: float) -> str:
    """03/05/2024 12:34:56 (the transformers examples' datefmt)"""
    return time.strftime("%m/%d/%Y %H:%M:%S", time.gmtime(int(t)))


def clock_only(t: float) -> str:
    """[12:34:56] — a time with no date (rich / loguru-style consoles)"""
    return time.strftime("%H:%M:%S", time.gmtime(int(t)))


def iso_local(t: float, offset_h: int) -> str:
    g, f = _split(t)
    sign = "+" if offset_h >= 0 else "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", g) + f".{int(f * 1e6):06d}{sign}{abs(offset_h):02d}:00"


def rfc3339_nano_utc(t: float) -> str:
    """kubectl logs --timestamps: 2024-03-05T12:34:56.789012345Z"""
    g, f = _split(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", g) + f".{int(f * 1e9):09d}Z"


def glog(t: float, nanos: bool = False) -> str:
    """The MMDD HH:MM:SS.ffffff part of a glog header (without the level letter)."""
    g, f = _split(t)
    frac = f"{int(f * 1e9):09d}" if nanos else f"{int(f * 1e6):06d}"
    return time.strftime("%m%d %H:%M:%S", g) + "." + frac


def glog_ms(t: float) -> str:
    """torch >= 2.5's python glog imitation: milliseconds padded to six digits (…21.884000)."""
    g, f = _split(t)
    return time.strftime("%m%d %H:%M:%S", g) + f".{int(f * 1000):03d}000"


def syslog(t: float) -> str:
    """Mar  5 12:34:56"""
    g = time.gmtime(int(t))
    return f"{_MON[g.tm_mon - 1]} {g.tm_mday:2d} {g.tm_hour:02d}:{g.tm_min:02d}:{g.tm_sec:02d}"


def ctime(t: float) -> str:
    """dmesg -T: Tue Mar  5 12:34:56 2024"""
    g = time.gmtime(int(t))
    return (f"{_DOW[g.tm_wday]} {_MON[g.tm_mon - 1]} {g.tm_mday:2d} "
            f"{g.tm_hour:02d}:{g.tm_min:02d}:{g.tm_sec:02d} {g.tm_year}")


def elastic_summary(t: float) -> str:
    """ChildFailedError's `time : 2024-03-05_12:34:56`"""
    return time.strftime("%Y-%m-%d_%H:%M:%S", time.gmtime(int(t)))


def slurm(t: float) -> str:
    """slurm_make_time_str: 2024-03-05T12:34:56"""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(t)))
