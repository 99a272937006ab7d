"""Which Kafka the shipper talks to, and whether it still holds what was shipped to it.

`rootrank ship` keeps each file's position (how far it was shipped) so a restart resumes. That is only
true of the Kafka it was shipped to: another cluster, or a fresh stack on the same address (a new
`rootrank up`), holds none of it. So positions are kept per cluster (`Probe.cluster_key`): its id
from the metadata response, with the logs topic's id when the broker gives one (a topic deleted and
created again has a new id); the bootstrap address when the broker gives no cluster id, or when it
cannot be reached at start (then the key last seen for that address, `clusters.json`). Some brokers
give every instance the same cluster id and no topic ids (the test servers: Tansu's is
"tansu_cluster", noida-db's a fixed one), so each position also records the partition and offset of
the last acknowledged message that carried its file's lines: when the topic's end is before that
offset now, the topic no longer holds them (`Probe.holds`), and the file is shipped again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("rootrank.ship")

_CLUSTERS_FILE = "clusters.json"


def _consumer_config(kafka: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The shipper's Kafka settings that a consumer takes too (connection and security), short timeouts."""
    from kafka import KafkaConsumer

    config = {k: v for k, v in kafka.items() if k in KafkaConsumer.DEFAULT_CONFIG}
    ms = int(timeout_s * 1000)
    config.update(request_timeout_ms=max(ms, 1000), bootstrap_timeout_ms=ms, client_id="rootrank-ship-probe",
                  enable_auto_commit=False, group_id=None)
    return config


def _bootstrap(kafka: dict[str, Any]) -> str:
    servers = kafka.get("bootstrap_servers", "")
    return ",".join(servers) if isinstance(servers, (list, tuple)) else str(servers)


class Probe:
    """A short-lived connection to the shipper's Kafka, made and closed before anything is shipped."""

    def __init__(self, kafka: dict[str, Any], topic: str, state_dir: Path, *, timeout_s: float = 3.0,
                 connect: bool = True) -> None:
        """`connect`: False for a wrapped command or stdin, which must not wait on Kafka to start (they keep
        no positions; their spool is kept under the key last seen for the address)."""
        self.topic = topic
        self.bootstrap = _bootstrap(kafka)
        self.state_dir = state_dir
        self.cluster_id: str | None = None
        self.topic_id: str | None = None
        self.reachable = False
        self._consumer: Any = None
        if not connect:
            return
        try:
            from kafka import KafkaConsumer

            self._consumer = KafkaConsumer(**_consumer_config(kafka, timeout_s))
            self._consumer.topics()  # a metadata request: the cluster's id and the topics' ids
            # kafka-python keeps the metadata response's cluster and topic ids on its client's ClusterMetadata
            # (public methods; the consumer exposes no other way to them).
            cluster = self._consumer._client.cluster
            self.cluster_id = cluster.cluster_id or None
            topic_id = cluster.topic_id(topic)
            self.topic_id = str(topic_id) if topic_id is not None else None
            self.reachable = True
        except Exception as exc:  # noqa: BLE001 - any failure to reach Kafka: positions keyed as last seen
            log.debug("cannot reach Kafka at %s to identify it (%s)", self.bootstrap, exc)

    @property
    def cluster_key(self) -> str:
        """What this run's positions (and spool) are kept under; see the module docstring."""
        known = self._known()
        if self.reachable:
            key = f"cluster {self.cluster_id}" if self.cluster_id else f"bootstrap {self.bootstrap}"
            if self.cluster_id and self.topic_id:
                key += f" topic {self.topic_id}"
            if known.get(self.bootstrap) != key:
                known[self.bootstrap] = key
                with contextlib.suppress(OSError):
                    self.state_dir.mkdir(parents=True, exist_ok=True)
                    (self.state_dir / _CLUSTERS_FILE).write_bytes(orjson.dumps(known))
            return key
        return known.get(self.bootstrap, f"bootstrap {self.bootstrap}")

    def _known(self) -> dict[str, str]:
        try:
            data = orjson.loads((self.state_dir / _CLUSTERS_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def holds(self, partition: int, offset: int) -> bool | None:
        """Whether the logs topic still holds the message at (`partition`, `offset`): its end is past it.
        None when that cannot be told (Kafka not reached)."""
        if not self.reachable or self._consumer is None:
            return None
        try:
            from kafka import TopicPartition

            tp = TopicPartition(self.topic, partition)
            end = self._consumer.end_offsets([tp]).get(tp)
        except Exception as exc:  # noqa: BLE001 - unknown partition, timeout: cannot tell
            log.debug("cannot read the end of %s[%d] (%s)", self.topic, partition, exc)
            return None
        return None if end is None else end > offset

    def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close()
            self._consumer = None


def key_digest(cluster_key: str) -> str:
    return hashlib.sha1(cluster_key.encode()).hexdigest()[:8]


@dataclass
class ProbeResult:
    """What a probe found: the key positions are kept under, and for each (partition, offset) it was asked
    about whether the topic still holds it (None: could not tell)."""

    cluster_key: str
    holds: dict[tuple[int, int], bool | None] = field(default_factory=dict)


def probe_in_child(kafka: dict[str, Any], topic: str, state_dir: Path, positions_file: Callable[[str], Path], *,
                   connect: bool, timeout_s: float = 3.0) -> ProbeResult:
    """A Probe run in a short-lived forked process, so that the shipper's own processes never hold a Kafka
    client before they fork (a kafka-python client's IO thread, left in the reading process, slowed it down
    while the broker was gone). `positions_file(cluster_key)` is where the positions kept under a key are:
    the child asks about the coordinates they record."""
    if not connect:
        return ProbeResult(Probe(kafka, topic, state_dir, connect=False).cluster_key)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe's process
        code = 1
        try:
            os.close(read_end)
            probe = Probe(kafka, topic, state_dir, timeout_s=timeout_s)
            try:
                key = probe.cluster_key
                holds = [[p, o, probe.holds(p, o)] for p, o in _recorded(positions_file(key))]
            finally:
                probe.close()
            with os.fdopen(write_end, "wb") as out:
                out.write(orjson.dumps({"key": key, "holds": holds}))
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as src:
        data = src.read()
    os.waitpid(pid, 0)
    try:
        found = orjson.loads(data)
        return ProbeResult(str(found["key"]), {(int(p), int(o)): h for p, o, h in found["holds"]})
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return ProbeResult(Probe(kafka, topic, state_dir, connect=False).cluster_key)


def _recorded(path: Path) -> list[tuple[int, int]]:
    """The (partition, offset) pairs the positions in `path` record."""
    try:
        saved = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return []
    out = []
    for entry in saved.values() if isinstance(saved, dict) else ():
        kafka = entry.get("kafka") if isinstance(entry, dict) else None
        if isinstance(kafka, list) and len(kafka) == 2 and all(isinstance(x, int) for x in kafka):
            out.append((kafka[0], kafka[1]))
    return out
