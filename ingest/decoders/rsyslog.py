"""rsyslog text: RSYSLOG_FileFormat, RSYSLOG_TraditionalFileFormat (RFC 3164) and RFC 5424 lines."""

from __future__ import annotations

import re
from datetime import datetime

from ingest import timestamps as tsu
from ingest.decoders.fields import int_field
from ingest.decoders.records import RawRecord, truncate

_TAG = r"([^\s\[\]:]+)(?:\[(\d+)\])?: ?"
# RSYSLOG_FileFormat: 2024-05-01T12:00:00.123456+00:00 host tag[pid]: msg
_RSYSLOG_FILE = re.compile(
    r"(?:<\d{1,3}>)?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) ([\w.:-]+) " + _TAG
)
# RSYSLOG_TraditionalFileFormat / RFC 3164: May  1 12:00:00 host tag[pid]: msg
_RSYSLOG_TRAD = re.compile(
    r"(?:<\d{1,3}>)?(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([ \d]?\d) (\d\d):(\d\d):(\d\d) "
    r"([\w.:-]+) " + _TAG
)
# RFC 5424: <13>1 2024-05-01T12:00:00.123Z host app procid msgid [sd]|- msg
_RFC5424 = re.compile(
    r"<\d{1,3}>1 (\S+) (\S+) (\S+) (\S+) \S+ (?:-|(?:\[(?:[^\]\"\\]|\"(?:[^\"\\]|\\.)*\"|\\.)*\])+)(?: |$)"
)


# A logger's level where a syslog header has its HOSTNAME: `2024-05-01T12:00:00Z WARNING torch.run: ...` is an
# application's log line with an ISO time, not a syslog line from a host named WARNING.
_LEVEL_WORDS = frozenset({"TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "WARNING", "ERROR", "ERR", "CRITICAL", "CRIT",
                          "FATAL", "ALERT", "EMERG", "EMERGENCY"})


_IPV6 = re.compile(r"[0-9A-Fa-f:.]+")  # the only HOSTNAME with a colon: an IPv6 address
_GLOG_HEADER = re.compile(r"[IWEFD]\d{4}")  # glog's level and month-day


def _syslog_line(
    line: str, year_hint: int | None
) -> tuple[str, datetime | None, str | None, str | None, int | None] | None:
    """(message, ts, host, tag, pid) when `line` is a syslog line in one of rsyslog's formats."""
    parsed = _syslog_fields(line, year_hint)
    if parsed is None:
        return None
    host, tag = parsed[2], parsed[3]
    if host is not None and (host.upper() in _LEVEL_WORDS or (":" in host and _IPV6.fullmatch(host) is None)
                             or _GLOG_HEADER.fullmatch(host) is not None):
        # a level word, python logging's `ERROR:logger.name:msg` or glog's `W0806 14:14:18.68 ...` after an ISO
        # time: an application's line behind a container runtime's or an aggregator's time, not a syslog line
        return None
    if tag is not None and tag.isdigit():
        return None  # a clock's hours where the TAG would be (`... W0806 14:14:18`): not a syslog tag
    return parsed


def _syslog_fields(
    line: str, year_hint: int | None
) -> tuple[str, datetime | None, str | None, str | None, int | None] | None:
    c = line[:1]
    if c == "<":
        m = _RFC5424.match(line)
        if m is not None:
            ts = None if m[1] == "-" else tsu.parse_iso(m[1])
            host = None if m[2] == "-" else m[2]
            tag = None if m[3] == "-" else m[3]
            pid = int_field(m[4]) if m[4] != "-" else None
            message = line[m.end() :]
            message = message.removeprefix("\ufeff")
            return message, ts, host, tag, pid
    if c.isdigit() or c == "<":
        m = _RSYSLOG_FILE.match(line)
        if m is not None:
            return line[m.end() :], tsu.parse_iso(m[1]), m[2], m[3], int_field(m[4])
    if c.isalpha() or c == "<":
        m = _RSYSLOG_TRAD.match(line)
        if m is not None:
            month = tsu.MONTHS[m[1]]
            day = int(m[2])
            ts = tsu.build(tsu.guess_year(month, day, year_hint), month, day, int(m[3]), int(m[4]), int(m[5]))
            return line[m.end() :], ts, m[6], m[7], int_field(m[8])
    return None


def syslog_header(line: str, year_hint: int | None = None) -> tuple[str, datetime | None, str | None] | None:
    """(message, ts, host) when `line` starts with a timestamped or <PRI> syslog header (RSYSLOG_FileFormat,
    RFC 5424; the traditional `May  1 12:00:00 host tag:` is a prefix `ingest.prefixes` reads)."""
    if not (line[:1].isdigit() or line[:1] == "<"):
        return None
    parsed = _syslog_line(line, year_hint)
    return None if parsed is None else parsed[:3]


def decode_syslog_lines(
    lines: list[str], received_ts: datetime | None, max_line_bytes: int, year_hint: int | None = None
) -> list[RawRecord] | None:
    if year_hint is None and received_ts is not None:
        year_hint = received_ts.year
    first = _syslog_line(lines[0], year_hint)
    if first is None:
        return None
    out: list[RawRecord] = []
    parsed: tuple[str, datetime | None, str | None, str | None, int | None] | None = first
    _, ts, host, tag, pid = first
    for line in lines:
        if parsed is None:
            parsed = _syslog_line(line, year_hint)
        if parsed is not None:
            message, ts, host, tag, pid = parsed
        else:
            message = line  # a line of a multi-line message: same sender
        parsed = None
        message, cut = truncate(message, max_line_bytes)
        labels = {"syslog_tag": tag} if tag else {}
        if cut:
            labels["truncated"] = "1"
        if not message.strip():
            continue
        out.append(
            RawRecord(
                text=message,
                source="rsyslog",
                host=host,
                pid=pid,
                ts=ts,
                received_ts=received_ts,
                labels=labels,
            )
        )
    return out
