"""What every decoder makes: `RawRecord`s (one line each, with the forwarder's metadata), the
on-demand `DecodedLines`, `DecodeError`, and the text -> lines -> records steps they share."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from typing import cast


class DecodeError(ValueError):
    """A message value that cannot be turned into records. `reason` is short and machine-friendly:
    empty, too_large, bad_json, no_text_field, bad_record, unsupported_version."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(slots=True)
class RawRecord:
    """One line as the forwarder delivered it, with the metadata the forwarder attached.

    `labels` carries Kubernetes pod labels as they are, plus rootrank's own keys: `k8s.pod`,
    `k8s.namespace`, `k8s.container`, `k8s.node`, `pod_index`, `syslog_tag`, `truncated`.

    `host_is_fallback`: `host` names only the lines that do not name their own (a shipper's host, read
    on one machine for many): a host the line's own prefix names wins (`to_event`).
    """

    text: str
    source: str = "plain"
    host: str | None = None
    job_id: str | None = None
    file: str | None = None
    stream: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    attempt: int | None = None
    ts: datetime | None = None
    received_ts: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    offset: int | None = None
    host_is_fallback: bool = False


def truncate(line: str, max_line_bytes: int) -> tuple[str, bool]:
    if len(line) * 4 <= max_line_bytes:  # fast path: cannot exceed the limit even if all 4-byte
        return line, False
    encoded = line.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_line_bytes:
        return line, False
    return encoded[:max_line_bytes].decode("utf-8", "ignore"), True


def split_lines(text: str) -> list[str]:
    """Newline-separated lines, without the newline (or CRLF) and without empty lines."""
    if "\n" not in text:
        line = text.removesuffix("\r")
        return [line] if line.strip() else []
    lines = (line.removesuffix("\r") for line in text.split("\n"))
    return [line for line in lines if line.strip()]


def records_from_text(text: str, template: RawRecord, max_line_bytes: int) -> list[RawRecord]:
    return records_from_lines(split_lines(text), template, max_line_bytes)


def records_from_lines(lines: list[str], template: RawRecord, max_line_bytes: int) -> list[RawRecord]:
    out: list[RawRecord] = []
    for whole in lines:
        line, cut = truncate(whole, max_line_bytes)
        labels = dict(template.labels)
        if cut:
            labels["truncated"] = "1"
        out.append(
            RawRecord(
                text=line,
                source=template.source,
                host=template.host,
                job_id=template.job_id,
                file=template.file,
                stream=template.stream,
                rank=template.rank,
                local_rank=template.local_rank,
                pid=template.pid,
                attempt=template.attempt,
                ts=template.ts,
                received_ts=template.received_ts,
                labels=labels,
                offset=template.offset,
                host_is_fallback=template.host_is_fallback,
            )
        )
    return out


class DecodedLines:
    """The lines of one value: every line's text at once, its RawRecord only when asked for.

    The streaming worker scans the texts and builds records (identity, timestamps, labels) only for
    the lines that hit. `record(i)` is what `decode_value(...)[i]` would be.
    """

    __slots__ = ("_before", "_make", "_records", "_runs", "_stream", "joined", "order_base", "srun_labels", "texts")

    def __init__(self, texts: list[str], records: list[RawRecord] | None = None,
                 make: Callable[[int], RawRecord] | None = None,
                 stream: Callable[[int], tuple[object, ...]] | None = None,
                 runs: list[tuple[int, int]] | None = None, joined: str | None = None,
                 before: Callable[[int], Iterator[str]] | None = None, order_base: int | None = None,
                 srun_labels: str | None = None) -> None:
        self.texts = texts
        # Lines of a file whose `srun -l` labels name nodes (the shipper read the file's head): "node".
        self.srun_labels = srun_labels
        # Lines of a file: the order of its line number 0 (ingest/order.py); a line's order adds its number.
        self.order_base = order_base
        self.joined = joined  # "\n".join(texts), when the decoder had it at hand
        # Lines of a file (a shipped batch): the file's lines before line i, closest first (see `lines_before`).
        self._before = before
        # A given list is only read (record() fills the None entries of a list made here, never a given one).
        self._records: list[RawRecord | None] = (
            cast("list[RawRecord | None]", records) if records is not None else [None] * len(texts))
        self._make = make
        self._stream = stream
        self._runs = runs

    @classmethod
    def of(cls, records: list[RawRecord]) -> DecodedLines:
        return cls([r.text for r in records], records)

    def __len__(self) -> int:
        return len(self.texts)

    def record(self, index: int) -> RawRecord:
        record = self._records[index]
        if record is None:
            assert self._make is not None
            record = self._records[index] = self._make(index)
        return record

    def stream_key(self, index: int) -> tuple[object, ...]:
        """(host, rank, file, stream) of line `index`, without building its record when the decoder can
        say it directly (a ship batch: the batch's identity and the line's stream)."""
        if self._stream is not None:
            return self._stream(index)
        record = self.record(index)
        return (record.host, record.rank, record.file, record.stream)

    def stream_runs(self) -> list[tuple[int, int]]:
        """The lines as ranges [lo, hi) of one stream key each, in order."""
        if self._runs is None:
            self._runs = runs_of(list(map(self.stream_key, range(len(self.texts)))))
        return self._runs

    def records(self) -> list[RawRecord]:
        return [self.record(i) for i in range(len(self.texts))]

    @property
    def from_file(self) -> bool:
        """The lines are consecutive lines of one file or stream (a shipped batch), framed as `rootrank
        diagnose` frames a file's lines (correlator/diagnosis/framing.py), not one record each."""
        return self._before is not None

    def lines_before(self, index: int) -> Iterator[str]:
        """The lines of line `index`'s file before it, closest first: the batch's own (blank lines
        included), then the context the shipper sent; nothing for lines that are not a file's."""
        if self._before is None:
            return iter(())
        return self._before(index)


def lines_before_in(lines: Sequence[str], at: int, context: Sequence[str], limit: int) -> Iterator[str]:
    """`lines[at - 1]`, `lines[at - 2]`, ... then the context from its end: at most `limit` lines."""
    n = 0
    for j in range(min(at, len(lines)) - 1, -1, -1):
        if n >= limit:
            return
        yield lines[j]
        n += 1
    for j in range(len(context) - 1, -1, -1):
        if n >= limit:
            return
        yield context[j]
        n += 1


def runs_of(keys: Sequence[Hashable]) -> list[tuple[int, int]]:
    """Ranges [lo, hi) of equal consecutive keys."""
    if not keys:
        return []
    if len(set(keys)) == 1:
        return [(0, len(keys))]
    out: list[tuple[int, int]] = []
    at = 0
    for _key, group in groupby(keys):
        size = sum(1 for _ in group)
        out.append((at, at + size))
        at += size
    return out
