"""Which host a shipped line gets (issues 29, 31): the host the line names itself, else the shipper's
(`--host`, `--host-from dir|stem`), else for a file what its path says by convention (as `diagnose` reads
it; the shipping machine is only the job's last fallback), for a wrapped command or stdin the shipping
machine's name. Forwarders' own host metadata (Kubernetes, Filebeat's host.name) still wins over a line's
prefix, as before."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import orjson
import pytest

from correlator import cli
from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.rules import load_ruleset
from correlator.diagnosis.signals import SignalExtractor
from correlator.stream.agents.match import MatchProcessor, RawMessage
from ingest.decoders import decode_value
from ingest.decoders.events import to_event
from ingest.decoders.records import RawRecord
from ingest.ship.batcher import Batcher
from ingest.ship.chunks import Chunk, Source
from ingest.ship.options import ShipOptions, ShipStats, host_from_path
from ingest.ship.sender import Sender, _unpack_message
from ingest.ship.spool import Spool
from ingest.ship.wire_format import encode_batch

KERN = "2026-12-04T21:23:50.666231+00:00 node04 kernel: NVRM: Xid (PCI:0000:ab:00): 79, pid=52548, GPU has fallen off the bus."
NCCL = "node04:52547:52547 [4] NCCL INFO cudaDriverVersion 12040"
RANK = "[rank37]: RuntimeError: CUDA error: unspecified launch failure"


@pytest.mark.parametrize(("path", "rule", "host"), [
    ("sim/job/node04/train.log", "dir", "node04"),
    ("/var/log/cluster/node04/kern.log", "dir", "node04"),
    ("logs/node04.log", "stem", "node04"),
    ("logs/node04.err.gz", "stem", "node04"),
    ("logs/gpu-a17.out", "stem", "gpu-a17"),
    ("train.log", "dir", None),
    ("logs/node04/train.log", "prefix", None),
    ("logs/node04/train.log", None, None),
])
def test_host_from_path(path: str, rule: str | None, host: str | None) -> None:
    assert host_from_path(path, rule) == host


def _batches(tmp_path: Path, sources: dict[int, Source], **options: object) -> list[dict[str, object]]:
    opts = ShipOptions(kafka={"bootstrap_servers": "127.0.0.1:9", "bootstrap_timeout_ms": 200}, job_id="job",
                       **options)  # type: ignore[arg-type]
    spool = Spool(tmp_path / "spool", 1 << 30)
    stats = ShipStats()
    sender = Sender(opts, spool, stats)
    chunks = [c for sid in sources for c in (Chunk(sid, f"line of {sid}\n".encode(), None), Chunk(sid, b"", None, eof=True))]

    class Queue:
        def get(self, timeout: float) -> Chunk | None:
            return chunks.pop(0) if chunks else None

    Batcher(opts, sources, Queue(), sender, None, stats).run(threading.Event())
    sender._stop.set()
    sender._drainer.join(5)
    return [orjson.loads(_unpack_message(raw).value) for raw in spool.peek_many(100)]


def test_the_shipper_names_each_files_host_by_its_rule(tmp_path: Path) -> None:
    files = [tmp_path / "job" / host / "train.log" for host in ("node03", "node04")]
    sources = {i: Source(id=i, name=str(f), file=str(f)) for i, f in enumerate(files)}
    assert sorted(b["host"] for b in _batches(tmp_path / "a", sources, host_from="dir")) == ["node03", "node04"]
    by_stem = {0: Source(id=0, name=str(tmp_path / "node07.log"), file=str(tmp_path / "node07.log"))}
    assert [b["host"] for b in _batches(tmp_path / "b", by_stem, host_from="stem")] == ["node07"]
    machine = socket.gethostname()
    # by default a file's lines get no host (their lines and path say it, as for diagnose): the machine that
    # read them is only the shipper, the job's last fallback
    assert {(b.get("host"), b.get("shipper")) for b in _batches(tmp_path / "c", sources)} == {(None, machine)}
    assert {b["host"] for b in _batches(tmp_path / "d", sources, host="given")} == {"given"}


@pytest.mark.parametrize("shipper_host", ["vm", "node99"])
def test_a_shipped_lines_own_host_wins_over_the_shippers(shipper_host: str) -> None:
    """Switched off (the record's host first, as for other forwarders), the kernel and NCCL lines of
    node04 are put on the shipping machine."""
    value = encode_batch([(None, None, KERN), (None, None, NCCL), (None, None, RANK)], job_id="j", host=shipper_host)
    events = [to_event(record) for record in decode_value(value)]
    assert [e.host for e in events] == ["node04", "node04", shipper_host]
    kern = events[0]
    assert kern.line.startswith("NVRM: Xid") and kern.ts is not None and kern.ts.year == 2026  # as diagnose reads it
    assert events[2].rank == 37


@pytest.mark.parametrize("line", [
    "2026-12-04T21:23:50.666231+00:00 WARNING torch.distributed.run: boom",
    # python logging's default format behind a container runtime's time: not a host called ERROR:torch...
    "2023-05-26T10:34:25.011962890Z ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 4",
    # glog's header behind a container runtime's time: not a host called W0806 with a tag '14'
    "2024-08-06T14:14:18.685923Z W0806 14:14:18.685921 1397 torch/distributed/elastic/multiprocessing/api.py:850] x",
])
def test_an_application_line_with_an_iso_time_and_a_level_is_not_a_syslog_line_from_a_host(line: str) -> None:
    [event] = [to_event(r) for r in decode_value(encode_batch([(None, None, line)], job_id="j", host="node07"))]
    assert event.host == "node07"
    [plain] = decode_value(line.encode())
    assert plain.source != "rsyslog" and plain.host is None


def test_a_forwarders_host_metadata_still_wins_over_the_lines_prefix() -> None:
    event = to_event(RawRecord(text=NCCL, source="filebeat", host="gpu-node-2"))
    assert event.host == "gpu-node-2" and event.labels == {"origin_host": "node04"}


def test_the_match_role_puts_a_shipped_xid_line_on_its_own_host() -> None:
    ruleset = load_ruleset()
    processor = MatchProcessor(SignalExtractor(ruleset, Matcher(ruleset)))
    value = encode_batch([(1764883430.0, None, KERN)], job_id="demo", host="vm", file="/sim/all.log")
    out = processor.process([RawMessage(value, "rootrank.logs", 0, 0)])
    xid = [s for s in out.signals if s.class_ == "gpu_hardware_error"]
    assert xid and {s.host for s in xid} == {"node04"}


def test_host_and_host_from_are_one_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.log").write_text("x\n")
    for argv, problem in ((["--host", "h", "--host-from", "dir", str(tmp_path / "a.log")], "not both"),
                          (["--host-from", "stem"], "give files")):
        assert cli.main(["ship", "--job", "J", *argv]) == 2
        assert problem in capsys.readouterr().err
