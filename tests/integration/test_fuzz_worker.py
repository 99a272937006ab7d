"""A fuzz batch through the live worker: random bytes, huge lines, deep JSON, wrong types, control
characters, invalid UTF-8, empty and oversized values, mixed with a real failure.

What must hold: the worker survives, every value sent is counted once (sent = processed +
dead-lettered), the values that are certainly poison are dead-lettered with their reason, an
oversize line is truncated and flagged, the peak memory of the worker stays bounded, and the real
failure in the middle of the garbage still makes its incident (with the rule-set version).

`make test` runs a short batch (ROOTRANK_FUZZ_MESSAGES, default 500); `make fuzz` sends 10,000.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaProducer

from correlator.diagnosis.models import MAX_EVIDENCE_LINE
from correlator.diagnosis.rules import load_ruleset
from ingest.ship.wire_format import encode_batch
from tests.fixtures.kafka import Pipeline, wait_for

pytestmark = pytest.mark.integration

MESSAGES = int(os.environ.get("ROOTRANK_FUZZ_MESSAGES", "500"))
SEED = int(os.environ.get("ROOTRANK_FUZZ_SEED", "8"))
PROCESSED = 'rootrank_raw_messages_total{outcome="processed"}'
DEAD = 'rootrank_raw_messages_total{outcome="deadletter"}'
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.14 GiB"
MAX_VALUE_BYTES = 4 * 1024 * 1024  # EngineSettings.max_value_bytes (the worker's default)
# Peak resident memory the worker may reach while chewing through the batch. The largest values
# are 4 MiB (bigger ones are refused unread), a batch is at most 500 values: the bound says the
# worker does not keep what it has processed.
PEAK_RSS_BOUND = 1024 * 1024 * 1024

WRONG_TYPES: list[Any] = [
    {"log": 12}, {"log": None}, {"log": ["a", "b"]}, {"log": {"nested": "x"}}, {"message": {"x": 1}},
    {"message": 1.5e308}, {"@timestamp": "not a time", "log": "[rank1]: step 3"},
    {"@timestamp": 1e300, "log": "x"}, {"@timestamp": -1, "message": "y"}, {"timestamp": [], "message": "z"},
    {"kubernetes": "a string", "log": "x"}, {"kubernetes": {"labels": [1, 2]}, "log": "x"},
    {"host": {"name": 5}, "message": "y"}, {"host": 7, "message": "y"}, {"log": {"file": {"path": 3}}, "message": "q"},
    {"v": 1, "source": "rootrank", "lines": "not a list"},
    {"v": 1, "source": "rootrank", "lines": [[None, None, 5]]},
    {"v": 1, "source": "rootrank", "lines": [["yesterday", "stdout", "x"]]},
    {"v": 1, "source": "rootrank", "rank": "eleven", "lines": [[None, None, "x"]]},
    {"v": 1, "source": "rootrank", "rank": 2**80, "lines": [[None, None, "x"]]},
    {"v": 1, "source": "rootrank", "labels": {"a": {"b": "c"}}, "lines": [[None, None, "x"]]},
    {"v": 99, "source": "rootrank", "lines": [[None, None, "x"]]}, {"v": 1, "source": "rootrank", "lines": []},
    {"source": "rootrank"}, {"lines": None}, True, 123, "a JSON string", [], [1, 2, 3], [{"log": 1}], None,
]


def _printable(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 :=[]().,/-_") for _ in range(n))


def fuzz_values(n: int, seed: int) -> list[tuple[str, bytes]]:
    """n (kind, value) pairs; deterministic for a seed."""
    rng = random.Random(seed)
    out: list[tuple[str, bytes]] = []
    too_large = max(1, n // 1000)
    huge = max(2, n // 200)
    out.extend(("too_large", b"[rank0]: " + b"A" * (MAX_VALUE_BYTES + rng.randint(1, 1 << 20))) for _ in range(too_large))
    # one line longer than the decoder's line cap, inside a valid value
    out.extend(("huge_line", ("[rank2]: " + _printable(rng, rng.randint(70_000, 400_000))).encode()) for _ in range(huge))
    kinds = ["random_bytes", "control_chars", "invalid_utf8", "deep_json", "wrong_types", "empty",
             "plain_text", "forwarder_json", "truncated_json"]
    while len(out) < n:
        kind = rng.choice(kinds)
        if kind == "random_bytes":
            value = rng.randbytes(rng.randint(1, 3000))
        elif kind == "control_chars":
            chars = [chr(rng.choice([*range(32), 127, 0x85, 0x2028, 0x202E, 0xFEFF])) for _ in range(rng.randint(1, 200))]
            text = "[rank1]: " + "".join(c + rng.choice(["", "x", "\x1b[31m"]) for c in chars)
            value = rng.choice([text.encode(), orjson.dumps({"log": text, "stream": "stderr"})])
        elif kind == "invalid_utf8":
            bad = rng.choice([b"\xff", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc", b"\xed\xa0\x80"])
            value = b"[rank1]: CUDA error " + bad + _printable(rng, rng.randint(0, 100)).encode()
        elif kind == "deep_json":
            depth = rng.choice([64, 1000, 5000, 20_000])
            value = rng.choice([b'{"log":' * depth + b'"x"' + b"}" * depth, b"[" * depth + b"]" * depth,
                                b'{"log": "a", "kubernetes": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"])
        elif kind == "wrong_types":
            value = json.dumps(rng.choice(WRONG_TYPES)).encode()  # stdlib: orjson refuses 2**80
        elif kind == "empty":
            value = rng.choice([b"", b" ", b"\n\n", b"\t \r\n"])
        elif kind == "plain_text":
            value = "\n".join(f"[rank{rng.randint(0, 7)}]: step {rng.randint(0, 9999)} {_printable(rng, 40)}"
                              for _ in range(rng.randint(1, 20))).encode()
        elif kind == "forwarder_json":
            value = orjson.dumps({"log": f"[rank{rng.randint(0, 7)}]: loss {rng.random():.3f}",
                                  "@timestamp": rng.choice([time.time(), "2025-03-01T12:00:00Z", "garbage"]),
                                  "kubernetes": {"pod_name": f"fuzz-worker-{rng.randint(0, 3)}"}})
        else:
            whole = orjson.dumps({"log": _printable(rng, 200), "stream": "stdout"})
            value = whole[: rng.randint(1, len(whole) - 1)]
        out.append((kind, value))
    rng.shuffle(out)
    return out


def read_everything(bootstrap: str, topic: str, *, timeout: float, idle_s: float = 3.0) -> list[Any]:
    """Every record of `topic`, up to now. The dead letters keep multi-MB raw values, and noida-db
    answers a fetch with all it has (it ignores the fetch size limits): allow large frames."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             receive_message_max_bytes=2_000_000_000, fetch_max_bytes=8 * 1024 * 1024,
                             max_partition_fetch_bytes=8 * 1024 * 1024, client_id="rootrank-fuzz-reader")
    records: list[Any] = []
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(consumer.position(tp) < end for tp, end in ends.items()):
            for recs in consumer.poll(timeout_ms=int(idle_s * 1000)).values():
                records.extend(recs)
    finally:
        consumer.close()
    return records


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.mark.timeout(300 + MESSAGES // 8)  # the 10,000-message run of `make fuzz` takes minutes
def test_fuzz_batch_through_the_live_worker(noida_pipeline: Pipeline) -> None:
    worker = noida_pipeline.worker
    assert worker.proc is not None
    pid = worker.proc.pid
    tag = time.time_ns() % 10**8
    oom_job, huge_job = f"fuzz-oom-{tag}", f"fuzz-huge-{tag}"
    values = fuzz_values(MESSAGES, SEED)
    # A real failure in the middle of the garbage, and a cause line far longer than the line cap.
    middle = len(values) // 2
    good = [("good", encode_batch([(None, None, f"[rank{r}]: step 7 loss 2.1{r}")], job_id=oom_job, host="node-a",
                                  offset=r)) for r in range(8)]
    good.append(("good", encode_batch([(None, None, f"[rank3]: {OOM}")], job_id=oom_job, host="node-a", offset=8)))
    huge_cause = f"[rank5]: {OOM} " + "0x7f" * 50_000
    good.append(("good_huge", encode_batch([(None, None, huge_cause)], job_id=huge_job, host="node-b", offset=0)))
    values[middle:middle] = good
    sizes = sum(len(v) for _, v in values)

    before = worker.metrics()
    rss_before = _rss(pid)
    started = time.monotonic()
    producer = KafkaProducer(bootstrap_servers=noida_pipeline.bootstrap, acks="all", linger_ms=20,
                             max_request_size=32 * 1024 * 1024)
    try:
        futures = [(kind, producer.send("rootrank.logs", value=value)) for kind, value in values]
        producer.flush(120)
        where = {(meta.partition, meta.offset): kind for kind, fut in futures for meta in [fut.get(timeout=60)]}
    finally:
        producer.close(10)
    sent = len(values)
    sent_s = time.monotonic() - started

    def delta(name: str) -> float:
        return worker.metrics().get(name, 0.0) - before.get(name, 0.0)

    wait_for(lambda: delta(PROCESSED) + delta(DEAD) >= sent, 60 + sent / 50, interval=1.0,
             what="the worker to read every fuzz value")
    time.sleep(1.0)
    processed, dead = delta(PROCESSED), delta(DEAD)
    elapsed = time.monotonic() - started
    assert worker.proc.poll() is None, worker.log_tail()
    peak, rss_after = _peak_rss(pid), _rss(pid)
    kinds = Counter(kind for kind, _ in values)
    print(f"\nfuzz: sent {sent} values ({sizes / 1e6:.1f} MB; {dict(sorted(kinds.items()))}); processed "
          f"{processed:.0f} + dead-lettered {dead:.0f} = {processed + dead:.0f} in {elapsed:.1f} s "
          f"(sending took {sent_s:.1f} s); worker RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB, "
          f"peak {peak / 2**20:.0f} MiB")
    assert processed + dead == sent

    # Certain poison is dead-lettered with its reason; everything the decoder could read was processed.
    certain = {"too_large": "too_large", "invalid_utf8": "not_utf8", "empty": "empty"}
    ours: dict[tuple[int, int], dict[str, Any]] = {}

    def read_ours() -> bool:
        # idle_s is generous: the first fetch of a topic holding multi-MB letters can take seconds.
        records = read_everything(noida_pipeline.bootstrap, "rootrank.deadletter", timeout=60 + sent / 100)
        ours.clear()
        for record in records:
            letter = orjson.loads(record.value)
            if (letter["partition"], letter["offset"]) in where:
                ours[(letter["partition"], letter["offset"])] = letter
        return len(ours) >= dead

    wait_for(read_ours, 120 + sent / 50, interval=1.0, what="our dead letters on rootrank.deadletter")
    assert len(ours) == dead
    reasons = Counter((where[pos], letter["reason"]) for pos, letter in ours.items())
    for kind, reason in certain.items():
        assert reasons[(kind, reason)] == kinds[kind], (kind, reasons)
    for kind in ("good", "good_huge", "huge_line", "plain_text", "control_chars"):
        assert not any(k == kind for k, _ in reasons), f"{kind} values were dead-lettered: {reasons}"
    print(f"fuzz: dead letters by (kind, reason): {dict(sorted(reasons.items()))}")

    assert peak < PEAK_RSS_BOUND, f"peak RSS {peak / 2**20:.0f} MiB"

    # The oversize cause line: truncated and flagged on its signal, capped in the incident.
    huge_signals: list[dict[str, Any]] = []

    def read_huge_signals() -> bool:
        records = read_everything(noida_pipeline.bootstrap, "rootrank.signals", timeout=60)
        values = [orjson.loads(r.value) for r in records if huge_job.encode() in r.value]
        # A record holds one signal (or a close request), or a JSON list of one job's signals.
        signals = [s for v in values for s in (v if isinstance(v, list) else [v])]
        huge_signals[:] = [s for s in signals if s.get("job_id") == huge_job and "rule_id" in s]  # not close ticks
        return bool(huge_signals)

    wait_for(read_huge_signals, 60, interval=1.0, what="the oversize OOM line's signal")
    assert all(len(s["line"]) <= MAX_EVIDENCE_LINE and s["fields"].get("truncated") == 1 for s in huge_signals)

    version = load_ruleset().version
    (incident,) = noida_pipeline.incidents(oom_job, timeout=60)
    assert (incident["class"], incident["initiator"]["rank"]) == ("cuda_oom", 3)
    (huge_incident,) = noida_pipeline.incidents(huge_job, timeout=60)
    for found in (incident, huge_incident):
        assert found["rule_set_version"] == version
        assert all(len(e["line"]) <= MAX_EVIDENCE_LINE for e in found["evidence"])
        assert len(found["initiator"]["line"]) <= MAX_EVIDENCE_LINE
