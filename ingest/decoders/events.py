"""A record -> the canonical `LogEvent` (`to_event`), and the job it belongs to (`job_id_for`)."""

from __future__ import annotations

import dataclasses
import functools
import re
from datetime import datetime

from ingest.decoders.fields import POD_NAME
from ingest.decoders.records import RawRecord
from ingest.decoders.rsyslog import syslog_header
from ingest.event import MAX_LINE_CHARS, LogEvent
from ingest.prefixes import Identity, identity_from_path, parse_prefixes

# Label of a shipped file's lines: the machine `rootrank ship` read them on, when it was not told their host
# (the last fallback for their job, never their host: a file may be a copy, or on a shared file system).
SHIPPED_FROM = "shipped_from"

_JOB_LABELS = (
    "training.kubeflow.org/job-name",
    "job-name",
    "kubeflow.org/job-name",
    "batch.kubernetes.io/job-name",
    # Filebeat de-dots label keys by default (labels.dedot: true)
    "training_kubeflow_org/job-name",
    "kubeflow_org/job-name",
    "batch_kubernetes_io/job-name",
    "volcano.sh/job-name",
    "jobset.sigs.k8s.io/jobset-name",
)
_SLURM_LABELS = ("SLURM_JOB_ID", "slurm_job_id", "slurm.job_id")
_SLURM_FILE = re.compile(r"(?:^|/)slurm-(\d+(?:_\d+)?)\.(?:out|err|log)$")


@functools.lru_cache(maxsize=32)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _job_hint(record: RawRecord, path_regex: str | None) -> str | None:
    """Everything job_id_for tries before falling back to the host."""
    if record.job_id:
        return record.job_id
    labels = record.labels
    if labels:
        for key in _JOB_LABELS:
            value = labels.get(key)
            if value:
                return value
    pod = labels.get("k8s.pod") if labels else None
    for name in (pod, record.host):
        if name:
            m = POD_NAME.match(name)
            if m is not None:
                return m["job"]
    if record.file:
        m = _SLURM_FILE.search(record.file)
        if m is not None:
            return m[1]
    if labels:
        for key in _SLURM_LABELS:
            value = labels.get(key)
            if value:
                return value
    if path_regex and record.file:
        m = _compiled(path_regex).search(record.file)
        if m is not None and m.groupdict().get("job"):
            return m["job"]
    return None


def job_id_for(record: RawRecord, *, path_regex: str | None = None) -> str:
    """The job a record belongs to. First hit of: the explicit `job_id`; a Kubeflow/batch job
    label; the pod name `JOB-worker-N` / `JOB-master-0` / `JOB-launcher-xxxxx` (from the pod
    label, or the host when it is a pod name); Slurm's `slurm-%j.out` file or SLURM_JOB_ID label;
    `path_regex`'s named group `job` on the file path; the host; "unknown"."""
    return _job_hint(record, path_regex) or record.host or record.labels.get(SHIPPED_FROM) or "unknown"


def _identity_of(record: RawRecord) -> Identity:
    """The line's prefixes; for a shipped line (`host_is_fallback`) also a syslog header of its own (a kernel
    line of a shipped kern.log: `2026-12-04T21:23:50+00:00 node04 kernel: NVRM: ...`), read as `rootrank
    diagnose` reads it: the header's host and time where the message's own prefixes name none."""
    year = record.ts.year if record.ts is not None else None
    if record.host_is_fallback:
        header = syslog_header(record.text, year)
        if header is not None:
            message, header_ts, header_host = header
            ident = parse_prefixes(message, year=year)
            return dataclasses.replace(
                ident, host=ident.host or header_host, ts=ident.ts or header_ts,
                ts_has_date=ident.ts_has_date if ident.ts else header_ts is not None,
            )
    return parse_prefixes(record.text, year=year)


def to_event(
    record: RawRecord,
    *,
    identity: Identity | None = None,
    default_job: str | None = None,
    offset: int | None = None,
    path_regex: str | None = None,
) -> LogEvent:
    """The canonical event for one record.

    Identity from the line's prefixes fills what the record lacks (the record's explicit fields
    win); when the two name different hosts, the prefix's goes to `labels["origin_host"]`.
    Except for a record whose host is a fallback (`host_is_fallback`: `rootrank ship`'s host, explicit
    or its machine's name, where a file was read): there the host the line names itself (a syslog or
    kernel line's hostname, pdsh's `host: `, NCCL's `host:pid:tid`, MPI's tag) wins, because it says
    where the line was written, as `rootrank diagnose` reads it (a line's host before its path's).
    The time is the line's own when it has one, else the record's. Job: explicit, then labels /
    pod name / Slurm / `path_regex`, then `default_job`, then the host, then "unknown".
    """
    if identity is None:
        identity = _identity_of(record)
    job = _job_hint(record, path_regex) or default_job or record.host or record.labels.get(SHIPPED_FROM) or "unknown"
    labels = dict(record.labels)
    if record.host_is_fallback:
        host = identity.host or record.host
    else:
        host = record.host or identity.host
        if identity.host and record.host and identity.host != record.host:
            labels["origin_host"] = identity.host
    line, raw_line, truncated = _bounded_text(record.text, identity.text, labels.get("truncated") == "1")
    return LogEvent(
        job_id=job,
        host=host,
        rank=record.rank if record.rank is not None else identity.rank,
        local_rank=record.local_rank if record.local_rank is not None else identity.local_rank,
        pid=record.pid if record.pid is not None else identity.pid,
        gpu=identity.gpu,
        ts=identity.ts or record.ts,
        received_ts=record.received_ts,
        source=record.source,
        stream=record.stream,
        file=record.file,
        offset=offset if offset is not None else record.offset,
        line=line,
        raw_line=raw_line,
        truncated=truncated,
        attempt=record.attempt,
        labels=labels,
    )


def _bounded_text(text: str, line: str, truncated: bool) -> tuple[str, str | None, bool]:
    """The event's line (its text without the prefixes) and its raw text when that differs, each cut to
    MAX_LINE_CHARS; whether anything was cut, here or by the decoder."""
    if len(line) > MAX_LINE_CHARS:
        line, truncated = line[:MAX_LINE_CHARS], True
    raw_line = text if text != line else None
    if raw_line is not None and len(raw_line) > MAX_LINE_CHARS:
        raw_line = raw_line[:MAX_LINE_CHARS]
    return line, raw_line, truncated


def _first_int(*values: object) -> int | None:
    return next((v for v in values if isinstance(v, int)), None)


def file_line_event(
    record: RawRecord,
    identity: Identity,
    borrowed_ts: datetime | None,
    *,
    offset: int | None = None,
    path_regex: str | None = None,
) -> LogEvent:
    """The event of a line of a file (a shipped batch's), framed as `rootrank diagnose` frames a file's
    lines: `identity` is the line's own (its prefixes, or the record it continues:
    correlator/diagnosis/framing.py), `borrowed_ts` the time of the closest earlier timed line.

    Who: the line's own identity first; then what the shipper was told (`--host`, `--rank`, ...: the
    record's fields); then what the file's path says by convention (`identity_from_path`), which is all
    `rootrank diagnose` has beside the line. When: the line's own time; else the time the shipper read a
    live line; else the borrowed one (the signal says so)."""
    hints = identity_from_path(record.file) if record.file else {}
    host_hint = hints.get("host")
    line, raw_line, truncated = _bounded_text(record.text, identity.text, record.labels.get("truncated") == "1")
    return LogEvent(
        job_id=job_id_for(record, path_regex=path_regex),
        host=identity.host or record.host or (host_hint if isinstance(host_hint, str) else None),
        rank=_first_int(identity.rank, record.rank, hints.get("rank")),
        local_rank=_first_int(identity.local_rank, record.local_rank, hints.get("local_rank")),
        pid=_first_int(identity.pid, record.pid),
        gpu=identity.gpu,
        ts=identity.ts or record.ts or borrowed_ts,
        received_ts=record.received_ts,
        source=record.source,
        stream=record.stream,
        file=record.file,
        offset=offset if offset is not None else record.offset,
        line=line,
        raw_line=raw_line,
        truncated=truncated,
        attempt=_first_int(record.attempt, hints.get("attempt")),
        labels=dict(record.labels),
    )
