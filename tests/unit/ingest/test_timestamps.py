"""Timestamp helpers: every result is UTC, bad input gives None, never an exception."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ingest import timestamps as tsu


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1717236000.25, utc(2024, 6, 1, 10, 0, 0, 250000)),
        (1717236000250, utc(2024, 6, 1, 10, 0, 0, 250000)),  # milliseconds
        (1717236000250000, utc(2024, 6, 1, 10, 0, 0, 250000)),  # microseconds
        (1717236000250000000, utc(2024, 6, 1, 10, 0, 0, 250000)),  # nanoseconds
        ("1717236000.25", utc(2024, 6, 1, 10, 0, 0, 250000)),
        ("2024-06-01T10:00:00.250000000Z", utc(2024, 6, 1, 10, 0, 0, 250000)),
        ("2024-06-01T12:00:00.25+02:00", utc(2024, 6, 1, 10, 0, 0, 250000)),
        ("2024-06-01 10:00:00,250", utc(2024, 6, 1, 10, 0, 0, 250000)),
        ("2024-06-01T10:00:00", utc(2024, 6, 1, 10, 0, 0)),
        (0, None),
        (-5, None),
        (1e300, None),
        (float("nan"), None),
        (True, None),
        ("", None),
        ("yesterday", None),
        ("2024-13-01T00:00:00Z", None),
        (None, None),
        ([1], None),
    ],
)
def test_parse_any(value: object, expected: datetime | None) -> None:
    assert tsu.parse_any(value) == expected


def test_build_rejects_impossible_dates_and_converts_offsets() -> None:
    assert tsu.build(2023, 2, 29, 0, 0, 0) is None
    assert tsu.build(2024, 2, 29, 0, 0, 0) == utc(2024, 2, 29)
    assert tsu.build(2024, 1, 1, 0, 30, 0, 0, "+0530") == utc(2023, 12, 31, 19, 0, 0)
    assert tsu.build(2024, 1, 1, 0, 0, 60) == utc(2024, 1, 1, 0, 0, 59)  # leap second clamps


def test_guess_year_never_puts_a_time_in_the_future() -> None:
    now = utc(2025, 1, 3, 12, 0, 0)
    assert tsu.guess_year(12, 31, None, now=now) == 2024
    assert tsu.guess_year(1, 2, None, now=now) == 2025
    assert tsu.guess_year(1, 5, None, now=now) == 2025  # within the two days of clock slack
    assert tsu.guess_year(12, 31, 2019, now=now) == 2019
    assert tsu.guess_year(1, 1, None, now=utc(2025, 12, 31)) == 2025  # slack crosses new year


def test_frac_to_us() -> None:
    assert [tsu.frac_to_us(f) for f in (None, "", "5", "123", "123456", "123456789")] == [
        0,
        0,
        500000,
        123000,
        123456,
        123456,
    ]
