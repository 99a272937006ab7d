"""Constructed multi-rank jobs, built as LogEvents and run through the real rule library."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from correlator.diagnosis.engine import Engine, JobState
from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.rules import RuleSet, load_ruleset
from correlator.diagnosis.signals import SignalExtractor
from ingest.event import LogEvent

T0 = datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC)


@pytest.fixture(scope="session")
def ruleset() -> RuleSet:
    return load_ruleset()


@pytest.fixture(scope="session")
def extractor(ruleset: RuleSet) -> SignalExtractor:
    return SignalExtractor(ruleset, Matcher(ruleset))


@pytest.fixture(scope="session")
def engine(ruleset: RuleSet) -> Engine:
    return Engine(ruleset)


class JobBuilder:
    """Lines of a 64-rank job on 8 hosts with per-host clock skew; events come out shuffled."""

    def __init__(self, world: int = 64, hosts: int = 8, skew_s: float = 3.0, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.world = world
        self.per_host = world // hosts
        self.hosts = [f"gpu-node-{h:02d}" for h in range(hosts)]
        self.skew = {h: self.rng.uniform(-skew_s, skew_s) for h in self.hosts}
        self.events: list[LogEvent] = []
        # A streaming forwarder (Fluent Bit, Vector) stamps each line when it reads it, on its own clock (NTP
        # synced): set to the seconds a line takes to reach it, and every event carries that receive time.
        self.forwarder_delay_s: float | None = None

    def host_of(self, rank: int) -> str:
        return self.hosts[rank // self.per_host]

    def emit(self, rank: int | None, at_s: float, line: str, host: str | None = None) -> None:
        host = host or (self.host_of(rank) if rank is not None else None)
        assert host is not None
        true_time = T0 + timedelta(seconds=at_s)
        seen_time = true_time + timedelta(seconds=self.skew[host])
        received = None
        if self.forwarder_delay_s is not None:
            received = true_time + timedelta(seconds=self.forwarder_delay_s + self.rng.uniform(0, 0.05))
        self.events.append(
            LogEvent(
                job_id="job-64",
                host=host,
                rank=rank,
                local_rank=None if rank is None else rank % self.per_host,
                pid=None if rank is None else 40000 + rank,
                ts=seen_time,
                received_ts=received,
                source="plain",
                file=f"{host}.log",
                offset=len(self.events),
                line=line,
            )
        )

    def emit_as(self, host: str, at_s: float, line: str, *, rank: int | None = None, local_rank: int | None = None,
                pid: int | None = None) -> None:
        """A line whose prefixes name exactly these (e.g. torchrun's `[default3]:` alone: a local rank, no rank)."""
        self.emit(None, at_s, line, host=host)
        self.events[-1] = self.events[-1].model_copy(update={"rank": rank, "local_rank": local_rank, "pid": pid})

    def init_lines(self, at_s: float = 0.0) -> None:
        for r in range(self.world):
            dev = r % self.per_host
            self.emit(
                r, at_s + self.rng.uniform(0, 1),
                f"NCCL INFO ncclCommInitRank comm 0x55d0c8a1{r:04x} rank {r} nranks {self.world} cudaDev "
                f"{dev} nvmlDev {dev} busId {self.bus_id(dev)} commId 0x9f3c - Init COMPLETE",
            )

    @staticmethod
    def bus_id(dev: int) -> str:
        """NCCL's busId of a host's GPU `dev` (bus << 12, hex): 18000, 2a000, ..."""
        return f"{(0x18 + dev * 0x12) << 12:x}"

    def pg_init(self, rank: int, at_s: float, pg: int, pg_rank: int, size: int, timeout_ms: int = 600000) -> None:
        self.emit(
            rank, at_s,
            f"[rank{rank}]:[I314 09:26:53.000000000 ProcessGroupNCCL.cpp:919] [PG ID {pg} PG GUID {pg} Rank {pg_rank}] "
            f"ProcessGroupNCCL initialization options: size: {size}, global rank: {rank}, TIMEOUT(ms): {timeout_ms}, "
            "USE_HIGH_PRIORITY_STREAM: 0, SPLIT_FROM: 0, SPLIT_COLOR: 0, PG Name: x",
        )

    def watchdog_pg(self, rank: int, at_s: float, pg: int, pg_rank: int, seq: int, enqueued: int, completed: int,
                    op: str = "ALLREDUCE", numel: int = 1048576, timeout_ms: int = 600000) -> None:
        """The two lines a 2.6 watchdog prints for one timed-out collective of group `pg`."""
        prefix = f"[rank{rank}]:[E314 09:37:00.000000000 ProcessGroupNCCL.cpp:632] [PG ID {pg} PG GUID {pg} Rank {pg_rank}]"
        self.emit(
            rank, at_s,
            f"{prefix} Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
            f"NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 21} milliseconds "
            "before timing out.",
        )
        self.emit(
            rank, at_s + 0.01,
            f"{prefix}  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: "
            f"{enqueued}, last completed work: {completed}",
        )

    def progress(self, rank: int, at_s: float, step: int) -> None:
        self.emit(rank, at_s, f"[rank{rank}]: {{'loss': 2.31, 'grad_norm': 1.02, 'learning_rate': 3e-05, 'epoch': 0.{step}}}")

    def watchdog(self, rank: int, at_s: float, seq: int, completed: int) -> None:
        self.emit(
            rank, at_s,
            f"[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) "
            "ran for 600018 milliseconds before timing out.",
        )
        self.emit(
            rank, at_s + 0.01,
            f"[E ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Exception (either an error "
            f"or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq + 2}, last completed "
            f"NCCL work: {completed}.",
        )

    def teardown(self, at_s: float) -> None:
        for host in self.hosts:
            for r in range(self.per_host):
                pid = 40000 + self.hosts.index(host) * self.per_host + r
                self.emit(
                    None, at_s + self.rng.uniform(0, 0.5),
                    f"W0314 09:37:{10 + r:02d}.000000 1234 torch/distributed/elastic/multiprocessing/api.py:897] "
                    f"Sending process {pid} closing signal SIGTERM",
                    host=host,
                )

    def shuffled(self) -> Iterator[LogEvent]:
        events = list(self.events)
        self.rng.shuffle(events)
        return iter(events)


def run(engine: Engine, extractor: SignalExtractor, events: list[LogEvent]) -> list:  # type: ignore[type-arg]
    """The events in batches of 97, in the order given (shuffled: a stream after a rebalance). Each line keeps
    its place in its file (its offset, as a forwarder sends it): the engine reads a file's order as the order
    its lines were written, so the place must not depend on the batch a line arrived in."""
    state = JobState(job_id="job-64")
    for batch_start in range(0, len(events), 97):
        state.add_all(extractor.from_events(events[batch_start : batch_start + 97]))
    return engine.diagnose(state)


@pytest.fixture
def job() -> JobBuilder:
    return JobBuilder()
