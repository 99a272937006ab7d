"""Fluent Bit JSON (tail, kubernetes filter, systemd input): the line in `log` (or `MESSAGE`)."""

from __future__ import annotations

from collections.abc import Mapping

from ingest import timestamps as tsu
from ingest.decoders.fields import add_k8s_labels, dict_field, flat_labels, int_field, str_field
from ingest.decoders.records import RawRecord


def fill_record(obj: Mapping[str, object], rec: RawRecord) -> None:
    """The record's identity, labels and time from the forwarder's fields (the caller took its text)."""
    k8s = dict_field(obj.get("kubernetes"))
    labels = flat_labels(k8s.get("labels"))
    node = str_field(k8s.get("host"))
    add_k8s_labels(
        labels,
        str_field(k8s.get("pod_name")),
        str_field(k8s.get("namespace_name")),
        str_field(k8s.get("container_name")),
        node,
    )
    rec.labels = labels
    rec.host = node or str_field(obj.get("host")) or str_field(obj.get("hostname")) or str_field(obj.get("_HOSTNAME"))
    rec.stream = str_field(obj.get("stream"))
    rec.file = str_field(obj.get("file")) or str_field(obj.get("filename"))
    for key in ("@timestamp", "date", "time", "timestamp"):
        if key in obj:
            rec.ts = tsu.parse_any(obj[key])
            if rec.ts is not None:
                break
    if rec.ts is None and "_SOURCE_REALTIME_TIMESTAMP" in obj:  # systemd input: microseconds
        rec.ts = tsu.parse_any(int_field(obj["_SOURCE_REALTIME_TIMESTAMP"]))
    if "_PID" in obj:
        rec.pid = int_field(obj["_PID"])
    if "SYSLOG_IDENTIFIER" in obj and (tag := str_field(obj["SYSLOG_IDENTIFIER"])):
        rec.labels["syslog_tag"] = tag
