"""`rootrank setup`: create the pipeline's topics with their partitions and configs.

Idempotent: existing topics are left alone, but a partition count that differs from the config is
reported, because the signals topic and the job-state changelog must stay co-partitioned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from correlator.config import KafkaSettings, Settings
from correlator.stream.topics import TopicSpec, topic_specs


def kafka_python_config(kafka: KafkaSettings) -> dict[str, Any]:
    """Connection and security options shared by every kafka-python client."""
    config: dict[str, Any] = {
        "bootstrap_servers": [s.strip() for s in kafka.bootstrap_servers.split(",") if s.strip()],
        "security_protocol": kafka.security_protocol,
    }
    if kafka.sasl_mechanism:
        config["sasl_mechanism"] = kafka.sasl_mechanism
        config["sasl_plain_username"] = kafka.sasl_username
        config["sasl_plain_password"] = kafka.sasl_password
    if kafka.ssl_cafile:
        config["ssl_cafile"] = kafka.ssl_cafile
    return config


@dataclass(frozen=True)
class TopicOutcome:
    spec: TopicSpec
    action: str  # created | exists | mismatch
    detail: str = ""


def ensure_topics(settings: Settings, *, timeout_s: float = 30.0) -> list[TopicOutcome]:
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    admin = _admin_with_retry(KafkaAdminClient, settings.kafka, timeout_s)
    outcomes: list[TopicOutcome] = []
    try:
        existing = set(admin.list_topics())
        partitions_of: dict[str, int] = {}
        if existing:
            for meta in admin.describe_topics([s.name for s in topic_specs(settings) if s.name in existing]):
                partitions_of[str(meta.get("topic") or meta.get("name"))] = len(meta.get("partitions") or [])
        for spec in topic_specs(settings):
            if spec.name in existing:
                have = partitions_of.get(spec.name)
                if have is not None and have != spec.partitions:
                    outcomes.append(TopicOutcome(spec, "mismatch", f"has {have} partitions, config says {spec.partitions}"))
                else:
                    outcomes.append(TopicOutcome(spec, "exists"))
                continue
            new = NewTopic(spec.name, spec.partitions, spec.replication_factor, topic_configs=dict(spec.configs))
            try:
                admin.create_topics([new], timeout_ms=int(timeout_s * 1000))
                outcomes.append(TopicOutcome(spec, "created"))
            except TopicAlreadyExistsError:
                outcomes.append(TopicOutcome(spec, "exists"))
            except KafkaError as exc:
                # Some brokers refuse a config they do not know; the topic itself matters more.
                admin.create_topics([NewTopic(spec.name, spec.partitions, spec.replication_factor)],
                                    timeout_ms=int(timeout_s * 1000))
                outcomes.append(TopicOutcome(spec, "created", f"without configs ({exc})"))
    finally:
        admin.close()
    return outcomes


def _admin_with_retry(factory: Any, kafka: KafkaSettings, timeout_s: float) -> Any:
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return factory(client_id="rootrank-setup", **kafka_python_config(kafka))
        except KafkaError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def format_outcomes(outcomes: list[TopicOutcome]) -> str:
    width = max((len(o.spec.name) for o in outcomes), default=10)
    rows = []
    for o in outcomes:
        configs = ",".join(f"{k}={v}" for k, v in sorted(o.spec.configs.items()))
        note = f"  ({o.detail})" if o.detail else ""
        rows.append(f"{o.action:8s} {o.spec.name:{width}s} partitions={o.spec.partitions} {configs}{note}")
    return "\n".join(rows)
