"""One simulated job from start-up to teardown: its log lines on true time (the package docstring tells
the story). The failure itself is the class's story (story.py, stories_*.py); this module plays the job
around it: start-up, training steps, the consequences on the other ranks, restarts and red herrings."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar, cast

from correlator.tooling.simulate import stories_compute, stories_data  # noqa: F401  (register the stories)
from correlator.tooling.simulate.job import Host, Process, lay_out_hosts
from correlator.tooling.simulate.lines import LogLine, Style, utc_datetime
from correlator.tooling.simulate.story import STORIES, Mode, Outcome, Story
from correlator.tooling.simulate.truth import SimulateError
from correlator.tooling.simulate.upstream import Env, child_failed, init_options, pg_prefix, watchdog_lines

T = TypeVar("T")

_STEP_S = 1.2
_API = "torch/distributed/elastic/multiprocessing/api.py"
_AGENT_API = "torch/distributed/elastic/agent/server/api.py"


@dataclass(frozen=True)
class Options:
    """Variations the scale suite turns on (all off for `rootrank simulate`)."""

    tp_size: int = 0  # a tensor-parallel process group per host (this many ranks), beside the default group
    restart: str | None = None  # attempt 0 dies of this class first; torchelastic restarts the workers
    restart_rank: int | None = None
    herrings: bool = False  # corrected PCIe AER lines, a survived exception, a late unrelated Xid
    cause_late: bool = False  # the cause's timestamped lines reach their file after the collateral
    # a second rank, on a host far from the initiator's, fails the same way 1-2 s after it, and the initiator's
    # host clock runs ahead of that host's by more than the gap: its lines look later than the echo's, so only
    # the correction of clock skew names the initiator (a crash story's; the suite uses it where the cause's
    # lines carry their own time)
    skewed_echo: bool = False
    timeout_s: float = 600.0


class Scenario:
    def __init__(
        self,
        cls: str,
        *,
        world_size: int,
        hosts: int,
        seed: int,
        skew_max_s: float,
        noise_lines: int,
        late_lines: int,
        initiator_rank: int | None,
        classes: Sequence[str],
        demo: bool,
        start: datetime,
        options: Options | None = None,
    ) -> None:
        if cls not in classes:
            raise SimulateError(f"unknown class {cls!r}; see `rootrank simulate --list-classes`")
        if cls not in STORIES:
            raise SimulateError(f"no story for class {cls!r} in the simulator")
        if hosts < 1 or world_size < hosts or world_size % hosts:
            raise SimulateError(f"--world-size {world_size} must be a positive multiple of --hosts {hosts}")
        self.cls = cls
        self.story: Story = STORIES[cls]
        self.options = options or Options()
        self.rng = random.Random(f"rootrank-simulate:{cls}:{seed}")
        self.seed = seed
        self.world_size = world_size
        self.noise_lines = max(3, noise_lines)
        self.late_lines = late_lines
        self.demo = demo
        self.job_id = f"sim-{cls.replace('_', '-')}-{seed}"
        self.t0 = start.timestamp() + (seed % 1000) * 7.0
        self.env = Env.draw(self.rng)
        self.hosts = lay_out_hosts(self.rng, world_size=world_size, hosts=hosts, skew_max_s=skew_max_s)
        self.procs = [p for h in self.hosts for p in h.procs]
        if initiator_rank is not None and not 0 <= initiator_rank < world_size:
            raise SimulateError(f"--initiator-rank {initiator_rank} is outside 0..{world_size - 1}")
        self.initiator_rank = initiator_rank if initiator_rank is not None else self.rng.randrange(world_size)
        self.mode: Mode = self.story.mode
        self.lines: list[LogLine] = []
        self.failure_lines: list[str] = []
        self.failure_t: float | None = None
        self.variant = ""
        self.timeout_s = self.options.timeout_s
        self.seq = self.rng.randint(200, 4000)
        self.tp_seq = self.rng.randint(2000, 9000)
        self.op = self.rng.choice(["ALLREDUCE", "ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE"])
        self.numel = self.rng.choice([466119168, 160672064, 25690112, 1048576])
        self.step = 0
        self.attempt = 0
        self.cache: dict[str, object] = {}  # pick's choices, per key
        self.late_xid_host = ""  # the red herrings' late Xid (options.herrings)
        # set by stories: the initiator's own collective (a mismatch), a desync report on rank 0
        self.odd_collective: tuple[str, int] | None = None
        self.desync_report = False
        self.echo: Process | None = None  # options.skewed_echo: the second rank that fails the same way
        self.echo_t = 0.0
        self._cause = False
        self.host_level = False

    @property
    def initiator(self) -> Process:
        return self.procs[self.initiator_rank]

    # --- emitters (stories write through these) -----------------------------------------------

    def emit(self, t: float, proc: Process | None, style: Style, body: str, **kw: Any) -> LogLine:
        host = proc.host if proc is not None else kw.pop("host")
        line = LogLine(t=t, host=host, style=style, body=body, proc=proc, cause=self._cause, **kw)
        self.lines.append(line)
        return line

    def rank(self, t: float, p: Process, lines: Sequence[str]) -> float:
        """Lines the process writes to stderr without a header (tracebacks, prints), one after the other."""
        for body in lines:
            self.emit(t, p, "rank", body)
            t += 0.0002
        return t

    def pylog(self, t: float, p: Process, body: str, level: str = "E", logger: str = "train") -> float:
        self.emit(t, p, "rank_pylog", body, level=level, srcloc=logger)
        return t + 0.0003

    def glog(self, t: float, p: Process, level: str, srcloc: str, body: str) -> float:
        style: Style = "rank_glog" if self.env.torch >= (2, 3) else "rank_old_glog"
        self.emit(t, p, style, body, level=level, srcloc=srcloc, thread=p.pid + 310)
        return t + 0.0003

    def ds(self, t: float, p: Process, level: str, srcloc: str, body: str) -> float:
        self.emit(t, p, "rank_ds", body, level=level, srcloc=srcloc)
        return t + 0.0003

    def nccl(self, t: float, p: Process, body: str, level: str = "WARN") -> float:
        self.emit(t, p, "nccl_raw", f"NCCL {level} {body}", thread=p.pid + 311)
        return t + 0.0002

    def kern(self, t: float, host: str, body: str) -> float:
        self.emit(t, None, "kern", body, host=host)
        return t + 0.000_05

    def vllm(self, t: float, p: Process | None, level: str, srcloc: str, body: str, host: str | None = None) -> float:
        if p is None:
            self.emit(t, None, "vllm", body, level=level, srcloc=srcloc, host=host)
        else:
            self.emit(t, p, "vllm", body, level=level, srcloc=srcloc)
        return t + 0.0003

    def trtllm(self, t: float, p: Process, level: str, body: str) -> float:
        self.emit(t, p, "trtllm", body, level=level)
        return t + 0.0003

    def agent(self, t: float, host: Host, level: str, srcloc: str, body: str) -> float:
        if self.env.torch >= (2, 3):
            self.emit(t, None, "agent_glog", body, host=host.name, level=level, srcloc=srcloc, thread=host.agent_pid)
        else:
            logger = srcloc.rsplit(".py", 1)[0].replace("/", ".")
            self.emit(t, None, "agent_py", body, host=host.name, level=level, srcloc=logger)
        return t + 0.0002

    def raw(self, t: float, host: str, lines: Sequence[str]) -> float:
        for body in lines:
            self.emit(t, None, "raw", body, host=host)
            t += 0.000_05
        return t

    def pick(self, key: str, options: Sequence[T]) -> T:
        """One choice per job (every rank of an all-ranks failure tells the same variant)."""
        if key not in self.cache:
            self.cache[key] = options[random.Random(f"{self.job_id}:{key}").randrange(len(options))]
        return cast(T, self.cache[key])  # stored by this line, from options of the same key

    def jitter(self, scale: float = 0.08) -> float:
        return self.rng.uniform(0, scale)

    def host_of(self, p: Process) -> Host:
        return self.hosts[p.host_index]

    # --- phases -------------------------------------------------------------------------------

    def startup(self, t: float) -> float:
        env = self.env
        comm_id = f"0x{self.rng.getrandbits(64):016x}"
        timeout_ms = int(self.timeout_s * 1000)
        for p in self.procs:
            tp = t + self.jitter(1.5)
            if p.rank == 0:
                self.emit(tp, p, "nccl", f"NCCL version {env.nccl}+cuda12.4")
            self.emit(tp + 0.01, p, "nccl", "cudaDriverVersion 12040")
            self.emit(tp + 0.02, p, "nccl", f"Bootstrap : Using eth0:10.0.{p.host_index % 250}.{10 + p.local_rank}<0>")
            if env.torch >= (2, 3):
                prefix = pg_prefix(env, 0, "0", "default_pg", p.rank)
                src, body = init_options(env, prefix, self.world_size, p.rank, timeout_ms, "0")
                self.glog(tp + 0.5, p, "I", src, body)
                if self.options.tp_size:
                    guid = str(1 + p.rank // self.options.tp_size)
                    prefix = pg_prefix(env, 1, guid, "undefined", p.rank % self.options.tp_size)
                    src, body = init_options(env, prefix, self.options.tp_size, p.rank, timeout_ms, guid)
                    self.glog(tp + 0.7, p, "I", src, body)
            comm = f"0x{self.rng.getrandbits(44) | 0x550000000000:x}"
            self.emit(t + 4.0 + self.jitter(0.3), p, "nccl",
                      f"ncclCommInitRank comm {comm} rank {p.rank} nranks {self.world_size} cudaDev {p.local_rank} "
                      f"nvmlDev {p.local_rank} busId {p.bus}000 commId {comm_id} - Init COMPLETE",
                      thread=p.pid + 180 + p.local_rank)
        return t + 6.0

    def chatter(self, start: float, steps: int, *, skip: Callable[[Process, int], bool] | None = None) -> float:
        """Training steps: a python-logging progress line per rank and step."""
        total = 5000
        t = start
        for _ in range(steps):
            self.step += 1
            k = self.step
            t += _STEP_S + self.rng.uniform(-0.05, 0.05)
            for p in self.procs:
                if skip is not None and skip(p, k):
                    continue
                loss = 2.6 * (0.999**k) + self.rng.uniform(-0.05, 0.05)
                self.emit(t + self.jitter(), p, "rank_pylog",
                          f"step {k}/{total} | loss {loss:.4f} | lr 2.95e-04 | grad_norm {self.rng.uniform(0.8, 1.3):.3f}"
                          f" | {_STEP_S:.2f} s/it", srcloc="train")
        return t

    # --- the whole story ----------------------------------------------------------------------

    def build(self) -> None:
        t = self.t0 if self.mode in ("launch", "launch_all") else self.startup(self.t0)
        before = self.story.before or (None if self.options.restart is None else "restart")
        if before == "preempted":
            t = self.preempted(t)
        elif before is not None:
            cls = "disk_full" if before == "disk_full" else self.options.restart
            assert cls is not None
            rank = 0 if before == "disk_full" else self.options.restart_rank
            t = self.restart(t, cls, rank)
        self.play(t)

    def play(self, t: float) -> None:
        mode, init = self.mode, self.initiator
        herring_rank = self.plant_herrings(t) if self.options.herrings else None
        if mode in ("serve", "serve_all"):
            self.serve(t)
            return
        if mode == "launch":
            self.failure_t = t + 1.0
            self.cause(t + 1.0, init)
            return
        if mode == "launch_all":
            self.failure_t = t + 1.0
            ends = [self.cause(t + 1.0 + self.jitter(0.4), p) for p in self.procs]
            self.failure_lines = list(dict.fromkeys(self.failure_lines))
            for host in self.hosts:
                failed = sorted(host.procs, key=lambda p: self.rng.random())
                self.teardown(host, max(ends) + 0.5 + self.jitter(0.5), [(p, 1) for p in failed], sigterm=[])
            return
        if mode == "victims":
            self.victims(t)
            return
        steps = self.noise_lines
        if mode == "all":
            steps = 2
        last = self.step + steps
        skip = (lambda p, k: p is init and k == last) if mode == "hang" else None
        t = self.chatter(t, steps, skip=skip)
        if herring_rank is not None:
            t = self.survived_exception(t, herring_rank)
        if mode == "all":
            t += 2.0
            self.failure_t = t
            ends = []
            for p in self.procs:
                ends.append(self.cause(t + self.jitter(0.4), p))
            self.failure_lines = list(dict.fromkeys(self.failure_lines))
            for host in self.hosts:
                failed = sorted(host.procs, key=lambda p: self.rng.random())
                self.teardown(host, max(ends) + 1.0 + self.jitter(0.5),
                              [(p, self.outcome_code) for p in failed], sigterm=[])
            return
        enqueue_t = t + 0.6
        if mode == "hang":
            self.failure_t = enqueue_t
            self.cause(enqueue_t, init)
            self.collateral(enqueue_t, early=False, exitcode=-6)
            return
        fail_t = t + 0.4 + self.jitter(0.3)
        self.failure_t = fail_t
        outcome = self.cause_outcome(fail_t, init)
        if self.options.skewed_echo and mode == "crash":
            self.skewed_echo(fail_t)
        if mode == "continue":
            self.chatter(fail_t, 8)
            return
        if mode == "mismatch":
            self.collateral(enqueue_t, early=False, exitcode=-6)
            return
        early = outcome.immediate or (not self.demo and self.seed % 2 == 1)
        self.collateral(enqueue_t, early=early, fail_t=fail_t, exitcode=outcome.exitcode)

    outcome_code = 1

    def skewed_echo(self, fail_t: float) -> None:
        """A second rank fails the same way `gap` (1-2 s) after the initiator, on the host half the job away
        (neither the initiator's nor a ring neighbour's, so it sees no consequence first), and the initiator's
        host clock runs 1.5-2.5 s more ahead of that host's than the gap: read as written, the echo is first."""
        init = self.initiator
        if len(self.hosts) < 4:
            return
        host = self.hosts[(init.host_index + len(self.hosts) // 2) % len(self.hosts)]
        echo = host.procs[init.local_rank % len(host.procs)]
        gap = self.rng.uniform(1.0, 2.0)
        host.skew = round(-self.rng.uniform(1.0, 2.0), 3)
        self.host_of(init).skew = round(host.skew + gap + self.rng.uniform(1.5, 2.5), 3)
        self.echo, self.echo_t = echo, fail_t + gap
        self.story_on(self.story, self.echo_t, echo)

    def cause_outcome(self, t: float, p: Process) -> Outcome:
        self._cause = True
        try:
            outcome = self.story.write(self, t, p)
        finally:
            self._cause = False
        self.failure_lines.append(outcome.headline)
        self.variant = outcome.story
        self.outcome_code = outcome.exitcode
        self.host_level = outcome.host_level
        return outcome

    def cause(self, t: float, p: Process) -> float:
        self.cause_outcome(t, p)
        return max(ln.t for ln in self.lines[-3:])

    # --- consequences ---------------------------------------------------------------------------

    def watchdog(self, t: float, p: Process, *, pg: tuple[int, str, str, int] | None = None, seq: int | None = None,
                 op: str | None = None, numel: int | None = None, enqueued: int | None = None) -> None:
        """The timeout reports of one rank for one collective of a process group (default: the world's)."""
        pg_id, guid, desc, pg_rank = pg or (0, "0", "default_pg", p.rank)
        seq = self.seq if seq is None else seq
        prefix = pg_prefix(self.env, pg_id, guid, desc, pg_rank)
        timeout_ms = int(self.timeout_s * 1000)
        for level, src, body in watchdog_lines(self.env, prefix, pg_rank, seq, op or self.op, numel or self.numel,
                                               timeout_ms, timeout_ms + self.rng.randint(20, 90),
                                               seq if enqueued is None else enqueued, seq - 1):
            self.glog(t, p, level, src, body)
            t += 0.0002

    def remote_error(self, t: float, p: Process) -> None:
        prefix = pg_prefix(self.env, 0, "0", "default_pg", p.rank)
        self.glog(t, p, "E", "ProcessGroupNCCL.cpp:1609",
                  f"{prefix} Process group watchdog thread terminated with exception: NCCL error: remote process exited "
                  f"or there was a network error, NCCL version {self.env.nccl}")

    def collateral(self, enqueue_t: float, *, early: bool, exitcode: int, fail_t: float | None = None) -> None:
        """Victims of the failure: watchdog timeouts on every rank still waiting, then each host's teardown.

        early: the initiator's process exits at once; its agent stops the host immediately and the ring
        neighbours on other hosts see the connection drop within a second, which stops their hosts too.
        With a tensor-parallel group per host, the initiator's host peers wait in their group's collective
        (its own counter), everyone else in the default group's.
        """
        init = self.initiator
        init_host = self.hosts[init.host_index]
        timeout_t = enqueue_t + self.timeout_s
        host_down: dict[int, tuple[float, Process, int]] = {}
        if early and fail_t is not None:
            exit_t = fail_t + 0.8 + self.jitter(0.3)
            host_down[init_host.index] = (exit_t, init, exitcode)
            per_host = len(init_host.procs)
            for offset in (per_host, -per_host):
                peer = self.procs[(init.rank + offset) % self.world_size]
                if peer.host_index in host_down:
                    continue
                err_t = exit_t + 0.25 + self.jitter(0.4)
                self.remote_error(err_t, peer)
                host_down[peer.host_index] = (err_t + 0.3 + self.jitter(0.2), peer, -6)
            echo = self.echo
            if echo is not None and echo.host_index not in host_down:  # its process is gone at once too
                host_down[echo.host_index] = (self.echo_t + 0.8 + self.jitter(0.3), echo, exitcode)
        tp = self.options.tp_size
        for host in self.hosts:
            if host.index in host_down:
                t, first, code = host_down[host.index]
                self.teardown(host, t, [(first, code)], sigterm=[p for p in host.procs if p is not first])
                continue
            victims = [p for p in host.procs
                       if (p is not init or self.odd_collective is not None) and p is not self.echo]
            for p in victims:
                when = timeout_t + self.jitter(0.04)
                if p is init and self.odd_collective is not None:
                    self.watchdog(when, p, op=self.odd_collective[0], numel=self.odd_collective[1])
                elif tp and host is init_host:
                    self.watchdog(when - 3.0, p, pg=(1, str(1 + p.rank // tp), "undefined", p.rank % tp),
                                  seq=self.tp_seq, op="_ALLGATHER_BASE", numel=self.numel // tp)
                else:
                    self.watchdog(when + (2.0 if tp else 0.0), p)
            if self.desync_report and host.index == 0:
                p0 = self.procs[0]
                self.glog(timeout_t + 0.05, p0, "E", "ProcessGroupNCCL.cpp:1714",
                          f"{pg_prefix(self.env, 0, '0', 'default_pg', 0)} Desync report: "
                          f"To our best knowledge, ranks [{init.rank}] are the lagging ranks that caused this timeout. "
                          "They never joined any collectives")
            if victims:
                first = victims[self.rng.randrange(len(victims))]
                survivors = [p for p in host.procs if p is not first]  # includes a hung initiator
                self.teardown(host, timeout_t + 2.5 + self.jitter(1.0), [(first, -6)], sigterm=survivors)

    def teardown(self, host: Host, t: float, failed: list[tuple[Process, int]], *, sigterm: Sequence[Process],
                 restart: bool = False) -> float:
        """torchelastic on `host`: SIGTERM to the survivors, the failure it saw, then ChildFailedError (or,
        with restarts left, the restart of the worker group)."""
        for p in sigterm:
            t = self.agent(t, host, "W", f"{_API}:897", f"Sending process {p.pid} closing signal SIGTERM")
            t += self.jitter(0.002)
        first, exitcode = failed[0]
        t += 0.3 + self.jitter(0.3)
        t = self.agent(t, host, "E", f"{_API}:869",
                       f"failed (exitcode: {exitcode}) local_rank: {first.local_rank} (pid: {first.pid}) of binary: "
                       "/usr/bin/python3")
        if restart:
            return self.agent(t + 0.1, host, "W", f"{_AGENT_API}:723",
                              "[default] Worker group FAILED. 2/3 attempts left; will restart worker group")
        when = utc_datetime(t + host.skew).strftime("%Y-%m-%d_%H:%M:%S")
        entries = [(p.rank, p.local_rank, code, p.pid) for p, code in failed]
        block = child_failed(self.env.script, host.name, when, entries[0], entries[1:])
        return self.raw(t + 0.01, host.name, block)

    def victims(self, t: float) -> None:
        """Every rank is a victim of something these logs do not show.

        nccl_timeout: a host that never logged stalled the job; all ranks here time out on the same
        collective with the same progress. launcher_teardown: the scheduler stopped the job (preemption);
        every agent receives SIGTERM and tears its workers down, with no error before it.
        """
        t = self.chatter(t, self.noise_lines)
        end_t = t + 0.6 + (self.timeout_s if self.cls == "nccl_timeout" else 5.0)
        self.failure_t = end_t
        if self.cls == "nccl_timeout":
            for p in self.procs:
                self.watchdog(end_t + self.jitter(0.04), p)
            self.failure_lines.append(next(ln.body for ln in self.lines if "Watchdog caught" in ln.body))
            for host in self.hosts:
                order = sorted(host.procs, key=lambda p: self.rng.random())
                self.teardown(host, end_t + 0.5 + self.jitter(1.0), [(order[0], -6)], sigterm=order[1:])
            return
        self.failure_lines.append(self.stop_by_scheduler(end_t))

    def stop_by_scheduler(self, t: float) -> str:
        """SLURM cancels the step (preemption): each agent is signalled and stops its workers."""
        job = 4000 + self.seed % 1000
        stamp = utc_datetime(t + self.hosts[0].skew).strftime("%Y-%m-%dT%H:%M:%S")
        headline = f"slurmstepd: error: *** STEP {job}.0 ON {self.hosts[0].name} CANCELLED AT {stamp} DUE TO PREEMPTION ***"
        self.raw(t, self.hosts[0].name, [headline])
        for host in self.hosts:
            th = t + 0.2 + self.jitter(0.5)
            th = self.agent(th, host, "I", f"{_AGENT_API}:733", "Received 15 death signal, shutting down workers")
            for p in host.procs:
                th = self.agent(th, host, "W", f"{_API}:897", f"Sending process {p.pid} closing signal SIGTERM")
            self.raw(th + 0.4, host.name, [f"srun: error: {host.name}: task {host.index}: Terminated"])
        return headline

    # --- attempts before the one that ends the job ------------------------------------------------

    def restart(self, t: float, cls: str, rank: int | None) -> float:
        """Attempt 0 fails with `cls` on `rank`; every agent restarts its worker group (new pids)."""
        story = STORIES[cls]
        init = self.procs[rank if rank is not None else (self.initiator_rank + len(self.procs) // 2) % len(self.procs)]
        t = self.chatter(t, max(3, self.noise_lines // 2))
        fail_t = t + 0.5
        saved = (self.failure_lines, self.variant, self.outcome_code)
        self.failure_lines = []
        outcome = self.story_on(story, fail_t, init)
        self.failure_lines, self.variant, self.outcome_code = saved
        init_host = self.host_of(init)
        down = fail_t + 1.0 + self.jitter(0.3)
        self.teardown(init_host, down, [(init, outcome.exitcode)], sigterm=[p for p in init_host.procs if p is not init],
                      restart=True)
        for host in self.hosts:
            th = down + 2.0 + self.jitter(3.0)
            if host is not init_host:
                th = self.agent(th, host, "I", f"{_AGENT_API}:906",
                                f"[default] Detected 1 new nodes from group_rank={init_host.index}; will restart worker group")
                for p in host.procs:
                    th = self.agent(th, host, "W", f"{_API}:897", f"Sending process {p.pid} closing signal SIGTERM")
            th = self.agent(th + 5.0, host, "I", f"{_AGENT_API}:525", "[default] Rendezvous complete for workers. Result:")
            self.raw(th, host.name, ["  restart_count=1", f"  master_addr={self.hosts[0].name}", "  master_port=29500",
                                     f"  group_rank={host.index}", f"  group_world_size={len(self.hosts)}", ""])
        self.attempt = 1
        self.respawn()
        return self.startup(down + 15.0)

    def story_on(self, story: Story, t: float, p: Process) -> Outcome:
        """Another class's failure (an earlier attempt's, or a red herring): not the truth's cause."""
        saved_odd, saved_desync = self.odd_collective, self.desync_report
        outcome = story.write(self, t, p)
        self.odd_collective, self.desync_report = saved_odd, saved_desync
        return outcome

    def respawn(self) -> None:
        """The restarted workers: same ranks and GPUs, new pids."""
        for host in self.hosts:
            host.procs = [replace(p, pid=p.pid + 1000 + self.rng.randint(0, 300)) for p in host.procs]
        self.procs = [p for h in self.hosts for p in h.procs]

    def preempted(self, t: float) -> float:
        """The scheduler cancels the job while rank 0 writes a checkpoint; the job is requeued hours later
        and resumes from that checkpoint (same log files, appended)."""
        t = self.chatter(t, max(3, self.noise_lines // 2))
        p0 = self.procs[0]
        path = self.pick("ckpt", ["/checkpoints/run-17/step_4000.pt", "/mnt/ckpt/llama-8b/iter_0012000/model.pt"])
        self.pylog(t + 0.2, p0, f"Saving checkpoint to {path}", level="I")
        self.stop_by_scheduler(t + 9.0 + self.jitter(2.0))
        self.respawn()
        return self.startup(t + 9000.0 + self.rng.uniform(0, 1800))

    # --- inference servers ------------------------------------------------------------------------

    def serve(self, t: float) -> None:
        """An inference server's story: the engine serves requests, one worker (or every rank) fails, the
        server shuts down."""
        head = self.hosts[0]
        for _ in range(self.noise_lines):
            t += 10.0
            self.vllm(t, None, "I", "loggers.py:116",
                      f"Engine 000: Avg prompt throughput: {self.rng.uniform(800, 2400):.1f} tokens/s, Avg generation "
                      f"throughput: {self.rng.uniform(300, 900):.1f} tokens/s, Running: {self.rng.randint(20, 90)} reqs, "
                      f"Waiting: 0 reqs, GPU KV cache usage: {self.rng.uniform(20, 60):.1f}%, Prefix cache hit rate: "
                      f"{self.rng.uniform(5, 40):.1f}%", host=head.name)
        self.failure_t = t + 3.0
        if self.mode == "serve_all":
            for p in self.procs:
                self.cause(self.failure_t + self.jitter(0.5), p)
            self.failure_lines = list(dict.fromkeys(self.failure_lines))
            self.raw(self.failure_t + 2.0, head.name, [
                "--------------------------------------------------------------------------",
                "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD",
                "  Proc: [[41923,1],0]", "  Errorcode: 1", "",
                "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.",
                "--------------------------------------------------------------------------"])
            return
        self.cause(self.failure_t, self.initiator)

    # --- red herrings -------------------------------------------------------------------------------

    def plant_herrings(self, t: float) -> int:
        """Corrected PCIe AER lines on a host (a noisy link the job survives), an Xid on another host an
        hour after the job died (planted at the end, see finish_herrings); returns the rank that will
        survive an exception."""
        host = self.hosts[(self.initiator.host_index + 1) % len(self.hosts)]
        p = host.procs[0]
        for k in range(3):
            tk = t + 3.0 + k * 0.9
            self.kern(tk, host.name, f"pcieport 0000:{p.bus}:00.0: AER: Corrected error received: 0000:{p.bus}:00.0")
            self.kern(tk, host.name, f"nvidia 0000:{p.bus}:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
                                     "(Receiver ID)")
            self.kern(tk, host.name, f"nvidia 0000:{p.bus}:00.0:   device [10de:2330] error status/mask=00000001/0000e000")
            self.kern(tk, host.name, f"nvidia 0000:{p.bus}:00.0:    [ 0] RxErr                  (First)")
        self.late_xid_host = self.hosts[(self.initiator.host_index + 2) % len(self.hosts)].name
        survivor = self.procs[(self.initiator_rank + 3 * len(host.procs) + 1) % self.world_size]
        return survivor.rank

    def survived_exception(self, t: float, rank: int) -> float:
        """A handled failure: the loop catches it, logs the traceback and goes on (more steps after it)."""
        p = self.procs[rank]
        env = self.env
        if self.cls == "cuda_oom" or self.options.restart == "cuda_oom":
            lines = [
                "Traceback (most recent call last):",
                f'  File "{env.lib("botocore/response.py")}", line 99, in read',
                ("    chunk = self." "_raw_stream.read(amt)"),  # noqa: ISC001 - quoted botocore source, split: see upstream.py
                ("urllib3.exceptions.ReadTimeoutError: AWSHTTPSConnectionPool(host='datasets.s3.amazonaws.com', "
                "port=443): Read timed out."),
            ]
            self.pylog(t + 0.1, p, "shard s3://datasets/tok/train-00417.bin read failed, retrying (1/5)", level="W",
                       logger="data")
        else:
            lines = [
                "Traceback (most recent call last):",
                f'  File "{env.script}", line 377, in train_step',
                "    outputs = model(**batch)",
                (f"{env.oom_error}: CUDA out of memory. Tried to allocate 1.50 GiB. GPU {p.local_rank} has a total "
                "capacity of 79.11 GiB of which 912.00 MiB is free."),
            ]
            self.pylog(t + 0.1, p, "OOM on micro-batch, halving micro_batch_size to 2 and retrying", level="W")
        self.rank(t + 0.11, p, lines)
        return self.chatter(t + 1.0, 3)

    def finish_herrings(self) -> None:
        if not self.options.herrings:
            return
        end = max(ln.t for ln in self.lines)
        host = self.late_xid_host
        self.kern(end + 3600.0 + self.rng.uniform(0, 600), host,
                  "NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")

    # --- how lines reach the files ----------------------------------------------------------------

    def make_late(self) -> None:
        candidates = [ln for ln in self.lines if ln.has_ts and not ln.cause]
        for line in self.rng.sample(candidates, min(self.late_lines, len(candidates))):
            line.delay = self.rng.uniform(5.0, 60.0)
        if self.options.cause_late:
            end = max(ln.t for ln in self.lines if ln.style != "kern" or ln.t <= (self.failure_t or 0) + 3000)
            for line in self.lines:
                if line.cause and line.has_ts:
                    line.delay = max(0.0, end - line.t) + 5.0

    def shift(self, seconds: float) -> None:
        for line in self.lines:
            line.t += seconds
        if self.failure_t is not None:
            self.failure_t += seconds
