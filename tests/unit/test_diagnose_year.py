"""A job's year-less stamps (c10d's `[E424`, a traditional syslog header's `Apr 24`) are in the year of its
dated lines, not in the year it is read: a 2024 job read in 2026 must not put its kernel's Xid two years
after its ranks' failures, on either path a file is read by (a plain log framed line by line, an rsyslog
file read record by record)."""

from __future__ import annotations

from pathlib import Path

from correlator.offline.diagnose import Diagnoser

RANK3 = """\
[rank3]:2024-04-24 23:20:00,118 - INFO - train - step 1/100 | loss 2.5601 | lr 2.95e-04
[rank3]:2024-04-24 23:21:40,120 - INFO - train - step 50/100 | loss 2.1102 | lr 2.95e-04
[rank3]:[E424 23:22:02.412000000 ProcessGroupNCCL.cpp:1515] [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group \
watchdog thread terminated with exception: CUDA error: unspecified launch failure
"""
RANK4 = """\
[rank4]:2024-04-24 23:20:00,131 - INFO - train - step 1/100 | loss 2.5511 | lr 2.95e-04
[rank4]:2024-04-24 23:21:40,133 - INFO - train - step 50/100 | loss 2.1187 | lr 2.95e-04
[rank4]:[E424 23:32:02.540000000 ProcessGroupNCCL.cpp:616] [Rank 4] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=901, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600029 \
milliseconds before timing out.
"""
KERN = """\
Apr 24 23:21:58 node07 kernel: [2951909.396413] NVRM: Xid (PCI:0000:4e:00): 79, pid=95378, name=python3.11, GPU \
has fallen off the bus.
Apr 24 23:21:58 node07 kernel: [2951909.396500] NVRM: GPU 0000:4e:00.0: GPU has fallen off the bus.
"""


def test_a_kernel_log_without_years_is_read_in_the_jobs_year(tmp_path: Path) -> None:
    """node07's GPU falls off the bus 4 s before rank 3's CUDA error there, and rank 4 times out 10 min
    later. (Off: the rsyslog records read without the job's year -> the Xid lands in the year it is read,
    after everything, and rank 3's CUDA error is the cause.)"""
    for host, text in (("node07", RANK3), ("node08", RANK4)):
        (tmp_path / host).mkdir()
        (tmp_path / host / "train.log").write_text(text)
    (tmp_path / "node07" / "kern.log").write_text(KERN)
    incidents, _ = Diagnoser().diagnose([str(tmp_path)])
    primary = incidents[0]
    assert (primary.class_, primary.initiator.host) == ("gpu_hardware_error", "node07")
    assert str(primary.initiator.ts).startswith("2024-04-24T23:21:58")
