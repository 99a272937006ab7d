"""Configuration from environment (ROOTRANK_*, nested with __) and an optional YAML file.

Each section belongs to one part of the pipeline; defaults are the embedded local stack.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from tenacity import wait_exponential, wait_random_exponential
from tenacity.wait import wait_base


class KafkaSettings(BaseModel):
    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    session_timeout_s: float = Field(
        default=30.0, description="consumer group session timeout; some brokers take half of it to finish a join"
    )
    producer_max_batch_size: int = Field(
        default=16_384,
        description="bytes per producer batch (1 = one message per batch, for brokers whose ListOffsets "
        "under-reports the end of a batched log, which breaks changelog recovery)",
    )
    producer_linger_ms: int = Field(default=0, description="how long the producer waits to fill a batch")
    consumer_max_fetch_bytes: int = Field(
        default=16 * 1024 * 1024,
        description="most bytes a fetch returns per partition (faust's default is 1 MiB: four shipped batches; "
        "16 MiB took a worker from 18.7-21.3 to 26.2-29.1 MiB/s of shipped log, docs/performance.md)",
    )
    consumer_fetch_max_wait_ms: int = Field(
        default=100,
        description="longest a fetch waits at the broker for new data (faust's own setting is 1500 ms; brokers "
        "that answer only when the wait is over, like Tansu, then add up to that much to every hop)",
    )
    max_request_bytes: int = Field(
        default=32 * 1024 * 1024, description="largest produce request the worker sends (dead letters keep raw bytes)"
    )


class TopicSettings(BaseModel):
    logs: str = "rootrank.logs"
    signals: str = "rootrank.signals"
    incidents: str = "rootrank.incidents"
    deadletter: str = "rootrank.deadletter"
    webhooks_deadletter: str = "rootrank.webhooks.deadletter"
    partitions: int = 8
    replication_factor: int = 1
    logs_max_message_bytes: int = Field(
        default=16 * 1024 * 1024, description="max.message.bytes of the logs topic (larger values are refused)"
    )
    deadletter_max_message_bytes: int = Field(
        default=32 * 1024 * 1024, description="max.message.bytes of the dead-letter topic (raw bytes base64-encoded)"
    )
    logs_retention_ms: int = Field(default=3 * 24 * 3600 * 1000, description="retention of raw logs and signals")


class EngineSettings(BaseModel):
    quiet_window_s: float = Field(default=20.0, description="a job's window closes after this long without new signals")
    rules_dir: str | None = Field(default=None, description="rule library folder (default: the installed one)")
    job_path_regex: str | None = Field(default=None, description="regex with a named group `job` applied to file paths")
    batch_size: int = Field(default=500, description="raw messages the match agent (and the correlate agent: "
                            "signals) takes from its topic at once")
    scan_max_bytes: int = Field(
        default=16 * 1024 * 1024,
        description="the match agent decodes and scans a batch in runs of at most this many bytes of values, "
        "handing the event loop back in between (a shipped message holds thousands of lines; a 16 MiB run "
        "holds the loop about 0.4 s)",
    )
    batch_within_s: float = Field(default=0.2, description="longest wait to fill a match batch")
    match_max_records: int = Field(
        default=50_000, description="most records the match role takes from one fetch (one getmany) and matches "
        "as one batch, in runs of scan_max_bytes",
    )
    max_value_bytes: int = Field(
        default=4 * 1024 * 1024, description="raw messages larger than this go to the dead-letter topic"
    )
    invalid_utf8: Literal["deadletter", "replace"] = Field(
        default="deadletter", description="a raw value that is not valid UTF-8: dead-letter it, or decode with U+FFFD"
    )
    tick_interval_s: float = Field(default=1.0, description="how often the correlator looks for quiet windows")
    rules_reload_s: float = Field(
        default=5.0, description="how often a worker looks for changed rule files (0: reload only on SIGHUP)"
    )


class ElasticsearchSettings(BaseModel):
    url: str = "http://127.0.0.1:9200"
    username: str | None = None
    password: str | None = None
    api_key: str | None = None
    ca_certs: str | None = None
    verify_certs: bool = True
    index_prefix: str = "rootrank"
    request_timeout_s: float = Field(default=30.0, description="per-request timeout of the sink and the CLI")
    bulk_max_docs: int = Field(default=500, description="records the sink reads from Kafka and writes per bulk")
    index_signals: bool = Field(default=True, description="also index matched lines (signals) for drill-down")
    manage_rollover: bool = Field(
        default=True, description="the sink rolls the write aliases over itself (turn off when ILM does it)"
    )
    rollover_check_s: float = Field(default=300.0, description="how often the sink checks the rollover conditions")
    rollover_max_age: str | None = "30d"
    rollover_max_primary_shard_size: str | None = "50gb"
    rollover_max_docs: int | None = None
    kibana_url: str | None = Field(default=None, description="`rootrank setup` imports the saved objects here")


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(default=12, ge=1)
    initial_backoff_s: float = Field(default=1.0, gt=0)
    max_backoff_s: float = Field(default=60.0, gt=0)
    budget_s: float = Field(default=600.0, gt=0, description="give up (dead-letter) after this long")
    timeout_s: float = Field(default=10.0, gt=0, description="one attempt, connect to last byte")
    max_retry_after_s: float = Field(default=300.0, ge=0, description="a longer Retry-After is dead-lettered")

    def backoff(self) -> wait_base:
        """The wait after a failed attempt, as a tenacity strategy: after attempt n, a wait in [c/2, c]
        with c = min(max_backoff_s, initial_backoff_s * 2**(n-1)). Half fixed, half random: attempts
        still spread out (no thundering herd after an outage) while the wait keeps growing."""
        half = {"multiplier": self.initial_backoff_s / 2, "max": self.max_backoff_s / 2}
        return wait_exponential(**half) + wait_random_exponential(**half)


class WebhookSettings(BaseModel):
    routes: list[dict[str, Any]] = Field(
        default_factory=list, description="ordered routes (match + receivers), see correlator/sinks/webhooks/routes.py"
    )
    receivers: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="name -> {kind: generic_json|slack|pagerduty|alertmanager, ...kind's config}"
    )
    api_token: SecretStr | None = Field(
        default=None, description="bearer token for writes to /jobs/{job_id}/webhooks; unset = writes refused"
    )
    allow_label_webhooks: bool = Field(
        default=False, description="let a job name its webhook in a log label (anyone who writes logs could redirect)"
    )
    kibana_base_url: str | None = Field(
        default=None, description="incident links: base URL, or a URL with an {incident_id} placeholder"
    )
    delivery: RetryPolicy = Field(default_factory=RetryPolicy, description="retries before dead-lettering")
    dead_retry_interval_s: float = Field(
        default=300.0, gt=0,
        description="a destination whose retries ran out (dead-lettered) keeps its deliveries pending and is "
        "tried again this often, one attempt each time; delivered once its receiver answers again",
    )
    max_pending_per_destination: int = Field(
        default=1000, ge=1,
        description="deliveries one destination may have waiting; past it a new one is dead-lettered for good",
    )
    max_pending_age_s: float = Field(
        default=86_400.0, gt=0,
        description="a delivery still pending after this long is dead-lettered for good (no longer retried)",
    )
    max_replay_age_s: float | None = Field(
        default=86_400.0,
        description="incident messages older than this (broker timestamp) notify nobody: a new consumer group "
        "reading the compacted incidents topic from the start must not page for last month's incidents",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROOTRANK_", env_nested_delimiter="__", extra="ignore")

    app_id: str = "rootrank"
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    topics: TopicSettings = Field(default_factory=TopicSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    elasticsearch: ElasticsearchSettings = Field(default_factory=ElasticsearchSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    data_dir: str = ".rootrank-data"
    web_port: int = 6066
    # Address of the worker's HTTP server (/metrics, /healthz, /readyz): 0.0.0.0 in a pod, so the
    # kubelet's probes and Prometheus reach it; loopback by default.
    web_bind: str = "127.0.0.1"


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Settings from a YAML file (ROOTRANK_CONFIG or `path`), then the environment, then `overrides`."""
    path = path or os.environ.get("ROOTRANK_CONFIG")
    data: dict[str, Any] = {}
    if path:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config file must be a mapping")
        data.update(loaded)
    env = Settings()  # environment only
    # Merged per key, not per section: ROOTRANK_WEBHOOKS__API_TOKEN must not drop the file's webhooks routes.
    merged = _deep_merge(_deep_merge(data, env.model_dump(exclude_unset=True)), overrides)
    return Settings.model_validate(merged)


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        current = out.get(key)
        out[key] = _deep_merge(current, value) if isinstance(value, dict) and isinstance(current, dict) else value
    return out
