"""Filebeat JSON (ECS: `message`, `log.file.path`, `@timestamp`, Beats `@metadata`, `fields`)."""

from __future__ import annotations

from collections.abc import Mapping

from ingest import timestamps as tsu
from ingest.decoders.fields import add_k8s_labels, dict_field, flat_labels, int_field, str_field
from ingest.decoders.records import RawRecord


def fill_record(obj: Mapping[str, object], rec: RawRecord) -> None:
    """The record's identity, labels and time from the forwarder's fields (the caller took its text)."""
    k8s = dict_field(obj.get("kubernetes"))
    labels = flat_labels(obj.get("labels"))  # ECS labels (add_labels processor)
    labels.update(flat_labels(k8s.get("labels")))
    namespace = k8s.get("namespace")
    node = str_field(dict_field(k8s.get("node")).get("name"))
    add_k8s_labels(
        labels,
        str_field(dict_field(k8s.get("pod")).get("name")),
        str_field(namespace) or str_field(dict_field(namespace).get("name")),
        str_field(dict_field(k8s.get("container")).get("name")),
        node,
    )
    for key, value in flat_labels(obj.get("fields")).items():
        labels.setdefault(key, value)
    rec.labels = labels
    host_field = obj.get("host")
    host_obj = dict_field(host_field)
    rec.host = node or str_field(host_obj.get("name")) or str_field(host_obj.get("hostname")) or str_field(host_field)
    log = dict_field(obj.get("log"))
    rec.file = str_field(dict_field(log.get("file")).get("path"))
    rec.offset = int_field(log.get("offset"))
    rec.stream = str_field(obj.get("stream"))
    rec.ts = tsu.parse_any(obj.get("@timestamp"))
