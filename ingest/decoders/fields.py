"""A forwarder's JSON fields read defensively (wrong types are absent, not errors), and Kubernetes
pod metadata as rootrank's labels."""

from __future__ import annotations

import re


def str_field(value: object) -> str | None:
    return value or None if isinstance(value, str) else None


def str_or_num_field(value: object) -> str | None:
    """For ids and labels, where a number (a Slurm job id, a replica index) is meaningful."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def int_field(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text[:1] == "-":
            return -int(text[1:]) if text[1:].isdigit() else None
        return int(text) if text.isdigit() and len(text) < 19 else None
    return None


def dict_field(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def flat_labels(value: object) -> dict[str, str]:
    """Scalar entries of a label map as strings (nested values are skipped)."""
    out: dict[str, str] = {}
    for key, item in dict_field(value).items():
        text = str_or_num_field(item)
        if text is not None:
            out[str(key)] = text
    return out


POD_NAME = re.compile(
    r"^(?P<job>.+)-(?P<role>worker|master|launcher|chief|ps|evaluator)-(?P<idx>[0-9]+|[a-z0-9]{5})$"
)


def add_k8s_labels(
    labels: dict[str, str], pod: str | None, namespace: str | None, container: str | None, node: str | None
) -> None:
    if pod:
        labels["k8s.pod"] = pod
        m = POD_NAME.match(pod)
        if m is not None and m["idx"].isdigit():
            labels["pod_index"] = m["idx"]
    if namespace:
        labels["k8s.namespace"] = namespace
    if container:
        labels["k8s.container"] = container
    if node:
        labels["k8s.node"] = node
