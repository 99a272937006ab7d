"""A job's run as a stream of records, and how a failure spreads through it.

A record is what one process wrote at one moment: (write time, order, node_rank, rank, kind, stderr?, lines).
`kind` says which process wrote it: rank (a training process), agent (torchrun / the DeepSpeed launcher on a
host), kernel (the host's kernel log), srun (the srun client on the batch host), stepd (slurmstepd on a
host), head (the launcher on the head node: deepspeed runner, pdsh, the batch script).

The cascade is a small discrete-event simulation: a rank dies, its host's launcher notices and tears the
other local ranks down, NCCL peers that had a connection to the dead ranks see it break (or do not, and
wait for their watchdog's timeout), srun kills the step when a task fails (--kill-on-bad-exit), and each
launcher prints its summary naming the first failure *it* saw.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from lab.synth import clock
from lab.synth import formats as F
from lab.synth.cluster import Host, Job

Rec = tuple[float, int, int, int, str, bool, list[str], int]


@dataclass
class Profile:
    launcher: str          # torchrun | srun | deepspeed | k8s | mpirun
    framework: str         # megatron | hf | deepspeed | lightning | plain
    layout: str
    appfmt: str
    kill_on_bad_exit: bool
    propagation: str       # timeout | remote | mixed
    kernel: str | None     # dmesg | dmesg-T | kern.log | journal | None
    agent_info: bool       # the elastic agent's INFO lines are shown (LOGLEVEL=INFO)
    tee: bool              # torchrun --tee 3 prefixes [default3]:
    role: str
    all_rank_steps: bool   # every rank logs its own progress lines
    script: str
    monitor: float         # torchrun's monitor interval (seconds)
    per_node_srun: bool    # srun runs one torchrun per node (else one task per rank)
    max_restarts: int
    stack_frames: bool     # the C++ stack of a watchdog abort is printed
    buffered_stdout: bool  # python stdout is block-buffered (no -u): INFO lines reach the file late


@dataclass
class Sim:
    job: Job
    prof: Profile
    rng: random.Random
    recs: list[Rec] = field(default_factory=list)
    _n: int = 0
    attempt: int = 0
    # cascade state of the current attempt
    dead: dict[int, tuple[float, int, str]] = field(default_factory=dict)   # rank -> (t, exit code, why)
    host_down: dict[int, float] = field(default_factory=dict)
    srun_killed_at: float | None = None
    summaries: list[tuple[int, int]] = field(default_factory=list)          # (node_rank, root rank)
    blocked_kind: dict[int, str] = field(default_factory=dict)              # r -> group kind it waits on
    host_names: list[list[str]] = field(default_factory=list)              # per attempt: node_rank -> name
    forced_culprit: int | None = None                                        # the same culprit on every attempt

    # ------------------------------------------------------------------ emitting
    def emit(self, tw: float, host: int, rank: int, kind: str, lines: list[str], err: bool = False) -> None:
        self._n += 1
        self.recs.append((tw, self._n, host, rank, kind, err, lines, self.attempt))

    def rank_out(self, r: int, t: float, lines: list[str], err: bool = False, late: float = 0.0) -> None:
        self.emit(t + late, r // self.job.gpn, r, "rank", lines, err)

    def app(self, r: int, t: float, level: str, msg: str, logger: str = "__main__", src: str = "train.py:214:main",
            late: float = 0.0) -> None:
        """One line of the training script's own logging, in the job's format."""
        job, h = self.job, self.job.host_of(r)
        lt = job.local_t(h, t)
        fmt = self.prof.appfmt
        if fmt == "py":
            line = f"{clock.py_asctime(lt)} - {level} - {logger} - {msg}"
        elif fmt == "hf":
            line = f"[{level}|{src}] {clock.py_asctime(lt)} >> {msg}"
        elif fmt == "ds":
            line = f"[{clock.py_asctime(lt)}] [{level}] [{src}] {msg}"
        elif fmt == "iso":
            line = f"{clock.iso_local(lt, job.tz)} {level:<7} [{logger}] {msg}"
        elif fmt == "clock":
            line = f"[{clock.clock_only(lt)}] {level:<8} {msg}"
        elif fmt == "us":
            line = f"{clock.us_date(lt)} - {level} - {logger} - {msg}"
        else:
            line = msg
        if self.prof.buffered_stdout and level == "INFO" and not late:
            late = self.rng.uniform(0.0, 25.0)
        self.rank_out(r, t, [line], err=level in ("ERROR", "WARNING"), late=late)

    def agent(self, h: Host, t: float, lines: list[str]) -> None:
        self.emit(t, h.node_rank, -1, "agent", lines, True)

    def kernel(self, h: Host, t: float, msgs: list[str]) -> None:
        if self.prof.kernel is None:
            return
        style = self.prof.kernel
        self.emit(t, h.node_rank, -1, "kernel", [F.kernel_line(self.job, h, t + i * 1e-5, style, m)
                                                 for i, m in enumerate(msgs)])

    def srun(self, t: float, lines: list[str]) -> None:
        self.emit(t, 0, -1, "srun", lines, True)

    def head(self, t: float, lines: list[str]) -> None:
        self.emit(t, 0, -1, "head", lines)

    # ------------------------------------------------------------------ a normal run
    def run_normal(self, t_start: float, t_end: float, step0: int, step_time: float, log_every: int,
                   ckpt_every: int, resume: bool) -> int:
        """Init, then steady training until t_end. Returns the last step reached."""
        job, prof, rng = self.job, self.prof, self.rng
        self.dead, self.host_down, self.srun_killed_at, self.summaries = {}, {}, None, []
        master = job.hosts[0]
        if self.attempt > 0:  # restarted workers are new processes
            shift = [rng.randint(900, 9000) for _ in job.hosts]
            job.pids = [p + shift[i // job.gpn] for i, p in enumerate(job.pids)]
        # launcher start
        if prof.launcher in ("torchrun", "k8s"):
            for h in job.hosts:
                t = t_start + rng.uniform(0, 3)
                lines = [F.elastic(job, h, t, "W", "torch.distributed.run", 793, ""),
                         "*****************************************",
                         ("Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid "
                         "your system being overloaded, please further tune the variable for optimal performance in "
                         "your application as needed. "),
                         "*****************************************"]
                if self.attempt == 0:
                    self.agent(h, t, lines)
                if prof.agent_info:
                    self.agent(h, t + rng.uniform(2, 20), F.rdzv_result(job, h, t + 20, self.attempt, master))
        elif prof.launcher == "deepspeed" and self.attempt == 0:
            head = job.hosts[0]
            hl = ",".join(job.me(h) for h in job.hosts[:4]) + ("..." if len(job.hosts) > 4 else "")
            self.head(t_start, [(f"[{clock.py_asctime(job.local_t(head, t_start))}] [INFO] [runner.py:607:main] cmd = "
                                f"pdsh -S -f 1024 -w {hl} export PYTHONPATH=/workspace; cd /workspace; "
                                f"{job.site.split('/lib/')[0]}/bin/python -u -m deepspeed.launcher.launch "
                                f"--world_info=eyJ... --node_rank=%n --master_addr={head.ip} --master_port=29500 "
                                f"{prof.script}")])
        elif prof.launcher == "srun" and self.attempt == 0:
            self.head(t_start - 2, [(f"+ srun --kill-on-bad-exit={int(prof.kill_on_bad_exit)} -l "
                                    f"{'--ntasks-per-node=1' if prof.per_node_srun else f'--ntasks-per-node={job.gpn}'}"
                                    f" bash -c 'train.sh {prof.script}'")])
        # ranks start
        for r in range(job.world):
            h = job.host_of(r)
            t = t_start + rng.uniform(8, 40) + (h.node_rank % 7) * 0.3
            self._rank_init(r, h, t, resume)
        # training
        t = t_start + 90 + rng.uniform(0, 60)
        step = step0
        if resume:
            self._ckpt_load(t - 30, step0)
        n = 0
        last_r = job.world - 1 if prof.framework == "megatron" else 0
        while t < t_end:
            step += log_every
            t += log_every * step_time * rng.uniform(0.97, 1.04)
            if t >= t_end:
                break
            self._step_line(last_r, t, step, step_time)
            if prof.all_rank_steps and n % 3 == 0:
                self._all_rank_steps(t + 0.05, step, step_time)
            n += 1
            if ckpt_every and step % ckpt_every == 0:
                self._ckpt_save(t + 1, step)
        return step

    def _rank_init(self, r: int, h: Host, t: float, resume: bool) -> None:
        job, prof, rng = self.job, self.prof, self.rng
        site = job.site
        if prof.framework == "lightning":
            self.rank_out(r, t, [f"Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/{job.world}"])
        elif prof.framework == "deepspeed":
            self.app(r, t, "INFO", "Initializing TorchBackend in DeepSpeed with backend nccl", "deepspeed",
                     "comm.py:637:init_distributed")
        elif r % job.gpn == 0 or prof.framework == "plain":
            self.app(r, t, "INFO", f"world_size={job.world} rank={r} local_rank={job.local(r)} "
                     f"tp={job.tp} pp={job.pp} dp={job.dp}")
        if job.tv >= (2, 2) and rng.random() < 0.9:
            self.rank_out(r, t + 0.2, [F.torch_warning(job, r, t + 0.2, "Environment variable NCCL_ASYNC_ERROR_HANDLING"
                                                       " is deprecated; use TORCH_NCCL_ASYNC_ERROR_HANDLING instead "
                                                       "(function getCvarInt)", "Utils.hpp", 133)], err=True)
        if job.nccl_debug and self.attempt == 0:
            self.rank_out(r, t + 2 + rng.random(), F.nccl_init(job, h, r, job.groups(r)))
            if rng.random() < 0.15:  # benign bootstrap retries and plugin chatter
                self.rank_out(r, t + 1, [F.nccl_info(job, h, r, "NET/Plugin: No plugin found (libnccl-net.so)"),
                                         F.nccl_info(job, h, r, "Call to connect returned Connection refused, "
                                                     "retrying")])
        if rng.random() < 0.5:
            self.rank_out(r, t + 5, [(f"{site}/torch/utils/checkpoint.py:464: UserWarning: torch.utils.checkpoint: the "
                                     "use_reentrant parameter should be passed explicitly. In version 2.4 we will raise "
                                     "an exception if use_reentrant is not passed. use_reentrant=False is recommended, "
                                     "but if you need to preserve the current default behavior, you can pass "
                                     "use_reentrant=True. Refer to docs for more details on the differences between "
                                     "the two variants."), "  warnings.warn("], err=True)
        del resume

    def _step_line(self, r: int, t: float, step: int, st: float) -> None:
        job, prof, rng = self.job, self.prof, self.rng
        loss = 2.0 + 6.0 / (1 + step / 3000) + rng.gauss(0, 0.03)
        h = job.host_of(r)
        if prof.framework == "megatron":
            stamp = f" [{clock.micro(job.local_t(h, t))}]" if job.tv >= (2, 3) else ""
            self.rank_out(r, t, [(f"{stamp} iteration {step:8d}/{500000:8d} | consumed samples: {step * 1024:12d} | "
                                 f"elapsed time per iteration (ms): {st * 1000 * rng.uniform(.98, 1.02):.1f} | "
                                 f"learning rate: {1.5e-4 * min(1, step / 2000):.6E} | global batch size:  1024 | "
                                 f"lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {rng.uniform(.6, 1.4):.3f} | "
                                 "number of skipped iterations:   0 | number of nan iterations:   0 |")])
        elif prof.framework == "hf":
            self.rank_out(r, t, [(f"{{'loss': {loss:.4f}, 'grad_norm': {rng.uniform(.5, 2):.4f}, "
                                 f"'learning_rate': {2e-5 * (1 - step / 1e6):.4e}, 'epoch': {step / 8000:.2f}}}")])
            pct = step % 1000 // 10
            self.rank_out(r, t + 0.01, [(f"{pct:3d}%|{'█' * (pct // 10):<10}| {step}/100000 "
                                        f"[{int(t - job.t0) // 3600:02d}:{int(t - job.t0) // 60 % 60:02d}:"
                                        f"{int(t - job.t0) % 60:02d}<99:00:00, {st:.2f}s/it]")], err=True)
        elif prof.framework == "deepspeed":
            self.app(r, t, "INFO", f"[Rank 0] step={step}, skipped=0, lr=[{1e-4:.6g}], mom=[(0.9, 0.95)]",
                     "deepspeed", "logging.py:96:log_dist")
            self.rank_out(r, t + 0.01, [(f"steps: {step} loss: {loss:.4f} iter time (s): {st:.3f} samples/sec: "
                                        f"{1024 / st:.3f}")])
        elif prof.framework == "lightning":
            self.rank_out(r, t, [(f"Epoch {step // 5000}:  {step % 5000 // 50:2d}%|          | {step % 5000}/5000 "
                                 f"[00:{int(t) % 60:02d}<12:13, {1 / st:.2f}it/s, v_num=3, train_loss={loss:.3f}]")],
                          err=True)
        else:
            self.app(r, t, "INFO", f"step {step} | loss {loss:.4f} | lr {1e-4:.2e} | {st:.2f} s/step | "
                     f"tokens/s {int(4e6 / st)}")

    def _all_rank_steps(self, t: float, step: int, st: float) -> None:
        job, rng = self.job, self.rng
        style = job.slurm_id % 3
        for r in range(job.world):
            if r == 0:
                continue
            dt = st * rng.uniform(.98, 1.03)
            msg = (f"[rank {r}] step {step} step_time {dt:.3f}s" if style == 0 else
                   f"rank={r} iter={step} time_ms={dt * 1000:.1f}" if style == 1 else
                   f"iter {step} fwd/bwd {dt * 0.8:.3f}s optim {dt * 0.2:.3f}s")
            self.app(r, t + rng.uniform(0, 0.2), "INFO", msg)

    def _ckpt_save(self, t: float, step: int) -> None:
        job, prof = self.job, self.prof
        h = job.hosts[0]
        if prof.framework == "megatron":
            self.rank_out(0, t, [(f"[{clock.micro(job.local_t(h, t))}] saving checkpoint at iteration {step:7d} to "
                                 "/lustre/ckpt/gpt in torch_dist format")])
            self.rank_out(0, t + 40, [(f"  [{clock.micro(job.local_t(h, t + 40))}] successfully saved checkpoint from "
                                      f"iteration {step:7d} to /lustre/ckpt/gpt [ t 1/{job.tp}, p 1/{job.pp} ]")])
        elif prof.framework == "hf":
            self.app(0, t, "INFO", f"Saving model checkpoint to /outputs/run/checkpoint-{step}", "transformers.trainer",
                     "trainer.py:3503:_save")
        elif prof.framework == "deepspeed":
            self.app(0, t, "INFO", f"[Rank 0] Saving model checkpoint: /ckpt/global_step{step}/"
                     "mp_rank_00_model_states.pt", "deepspeed", "logging.py:96:log_dist")
        else:
            self.app(0, t, "INFO", f"saved checkpoint step_{step:07d} to s3://team-ckpt/run/step_{step:07d}/ in 38.2s")

    def _ckpt_load(self, t: float, step: int) -> None:
        job, prof = self.job, self.prof
        if prof.framework == "megatron":
            self.rank_out(0, t, [f" loading distributed checkpoint from /lustre/ckpt/gpt at iteration {step}"])
            self.rank_out(0, t + 25, [(f"  successfully loaded checkpoint from /lustre/ckpt/gpt [ t 1/{job.tp}, "
                                      f"p 1/{job.pp} ] at iteration {step}")])
        else:
            self.app(0, t, "INFO", f"Resuming from checkpoint step {step}")

    # ------------------------------------------------------------------ the cascade
    def neighbours(self, r: int) -> list[int]:
        """The ranks NCCL's inter-node rings connect r to: the same local GPU on the adjacent nodes."""
        job = self.job
        n = len(job.hosts)
        if n < 2:
            return []
        node, loc = divmod(r, job.gpn)
        return sorted({((node - 1) % n) * job.gpn + loc, ((node + 1) % n) * job.gpn + loc} - {r})

    def cascade(self, first: dict[int, tuple[float, int, str]], stalled: set[int], t_block: dict[int, float],
                block_seq: dict[str, int], ops: dict[str, tuple[str, int]], restart: bool = False,
                hang: bool = False) -> float:
        """Spread a failure through the job and print what every process prints.

        first: ranks that die on their own (the culprit, and anything the story adds): r -> (t, code, why)
        stalled: ranks that never enqueue the collective the others wait for (a hang)
        t_block: r -> when r enqueued the collective it will wait on (default: the failure time)
        block_seq / ops: per group kind the SeqNum and (OpType, numel) of that collective
        Returns the time the last process of the attempt ended.
        """
        job, prof, rng = self.job, self.prof, self.rng
        q: list[tuple[float, int, str, int, int, str]] = []
        n = 0

        def push(t: float, what: str, r: int, code: int = 0, why: str = "") -> None:
            nonlocal n
            n += 1
            heapq.heappush(q, (t, n, what, r, code, why))

        for r, (t, code, why) in first.items():
            push(t, "die", r, code, why)
        t_fail = min(v[0] for v in first.values()) if first else min(t_block.values())
        timeout = job.timeout_ms / 1000
        kinds = {}
        for r in range(job.world):
            if r in first or r in stalled:
                continue
            tb = t_block.get(r, t_fail)
            kinds[r] = tb
            push(tb + timeout + rng.uniform(0.02, 1.0), "timeout", r)
        remote = prof.propagation in ("remote", "mixed")
        hop = (1.0, 25.0) if job.ib else (0.05, 2.0)
        torn: set[int] = set()
        srun_scheduled = False
        end = t_fail
        restart_done = False
        while q:
            t, _, what, r, code, why = heapq.heappop(q)
            if what == "srun_kill":
                self._srun_kill(t)
                end = max(end, t + 3)
                for rr in range(job.world):
                    if rr not in self.dead:
                        self.dead[rr] = (t + rng.uniform(0.1, 1.5), -15, "srun")
                break
            if what == "teardown":
                h = job.hosts[r]
                if r in torn:
                    continue
                torn.add(r)
                end = max(end, self._teardown(h, t, restart))
                if prof.launcher == "deepspeed":
                    self.head(t + rng.uniform(0.5, 2), [(f"pdsh@{job.me(job.hosts[0])}: {job.me(h)}: ssh exited with exit "
                                                        "code 1")])
                if prof.launcher == "srun" and prof.per_node_srun:
                    code0 = self._first_local(h)[2]
                    self.srun(t + rng.uniform(2, 4), [(f"srun: error: {h.name}: task {h.node_rank}: Exited with exit "
                                                      f"code {1 if code0 else 0}")])
                    if prof.kill_on_bad_exit and not srun_scheduled:
                        srun_scheduled = True
                        push(t + rng.uniform(2.2, 4.5), "srun_kill", -1)
                if restart and not restart_done:
                    restart_done = True
                    self._elastic_restart_others(h, t)
                    return t + 30
                continue
            if r in self.dead:
                continue
            if what == "timeout":
                if hang and r in stalled:
                    continue
                self._print_timeout(r, t, kinds.get(r, t_fail), block_seq, ops)
                push(t + rng.uniform(0.05, 0.6), "die", r, -6, "timeout")
                continue
            if what == "remote":
                self._print_remote(r, t, why, block_seq, ops)
                push(t + rng.uniform(0.05, 0.5), "die", r, -6, "remote")
                continue
            # a death
            self.dead[r] = (t, code, why)
            end = max(end, t)
            h = job.host_of(r)
            if prof.launcher in ("torchrun", "k8s", "deepspeed") or (prof.launcher == "srun" and prof.per_node_srun):
                if h.node_rank not in self.host_down:
                    self.host_down[h.node_rank] = t
                    push(t + rng.uniform(0.1, prof.monitor) + 0.05, "teardown", h.node_rank)
            elif prof.launcher in ("srun", "mpirun"):
                sig = {-9: "Killed", -6: "Aborted (core dumped)", -11: "Segmentation fault (core dumped)",
                       -15: "Terminated", -7: "Bus error (core dumped)"}.get(code)
                if why not in ("srun", "teardown"):
                    if prof.launcher == "srun":
                        txt = ("Out Of Memory" if why == "oom-cgroup" else sig or f"Exited with exit code {code}")
                        self.srun(t + rng.uniform(0.1, 1.0), [f"srun: error: {h.name}: task {r}: {txt}"])
                    else:
                        self.head(t + rng.uniform(0.1, 1.0), [
                            "--------------------------------------------------------------------------",
                            ("Primary job  terminated normally, but 1 process returned a non-zero exit code. Per "
                            "user-direction, the job has been aborted."),
                            "--------------------------------------------------------------------------",
                            "--------------------------------------------------------------------------",
                            (f"mpirun noticed that process rank {r} with PID {job.pids[r]} on node {h.name} exited on "
                            f"signal {-code if code < 0 else 0} ({sig or 'Exit'})."),
                            "--------------------------------------------------------------------------"])
                    if prof.kill_on_bad_exit and not srun_scheduled:
                        srun_scheduled = True
                        push(t + rng.uniform(0.5, 2.0), "srun_kill", -1)
            if remote and why not in ("teardown", "srun"):
                pass
            if remote and why != "srun":
                for nb in self.neighbours(r):
                    if nb in self.dead or (nb in stalled and hang):
                        continue
                    if prof.propagation == "mixed" and rng.random() < 0.5:
                        continue
                    push(t + rng.uniform(*hop), "remote", nb, 0, str(r))
        return end

    def _first_local(self, h: Host) -> tuple[int, float, int, str]:
        job = self.job
        cands = [(v[0], r, v[1], v[2]) for r, v in self.dead.items() if job.host_of(r) is h and v[2] != "teardown"]
        if not cands:
            cands = [(v[0], r, v[1], v[2]) for r, v in self.dead.items() if job.host_of(r) is h]
        t, r, code, why = min(cands)
        return r, t, code, why

    def _teardown(self, h: Host, t: float, restart: bool) -> float:
        """The host's launcher saw a worker fail: it stops the others and says so."""
        job, prof, rng = self.job, self.prof, self.rng
        first_r, first_t, first_code, _ = self._first_local(h)
        failed = sorted((v[0], r, v[1]) for r, v in self.dead.items()
                        if job.host_of(r) is h and v[2] != "teardown")
        alive = [r for r in job.ranks_on(h) if r not in self.dead]
        if prof.launcher == "deepspeed":
            lines = [f"[{clock.py_asctime(job.local_t(h, t))}] [INFO] [launch.py:319:sigkill_handler] Killing "
                     f"subprocess {job.pids[r]}" for r in job.ranks_on(h)]
            lines.append(f"[{clock.py_asctime(job.local_t(h, t + .4))}] [ERROR] [launch.py:325:sigkill_handler] "
                         f"['{job.site.split('/lib/')[0]}/bin/python', '-u', '{prof.script}', '--local_rank="
                         f"{job.local(first_r)}', '--deepspeed', '--deepspeed_config', 'ds_config.json'] exits with "
                         f"return code = {first_code}")
            self.agent(h, t, lines)
            for r in alive:
                self.dead[r] = (t + rng.uniform(0.05, 0.5), -15, "teardown")
            return t + 1
        # torchrun
        lines = [F.elastic_sigterm(job, h, t + i * 0.002, job.pids[r]) for i, r in enumerate(alive)]
        for r in alive:
            self.dead[r] = (t + rng.uniform(0.05, 1.0), -15, "teardown")
        t2 = t + rng.uniform(0.2, 2.0)
        lines.append(F.elastic_failed(job, h, t2, job.local(first_r), job.pids[first_r], first_code))
        if restart:
            if prof.agent_info:
                lines.append(F.elastic(job, h, t2 + .01, "I", F.AGENT_API, 891,
                                       f"[{prof.role}] Worker group FAILED. {prof.max_restarts - self.attempt}/"
                                       f"{prof.max_restarts} attempts left; will restart worker group"))
                lines.append(F.elastic(job, h, t2 + .02, "I", F.AGENT_API, 708, f"[{prof.role}] Stopping worker group"))
            self.agent(h, t, lines)
            return t2
        root = (first_r, job.local(first_r), first_code, job.pids[first_r], first_t)
        others = [(r, job.local(r), c, job.pids[r], tt) for tt, r, c in failed if r != first_r][:job.gpn]
        if prof.agent_info and rng.random() < 0.5:
            lines.append(F.elastic(job, h, t2 + .01, "I", F.AGENT_API, 725, "Local worker group finished (FAILED). "
                                   "Waiting 300 seconds for other agents to finish"))
        lines += F.child_failed(job, h, t2 + .05, prof.script, root, others)
        self.agent(h, t, lines)
        self.summaries.append((h.node_rank, first_r))
        return t2

    def _elastic_restart_others(self, failed: Host, t: float) -> None:
        """torchelastic: the other agents see a node waiting in the rendezvous and restart their workers."""
        job, prof, rng = self.job, self.prof, self.rng
        for h in job.hosts:
            if h is failed:
                continue
            tt = t + rng.uniform(1, prof.monitor + 8)
            lines = []
            if prof.agent_info:
                lines.append(F.elastic(job, h, tt, "I", F.AGENT_API, 907, f"[{prof.role}] Detected 1 new nodes from "
                                       f"group_rank={failed.node_rank}; will restart worker group"))
                lines.append(F.elastic(job, h, tt, "I", F.AGENT_API, 708, f"[{prof.role}] Stopping worker group"))
            lines += [F.elastic_sigterm(job, h, tt + 0.01 * i, job.pids[r]) for i, r in enumerate(job.ranks_on(h))]
            self.agent(h, tt, lines)

    def _srun_kill(self, t: float) -> None:
        job, prof, rng = self.job, self.prof, self.rng
        self.srun(t, ["srun: Job step aborted: Waiting up to 32 seconds for job step to finish."])
        step = f"STEP {job.slurm_id}.0"
        for h in job.hosts:
            if prof.per_node_srun and h.node_rank in self.host_down:
                continue
            tt = t + rng.uniform(0.05, 0.8)
            self.emit(tt, h.node_rank, -1, "stepd", [F.stepd_cancelled(job, h, tt, step, None)], True)
            if prof.per_node_srun:
                self.agent(h, tt + 0.01, F.elastic_signal_exception(job, h, tt + 0.01, 15))
        killed = [h for h in job.hosts if h.node_rank not in self.host_down]
        if prof.per_node_srun:
            for h in killed[:50]:
                self.srun(t + rng.uniform(1, 3), [f"srun: error: {h.name}: task {h.node_rank}: Exited with exit code 1"])
        else:
            for h in killed[:50]:
                self.srun(t + rng.uniform(1, 3), [(f"srun: error: {h.name}: {F.srun_tasks(list(job.ranks_on(h)))}: "
                                                  "Terminated")])
        self.srun(t + 33, [f"srun: Force Terminated StepId={job.slurm_id}.0"] if rng.random() < 0.3 else [])

    def _print_timeout(self, r: int, t: float, tb: float, block_seq: dict[str, int],
                       ops: dict[str, tuple[str, int]]) -> None:
        job, rng = self.job, self.rng
        kind = self._kind_of(r, ops)
        g = job.group(r, kind)
        seq = block_seq[kind]
        op, numel = ops[kind]
        ran = int((t - tb) * 1000)
        lines = F.watchdog_timeout(job, r, g, t, seq, op, numel, ran, seq + rng.choice([0, 0, 1, 2]), seq - 1,
                                   self.prof.stack_frames and rng.random() < 0.7)
        if job.tv >= (2, 5) and rng.random() < 0.6:
            lines = F.dump_signal(job, r, g, t + 0.001, "this local rank", seq, seq - 1)[:1] + lines
        self.rank_out(r, t, lines, err=True)

    def _kind_of(self, r: int, ops: dict[str, tuple[str, int]]) -> str:
        """The group r is blocked on: its TP group if it shares one with the failed rank, else the gradient group."""
        return self.blocked_kind.get(r, self.job.grad_kind if self.job.grad_kind in ops else "default")

    def _print_remote(self, r: int, t: float, why: str, block_seq: dict[str, int],
                      ops: dict[str, tuple[str, int]]) -> None:
        job, rng = self.job, self.rng
        peer = job.host_of(int(why))
        kind = self._kind_of(r, ops)
        g = job.group(r, kind)
        op, numel = ops[kind]
        lines = F.remote_error(job, r, g, t, block_seq[kind], op, numel, peer, rng.randint(30000, 60999),
                               "ib" if job.ib else "socket")
        self.rank_out(r, t, lines, err=True)
