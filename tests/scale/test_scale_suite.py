"""The scale suite: large simulated jobs, generated here, diagnosed by `Diagnoser` (no ../shared needed).

28 jobs of 512, 1024, 2048 and 4096 ranks (8 ranks per host), each host's clock skewed by up to +-5 s, causes
drawn from several classes (CUDA OOM, Xid, host OOM kill, InfiniBand error, a straggler, a collective
mismatch, corrupt checkpoints and bad data shards...). Variations, seeded per job:
- the cause's line arrives after most of the collateral: the initiator is on the last host (its files are
  read last) and its timestamped lines are flushed after the cascade;
- a torchelastic restart: attempt 0 fails one way, attempt 1 another; the truth is attempt 1's cause;
- two kinds of process group: the default group and a tensor-parallel group per host; a hang inside one
  TP group leaves the stuck rank missing from that group's reports;
- red herrings: corrected PCIe AER lines, a handled exception the job trained on after (progress lines
  from the same rank), an unrelated Xid on another host an hour after the job died;
- a skewed echo (every Xid and host-OOM-kill job: their cause is a kernel line with its own time): a rank
  half the job away fails the same way 1-2 s after the initiator, and the initiator's host clock runs ahead
  of the echo's by more than that, so the echo's line carries the earlier timestamp. Only the correction of
  clock skew (the jobs' NCCL init bursts, training steps, watchdog timeouts and teardowns) names the
  initiator: with `estimate_clock` returning `Clock()` these 6 jobs name the echo and the suite fails.
The suite asserts class and initiator right in >= 95% of the jobs (misses printed with their reasons) and
prints the wall time of the largest job's diagnose (asserted only loosely: CI machines vary).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from correlator.tooling.simulate import Options, Truth, log_paths, simulate

START = datetime(2026, 3, 14, 9, 0, tzinfo=UTC)
SIZES = [512] * 10 + [1024] * 8 + [2048] * 6 + [4096] * 4
CAUSES = ["cuda_oom", "gpu_hardware_error", "host_oom_kill", "network_fabric_error", "straggler_hang",
          "collective_mismatch", "checkpoint_corruption", "streaming_data_error", "torch_load_failed",
          "cuda_illegal_memory_access", "dataloader_worker_killed"]
RANKS_PER_HOST = 8
# Causes whose line carries its own time (the kernel's Xid and OOM-killer lines): a second rank failing the same
# way a moment later is told apart by time alone, and the clocks must be aligned for it (Options.skewed_echo).
SKEWED_ECHO_CLASSES = ("gpu_hardware_error", "host_oom_kill")
# Jobs the engine gets wrong today, with the reason (reported to its owner with these reproductions): a listed
# job may miss without failing the suite, but still counts against the 95% bar; a fix prints "now right" and
# should remove the entry. Empty since the TP-group identity and CRC-32 fixes (see git log).
KNOWN_ENGINE_MISSES: dict[int, str] = {}


@dataclass(frozen=True)
class Job:
    index: int
    world: int
    cls: str
    seed: int
    options: Options
    initiator: int

    def describe(self) -> str:
        o = self.options
        bits = [f"tp{o.tp_size}" if o.tp_size else "", f"restart({o.restart})" if o.restart else "",
                "herrings" if o.herrings else "", "cause-late" if o.cause_late else "",
                "skewed-echo" if o.skewed_echo else ""]
        return f"job {self.index}: {self.world} ranks, {self.cls} on rank {self.initiator}, " + ", ".join(b for b in bits if b)


def jobs() -> list[Job]:
    rng = random.Random("rootrank-scale-suite")
    out = []
    for index, world in enumerate(SIZES):
        cls = CAUSES[index % len(CAUSES)]
        hosts = world // RANKS_PER_HOST
        late = rng.random() < 0.5
        # the cause's host is the last one read when its lines come late
        initiator = (hosts - 1) * RANKS_PER_HOST + rng.randrange(RANKS_PER_HOST) if late else rng.randrange(world)
        restart = None
        if rng.random() < 0.3:
            restart = "host_oom_kill" if cls == "cuda_oom" else "cuda_oom"
        options = Options(
            tp_size=RANKS_PER_HOST if cls == "straggler_hang" or rng.random() < 0.33 else 0,
            restart=restart, restart_rank=rng.randrange(world) if restart else None,
            herrings=rng.random() < 0.5, cause_late=late, skewed_echo=cls in SKEWED_ECHO_CLASSES,
        )
        out.append(Job(index, world, cls, 1000 + index, options, initiator))
    return out


def _verdict(truth: Truth, incidents: list) -> str:  # type: ignore[type-arg]
    """'' when the diagnosis names the truth's class and initiator, else why not."""
    if not incidents:
        return "no incident"
    p = incidents[0]
    got = f"got {p.class_} rank={p.initiator.rank} host={p.initiator.host} attempt={p.attempt} ({p.confidence_reason[:220]})"
    if p.class_ != truth.class_ and p.class_ not in truth.accepted:
        return f"class: {got}"
    want = truth.initiator
    if want.all:
        return ""
    same = p.initiator.rank == want.rank or (
        p.initiator.rank is None and p.initiator.host == want.host and p.initiator.local_rank == want.local_rank)
    return "" if same else f"initiator: {got}"


def test_scale_suite(tmp_path: Path) -> None:
    from correlator.offline.diagnose import Diagnoser

    diagnoser = Diagnoser()
    misses: list[str] = []
    known_misses: list[str] = []
    largest: tuple[int, float] = (0, 0.0)
    total_lines = 0
    t_suite = time.perf_counter()
    all_jobs = jobs()
    for job in all_jobs:
        out = tmp_path / f"job{job.index}"
        truth = simulate(job.cls, world_size=job.world, hosts=job.world // RANKS_PER_HOST, seed=job.seed,
                         skew_max_s=5.0, noise_lines=4, out=out, initiator_rank=job.initiator, start=START,
                         options=job.options)
        paths = log_paths(out, truth)
        total_lines += sum(Path(p).read_bytes().count(b"\n") for p in paths)
        t0 = time.perf_counter()
        incidents, _ = diagnoser.diagnose(paths, truth.job_id)
        wall = time.perf_counter() - t0
        if job.world >= largest[0]:
            largest = (job.world, max(wall, largest[1]) if job.world == largest[0] else wall)
        reason = _verdict(truth, incidents)
        if reason:
            known = KNOWN_ENGINE_MISSES.get(job.index)
            line = f"{job.describe()} [story {truth.story!r}, torch {truth.software['torch']}]: {reason}"
            (known_misses if known else misses).append(line + (f" -- known engine miss: {known}" if known else ""))
        elif job.index in KNOWN_ENGINE_MISSES:
            print(f"  now right (remove from KNOWN_ENGINE_MISSES): {job.describe()}")
    right = len(all_jobs) - len(misses) - len(known_misses)
    print(f"\nscale suite: {right}/{len(all_jobs)} jobs right ({100 * right / len(all_jobs):.1f}%; "
          f"{len(known_misses)} known engine misses), {total_lines} lines, {time.perf_counter() - t_suite:.1f} s in all; "
          f"largest job ({largest[0]} ranks) diagnosed in {largest[1]:.2f} s")
    for miss in known_misses + misses:
        print("  MISS", miss)
    # The bar: 95% of the jobs right, and no miss outside the known list.
    assert not misses, "\n".join(misses)
    assert right >= 0.95 * len(all_jobs), "\n".join(known_misses + misses)
    assert largest[1] < 120.0, f"the {largest[0]}-rank job took {largest[1]:.1f} s to diagnose (target < 30 s)"


@pytest.mark.parametrize("job", [j for j in jobs() if j.options.tp_size and j.cls == "straggler_hang"][:1],
                         ids=lambda j: f"job{j.index}")
def test_a_hang_in_a_tp_group_leaves_the_stuck_rank_out_of_that_groups_reports(tmp_path: Path, job: Job) -> None:
    truth = simulate(job.cls, world_size=job.world, hosts=job.world // RANKS_PER_HOST, seed=job.seed, skew_max_s=5.0,
                     noise_lines=4, out=tmp_path, initiator_rank=job.initiator, start=START, options=job.options)
    host = truth.initiator.host
    text = "\n".join(Path(p).read_text() for p in log_paths(tmp_path, truth) if f"/{host}/" in p)
    guid = 1 + job.initiator // RANKS_PER_HOST
    reporters = {line.split("[rank", 1)[1].split("]", 1)[0] for line in text.splitlines()
                 if "Watchdog caught" in line and (f"PG GUID {guid}(" in line or "[PG 1 " in line)}
    peers = {str(r) for r in range(job.initiator - job.initiator % 8, job.initiator - job.initiator % 8 + 8)}
    assert reporters == peers - {str(job.initiator)}


@pytest.mark.parametrize("job", [j for j in jobs() if j.options.skewed_echo][:1], ids=lambda j: f"job{j.index}")
def test_a_skewed_echo_carries_an_earlier_timestamp_than_the_initiator(tmp_path: Path, job: Job) -> None:
    """What makes the skewed-echo jobs need the skew correction: read as the hosts' clocks wrote them, the echo's
    cause line (another host's) comes before the initiator's, while in true time it came 1-2 s after."""
    truth = simulate(job.cls, world_size=job.world, hosts=job.world // RANKS_PER_HOST, seed=job.seed, skew_max_s=5.0,
                     noise_lines=4, out=tmp_path, initiator_rank=job.initiator, start=START, options=job.options)
    head = truth.failure_lines[0].split(": ", 1)[0]  # the kernel line's fixed head: "NVRM", "Out of memory"
    first_stamp: dict[str, str] = {}  # host -> the time its clock wrote on its first such line
    for path in log_paths(tmp_path, truth):
        if path.endswith("kern.log"):
            for line in Path(path).read_text().splitlines():
                stamp, host, _, text = line.split(" ", 3)
                if text.startswith(head):
                    first_stamp.setdefault(host, stamp)
    init_host = truth.initiator.host
    assert init_host in first_stamp
    earliest = min(first_stamp, key=first_stamp.__getitem__)
    assert earliest != init_host
    assert truth.skew_s[init_host] - truth.skew_s[earliest] > 1.0 + 1.5
