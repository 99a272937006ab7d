"""Golden tests per forwarder: the JSON/text each one emits by default -> exact RawRecords.

The documents below follow the forwarders' default output: Fluent Bit's kafka output (format
json, timestamp_key @timestamp, timestamp_format double) after the tail input with the CRI parser
and the kubernetes filter; Vector's kafka sink (codec json) after the kubernetes_logs and file
sources; Filebeat's kafka output (codec json) after the filestream and container inputs with
add_kubernetes_metadata (whose labels are de-dotted by default).
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from ingest.decoders import DecodeError, RawRecord, decode_lines, decode_value, job_id_for, to_event
from ingest.event import MAX_LINE_CHARS, LogEvent
from ingest.prefixes import Identity
from ingest.ship.wire_format import MAX_BATCH_BYTES, encode_batch, encode_batches

RECEIVED = datetime(2024, 6, 1, 10, 0, 5, tzinfo=UTC)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def dumps(obj: object) -> bytes:
    return orjson.dumps(obj)


# --- Fluent Bit -------------------------------------------------------------------------------


def test_fluentbit_kubernetes_cri_record() -> None:
    value = dumps(
        {
            "@timestamp": 1717236000.25,
            "time": "2024-06-01T10:00:00.250000000Z",
            "stream": "stderr",
            "_p": "F",
            "log": "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "kubernetes": {
                "pod_name": "llama-ft-worker-1",
                "namespace_name": "ml",
                "pod_id": "0f1e2d3c-aaaa-bbbb-cccc-000000000001",
                "labels": {
                    "training.kubeflow.org/job-name": "llama-ft",
                    "training.kubeflow.org/replica-index": "1",
                    "training.kubeflow.org/replica-type": "worker",
                },
                "annotations": {"sidecar.istio.io/inject": "false"},
                "host": "gpu-node-12",
                "container_name": "pytorch",
                "docker_id": "6c1f0e",
                "container_hash": "registry.local/train@sha256:00",
                "container_image": "registry.local/train:1.4",
            },
        }
    )
    assert decode_value(value, received_ts=RECEIVED) == [
        RawRecord(
            text="[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            source="fluentbit",
            host="gpu-node-12",
            stream="stderr",
            ts=utc(2024, 6, 1, 10, 0, 0, 250000),
            received_ts=RECEIVED,
            labels={
                "training.kubeflow.org/job-name": "llama-ft",
                "training.kubeflow.org/replica-index": "1",
                "training.kubeflow.org/replica-type": "worker",
                "k8s.pod": "llama-ft-worker-1",
                "pod_index": "1",
                "k8s.namespace": "ml",
                "k8s.container": "pytorch",
                "k8s.node": "gpu-node-12",
            },
        )
    ]


def test_fluentbit_docker_json_log_with_trailing_newline_and_iso_timestamp() -> None:
    value = dumps(
        {"@timestamp": "2024-06-01T10:00:00.000000Z", "log": "NCCL WARN something\n", "stream": "stdout"}
    )
    [record] = decode_value(value)
    assert record == RawRecord(
        text="NCCL WARN something", source="fluentbit", stream="stdout", ts=utc(2024, 6, 1, 10, 0, 0)
    )


def test_fluentbit_multiline_log_becomes_one_record_per_line() -> None:
    value = dumps(
        {
            "date": 1717236000.0,
            "log": 'Traceback (most recent call last):\n  File "/a.py", line 1, in <module>\n\nValueError: x\n',
        }
    )
    records = decode_value(value)
    assert [r.text for r in records] == [
        "Traceback (most recent call last):",
        '  File "/a.py", line 1, in <module>',
        "ValueError: x",
    ]
    assert {r.ts for r in records} == {utc(2024, 6, 1, 10, 0, 0)}
    assert {r.source for r in records} == {"fluentbit"}


def test_fluentbit_systemd_input_record() -> None:
    value = dumps(
        {
            "@timestamp": 1717236000.5,
            "_HOSTNAME": "gpu-node-3",
            "_PID": "1",
            "SYSLOG_IDENTIFIER": "kernel",
            "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        }
    )
    assert decode_value(value) == [
        RawRecord(
            text="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            source="fluentbit",
            host="gpu-node-3",
            pid=1,
            ts=utc(2024, 6, 1, 10, 0, 0, 500000),
            labels={"syslog_tag": "kernel"},
        )
    ]


# --- Vector -----------------------------------------------------------------------------------


def test_vector_kubernetes_logs_record() -> None:
    value = dumps(
        {
            "file": "/var/log/pods/ml_bert-pt-worker-3_uid/pytorch/0.log",
            "kubernetes": {
                "container_id": "containerd://9f8e",
                "container_image": "registry.local/bert:2",
                "container_name": "pytorch",
                "namespace_labels": {"kubernetes.io/metadata.name": "ml"},
                "node_labels": {"nvidia.com/gpu.product": "H100"},
                "pod_ip": "10.4.0.7",
                "pod_ips": ["10.4.0.7"],
                "pod_labels": {"training.kubeflow.org/job-name": "bert-pt", "app": "bert"},
                "pod_name": "bert-pt-worker-3",
                "pod_namespace": "ml",
                "pod_node_name": "gpu-node-2",
                "pod_owner": "PyTorchJob/bert-pt",
                "pod_uid": "7d6c",
            },
            "message": "gpu-node-2:77:90 [3] NCCL WARN Cuda failure 'out of memory'",
            "source_type": "kubernetes_logs",
            "stream": "stderr",
            "timestamp": "2024-06-01T10:00:00.123456789Z",
        }
    )
    assert decode_value(value, received_ts=RECEIVED) == [
        RawRecord(
            text="gpu-node-2:77:90 [3] NCCL WARN Cuda failure 'out of memory'",
            source="vector",
            host="gpu-node-2",
            file="/var/log/pods/ml_bert-pt-worker-3_uid/pytorch/0.log",
            stream="stderr",
            ts=utc(2024, 6, 1, 10, 0, 0, 123456),
            received_ts=RECEIVED,
            labels={
                "training.kubeflow.org/job-name": "bert-pt",
                "app": "bert",
                "k8s.pod": "bert-pt-worker-3",
                "pod_index": "3",
                "k8s.namespace": "ml",
                "k8s.container": "pytorch",
                "k8s.node": "gpu-node-2",
            },
        )
    ]


def test_vector_file_source_record() -> None:
    value = dumps(
        {
            "file": "/shared/logs/rank5.log",
            "host": "node07",
            "message": "[rank5]: RuntimeError: NCCL communicator was aborted on rank 5.",
            "source_type": "file",
            "timestamp": "2024-06-01T10:00:01Z",
        }
    )
    assert decode_value(value) == [
        RawRecord(
            text="[rank5]: RuntimeError: NCCL communicator was aborted on rank 5.",
            source="vector",
            host="node07",
            file="/shared/logs/rank5.log",
            ts=utc(2024, 6, 1, 10, 0, 1),
        )
    ]


# --- Filebeat ---------------------------------------------------------------------------------


def test_filebeat_filestream_record() -> None:
    value = dumps(
        {
            "@timestamp": "2024-06-01T10:00:02.345Z",
            "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.13.4"},
            "log": {"offset": 40960, "file": {"path": "/home/alice/slurm-884213.out"}},
            "message": "E0601 10:00:02.300000 1777 torch/distributed/elastic/multiprocessing/api.py:874] failed "
            "(exitcode: -9) local_rank: 1 (pid: 1780) of binary: /usr/bin/python",
            "input": {"type": "filestream"},
            "ecs": {"version": "8.0.0"},
            "host": {"name": "cn-112"},
            "agent": {
                "id": "a",
                "name": "cn-112",
                "type": "filebeat",
                "version": "8.13.4",
                "ephemeral_id": "e",
            },
        }
    )
    assert decode_value(value) == [
        RawRecord(
            text="E0601 10:00:02.300000 1777 torch/distributed/elastic/multiprocessing/api.py:874] failed "
            "(exitcode: -9) local_rank: 1 (pid: 1780) of binary: /usr/bin/python",
            source="filebeat",
            host="cn-112",
            file="/home/alice/slurm-884213.out",
            ts=utc(2024, 6, 1, 10, 0, 2, 345000),
            offset=40960,
        )
    ]


def test_filebeat_container_input_with_kubernetes_metadata() -> None:
    value = dumps(
        {
            "@timestamp": "2024-06-01T10:00:03.000Z",
            "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.13.4"},
            "stream": "stderr",
            "message": "[rank9]: Traceback (most recent call last):",
            "kubernetes": {
                "pod": {"name": "gpt-mpi-launcher-q8x2z", "uid": "u1"},
                "namespace": "research",
                "labels": {
                    "training_kubeflow_org/job-name": "gpt-mpi",
                    "training_kubeflow_org/job-role": "launcher",
                },
                "node": {"name": "cpu-node-1"},
                "container": {"name": "mpi-launcher"},
            },
            "container": {"id": "c1", "runtime": "containerd", "image": {"name": "gpt:1"}},
            "log": {
                "offset": 0,
                "file": {"path": "/var/log/containers/gpt-mpi-launcher-q8x2z_research_mpi-launcher-c1.log"},
            },
            "input": {"type": "container"},
            "host": {"name": "cpu-node-1"},
            "agent": {"type": "filebeat", "version": "8.13.4"},
            "ecs": {"version": "8.0.0"},
        }
    )
    assert decode_value(value) == [
        RawRecord(
            text="[rank9]: Traceback (most recent call last):",
            source="filebeat",
            host="cpu-node-1",
            file="/var/log/containers/gpt-mpi-launcher-q8x2z_research_mpi-launcher-c1.log",
            stream="stderr",
            ts=utc(2024, 6, 1, 10, 0, 3),
            offset=0,
            labels={
                "training_kubeflow_org/job-name": "gpt-mpi",
                "training_kubeflow_org/job-role": "launcher",
                "k8s.pod": "gpt-mpi-launcher-q8x2z",
                "k8s.namespace": "research",
                "k8s.container": "mpi-launcher",
                "k8s.node": "cpu-node-1",
            },
        )
    ]


def test_filebeat_custom_fields_give_explicit_identity() -> None:
    value = dumps(
        {
            "@timestamp": "2024-06-01T10:00:03Z",
            "@metadata": {"beat": "filebeat"},
            "message": "hello",
            "fields": {"job_id": "exp-42", "rank": 3, "SLURM_JOB_ID": "99"},
            "host": {"name": "n1"},
        }
    )
    [record] = decode_value(value)
    assert (record.job_id, record.rank, record.labels) == (
        "exp-42",
        3,
        {"job_id": "exp-42", "rank": "3", "SLURM_JOB_ID": "99"},
    )


def test_json_lines_value_holds_several_records() -> None:
    value = (
        dumps({"log": "first", "stream": "stdout"})
        + b"\n"
        + dumps({"message": "second", "host": "n2"})
        + b"\n"
    )
    assert decode_value(value) == [
        RawRecord(text="first", source="fluentbit", stream="stdout"),
        RawRecord(text="second", source="vector", host="n2"),
    ]


def test_json_lines_value_with_a_broken_line_is_bad_json() -> None:
    with pytest.raises(DecodeError) as info:
        decode_value(dumps({"log": "first"}) + b'\n{"log": ')
    assert info.value.reason == "bad_json"


def test_json_array_of_records() -> None:
    value = dumps([{"date": 1717236000.0, "log": "a"}, {"date": 1717236001.0, "log": "b"}])
    assert [(r.text, r.ts) for r in decode_value(value)] == [
        ("a", utc(2024, 6, 1, 10, 0, 0)),
        ("b", utc(2024, 6, 1, 10, 0, 1)),
    ]


def test_line_that_only_looks_like_a_json_array_is_plain_text() -> None:
    [record] = decode_value(b'[{"rank": 0}] is the placement')
    assert record == RawRecord(text='[{"rank": 0}] is the placement')


# --- rootrank's own batches -------------------------------------------------------------------


def test_rootrank_batch_round_trip() -> None:
    value = encode_batch(
        [(1717236000.5, "stderr", "[rank11]: boom"), (None, None, "no time, no stream")],
        job_id="llama70b-run7",
        host="node17",
        rank=11,
        local_rank=3,
        pid=52113,
        attempt=1,
        file="/logs/rank11.log",
        labels={"team": "llm"},
    )
    common = {
        "source": "rootrank",
        "host": "node17",
        "job_id": "llama70b-run7",
        "file": "/logs/rank11.log",
        "rank": 11,
        "local_rank": 3,
        "pid": 52113,
        "attempt": 1,
        "received_ts": RECEIVED,
        "labels": {"team": "llm"},
        "host_is_fallback": True,  # a line's own host prefix wins over the shipper's (test_host_precedence.py)
    }
    assert decode_value(value, received_ts=RECEIVED) == [
        RawRecord(text="[rank11]: boom", stream="stderr", ts=utc(2024, 6, 1, 10, 0, 0, 500000), **common),  # type: ignore[arg-type]
        RawRecord(text="no time, no stream", stream=None, ts=None, **common),  # type: ignore[arg-type]
    ]


def test_encode_batches_splits_under_the_size_limit_and_keeps_every_line() -> None:
    lines = [(1717236000.0 + i, "stdout", f"line {i} " + "x" * 200) for i in range(500)]
    values = encode_batches(lines, max_bytes=20_000, job_id="j", host="h", rank=0)
    assert len(values) > 1
    assert all(len(v) <= 20_000 for v in values)
    texts = [r.text for v in values for r in decode_value(v)]
    assert texts == [text for _, _, text in lines]
    assert MAX_BATCH_BYTES < 1_000_000


def test_encode_batch_rejects_an_empty_batch() -> None:
    with pytest.raises(ValueError):
        encode_batch([], job_id="j")


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ({"v": 99, "source": "rootrank", "lines": [[1.0, "stdout", "x"]]}, "unsupported_version"),
        ({"v": 2, "source": "rootrank", "lines": [[1.0, "stdout", "x"]]}, "bad_field"),  # version 2 has text
        ({"v": 2, "source": "rootrank", "text": "a\nb", "ts": [1.0]}, "bad_field"),  # a ts per line, or one
        ({"v": 2, "source": "rootrank", "text": "a", "stream": 3}, "bad_field"),
        ({"v": 1, "source": "rootrank", "lines": "x"}, "bad_field"),
        ({"v": 1, "source": "rootrank", "lines": [[1.0, "stdout"]]}, "bad_field"),
        ({"v": 1, "source": "rootrank", "lines": [["soon", "stdout", "x"]]}, "bad_field"),
        ({"v": 1, "source": "rootrank", "lines": [[1.0, 5, "x"]]}, "bad_field"),
        ({"v": 1, "source": "rootrank", "lines": [[1.0, "stdout", None]]}, "bad_field"),
        ({"v": 1, "source": "rootrank", "rank": "three", "lines": [[1.0, "stdout", "x"]]}, "bad_field"),
        ({"v": 1, "source": "rootrank", "labels": [1], "lines": [[1.0, "stdout", "x"]]}, "bad_field"),
    ],
)
def test_invalid_rootrank_batches(obj: dict[str, object], reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_value(dumps(obj))
    assert info.value.reason == reason


# --- rsyslog ----------------------------------------------------------------------------------


def test_rsyslog_file_format() -> None:
    value = (
        b"2024-05-01T12:00:00.123456+02:00 gpu-node-9 kernel: NVRM: Xid (PCI:0000:ca:00): 48, pid=1, DBE\n"
    )
    assert decode_value(value, received_ts=RECEIVED) == [
        RawRecord(
            text="NVRM: Xid (PCI:0000:ca:00): 48, pid=1, DBE",
            source="rsyslog",
            host="gpu-node-9",
            ts=utc(2024, 5, 1, 10, 0, 0, 123456),
            received_ts=RECEIVED,
            labels={"syslog_tag": "kernel"},
        )
    ]


def test_rsyslog_traditional_format_takes_the_year_from_received_time() -> None:
    value = b"May  1 12:00:00 node3 python3[4411]: [rank2]: RuntimeError: CUDA error: misaligned address"
    assert decode_value(value, received_ts=RECEIVED) == [
        RawRecord(
            text="[rank2]: RuntimeError: CUDA error: misaligned address",
            source="rsyslog",
            host="node3",
            pid=4411,
            ts=utc(2024, 5, 1, 12, 0, 0),
            received_ts=RECEIVED,
            labels={"syslog_tag": "python3"},
        )
    ]


def test_rfc5424_with_structured_data() -> None:
    value = b'<13>1 2024-05-01T12:00:00.5Z node4 trainer 812 - [meta seq="1" note="a \\] b"] step 10 loss nan'
    assert decode_value(value) == [
        RawRecord(
            text="step 10 loss nan",
            source="rsyslog",
            host="node4",
            pid=812,
            ts=utc(2024, 5, 1, 12, 0, 0, 500000),
            labels={"syslog_tag": "trainer"},
        )
    ]


def test_rfc5424_with_nil_fields() -> None:
    [record] = decode_value(b"<14>1 - - - - - - hello")
    assert record == RawRecord(text="hello", source="rsyslog")


def test_rsyslog_message_with_continuation_lines_keeps_the_sender() -> None:
    value = (
        b"2024-05-01T12:00:00Z node3 python3[7]: Traceback (most recent call last):\n"
        b'  File "/a.py", line 1, in <module>\n'
        b"2024-05-01T12:00:01Z node3 python3[7]: ValueError: bad\n"
    )
    records = decode_value(value)
    assert [(r.text, r.host, r.pid, r.ts) for r in records] == [
        ("Traceback (most recent call last):", "node3", 7, utc(2024, 5, 1, 12, 0, 0)),
        ('  File "/a.py", line 1, in <module>', "node3", 7, utc(2024, 5, 1, 12, 0, 0)),
        ("ValueError: bad", "node3", 7, utc(2024, 5, 1, 12, 0, 1)),
    ]


# --- plain text -------------------------------------------------------------------------------


def test_plain_text_message_with_several_lines() -> None:
    value = b"[rank0]: one\r\n\r\n[rank1]: two\n   \nthree"
    assert decode_value(value, received_ts=RECEIVED) == [
        RawRecord(text="[rank0]: one", received_ts=RECEIVED),
        RawRecord(text="[rank1]: two", received_ts=RECEIVED),
        RawRecord(text="three", received_ts=RECEIVED),
    ]


def test_plain_text_keeps_carriage_returns_inside_a_line_for_split_glued() -> None:
    [record] = decode_value(b" 10%|#  | 1/10 [00:01<00:09]\r 20%|## | 2/10 [00:02<00:08]\r\n")
    assert record.text == " 10%|#  | 1/10 [00:01<00:09]\r 20%|## | 2/10 [00:02<00:08]"


def test_non_utf8_plain_text_is_replaced_not_rejected() -> None:
    [record] = decode_value(b"bad \xff\xfe bytes")
    assert record.text == "bad \ufffd\ufffd bytes"
    assert record.source == "plain"


def test_python_dict_printed_by_a_training_script_is_a_plain_line() -> None:
    [record] = decode_value(b"{'loss': 0.25, 'learning_rate': 1e-05, 'epoch': 0.5}")
    assert record == RawRecord(text="{'loss': 0.25, 'learning_rate': 1e-05, 'epoch': 0.5}")


def test_kubectl_timestamped_line_is_plain_not_syslog() -> None:
    [record] = decode_value(b"2024-01-01T12:00:00.123456789Z [rank1]: x")
    assert record.source == "plain"


# --- limits and bad input ---------------------------------------------------------------------


def test_long_line_is_truncated_and_flagged() -> None:
    value = b"A" * 70_000 + b"\nshort"
    first, second = decode_value(value, max_line_bytes=65_536)
    assert first.text == "A" * 65_536 and first.labels == {"truncated": "1"}
    assert second.text == "short" and second.labels == {}


def test_truncation_never_splits_a_multibyte_character() -> None:
    [record] = decode_value(("é" * 1000).encode(), max_line_bytes=1001)
    assert record.text == "é" * 500
    assert record.labels["truncated"] == "1"


def test_truncated_json_line_is_flagged_too() -> None:
    [record] = decode_value(dumps({"log": "x" * 100, "stream": "stdout"}), max_line_bytes=10)
    assert (record.text, record.labels) == ("x" * 10, {"truncated": "1"})


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "empty"),
        (b"  \n\r\n\t", "empty"),
        (b"\xef\xbb\xbf  ", "empty"),
        (b'{"log": "unterminated', "bad_json"),
        (b'{"log": "x"} trailing', "bad_json"),
        (b"{}", "no_text_field"),
        (b'{"level": "info", "count": 3}', "no_text_field"),
        (b'{"log": 5, "message": ["not", "text"]}', "no_text_field"),
    ],
)
def test_bad_input_raises_decode_error_with_reason(value: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_value(value)
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError)


def test_too_large_value() -> None:
    with pytest.raises(DecodeError) as info:
        decode_value(b"x" * 2_000, max_value_bytes=1_000)
    assert info.value.reason == "too_large"


def test_json_with_invalid_utf8_is_repaired_not_rejected() -> None:
    [record] = decode_value(b'{"log": "gpu \xff fault", "stream": "stderr"}')
    assert record.text == "gpu \ufffd fault"


def test_json_with_wrongly_typed_metadata_still_decodes() -> None:
    value = dumps(
        {
            "log": "x",
            "kubernetes": "not-a-dict",
            "@timestamp": 1e300,
            "stream": 7,
            "rank": True,
            "file": ["a"],
        }
    )
    assert decode_value(value) == [RawRecord(text="x", source="fluentbit")]


def test_json_with_only_an_empty_line_gives_no_records() -> None:
    assert decode_value(dumps({"log": "\n", "stream": "stdout"})) == []


# --- job id -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "path_regex", "expected"),
    [
        (RawRecord(text="x", job_id="explicit", labels={"job-name": "label"}, host="h"), None, "explicit"),
        (
            RawRecord(text="x", labels={"training.kubeflow.org/job-name": "kf", "k8s.pod": "p-worker-0"}),
            None,
            "kf",
        ),
        (RawRecord(text="x", labels={"job-name": "batchjob"}), None, "batchjob"),
        (RawRecord(text="x", labels={"kubeflow.org/job-name": "old-kf"}), None, "old-kf"),
        (RawRecord(text="x", labels={"batch.kubernetes.io/job-name": "indexed"}), None, "indexed"),
        (RawRecord(text="x", labels={"training_kubeflow_org/job-name": "dedotted"}), None, "dedotted"),
        (RawRecord(text="x", labels={"k8s.pod": "resnet-dist-worker-12"}, host="node"), None, "resnet-dist"),
        (RawRecord(text="x", labels={"k8s.pod": "t5-master-0"}), None, "t5"),
        (RawRecord(text="x", labels={"k8s.pod": "gpt-mpi-launcher-q8x2z"}), None, "gpt-mpi"),
        (RawRecord(text="x", host="pt-abc123-worker-0"), None, "pt-abc123"),
        (RawRecord(text="x", file="/home/u/runs/slurm-55123.out", host="cn-1"), None, "55123"),
        (RawRecord(text="x", labels={"SLURM_JOB_ID": "777"}, host="cn-1"), None, "777"),
        (RawRecord(text="x", file="/jobs/exp-9/rank0.log", host="cn-1"), r"/jobs/(?P<job>[^/]+)/", "exp-9"),
        (RawRecord(text="x", file="/other/rank0.log", host="cn-1"), r"/jobs/(?P<job>[^/]+)/", "cn-1"),
        (RawRecord(text="x", host="cn-1"), None, "cn-1"),
        (RawRecord(text="x"), None, "unknown"),
    ],
)
def test_job_id_for(record: RawRecord, path_regex: str | None, expected: str) -> None:
    assert job_id_for(record, path_regex=path_regex) == expected


# --- to_event ---------------------------------------------------------------------------------


def test_to_event_combines_record_and_prefixes() -> None:
    [record] = decode_value(
        dumps(
            {
                "@timestamp": 1717236000.0,
                "stream": "stderr",
                "log": "gpu-node-2:77:90 [3] NCCL WARN Cuda failure 'out of memory'",
                "kubernetes": {
                    "pod_name": "bert-pt-worker-3",
                    "host": "gpu-node-2",
                    "labels": {"training.kubeflow.org/job-name": "bert-pt"},
                },
            }
        ),
        received_ts=RECEIVED,
    )
    event = to_event(record, offset=17)
    assert event == LogEvent(
        job_id="bert-pt",
        host="gpu-node-2",
        pid=77,
        gpu="3",
        ts=utc(2024, 6, 1, 10, 0, 0),
        received_ts=RECEIVED,
        source="fluentbit",
        stream="stderr",
        offset=17,
        line="NCCL WARN Cuda failure 'out of memory'",
        raw_line="gpu-node-2:77:90 [3] NCCL WARN Cuda failure 'out of memory'",
        labels={
            "training.kubeflow.org/job-name": "bert-pt",
            "k8s.pod": "bert-pt-worker-3",
            "pod_index": "3",
            "k8s.node": "gpu-node-2",
        },
    )
    assert event.rank is None  # a pod's index is not its global rank


def test_to_event_record_fields_win_and_prefix_host_is_kept_as_origin() -> None:
    record = RawRecord(
        text="(Worker pid=5, ip=10.0.0.9) [rank4]: boom",
        source="rootrank",
        host="head-node",
        rank=1,
        job_id="rl-run",
    )
    event = to_event(record)
    assert (event.rank, event.pid, event.host, event.line) == (1, 5, "head-node", "boom")
    assert event.labels == {"origin_host": "10.0.0.9"}


def test_to_event_line_time_beats_record_time_and_gets_its_year() -> None:
    record = RawRecord(text="[rank0]:[E1231 23:59:59.000000001 a.cpp:1] x", ts=utc(2022, 12, 31, 23, 59, 58))
    event = to_event(record)
    assert event.ts == utc(2022, 12, 31, 23, 59, 59)


def test_to_event_falls_back_to_record_time() -> None:
    event = to_event(RawRecord(text="no prefix", ts=utc(2022, 1, 1)))
    assert event.ts == utc(2022, 1, 1)
    assert event.raw_line is None


def test_to_event_uses_the_given_identity_instead_of_parsing() -> None:
    record = RawRecord(text='  File "/a.py", line 1, in f', host="n1")
    inherited = Identity(text='  File "/a.py", line 1, in f', rank=7, gpu="1")
    event = to_event(record, identity=inherited)
    assert (event.rank, event.gpu, event.host) == (7, "1", "n1")


def test_to_event_job_resolution_order() -> None:
    assert to_event(RawRecord(text="x", host="n1"), default_job="given").job_id == "given"
    assert (
        to_event(RawRecord(text="x", host="n1", labels={"job-name": "lab"}), default_job="given").job_id
        == "lab"
    )
    assert to_event(RawRecord(text="x", host="n1")).job_id == "n1"
    assert to_event(RawRecord(text="x")).job_id == "unknown"
    assert (
        to_event(RawRecord(text="x", file="/jobs/j7/a.log"), path_regex=r"/jobs/(?P<job>\w+)/").job_id == "j7"
    )


def test_to_event_caps_the_line_length() -> None:
    event = to_event(RawRecord(text="y" * (MAX_LINE_CHARS + 10)))
    assert len(event.line) == MAX_LINE_CHARS and event.truncated


def test_to_event_carries_the_decoder_truncation_flag() -> None:
    [record] = decode_value(b"z" * 100, max_line_bytes=50)
    assert to_event(record).truncated is True


@pytest.mark.parametrize("value", [
    encode_batch([(1714564800.5, "stderr", "a\r"), (None, None, "  "), (1714564801.0, "", "[rank3]: x"),
                  (1e9, "stdout", ""), (1714564802.0, None, "tail")], job_id="j", rank=1, offset=5, labels={"a": "b"}),
    encode_batch([(1714564800.5, "stderr", "é ü"), (None, None, "\u2603")], host="h", pid=3),
    encode_batch([(1714564800.5, "stderr", "two\nlines"), (None, None, "b")]),
    encode_batch([(1714564800.5, "stderr", "a" * 20000)]),
    # version 1 (a row per line), as shippers before version 2 send it
    encode_batch([(1714564800.5, "stderr", "a\r"), (None, None, "  "), (1714564801.0, "", "[rank3]: x"),
                  (1e9, "stdout", ""), (1714564802.0, None, "tail")], job_id="j", rank=1, offset=5, version=1),
    encode_batch([(1714564800.5, "stderr", "é ü"), (None, None, "\u2603")], host="h", pid=3, version=1),
    dumps({"v": 2, "source": "rootrank", "text": "a\r\n\nb", "ts": 1.5, "stream": ["stdout", None, "stderr"]}),
    dumps({"v": 2, "source": "rootrank", "text": "", "ts": None}),
    dumps({"v": 2, "source": "rootrank", "text": "a\nb", "ts": [1.0, "x"]}),
    dumps({"v": 2, "source": "rootrank", "text": "a\nb", "stream": ["stdout"]}),
    dumps({"v": 2, "source": "rootrank", "text": 7}),
    dumps({"source": "rootrank", "text": "a\nb"}),
    dumps({"v": 1, "source": "rootrank", "lines": [[1.0, "stderr", "a"], [None, None, 5]]}),
    dumps({"v": 1, "source": "rootrank", "lines": [[1.0, "stderr", "a"], "abc"]}),
    dumps({"v": 1, "source": "rootrank", "lines": [[1.0, "stderr", "a", 4]]}),
    dumps({"v": 1, "source": "rootrank", "lines": [[True, "x", "a"]]}),
    dumps({"v": 2, "source": "rootrank", "lines": [[1.0, "x", "a"]]}),
    dumps({"v": 3, "source": "rootrank", "lines": [[1.0, "x", "a"]]}),
    dumps({"v": 1, "source": "rootrank", "rank": "x", "lines": [[1.0, "x", "a"]]}),
    dumps({"v": 2, "source": "rootrank", "rank": "x", "text": "a"}),
    dumps({"v": 1, "source": "rootrank", "lines": []}),
    dumps({"log": "[rank5]: hello\n", "kubernetes": {"host": "n1"}}),
])
def test_decode_lines_is_decode_value_with_records_on_demand(value: bytes) -> None:
    try:
        eager = decode_value(value, received_ts=RECEIVED)
    except DecodeError as exc:
        with pytest.raises(DecodeError) as lazy_exc:
            decode_lines(value, received_ts=RECEIVED)
        assert lazy_exc.value.reason == exc.reason
        return
    lazy = decode_lines(value, received_ts=RECEIVED)
    assert lazy.texts == [r.text for r in eager]
    assert [lazy.record(i) for i in reversed(range(len(lazy)))][::-1] == eager


@pytest.mark.parametrize("lines", [
    [(1714564800.5, "stderr", "[rank3]: step 7 loss 2.1"), (1714564800.5, "stderr", "é ü \u2603")],
    [(1714564800.5, "stderr", "a"), (None, "stdout", "b\r"), (1714564801.0, None, "   "), (None, None, "c")],
    [(None, None, "one line, nothing known")],
])
def test_a_joined_batch_decodes_as_the_same_lines_as_rows(lines: list[tuple[float | None, str | None, str]]) -> None:
    """Version 2 (the lines joined in one string) is what `rootrank ship` writes; version 1 (a row per
    line) is what shippers before it wrote: the worker must read the same records from both."""
    joined = encode_batch(lines, job_id="j", host="h", offset=3)
    rows = encode_batch(lines, job_id="j", host="h", offset=3, version=1)
    assert orjson.loads(joined)["v"] == 2 and "text" in orjson.loads(joined)
    assert orjson.loads(rows)["v"] == 1 and "lines" in orjson.loads(rows)
    assert decode_value(joined, received_ts=RECEIVED) == decode_value(rows, received_ts=RECEIVED)
    assert decode_lines(joined, received_ts=RECEIVED).texts == decode_lines(rows, received_ts=RECEIVED).texts


def test_a_batch_with_a_line_holding_a_newline_is_written_as_rows() -> None:
    value = encode_batch([(None, None, "two\nlines"), (None, None, "b")], job_id="j")
    assert orjson.loads(value)["v"] == 1
    assert [r.text for r in decode_value(value)] == ["two", "lines", "b"]
