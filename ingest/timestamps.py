"""Timestamp helpers shared by the decoders and the prefix parser.

Every datetime that leaves this module is tz-aware UTC. Log lines rarely say their time zone;
a naive wall-clock time is taken as UTC (containers and most clusters log in UTC), which keeps
the ordering of lines from one job consistent even when it is off by a fixed offset.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

# Epoch values outside this range are not log times (a counter, a bad field): ignore them.
_MIN_EPOCH = 100_000_000.0  # 1973: anything earlier is a counter, not a log time
_MAX_EPOCH = 4_102_444_800.0  # 2100-01-01

MONTHS = {
    "Jan": 1, "Feb": 2, "Mar": 3, "Apr": 4, "May": 5, "Jun": 6,
    "Jul": 7, "Aug": 8, "Sep": 9, "Oct": 10, "Nov": 11, "Dec": 12,
}  # fmt: skip

# A year-less time (glog, syslog) more than this far in the future belongs to the previous year.
_FUTURE_SLACK = timedelta(days=2)


def from_epoch(value: float) -> datetime | None:
    """Seconds since the epoch -> UTC datetime; milliseconds/nanoseconds are recognised by size."""
    if math.isnan(value):
        return None
    if value > 1e17:  # nanoseconds
        value /= 1e9
    elif value > 1e14:  # microseconds
        value /= 1e6
    elif value > 1e11:  # milliseconds
        value /= 1e3
    if not (_MIN_EPOCH < value < _MAX_EPOCH):
        return None
    return datetime.fromtimestamp(value, UTC)


def frac_to_us(frac: str | None) -> int:
    """'123' -> 123000, '408271257' -> 408271 (nanoseconds truncated to microseconds)."""
    if not frac:
        return 0
    return int((frac + "000000")[:6])


def tz_offset(tz: str | None) -> timedelta:
    """'Z', '+00:00', '-0530', None -> offset to subtract to get UTC."""
    if not tz or tz in ("Z", "z"):
        return timedelta(0)
    sign = -1 if tz[0] == "-" else 1
    digits = tz[1:].replace(":", "")
    if len(digits) < 4:
        digits = digits.ljust(4, "0")
    return sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:4]))


def build(
    year: int,
    month: int,
    day: int,
    hour: int,
    minute: int,
    second: int,
    micro: int = 0,
    tz: str | None = None,
) -> datetime | None:
    """A UTC datetime from parts, or None when the parts are not a valid date (e.g. 2023-02-30)."""
    try:
        if tz is None or tz == "Z" or tz == "z":
            return datetime(year, month, day, hour, minute, min(second, 59), micro, UTC)
        local = datetime(year, month, day, hour, minute, min(second, 59), micro, UTC)  # at the offset `tz`
        return local - tz_offset(tz)
    except (OverflowError, ValueError):
        return None


# (refreshed_at, year, (month, day) of now + slack, year of now + slack): guess_year runs for every
# year-less timestamp, so "now" is looked up at most once a second.
_now_cache: tuple[float, int, tuple[int, int], int] = (-1.0, 0, (0, 0), 0)


def guess_year(month: int, day: int, year: int | None, now: datetime | None = None) -> int:
    """The year of a year-less timestamp: the given one, else this year unless that is in the future."""
    global _now_cache  # noqa: PLW0603 - replaced whole at most once a second; readers need no lock
    if year is not None:
        return year
    if now is None:
        mono = time.monotonic()
        if mono - _now_cache[0] > 1.0:
            current = datetime.now(UTC)
            limit = current + _FUTURE_SLACK
            _now_cache = (mono, current.year, (limit.month, limit.day), limit.year)
        _, this_year, limit_md, limit_year = _now_cache
    else:
        limit = now + _FUTURE_SLACK
        this_year, limit_md, limit_year = now.year, (limit.month, limit.day), limit.year
    if limit_year == this_year and (month, day) > limit_md:
        return this_year - 1
    return this_year


def parse_iso(value: str) -> datetime | None:
    """ISO 8601 / RFC 3339 text (any fraction length, 'Z' or offset, or naive) -> UTC datetime."""
    text = value.strip()
    if not text:
        return None
    # fromisoformat handles 'Z', offsets and fractions in 3.11; it chokes on >6 digit fractions
    # in some forms, so normalise the fraction first.
    dot = text.find(".", 19)
    if dot != -1:
        end = dot + 1
        while end < len(text) and text[end].isdigit():
            end += 1
        if end - dot - 1 > 6:
            text = text[: dot + 7] + text[end:]
    try:
        parsed = datetime.fromisoformat(text.replace(",", ".", 1) if "," in text[19:20] else text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def parse_any(value: object) -> datetime | None:
    """A forwarder's timestamp field: epoch number, numeric string, or ISO text."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return from_epoch(float(value))
        except (OverflowError, ValueError, OSError):
            return None
    if isinstance(value, str):
        head = value[:1]
        if head.isdigit() and ("-" not in value[:5]):
            try:
                return from_epoch(float(value))
            except (OverflowError, ValueError, OSError):
                return None
        return parse_iso(value)
    return None
