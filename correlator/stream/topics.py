"""Names and shapes of every Kafka topic the pipeline uses, in one place.

`rootrank setup` creates them from here, the faust apps subscribe to them from here, and the
tests read them from here, so a renamed topic is renamed everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from correlator.config import Settings

MATCH_ROLE = "match"
CORRELATE_ROLE = "correlate"
ROLES = (MATCH_ROLE, CORRELATE_ROLE)

JOBS_TABLE = "jobs"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)
    purpose: str = ""  # what the topic carries (the specs below read as the list of topics)


def group_id(settings: Settings, role: str) -> str:
    """Each role is its own consumer group (and faust app), so roles scale and rebalance independently."""
    return f"{settings.app_id}-{role}"


def jobs_changelog_topic(settings: Settings) -> str:
    """The correlator's job-state changelog (faust's naming: `<app id>-<table>-changelog`)."""
    return f"{group_id(settings, CORRELATE_ROLE)}-{JOBS_TABLE}-changelog"


def topic_specs(settings: Settings) -> list[TopicSpec]:
    t = settings.topics
    retention = str(t.logs_retention_ms)
    return [
        TopicSpec(
            t.logs, t.partitions, t.replication_factor,
            {"retention.ms": retention, "max.message.bytes": str(t.logs_max_message_bytes)},
            "raw values from forwarders and `rootrank ship`",
        ),
        # Keyed by job id: every signal of one job lands in one partition, next to that job's state.
        TopicSpec(t.signals, t.partitions, t.replication_factor, {"retention.ms": retention},
                  "signals (matched lines and facts) keyed by job id"),
        # Keyed by incident id; the latest revision of each incident is what the sinks need.
        TopicSpec(t.incidents, t.partitions, t.replication_factor, {"cleanup.policy": "compact"},
                  "incidents keyed by incident id (latest revision kept)"),
        TopicSpec(
            t.deadletter, t.partitions, t.replication_factor,
            {"retention.ms": str(14 * 24 * 3600 * 1000), "max.message.bytes": str(t.deadletter_max_message_bytes)},
            "raw values that could not be decoded, with the reason",
        ),
        TopicSpec(t.webhooks_deadletter, t.partitions, t.replication_factor,
                  {"retention.ms": str(14 * 24 * 3600 * 1000)}, "webhook deliveries that kept failing"),
        # Must have as many partitions as the signals topic: partition p of the state belongs to
        # partition p of the signals.
        TopicSpec(jobs_changelog_topic(settings), t.partitions, t.replication_factor,
                  {"cleanup.policy": "compact"}, "correlator job state (faust table changelog)"),
    ]
