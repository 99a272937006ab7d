"""Real forwarders into the live pipeline (noida-db, the broker librdkafka clients can talk to).

- rsyslog (its own config and work dir, not the system daemon) tails a training log with imfile and
  sends RSYSLOG_FileFormat lines with omkafka: the worker takes the host from the syslog header, the
  job from the pod-style host name, the rank from the line, and names the initiating rank.
- kcat sends Fluent Bit, Vector and Filebeat JSON in their default shapes (those forwarders cannot
  run here): the three decode to the same events, and each gives the same incident.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from correlator.tooling.embedded import stop_process
from ingest.decoders import decode_value, to_event
from tests.fixtures.kafka import Pipeline

pytestmark = pytest.mark.integration

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
       "79.14 GiB of which 1.19 GiB is free.")


def watchdog(rank: int) -> str:
    return (f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum=4411, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) "
            "ran for 600018 milliseconds before timing out.")


def job_lines() -> list[tuple[float, int, str]]:
    """(seconds after start, rank, line): rank 3 runs out of memory, ranks 0-7 then time out."""
    lines = [(0.0, r, f"[rank{r}]: step 4410 loss 2.31{r} lr 3.0e-4") for r in range(8)]
    lines.append((1.0, 3, f"[rank3]: {OOM}"))
    lines += [(601.0 + r * 0.01, r, watchdog(r)) for r in range(8) if r != 3]
    return lines


# --- rsyslog + omkafka -----------------------------------------------------------------------------


def rsyslog_config(work: Path, log_file: Path, bootstrap: str, hostname: str) -> Path:
    conf = work / "rsyslog.conf"
    conf.write_text(f"""
global(workDirectory="{work}" localHostName="{hostname}" maxMessageSize="64k")
module(load="imfile" mode="polling" PollingInterval="1")
module(load="omkafka")
input(type="imfile" File="{log_file}" Tag="train:" ruleset="to_kafka" freshStartTail="off")
ruleset(name="to_kafka") {{
  action(type="omkafka" broker=["{bootstrap}"] topic="rootrank.logs" template="RSYSLOG_FileFormat"
         confParam=["socket.timeout.ms=5000", "queue.buffering.max.ms=50"])
}}
""")
    return conf


@pytest.mark.skipif(shutil.which("rsyslogd") is None or not Path("/usr/lib/x86_64-linux-gnu/rsyslog/omkafka.so").exists(),
                    reason="rsyslog with omkafka not installed (apt-get install rsyslog rsyslog-kafka)")
def test_rsyslog_omkafka_lines_are_decoded_and_correlated(noida_pipeline: Pipeline, tmp_path: Path) -> None:
    job = f"rsjob{time.time_ns() % 10**6}"
    hostname = f"{job}-worker-0"  # a pod-style host name: the job is "rsjob..."
    work = tmp_path / "rsyslog"
    work.mkdir()
    log_file = tmp_path / "train.log"
    log_file.write_text("")
    conf = rsyslog_config(work, log_file, noida_pipeline.bootstrap, hostname)
    check = subprocess.run(["rsyslogd", "-N1", "-f", str(conf)], capture_output=True, text=True, timeout=30, check=False)
    assert check.returncode == 0, check.stderr
    rsyslog = subprocess.Popen(["rsyslogd", "-n", "-f", str(conf), "-i", str(work / "rsyslogd.pid")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        time.sleep(1.0)
        assert rsyslog.poll() is None, rsyslog.stdout.read().decode() if rsyslog.stdout else ""
        with log_file.open("a") as f:
            for _, _, line in job_lines():
                f.write(line + "\n")
        (incident,) = noida_pipeline.incidents(job, timeout=60)
    finally:
        stop_process(rsyslog)
    assert incident["class"] == "cuda_oom"
    assert (incident["initiator"]["rank"], incident["initiator"]["host"]) == (3, hostname)
    collateral = {c["class"]: c for c in incident["collateral"]}
    assert collateral["nccl_timeout"]["ranks"] == [0, 1, 2, 4, 5, 6, 7]
    assert collateral["nccl_timeout"]["hosts"] == [hostname]


# --- kcat with Fluent Bit / Vector / Filebeat shapes ------------------------------------------------

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def fluentbit(job: str, at: datetime, rank: int, line: str) -> dict[str, Any]:
    """Fluent Bit's kafka output, format json, tail input with the kubernetes filter (its defaults)."""
    pod = f"{job}-worker-{rank // 4}"
    return {
        "@timestamp": at.timestamp(), "log": line + "\n", "stream": "stderr", "time": _iso(at),
        "kubernetes": {"pod_name": pod, "namespace_name": "training",
                       "pod_id": "5c1f2b7a-0000-4000-8000-00000000000" + str(rank // 4),
                       "labels": {"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": "worker"},
                       "host": f"gpu-node-{rank // 4}", "container_name": "pytorch",
                       "docker_id": "3f0c9d1e", "container_image": "nvcr.io/nvidia/pytorch:24.05-py3"},
    }


def vector(job: str, at: datetime, rank: int, line: str) -> dict[str, Any]:
    """Vector's kafka sink, encoding json, kubernetes_logs source (its default event shape)."""
    pod = f"{job}-worker-{rank // 4}"
    return {
        "file": f"/var/log/pods/training_{pod}_5c1f/pytorch/0.log",
        "kubernetes": {"container_name": "pytorch", "pod_name": pod, "pod_namespace": "training",
                       "pod_node_name": f"gpu-node-{rank // 4}", "pod_uid": "5c1f2b7a",
                       "pod_labels": {"training.kubeflow.org/job-name": job}},
        "message": line, "source_type": "kubernetes_logs", "stream": "stderr", "timestamp": _iso(at),
    }


def filebeat(job: str, at: datetime, rank: int, line: str) -> dict[str, Any]:
    """Filebeat's kafka output, codec json, container input with add_kubernetes_metadata."""
    pod = f"{job}-worker-{rank // 4}"
    return {
        "@timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.13.4"},
        "message": line, "stream": "stderr", "input": {"type": "container"},
        "log": {"offset": 1000 + rank, "file": {"path": f"/var/log/containers/{pod}_training_pytorch-3f0c.log"}},
        "kubernetes": {"pod": {"name": pod, "uid": "5c1f2b7a"}, "namespace": "training",
                       "node": {"name": f"gpu-node-{rank // 4}"}, "container": {"name": "pytorch"},
                       "labels": {"training_kubeflow_org/job-name": job}},
        "host": {"name": f"gpu-node-{rank // 4}"}, "agent": {"type": "filebeat", "version": "8.13.4"},
        "ecs": {"version": "8.0.0"},
    }


SHAPES = {"fluentbit": fluentbit, "vector": vector, "filebeat": filebeat}


def shaped_values(shape: str, job: str) -> list[bytes]:
    make = SHAPES[shape]
    return [orjson.dumps(make(job, T0 + timedelta(seconds=at), rank, line)) for at, rank, line in job_lines()]


def test_forwarder_json_shapes_decode_to_the_same_events() -> None:
    job = "shape-job"
    events: dict[str, list[tuple[Any, ...]]] = {}
    for shape in SHAPES:
        out = []
        for value in shaped_values(shape, job):
            (record,) = decode_value(value)
            e = to_event(record)
            out.append((e.job_id, e.host, e.rank, e.ts, e.stream, e.line))
        events[shape] = out
    assert events["fluentbit"] == events["vector"] == events["filebeat"]
    assert events["fluentbit"][8] == ("shape-job", "gpu-node-0", 3, T0 + timedelta(seconds=1), "stderr", OOM)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (apt-get install kcat)")
def test_kcat_delivers_forwarder_shapes_that_correlate_alike(noida_pipeline: Pipeline, tmp_path: Path) -> None:
    stamp = time.time_ns() % 10**6
    jobs = {shape: f"kc{shape}{stamp}" for shape in SHAPES}
    for shape, job in jobs.items():
        lines_file = tmp_path / f"{shape}.jsonl"
        lines_file.write_bytes(b"\n".join(shaped_values(shape, job)) + b"\n")
        sent = subprocess.run(["kcat", "-P", "-b", noida_pipeline.bootstrap, "-t", "rootrank.logs", "-l", str(lines_file)],
                              capture_output=True, text=True, timeout=60, check=False,
                              env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")})
        assert sent.returncode == 0, sent.stderr
    incidents = {}
    for shape, job in jobs.items():
        (incidents[shape],) = noida_pipeline.incidents(job, timeout=60)

    def comparable(incident: dict[str, Any]) -> dict[str, Any]:
        return {"class": incident["class"], "initiator": incident["initiator"], "collateral": incident["collateral"]}

    assert comparable(incidents["fluentbit"]) == comparable(incidents["vector"]) == comparable(incidents["filebeat"])
    assert incidents["fluentbit"]["class"] == "cuda_oom"
    assert (incidents["fluentbit"]["initiator"]["rank"], incidents["fluentbit"]["initiator"]["host"]) == (3, "gpu-node-0")
