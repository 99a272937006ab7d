"""The sink worker between a real broker and the Elasticsearch API: nothing is committed before
Elasticsearch acknowledged it, an outage backs up Kafka and loses nothing, re-deliveries stay single."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from elasticsearch import Elasticsearch
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient

from correlator.config import Settings
from correlator.diagnosis.models import Incident
from correlator.sinks.elasticsearch.agent import ES_SINK_ROLE, SinkLoop, build_loops, incidents_group
from correlator.sinks.elasticsearch.indices import incidents_names, install_templates
from tests.fixtures.elasticsearch import ElasticsearchServer
from tests.fixtures.kafka import BrokerAddress, create_topics, read_topic, wait_for
from tests.integration.es_support import make_incident

pytestmark = pytest.mark.integration

ALIAS = incidents_names().alias
OUTAGE_S = 60.0  # issue 4 asks for 30 s, the reliability issue for 60 s: the longer one covers both


@dataclass
class Stack:
    settings: Settings
    es: Elasticsearch
    producer: KafkaProducer
    loops: list[SinkLoop]
    threads: list[threading.Thread]
    stop: threading.Event

    def send(self, incidents: list[Incident]) -> None:
        for i in incidents:
            self.producer.send(self.settings.topics.incidents, key=i.incident_id.encode(),
                               value=orjson.dumps(i.to_json_dict()))
        self.producer.flush(30)

    def send_raw(self, value: bytes) -> None:
        self.producer.send(self.settings.topics.incidents, key=b"poison", value=value)
        self.producer.flush(30)

    def docs(self) -> dict[str, list[dict[str, Any]]]:
        """incident_id -> every document with that id (to see duplicates across indices)."""
        self.es.indices.refresh(index=ALIAS)
        hits = self.es.search(index=ALIAS, query={"match_all": {}}, size=5000,
                              source=["rootrank.incident_id", "rootrank.revision"])["hits"]["hits"]
        out: dict[str, list[dict[str, Any]]] = {}
        for h in hits:
            out.setdefault(h["_id"], []).append(h["_source"]["rootrank"])
        return out

    def committed(self) -> int:
        """Sum of the offsets the sink's group committed, as the broker reports them."""
        admin = KafkaAdminClient(bootstrap_servers=self.settings.kafka.bootstrap_servers, client_id="es-outage-test")
        try:
            group = incidents_group(self.settings)
            offsets = admin.list_group_offsets(group).get(group, {})
        finally:
            admin.close()
        return sum(om.offset for tp, om in offsets.items() if tp.topic == self.settings.topics.incidents and om.offset >= 0)

    def alive(self) -> bool:
        return all(t.is_alive() for t in self.threads)


@pytest.fixture
def stack(tansu_broker: BrokerAddress, noida_elasticsearch: ElasticsearchServer) -> Iterator[Stack]:
    suffix = uuid.uuid4().hex[:8]
    settings = Settings(
        app_id=f"rootrank-test-{suffix}",
        kafka={"bootstrap_servers": str(tansu_broker), "session_timeout_s": 10.0},
        topics={"incidents": f"rootrank.incidents.{suffix}", "deadletter": f"rootrank.deadletter.{suffix}",
                "partitions": 2},
        elasticsearch={"url": noida_elasticsearch.url, "index_signals": False, "bulk_max_docs": 50,
                       "request_timeout_s": 5.0},
    )
    create_topics(str(tansu_broker), [settings.topics.incidents, settings.topics.deadletter], partitions=2)
    es = Elasticsearch(noida_elasticsearch.url, request_timeout=10)
    install_templates(settings, es)
    stop = threading.Event()
    loops = build_loops(settings, stop, poll_timeout_s=0.2)
    threads = [threading.Thread(target=loop.run, name=loop.name, daemon=True) for loop in loops]
    for t in threads:
        t.start()
    producer = KafkaProducer(bootstrap_servers=str(tansu_broker), acks="all", linger_ms=0)
    try:
        yield Stack(settings, es, producer, loops, threads, stop)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=20)
        for loop in loops:
            loop.consumer.close(autocommit=False)
        if loops and loops[0].dead_letters.producer is not None:
            loops[0].dead_letters.producer.close(timeout=5)
        producer.close(timeout=5)
        es.close()


def test_elasticsearch_outage_backs_up_kafka_and_loses_nothing(stack: Stack,
                                                               noida_elasticsearch: ElasticsearchServer) -> None:
    started = time.monotonic()
    before = [make_incident(n) for n in range(20)]
    stack.send(before)
    wait_for(lambda: len(stack.docs()) == 20, 60, what="the first 20 incidents indexed")
    wait_for(lambda: stack.committed() == 20, 30, what="their offsets committed")

    noida_elasticsearch.stop()  # SIGTERM: the server saves its data, as `docker stop` would
    down_at = time.monotonic()
    sent_during = 0
    # While it is down: 40 new incidents, a newer revision of 5 old ones, and 5 duplicates.
    for k in range(10):
        batch = [make_incident(20 + 4 * k + j) for j in range(4)]
        if k < 5:
            batch.append(make_incident(k, revision=2))
            batch.append(make_incident(20 + k))
        stack.send(batch)
        sent_during += len(batch)
        time.sleep(2.0)
    committed_during = stack.committed()
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
    assert stack.committed() == committed_during == 20, "offsets were committed while Elasticsearch was down"
    assert stack.alive(), "a sink thread died during the outage"
    outage_s = time.monotonic() - down_at

    noida_elasticsearch.start()  # same port, same data dir
    back_at = time.monotonic()
    wait_for(lambda: len(stack.docs()) == 60, 90, what="all 60 incidents indexed after the restart")
    catch_up_s = time.monotonic() - back_at
    total_sent = 20 + sent_during
    wait_for(lambda: stack.committed() == total_sent, 30, what="every offset committed")

    docs = stack.docs()
    assert sorted(docs) == sorted(f"inc-job-a-{n:04d}" for n in range(60))
    assert {i: len(d) for i, d in docs.items() if len(d) != 1} == {}, "an incident is indexed twice"
    assert [docs[f"inc-job-a-{n:04d}"][0]["revision"] for n in range(6)] == [2, 2, 2, 2, 2, 1]
    assert stack.alive()
    stats = stack.loops[0].stats
    assert stats.dead_lettered == 0
    retries = stack.loops[0].writer.stats.retries
    assert retries > 0, "the outage was not noticed by the writer"
    print(f"\nES outage: {total_sent} incident messages sent ({sent_during} during a {outage_s:.1f} s outage), "
          f"60 distinct incidents expected, {len(docs)} found, 0 duplicates; {retries} bulk retries; "
          f"caught up {catch_up_s:.1f} s after the restart; test took {time.monotonic() - started:.1f} s")


def test_poison_and_rejected_records_go_to_the_dead_letter_topic_and_are_committed(stack: Stack) -> None:
    stack.send_raw(b"{not json")
    stack.send_raw(orjson.dumps({"incident_id": "x"}))  # JSON, not an incident
    stack.send([make_incident(1)])
    wait_for(lambda: stack.committed() == 3, 60, what="all three offsets committed")
    assert list(stack.docs()) == ["inc-job-a-0001"]
    letters = read_topic(stack.settings.kafka.bootstrap_servers, stack.settings.topics.deadletter, expect=2, timeout=30)
    reasons = sorted(orjson.loads(r.value)["reason"].split(":")[0] for r in letters)
    assert reasons == ["not an incident", "not an incident"]
    assert all(orjson.loads(r.value)["stage"] == ES_SINK_ROLE for r in letters)
