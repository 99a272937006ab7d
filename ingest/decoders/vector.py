"""Vector JSON (kubernetes_logs, file sources): the line in `message`, the time in `timestamp`."""

from __future__ import annotations

from collections.abc import Mapping

from ingest import timestamps as tsu
from ingest.decoders.fields import add_k8s_labels, dict_field, flat_labels, str_field
from ingest.decoders.records import RawRecord


def fill_record(obj: Mapping[str, object], rec: RawRecord) -> None:
    """The record's identity, labels and time from the forwarder's fields (the caller took its text)."""
    k8s = dict_field(obj.get("kubernetes"))
    labels = flat_labels(k8s.get("pod_labels"))
    node = str_field(k8s.get("pod_node_name"))
    add_k8s_labels(
        labels,
        str_field(k8s.get("pod_name")),
        str_field(k8s.get("pod_namespace")),
        str_field(k8s.get("container_name")),
        node,
    )
    rec.labels = labels
    rec.host = node or str_field(obj.get("host")) or str_field(obj.get("hostname"))
    rec.stream = str_field(obj.get("stream"))
    rec.file = str_field(obj.get("file"))
    rec.ts = tsu.parse_any(obj.get("timestamp"))
    if rec.ts is None and "@timestamp" in obj:
        rec.ts = tsu.parse_any(obj["@timestamp"])
