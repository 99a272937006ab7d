"""How a line of a log file becomes an event: one definition for `rootrank diagnose` and the stream.

A line read from a file (diagnose maps it; `rootrank ship` sends it in a batch) does not always say who
wrote it or when. The same steps fill that in on both paths, so both give the engine the same signal:

1. glued records (`split_glued`: tqdm redraws with a record behind them, interleaved `what():`): the
   segment the rule matched is the line;
2. identity and time from the line itself (`identify_line`): a syslog header (host, time, pid) when the
   file is rsyslog text, then the prefixes (`parse_prefixes`);
3. a line that names nobody and continues a record (a traceback's frames and exception line, NCCL's
   `Last error:` detail) takes the identity of the record it continues (`continued_identity`);
4. a line without a time takes the time of the closest earlier timed line of its file, as a lower bound
   (`earlier_time`; the signal carries `time_borrowed`);
5. what the file's path says by convention (`identity_from_path`: `node01/`, `rank3.log`, torchrun's
   `attempt_N/LOCAL_RANK/`) fills what the line does not say.

Steps 3 and 4 look back at most `CONTINUATION_LOOKBACK` lines of the same file. `diagnose` has the
file; the stream has the lines of the batch before the line, and the `context` a shipper sends with
each batch: the lines of the file right before the batch's first one (ingest/ship/wire_format.py), as
many as a look back can read. The result does not depend on where a batch starts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Iterable, Iterator
from datetime import datetime
from types import ModuleType

from correlator.diagnosis.matcher import Buffer
from ingest.multiline import is_continuation, split_glued
from ingest.prefixes import Identity, SrunLabels, parse_prefixes

CONTINUATION_LOOKBACK = 64  # lines a look back reads (and a shipper sends as a batch's context)


@dataclasses.dataclass(frozen=True, slots=True)
class Framed:
    """A line's text as the rule matched it (`raw`), who wrote it and when (`identity`), and whether that
    time is an earlier line's (`borrowed`: a lower bound)."""

    raw: str
    identity: Identity
    ts: datetime | None
    borrowed: bool


@functools.cache
def _decoders() -> ModuleType:
    """The forwarders' decoders, imported by the first line that may be an rsyslog line, not at start-up."""
    import ingest.decoders

    return ingest.decoders


@functools.lru_cache(maxsize=8192)
def identify_line(raw: str, srun_labels: SrunLabels = "auto", year: int | None = None) -> Identity:
    """Who wrote a line and when, from the line alone: an rsyslog header (its host, time and pid say who
    sent the line, as the rsyslog decoder reads them), then the prefixes of the message. `srun_labels`: how
    the file's `srun -l` labels read (`sniff_srun_labels`); `year` completes year-less stamps (the job's year,
    not the reader's: a 2024 job read in 2026).

    Memoized: looking back for a timestamp or a traceback's owner revisits the same lines."""
    host: str | None = None
    pid: int | None = None
    header_ts = None
    text = raw
    if raw[:1].isdigit() or raw[:1] == "<":
        decoders = _decoders()
        try:
            records = decoders.decode_value(raw.encode("utf-8", "replace"))
        except decoders.DecodeError:
            records = []
        if records and records[0].source == "rsyslog":
            host, header_ts, text, pid = records[0].host, records[0].ts, records[0].text, records[0].pid
    ident = parse_prefixes(text, srun_labels=srun_labels, year=year)
    if host is None and header_ts is None:
        return ident
    # The header's host and pid are the record's own fields: they win over the message's prefixes, as
    # `ingest.decoders.to_event` lets a record's fields win.
    return dataclasses.replace(
        ident, host=host or ident.host, pid=pid if pid is not None else ident.pid, ts=ident.ts or header_ts,
        ts_has_date=ident.ts_has_date if ident.ts else header_ts is not None,
    )


def lines_before(body: Buffer, start: int) -> Iterator[str]:
    """The lines of a buffer before offset `start` (a line's first byte), closest first, at most
    CONTINUATION_LOOKBACK of them."""
    pos = start
    for _ in range(CONTINUATION_LOOKBACK):
        if pos <= 0:
            return
        prev_start = body.rfind(b"\n", 0, pos - 1) + 1
        yield body[prev_start : pos - 1].decode("utf-8", "replace")
        pos = prev_start


def earlier_time(before: Iterable[str], srun_labels: SrunLabels = "auto", year: int | None = None) -> datetime | None:
    """An untimed line (a traceback's last line) happened at about the time of the closest timed line
    before it (a lower bound)."""
    for prev in before:
        ts = identify_line(prev, srun_labels, year).ts
        if ts is not None:
            return ts
    return None


def continued_identity(
    current: str, before: Iterable[str], ident: Identity, srun_labels: SrunLabels = "auto", year: int | None = None
) -> Identity:
    """A line that names nobody takes the identity of the record it continues (a traceback's frames and
    its exception line, a detail line). Only a line that continues something (indented, a frame, or the
    exception after frames) inherits; a launcher's own line right after a rank's line does not."""
    current_continues = is_continuation(current)
    for n, prev in enumerate(before):
        if not prev.strip():
            break
        if n == 0 and not (current_continues or is_continuation(prev)):
            break
        prev_ident = identify_line(prev, srun_labels, year)
        if prev_ident.rank is not None or prev_ident.host is not None or prev_ident.pid is not None:
            return dataclasses.replace(
                prev_ident,
                text=ident.text,
                ts=ident.ts or prev_ident.ts,
                ts_has_date=ident.ts_has_date if ident.ts else prev_ident.ts_has_date,
            )
        if not is_continuation(prev):
            break
    return ident


def frame_line(
    line: str, before: Callable[[], Iterable[str]], matches: Callable[[str], bool] | None = None, *,
    srun_labels: SrunLabels = "auto", year: int | None = None,
) -> Framed:
    """Steps 1-4 of the module docstring for one line (without its newline). `before()` gives the lines of
    its file before it, closest first; `matches(segment)`: whether the rule that hit the line matches a
    segment of it (to pick the glued record it hit); `srun_labels` and `year` as for `identify_line`."""
    raw = line.rstrip("\r")
    if "\r" in raw or "|" in raw:
        segments = split_glued(raw)
        if len(segments) > 1:
            raw = next((s for s in segments if matches is None or matches(s)), segments[-1])
    ident = identify_line(raw, srun_labels, year)
    if ident.rank is None and ident.host is None and ident.pid is None and ident.local_rank is None:
        ident = continued_identity(line, before(), ident, srun_labels, year)
    ts = ident.ts if ident.ts is not None else earlier_time(before(), srun_labels, year)
    return Framed(raw, ident, ts, ident.ts is None and ts is not None)


_HEADS: dict[str, Hashable] = {}  # a line's leading "[...]" or "[...]:" -> the process it names, or "" (none)


def line_process(text: str) -> Hashable:
    """Who wrote a line as its own prefixes say, (rank, host, pid, local_rank): the key routine lines
    (progress, metric values) are folded by, per process, as `rootrank diagnose` folds them
    (correlator/offline/routine.py). A leading prefix that names a rank (`[rank37]:`) is read once per
    distinct prefix; any other line is identified whole (`identify_line`)."""
    if text[:1] == "[":
        close = text.find("]", 1, 32)
        if close > 0:
            head = text[: close + 2] if text[close + 1 : close + 2] == ":" else text[: close + 1]
            known = _HEADS.get(head)
            if known is None:
                if len(_HEADS) > 1 << 16:
                    _HEADS.clear()
                ident = parse_prefixes(head + " x")
                named = ident.rank is not None and ident.text.strip() == "x"
                known = _HEADS[head] = (ident.rank, ident.host, ident.pid, ident.local_rank) if named else ""
            if known != "":
                return known
    ident = identify_line(text)
    return (ident.rank, ident.host, ident.pid, ident.local_rank)


_BYTE_HEADS: dict[bytes, bool] = {}  # a line's leading b"[...]:" -> whether it is prefixes naming a rank


def process_bytes(buf: bytes, start: int, end: int) -> bytes:
    """Bytes that tell apart the processes of the UTF-8 lines `buf[start:end]` (never two of them as one, as
    `line_process` tells them): a leading prefix that names a rank (`[rank37]:`, what a raw screen of many
    lines meets most) as its own bytes, looked at once per prefix; else the process `line_process` reads.
    Starts with a NUL, so it can follow other bytes of a key."""
    if buf[start : start + 1] == b"[":
        close = buf.find(b"]", start + 1, min(end, start + 32))
        if close > 0:
            stop = close + 2 if buf[close + 1 : close + 2] == b":" else close + 1
            head = buf[start:stop]
            named = _BYTE_HEADS.get(head)
            if named is None:
                if len(_BYTE_HEADS) > 1 << 16:
                    _BYTE_HEADS.clear()
                ident = parse_prefixes(head.decode("utf-8", "replace") + " x")
                named = _BYTE_HEADS[head] = ident.rank is not None and ident.text.strip() == "x"
            if named:
                return b"\0" + head
    return b"\0\0" + repr(line_process(buf[start:end].decode("utf-8", "replace"))).encode()
