"""One simulated job from start-up to teardown: its log lines on true time (the package docstring tells
the story)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from correlator.diagnosis.rules import Rule, RuleSet
from correlator.tooling.simulate.classes import DEMO_CLASS, DEMO_XID_TEXT, Mode, mode_of
from correlator.tooling.simulate.examples import (
    EXCEPTION_LINE,
    KERNEL_HINT,
    LAUNCHER_LINE,
    NCCL_LOG,
    FailureText,
    blames_another_rank,
    replace_group,
    split_example,
    strip_identity,
    substitute_identity,
)
from correlator.tooling.simulate.job import Host, Process, lay_out_hosts
from correlator.tooling.simulate.lines import LogLine, Style, utc_datetime
from correlator.tooling.simulate.regex_sample import sample_matching
from correlator.tooling.simulate.rule_lookup import best_class, rule_matches, signature_rules
from correlator.tooling.simulate.truth import SimulateError

_STEP_S = 1.2
_NCCL_VERSION = "2.21.5"


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
        ruleset: RuleSet,
        demo: bool,
        start: datetime,
    ) -> None:
        if cls not in ruleset.classes:
            raise SimulateError(f"unknown class {cls!r}; see `rootrank simulate --list-classes`")
        if hosts < 1 or world_size < hosts or world_size % hosts:
            raise SimulateError(f"--world-size {world_size} must be a positive multiple of --hosts {hosts}")
        self.cls = cls
        self.ruleset = ruleset
        self.rng = random.Random(f"rootrank-simulate:{cls}:{seed}")
        self.seed = seed
        self.world_size = world_size
        self.noise_lines = max(3, noise_lines)
        self.late_lines = late_lines
        self.demo = demo
        self.job_id = f"sim-{cls.replace('_', '-')}-{seed}"
        self.t0 = start.timestamp() + (seed % 1000) * 7.0
        self.hosts = lay_out_hosts(self.rng, world_size=world_size, hosts=hosts, skew_max_s=skew_max_s)
        self.procs = [p for h in self.hosts for p in h.procs]
        if initiator_rank is not None and not 0 <= initiator_rank < world_size:
            raise SimulateError(f"--initiator-rank {initiator_rank} is outside 0..{world_size - 1}")
        self.initiator = self.procs[initiator_rank if initiator_rank is not None else self.rng.randrange(world_size)]
        self.mode: Mode = mode_of(cls)
        self.lines: list[LogLine] = []
        self.rule: Rule | None = None
        self.failure_lines: list[str] = []
        self.failure_t: float | None = None
        self.timeout_s = 600.0
        self.seq_base = self.rng.randint(200, 4000)
        self.op = self.rng.choice(["ALLREDUCE", "ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE"])
        self.numel = self.rng.choice([466119168, 160672064, 25690112, 1048576])

    # --- helpers ---

    def emit(self, t: float, proc: Process | None, style: Style, body: str, **kw: Any) -> LogLine:
        host = proc.host if proc is not None else kw.pop("host")
        line = LogLine(t=t, host=host, style=style, body=body, proc=proc, **kw)
        self.lines.append(line)
        return line

    def jitter(self, scale: float = 0.08) -> float:
        return self.rng.uniform(0, scale)

    # --- phases ---

    def startup(self) -> float:
        t = self.t0
        comm_id = f"0x{self.rng.getrandbits(64):016x}"
        for p in self.procs:
            tp = t + self.jitter(1.5)
            if p.rank == 0:
                self.emit(tp, p, "nccl", f"NCCL version {_NCCL_VERSION}+cuda12.4")
            self.emit(tp + 0.01, p, "nccl", "cudaDriverVersion 12040")
            self.emit(tp + 0.02, p, "nccl", f"Bootstrap : Using eth0:10.0.{p.host_index}.{10 + p.local_rank}<0>")
            comm = f"0x{self.rng.getrandbits(44) | 0x550000000000:x}"
            self.emit(
                t + 4.0 + self.jitter(0.3),
                p,
                "nccl",
                f"ncclCommInitRank comm {comm} rank {p.rank} nranks {self.world_size} cudaDev {p.local_rank} "
                f"nvmlDev {p.local_rank} busId {p.bus}000 commId {comm_id} - Init COMPLETE",
                thread=p.pid + 180 + p.local_rank,
            )
        return t + 6.0

    def chatter(self, start: float, steps: int, first_step: int, *, skip: Callable[[Process, int], bool] | None = None,
                metric: tuple[Rule, FailureText, str] | None = None) -> float:
        total = 5000
        t = start
        for k in range(first_step, first_step + steps):
            t += _STEP_S + self.rng.uniform(-0.05, 0.05)
            for p in self.procs:
                if skip is not None and skip(p, k):
                    continue
                tp = t + self.jitter()
                if metric is not None:
                    self.emit(tp, p, "rank_pylog", self.metric_line(metric, p, normal=True, step=k))
                else:
                    loss = 2.6 * (0.999 ** k) + self.rng.uniform(-0.05, 0.05)
                    self.emit(tp, p, "rank_pylog", f"step {k}/{total} | loss {loss:.4f} | lr 2.95e-04 | {_STEP_S:.2f} s/it")
            if k % 5 == 0 and (skip is None or not skip(self.procs[0], k)):
                pct = k * 100 // total
                bars = "\r".join(
                    f"{pct:3d}%|{'█' * (pct // 10)}{' ' * (10 - pct // 10)}| {j}/{total} [{j * 6 // 5 // 60:02d}:{j * 6 // 5 % 60:02d}<"
                    f"{(total - j) * 6 // 5 // 3600:02d}:{(total - j) * 6 // 5 // 60 % 60:02d}, {_STEP_S:.2f}s/it]"
                    for j in (k - 2, k - 1, k)
                )
                self.emit(t + 0.2, self.procs[0], "rank", bars)
        return t

    def metric_line(
        self, metric: tuple[Rule, FailureText, str], proc: Process, *, normal: bool, value: str | None = None,
        step: int | None = None,
    ) -> str:
        """The metric rule's example line for `proc`: a normal value, `value`, or the example's own (normal=False)."""
        rule, failure, field_name = metric
        text = substitute_identity(failure.text, rule, proc)
        if step is not None:
            text = replace_group(text, rule, "step", str(step))
        for pattern in rule.extract + rule.patterns:
            try:
                m = re.compile(pattern).search(text)
            except re.error:
                continue
            if m and field_name in m.groupdict() and m.group(field_name) is not None:
                base = 2.5 if "loss" in field_name else 1.0
                new = value if value is not None else f"{base * self.rng.uniform(0.95, 1.05):.4f}"
                if not normal and value is None:
                    return text
                s, e = m.span(field_name)
                return text[:s] + new + text[e:]
        return text

    # --- the failure ---

    def pick_failure(self) -> tuple[Rule | None, list[FailureText]]:
        rules = signature_rules(self.ruleset, self.cls)
        if self.demo and self.cls == DEMO_CLASS:
            text = DEMO_XID_TEXT.format(bus=self.initiator.bus, pid=self.initiator.pid)
            rule = next((r for r in rules if rule_matches(self.ruleset, r, text)), rules[0] if rules else None)
            return rule, [FailureText(text=text, kernel=True)]
        if self.mode == "hang":
            # A straggler prints no error: it starts a step like everyone (the absence rule's start marker,
            # when the library has one) and then never logs progress again.
            for rule in rules:
                if rule.absence is None:
                    continue
                for example in rule.examples.match:
                    marker = split_example(example)
                    if marker.text and rule_matches(self.ruleset, rule, marker.text):
                        return rule, [marker]
            return (rules[0] if rules else None), []
        if not rules:
            raise SimulateError(f"no signature rule of class {self.cls!r} in the rule library (rules/); cannot simulate it")
        # The initiating line is a cause the library takes seriously: not a collateral-role rule (a "remote
        # peer closed" error is what the victims print), not a low-confidence hint, plain patterns first.
        def plain(r: Rule) -> bool:
            return r.metric is None and r.absence is None and r.sequence is None

        causal = [r for r in rules if self.ruleset.role_of(r) != "collateral"]
        tiers = [
            [r for r in causal if plain(r) and r.confidence >= 0.45],
            [r for r in causal if plain(r)],
            causal,
            rules,
        ]
        special = [r for r in causal if (r.metric is not None or r.sequence is not None) and r.confidence >= 0.45]
        if special and self.seed % 3 == 2:
            # Every third seed exercises the rules that need more than one line: a metric across ranks,
            # a marker earlier in the job.
            tiers.insert(0, special)
        candidates = next(t for t in tiers if t)
        pairs: list[tuple[Rule, FailureText]] = []
        for rule in candidates:
            for example in rule.examples.match:
                failure = split_example(example)
                if failure.text and rule_matches(self.ruleset, rule, failure.text):
                    pairs.append((rule, failure))
        if not pairs:
            # The rules need context their prefix-less text lacks: ship an example as written.
            rule = candidates[self.rng.randrange(len(candidates))]
            example = rule.examples.match[0]
            return rule, [FailureText(text=strip_identity(example), kernel=bool(KERNEL_HINT.search(example)))]
        # An example that a more confident rule of another class also matches stands for that class, not
        # this one; such overlaps are the rule library's to resolve, so prefer the examples without them.
        clear = [(r, f) for r, f in pairs if best_class(self.ruleset, f.text) in (None, self.cls)]
        chosen = clear or pairs
        rule, failure = chosen[self.rng.randrange(len(chosen))]
        return rule, [failure]

    def failure_lines_for(self, t: float, proc: Process, rule: Rule | None, failures: Sequence[FailureText]) -> float:
        """Emit the failure on `proc` starting at `t`; returns the time of the last line."""
        for failure in failures:
            blamed = None
            if rule is not None and blames_another_rank(failure.text, rule) and self.world_size > 1:
                # "Rank 0 is running X, but Rank 37 is running Y": a peer writes the line that names the culprit.
                blamed, proc = proc, self.procs[0 if proc.rank != 0 else 1]
            text = substitute_identity(failure.text, rule, proc, blamed) if rule is not None else failure.text
            if rule is not None and not rule_matches(self.ruleset, rule, text):
                text = failure.text  # the substitution broke the match: keep the example's numbers
            if failure.kernel:
                self.emit(t, None, "kern", text, host=proc.host)
                self.failure_lines.append(text)
                if self.cls == "gpu_hardware_error":
                    # The device is gone: the rank's next CUDA call fails.
                    t += 0.35 + self.jitter(0.1)
                    for body in (
                        "Traceback (most recent call last):",
                        '  File "/workspace/train.py", line 212, in <module>',
                        "    loss.backward()",
                        "RuntimeError: CUDA error: unspecified launch failure",
                        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
                    ):
                        self.emit(t, proc, "rank", body)
                        t += 0.0005
                continue
            if LAUNCHER_LINE.search(text):
                text = re.sub(r"--local_rank=\d+", f"--local_rank={proc.local_rank}", text)
                text = re.sub(r"local_rank: \d+", f"local_rank: {proc.local_rank}", text)
                self.emit(t, None, "agent", text, host=proc.host)
            elif NCCL_LOG.match(text):
                self.emit(t, proc, "nccl_raw", text, thread=proc.pid + 311)
            elif failure.glog_level:
                self.emit(t, proc, "rank_glog", text, level=failure.glog_level, srcloc=failure.glog_srcloc or "")
            elif failure.pylog_level:
                self.emit(t, proc, "rank_pylog", text, level=failure.pylog_level)
            elif EXCEPTION_LINE.match(text):
                for body in ("Traceback (most recent call last):", '  File "/workspace/train.py", line 212, in <module>',
                             "    main(args)", '  File "/workspace/train.py", line 187, in main'):
                    self.emit(t, proc, "rank", body)
                    t += 0.0003
                self.emit(t, proc, "rank", text)
            else:
                self.emit(t, proc, "rank", text)
            self.failure_lines.append(text)
            t += 0.001
        return t

    def sequence_marker(self, t: float, proc: Process, rule: Rule) -> None:
        if rule.sequence is None:
            return
        for pattern in rule.sequence.after:
            text = sample_matching(pattern, caseless=rule.caseless)
            if text:
                self.emit(t, proc, "rank_pylog", text)
                return

    # --- collateral ---

    def watchdog(self, t: float, p: Process, seq: int) -> None:
        pg = f"PG ID 0 PG GUID 0(default_pg) Rank {p.rank}"
        work = (
            f"WorkNCCL(SeqNum={seq}, OpType={self.op}, NumelIn={self.numel}, NumelOut={self.numel}, "
            f"Timeout(ms)={int(self.timeout_s * 1000)})"
        )
        ran = int(self.timeout_s * 1000) + self.rng.randint(20, 90)
        tid = p.pid + 310
        self.emit(t, p, "rank_glog", f"[Rank {p.rank}] Watchdog caught collective operation timeout: {work} ran for {ran} milliseconds before timing out.",
                  level="E", srcloc="ProcessGroupNCCL.cpp:616", thread=tid)
        self.emit(t + 0.0004, p, "rank_glog",
                  f"[{pg}] Exception (either an error or timeout) detected by watchdog at work: {seq}, "
                  f"last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.",
                  level="E", srcloc="ProcessGroupNCCL.cpp:1785", thread=tid)
        self.emit(t + 0.0006, p, "rank_glog",
                  f"[{pg}] Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.",
                  level="E", srcloc="ProcessGroupNCCL.cpp:630", thread=tid)
        self.emit(t + 0.0008, p, "rank_glog",
                  f"[{pg}] To avoid data inconsistency, we are taking the entire process down.",
                  level="E", srcloc="ProcessGroupNCCL.cpp:636", thread=tid)
        self.emit(t + 0.002, p, "rank_glog",
                  f"[{pg}] Process group watchdog thread terminated with exception: [Rank {p.rank}] Watchdog caught "
                  f"collective operation timeout: {work} ran for {ran} milliseconds before timing out.",
                  level="F", srcloc="ProcessGroupNCCL.cpp:1609", thread=tid)

    def remote_error(self, t: float, p: Process) -> None:
        pg = f"PG ID 0 PG GUID 0(default_pg) Rank {p.rank}"
        self.emit(t, p, "rank_glog",
                  f"[{pg}] Process group watchdog thread terminated with exception: NCCL error: remote process exited "
                  f"or there was a network error, NCCL version {_NCCL_VERSION}",
                  level="E", srcloc="ProcessGroupNCCL.cpp:1609", thread=p.pid + 310)

    def teardown(self, host: Host, t: float, failed: list[tuple[Process, int]], *, sigterm: Sequence[Process]) -> None:
        """torchelastic on `host`: SIGTERM to the survivors, then ChildFailedError naming the first failure."""
        api = "torch/distributed/elastic/multiprocessing/api.py"
        for p in sigterm:
            self.emit(t, None, "agent_glog", f"Sending process {p.pid} closing signal SIGTERM",
                      host=host.name, level="W", srcloc=f"{api}:897", thread=host.agent_pid)
            t += 0.0002 + self.jitter(0.002)
        first, exitcode = failed[0]
        t += 0.3 + self.jitter(0.3)
        self.emit(t, None, "agent_glog",
                  f"failed (exitcode: {exitcode}) local_rank: {first.local_rank} (pid: {first.pid}) of binary: /usr/bin/python3",
                  host=host.name, level="E", srcloc=f"{api}:869", thread=host.agent_pid)
        when = utc_datetime(t + host.skew).strftime("%Y-%m-%d_%H:%M:%S")
        signal_name = {-6: "SIGABRT", -9: "SIGKILL", -7: "SIGBUS", -11: "SIGSEGV", -15: "SIGTERM"}.get(exitcode)
        block = [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())",
            '  File "/usr/local/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 263, in launch_agent',
            "    raise ChildFailedError(",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "============================================================",
            "/workspace/train.py FAILED",
            "------------------------------------------------------------",
            "Failures:",
        ]
        others = failed[1:]
        if not others:
            block.append("  <NO_OTHER_FAILURES>")
        for i, (p, code) in enumerate(others, start=1):
            block += [f"[{i}]:", f"  time      : {when}", f"  host      : {host.name}",
                      f"  rank      : {p.rank} (local_rank: {p.local_rank})", f"  exitcode  : {code} (pid: {p.pid})",
                      "  error_file: <N/A>", "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"]
        block += [
            "------------------------------------------------------------",
            "Root Cause (first observed failure):",
            "[0]:",
            f"  time      : {when}",
            f"  host      : {host.name}",
            f"  rank      : {first.rank} (local_rank: {first.local_rank})",
            f"  exitcode  : {exitcode} (pid: {first.pid})",
            "  error_file: <N/A>",
            f"  traceback : Signal {-exitcode} ({signal_name}) received by PID {first.pid}" if signal_name
            else "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            "============================================================",
        ]
        for body in block:
            t += 0.00005
            self.emit(t, None, "agent", body, host=host.name)

    # --- the whole story ---

    def build(self) -> None:
        t = self.startup()
        rule, failures = self.pick_failure()
        self.rule = rule
        init = self.initiator
        steps = self.noise_lines
        metric: tuple[Rule, FailureText, str] | None = None
        if rule is not None and rule.metric is not None and failures:
            metric = (rule, failures[0], rule.metric.field)
        if self.mode == "all":
            t = self.chatter(t, 2, 0) + 2.0
            self.failure_t = t
            exit_t = t
            for p in self.procs:
                tp = t + self.jitter(0.4)
                if rule is not None and rule.sequence is not None:
                    self.sequence_marker(tp - 1.5, p, rule)  # e.g. every rank starts loading the same checkpoint
                end = self.failure_lines_for(tp, p, rule, failures)
                exit_t = max(exit_t, end)
            self.failure_lines = list(dict.fromkeys(self.failure_lines))
            for host in self.hosts:
                failed = sorted(host.procs, key=lambda p: self.rng.random())
                self.teardown(host, exit_t + 1.0 + self.jitter(0.5), [(p, 1) for p in failed], sigterm=[])
            return
        if self.mode == "victims":
            self.victims(t, rule, failures)
            return
        # Training until the failing step.
        last_step = steps
        hang_rank_stops = self.mode == "hang"
        t = self.chatter(
            t, steps, 1,
            skip=(lambda p, k: p is init and k == last_step) if hang_rank_stops else None,
            metric=metric,
        )
        seq = self.seq_base + last_step
        absence_rule = rule if rule is not None and rule.absence is not None and failures else None
        if absence_rule is not None:
            # Every rank starts the marked operation; all but the initiator finish it.
            for p in self.procs:
                self.failure_lines_for(t + 0.5 + self.jitter(0.2), p, absence_rule, failures)
            self.failure_lines = self.failure_lines[:1]
            self.failure_t = t + 0.5
            end_text = next((s for s in (sample_matching(e, caseless=absence_rule.caseless) for e in absence_rule.absence.end) if s), None)  # type: ignore[union-attr]
            for p in self.procs:
                if p is not init and end_text:
                    self.emit(t + 4.0 + self.jitter(1.0), p, "rank_pylog", end_text)
            deadline = absence_rule.absence.deadline_s  # type: ignore[union-attr]
            # The peers' NCCL timeout (torch's 30 min when the marker's deadline is longer than 10 min)
            # fires after the deadline, so the missing end marker is visible before the cascade.
            self.timeout_s = max(self.timeout_s, 1800.0 if deadline < 1740 else deadline + 300)
            t += 6.0
        enqueue_t = t + 0.6
        if self.mode == "hang" or absence_rule is not None:
            if self.failure_t is None:
                self.failure_t = enqueue_t
            self.collateral(enqueue_t, seq, early=False)
            return
        # The failure itself.
        fail_t = t + 0.4 + self.jitter(0.3)
        if metric is not None:
            raw = re.search(r"(?i)nan|inf", failures[0].text)
            value = None if raw else f"{(rule.metric.spike_ratio if rule and rule.metric else 10) * 40:.4f}"
            body = self.metric_line(metric, init, normal=value is not None, value=value, step=last_step + 1)
            self.emit(fail_t, init, "rank_pylog", body, level="W")
            self.failure_lines.append(body)
            self.failure_t = fail_t
        else:
            if rule is not None and rule.sequence is not None:
                self.sequence_marker(fail_t - 8.0, init, rule)
            self.failure_t = fail_t
            self.failure_lines_for(fail_t, init, rule, failures)
        if self.mode == "continue":
            self.chatter(fail_t, 8, last_step + 2, metric=metric)
            return
        early = not self.demo and self.seed % 2 == 1
        self.collateral(enqueue_t, seq, early=early, fail_t=fail_t)

    def collateral(self, enqueue_t: float, seq: int, *, early: bool, fail_t: float | None = None) -> None:
        """Victims of the failure: watchdog timeouts on every rank still waiting, then each host's teardown.

        early: the initiator's process exits at once; its agent stops the host immediately and the ring
        neighbours on other hosts (socket transport) see the connection drop within a second, which stops
        their hosts too. Everyone else waits for the watchdog.
        """
        init = self.initiator
        init_host = self.hosts[init.host_index]
        timeout_t = enqueue_t + self.timeout_s
        host_down: dict[int, tuple[float, Process, int]] = {}
        if early and fail_t is not None:
            exit_t = fail_t + 0.8 + self.jitter(0.3)
            host_down[init_host.index] = (exit_t, init, 1)
            per_host = len(init_host.procs)
            for offset in (per_host, -per_host):
                peer = self.procs[(init.rank + offset) % self.world_size]
                if peer.host_index in host_down:
                    continue
                err_t = exit_t + 0.25 + self.jitter(0.4)
                self.remote_error(err_t, peer)
                host_down[peer.host_index] = (err_t + 0.3 + self.jitter(0.2), peer, -6)
        for host in self.hosts:
            if host.index in host_down:
                t, first, code = host_down[host.index]
                self.teardown(host, t, [(first, code)], sigterm=[p for p in host.procs if p is not first])
                continue
            victims = [p for p in host.procs if p is not init]
            for p in victims:
                self.watchdog(timeout_t + self.jitter(0.04), p, seq)
            if victims:
                first = victims[self.rng.randrange(len(victims))]
                survivors = [p for p in host.procs if p is not first]  # includes a hung initiator
                self.teardown(host, timeout_t + 0.5 + self.jitter(1.0), [(first, -6)], sigterm=survivors)

    def victims(self, t: float, rule: Rule | None, failures: Sequence[FailureText]) -> None:
        """Every rank is a victim of something these logs do not show.

        nccl_timeout: a host that never logged stalled the job; all ranks here time out on the same
        collective with the same progress. launcher_teardown: the scheduler stopped the job (preemption);
        every worker gets SIGTERM and every launcher tears its host down, with no error before it.
        """
        t = self.chatter(t, self.noise_lines, 1)
        seq = self.seq_base + self.noise_lines
        end_t = t + 0.6 + (self.timeout_s if self.cls == "nccl_timeout" else 5.0)
        self.failure_t = end_t
        if self.cls == "nccl_timeout":
            for p in self.procs:
                self.watchdog(end_t + self.jitter(0.04), p, seq)
            self.failure_lines.append(next(ln.body for ln in self.lines if "Watchdog caught" in ln.body))
        elif rule is not None:
            for p in self.procs:
                self.failure_lines_for(end_t + self.jitter(0.05), p, rule, failures)
            self.failure_lines = self.failure_lines[:1]
        for host in self.hosts:
            order = sorted(host.procs, key=lambda p: self.rng.random())
            code = -6 if self.cls == "nccl_timeout" else -15
            self.teardown(host, end_t + 0.5 + self.jitter(1.0), [(order[0], code)], sigterm=order[1:])

    def make_late(self) -> None:
        candidates = [ln for ln in self.lines if ln.has_ts]
        for line in self.rng.sample(candidates, min(self.late_lines, len(candidates))):
            line.delay = self.rng.uniform(5.0, 60.0)

