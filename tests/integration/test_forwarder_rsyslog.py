"""The shipped rsyslog config, run for real: rsyslogd (imfile + omkafka) follows a training log and
sends to the logs topic of a real broker; what arrives decodes into the lines that were written."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from correlator.config import Settings
from correlator.tooling.embedded import stop_process
from ingest.decoders import decode_value, to_event
from tests.fixtures.kafka import BrokerAddress, create_topics, read_topic

pytestmark = pytest.mark.integration

CONF = Path(__file__).resolve().parents[2] / "deploy" / "forwarders" / "rsyslog" / "rootrank.conf"

LINES = [
    "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.14 GiB",
    "[rank0]:[E ProcessGroupNCCL.cpp:630] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42)",
    "plain progress line step=1200 loss=2.31",
]


def test_rsyslog_config_delivers_training_lines_to_the_logs_topic(noida_kafka: BrokerAddress, tmp_path: Path) -> None:
    rsyslogd = shutil.which("rsyslogd") or ("/usr/sbin/rsyslogd" if Path("/usr/sbin/rsyslogd").exists() else None)
    if rsyslogd is None or not Path("/usr/lib/x86_64-linux-gnu/rsyslog/omkafka.so").exists():
        pytest.skip("rsyslog with omkafka not installed (scripts/install-system-deps.sh)")
    topic = Settings().topics.logs
    create_topics(str(noida_kafka), [topic], partitions=1)
    logs = tmp_path / "training"
    logs.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    # The shipped file, with only the broker address and the followed folder of this test.
    conf = CONF.read_text(encoding="utf-8")
    assert conf.count('broker=["kafka:9092"]') == 1 and conf.count('File="/var/log/training/*.log"') == 1
    conf = conf.replace('broker=["kafka:9092"]', f'broker=["{noida_kafka}"]')
    conf = conf.replace('File="/var/log/training/*.log"', f'File="{logs}/*.log"')
    (tmp_path / "rootrank.conf").write_text(conf, encoding="utf-8")
    main = tmp_path / "rsyslog.conf"
    main.write_text(f'global(workDirectory="{work}")\ninclude(file="{tmp_path / "rootrank.conf"}")\n', encoding="utf-8")

    log_file = logs / "job-7.log"
    log_file.write_text("", encoding="utf-8")
    with (tmp_path / "rsyslogd.out").open("wb") as out:
        proc = subprocess.Popen([rsyslogd, "-n", "-f", str(main), "-i", str(tmp_path / "rsyslogd.pid")],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        time.sleep(1.0)  # imfile's inotify watch is set up
        with log_file.open("a", encoding="utf-8") as f:
            for line in LINES:
                f.write(line + "\n")
        records = read_topic(str(noida_kafka), topic, expect=len(LINES), timeout=30)
    finally:
        stop_process(proc, timeout=15)
    assert len(records) == len(LINES), (tmp_path / "rsyslogd.out").read_text(errors="replace")
    decoded = [r for rec in records for r in decode_value(rec.value)]
    assert [r.source for r in decoded] == ["rsyslog"] * len(LINES)
    assert [r.text for r in decoded] == LINES
    assert all(r.ts is not None and r.host for r in decoded)
    events = [to_event(r) for r in decoded]
    assert (events[0].rank, events[1].rank) == (3, 0)  # the `[rankN]:` prefixes survive the trip
