"""Bad input never stops the worker: each bad value lands on rootrank.deadletter with the reason and
its raw bytes, and every value sent is counted once: sent = processed + dead-lettered."""

from __future__ import annotations

import base64
import time

import orjson
import pytest
from kafka import KafkaProducer

from ingest.ship.wire_format import encode_batch
from tests.fixtures.kafka import Pipeline, read_topic, wait_for

pytestmark = pytest.mark.integration

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.14 GiB"
PROCESSED = 'rootrank_raw_messages_total{outcome="processed"}'
DEAD = 'rootrank_raw_messages_total{outcome="deadletter"}'


def test_bad_input_goes_to_deadletter_and_counts_add_up(noida_pipeline: Pipeline) -> None:
    job = f"badinput-{time.time_ns() % 10**8}"
    bad = {
        "not_utf8": b"[rank1]: CUDA error \xff\xfe\xfd not text at all \x80",
        "bad_json": b'{"log": "[rank2]: ' + OOM.encode() + b'", "stream": ',  # JSON cut off
        "too_large": b"A" * (10 * 1024 * 1024),  # one 10 MB line
        "empty": b"",
    }
    good = [encode_batch([(None, None, f"[rank{r}]: step 7 loss 2.1{r}")], job_id=job, host="node-a", offset=r)
            for r in range(20)]
    good.append(encode_batch([(None, None, f"[rank3]: {OOM}")], job_id=job, host="node-a", offset=20))

    before = noida_pipeline.worker.metrics()
    producer = KafkaProducer(bootstrap_servers=noida_pipeline.bootstrap, acks="all", max_request_size=32 * 1024 * 1024)
    try:
        sent_bad = {reason: producer.send("rootrank.logs", value=value).get(timeout=30) for reason, value in bad.items()}
        for value in good:
            producer.send("rootrank.logs", value=value).get(timeout=30)
    finally:
        producer.close()
    sent = len(bad) + len(good)

    def delta(name: str) -> float:
        return noida_pipeline.worker.metrics().get(name, 0.0) - before.get(name, 0.0)

    wait_for(lambda: delta(PROCESSED) + delta(DEAD) >= sent, 60, what="the worker to read every value")
    time.sleep(1.0)
    processed, dead = delta(PROCESSED), delta(DEAD)
    print(f"\nsent {sent}: processed {processed:.0f}, dead-lettered {dead:.0f}")
    assert (processed, dead) == (len(good), len(bad))
    assert processed + dead == sent

    where = {(meta.partition, meta.offset): reason for reason, meta in sent_bad.items()}
    letters = [orjson.loads(r.value) for r in read_topic(noida_pipeline.bootstrap, "rootrank.deadletter", idle_s=1.0)]
    ours = {(d["partition"], d["offset"]): d for d in letters if (d["partition"], d["offset"]) in where}
    assert len(ours) == len(bad)
    for position, letter in ours.items():
        reason = where[position]
        assert letter["reason"] == reason, letter["detail"]
        assert letter["topic"] == "rootrank.logs"
        assert base64.b64decode(letter["raw_b64"]) == bad[reason]
        assert letter["size"] == len(bad[reason]) and letter["raw_truncated"] is False

    # The good values of the same batch still made their incident.
    (incident,) = noida_pipeline.incidents(job, timeout=60)
    assert (incident["class"], incident["initiator"]["rank"]) == ("cuda_oom", 3)
