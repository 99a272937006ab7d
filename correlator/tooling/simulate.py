"""`rootrank simulate`: logs of a multi-rank job that fails in a known way, with the truth beside them.

The scenario model (one job, `world_size` ranks spread evenly over `hosts`):

1. start-up: every rank prints NCCL INFO init lines (`ncclCommInitRank ... rank R nranks N`, which
   tie host:pid to the rank and give the world size);
2. training chatter: per-step python-logging lines from every rank, tqdm bars from rank 0;
3. the failure: the initiating rank (or every rank, for deterministic data/checkpoint errors) prints
   the failure lines of the class, taken from the rule library's own `examples.match` so the
   simulator and the rules cannot drift apart;
4. collateral: ranks blocked in the collective hit the NCCL watchdog after its timeout (same SeqNum,
   same true time on every rank, so the lines are also the skew anchors), then each host's
   torchelastic agent tears its workers down (SIGTERM, ChildFailedError with a "Root Cause" that
   names whichever local rank died first - often a victim, as in real logs).

Per-host clock skew is applied to every timestamp a line carries (python logging, torch/glog
brackets, torchelastic agent, rsyslog); the truth records it. Lines without timestamps
(tracebacks, NCCL INFO, tqdm) are written where they happen in the file, as in real logs.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from correlator.diagnosis.rules import Rule, RuleSet, load_ruleset
from ingest.prefixes import parse_prefixes

Format = Literal["plain", "fluentbit", "vector", "filebeat", "rsyslog"]
FORMATS: tuple[str, ...] = ("plain", "fluentbit", "vector", "filebeat", "rsyslog")
Mode = Literal["crash", "hang", "all", "continue", "victims"]

DEMO_CLASS = "gpu_hardware_error"
DEMO_RANK = 37
DEMO_XID_TEXT = "NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pid}, GPU has fallen off the bus."

# Deterministic data/config errors: every rank loads the same bad file or config and fails the same way.
ALL_RANK_CLASSES = frozenset(
    {
        "checkpoint_corruption",
        "unpickling_truncated",
        "torch_load_failed",
        "weights_only_unpickling_error",
        "checkpoint_version_incompatible",
        "safetensors_load_error",
        "model_state_dict_mismatch",
        "optimizer_state_dict_mismatch",
        "optimizer_state_resize_failure",
        "tensorrt_llm_weight_mapper",
        "dataset_license_issue",
        "launch_config_error",
    }
)
# The job keeps running after the event (a numeric anomaly, a detector's warning).
CONTINUE_CLASSES = frozenset(
    {"sdc_grad_norm_spike", "sdc_parameter_drift", "sdc_gemm_mismatch", "nccl_reduce_scatter_sdc", "loss_nan", "pii_leakage"}
)
# Consequences only: every rank shows the class and nothing in the logs says who started it.
VICTIM_CLASSES = frozenset({"nccl_timeout", "launcher_teardown"})
# The initiating rank stops making progress without an error line of its own.
HANG_CLASSES = frozenset({"straggler_hang"})

_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
_STEP_S = 1.2
_NCCL_VERSION = "2.21.5"


class SimulateError(ValueError):
    """A scenario that cannot be built (unknown class, no usable rule); the message says why."""


class TruthInitiator(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int | None
    host: str | None = None
    local_rank: int | None = None
    pid: int | None = None
    gpu: str | None = None
    all: bool = Field(default=False, description="every rank failed the same way (a deterministic data/config error)")
    unknown: bool = Field(default=False, description="only consequences were logged; no line shows who started it")


class Truth(BaseModel):
    """What the simulated job really did; written as truth.json next to the logs."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    class_: str = Field(alias="class")
    initiator: TruthInitiator
    world_size: int
    job_id: str
    seed: int
    skew_s: dict[str, float]
    hosts: list[str]
    format: str
    mode: str
    rule: str | None = Field(default=None, description="rule whose examples gave the failure lines")
    failure_lines: list[str] = Field(default_factory=list)
    failure_ts: str | None = Field(default=None, description="true UTC time of the first failure line")
    files: list[str] = Field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


# --- identities -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Proc:
    rank: int
    host: str
    host_index: int
    local_rank: int
    pid: int
    bus: str

    @property
    def gpu(self) -> str:
        return str(self.local_rank)


@dataclass
class _Host:
    name: str
    index: int
    skew: float
    agent_pid: int
    procs: list[_Proc] = field(default_factory=list)


# --- lines ------------------------------------------------------------------------------------

# How a line is rendered; the timestamp styles use the host's (skewed) clock.
Style = Literal["rank", "rank_pylog", "rank_glog", "nccl", "nccl_raw", "agent_glog", "agent", "kern"]


@dataclass
class _Line:
    t: float  # true time (epoch seconds) the line was written
    host: str
    style: Style
    body: str
    proc: _Proc | None = None
    level: str = "I"  # glog/pylog level
    srcloc: str = ""  # glog source location
    thread: int = 0
    delay: float = 0.0  # extra seconds before the line reaches the file/forwarder (late lines)
    stream: str = "stderr"

    @property
    def has_ts(self) -> bool:
        return self.style in ("rank_pylog", "rank_glog", "agent_glog", "kern")


_PYLOG_LEVEL = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _render(line: _Line, skew: float) -> str:
    local = _dt(line.t + skew)
    p = line.proc
    if line.style == "rank":
        assert p is not None
        return f"[rank{p.rank}]: {line.body}" if line.body else f"[rank{p.rank}]:"
    if line.style == "rank_pylog":
        assert p is not None
        ts = local.strftime("%Y-%m-%d %H:%M:%S") + f",{local.microsecond // 1000:03d}"
        return f"[rank{p.rank}]:{ts} - {_PYLOG_LEVEL.get(line.level, 'INFO')} - train - {line.body}"
    if line.style == "rank_glog":
        assert p is not None
        # torch >= 2.4 c10 logging: month without padding, nanoseconds, no thread id.
        frac = f"{local.microsecond:06d}{(p.pid * 7 + int(line.t * 1000)) % 1000:03d}"
        return f"[rank{p.rank}]:[{line.level}{local.month}{local.day:02d} {local:%H:%M:%S}.{frac} {line.srcloc}] {line.body}"
    if line.style == "nccl":
        assert p is not None
        return f"{p.host}:{p.pid}:{line.thread or p.pid} [{p.local_rank}] NCCL INFO {line.body}"
    if line.style == "nccl_raw":
        assert p is not None
        return f"{p.host}:{p.pid}:{line.thread or p.pid} [{p.local_rank}] {line.body}"
    if line.style == "agent_glog":
        return f"{line.level}{local:%m%d %H:%M:%S}.{local.microsecond:06d} {line.thread} {line.srcloc}] {line.body}"
    if line.style == "agent":
        return line.body
    if line.style == "kern":
        return f"{_rfc3339(local)} {line.host} kernel: {line.body}"
    raise AssertionError(line.style)


def _rfc3339(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond:06d}+00:00"


# --- taking failure lines from the rule library ----------------------------------------------

_LEADING_TS = [
    # rsyslog / ISO, python logging
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s*(?:-\s+)?(?:\S+\s+kernel:\s*)?"),
    # syslog traditional: "Dec  6 18:44:10 node04 kernel: "
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ (?:kernel: )?"),
    # dmesg: "[12345.678901] " and "[Fri Dec  6 18:44:10 2024] "
    re.compile(r"^\[\s*\d+\.\d+\]\s*"),
    re.compile(r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]\s*"),
    re.compile(r"^kernel:\s*"),
]
# python logging's "LEVEL - logger - " / "logger - LEVEL - " / "[LEVEL] " header once the time is gone
_PYLOG_HEADER = re.compile(
    r"^(?:\[?(?P<a>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\]?\s*[-:|]\s*(?:[\w.]+\s*[-:|]\s+)?"
    r"|[\w.]+\s+-\s+(?P<b>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+-\s+)"
)
_GLOG = re.compile(r"^\[?(?P<level>[IWEF])\d{3,4} \d\d:\d\d:\d\d\.\d+(?: +\d+)? (?P<srcloc>[^\]\s]+:\d+)\]\s?")
_RANK_PREFIX = re.compile(
    r"^(?:\[(?:rank|default)\d+\]:\s?|\[\d+,mpirank:\d+,[^\]]*\]<\w+>:\s?|\d+:\s(?=\S)"
    r"|\((?:\w+ )?(?:pid|rank)=[^)]*\)\s*|\S+:\d+:\d+ \[\d+\] )"
)
_KERNEL_HINT = re.compile(r"NVRM:|\bkernel:|Out of memory: Killed process|oom-kill|oom_reaper|\bmlx5_core\b|\bpcieport\b|AER:")
# Lines the launcher (torchrun agent, deepspeed launcher) writes about a worker, not the worker itself.
_LAUNCHER_LINE = re.compile(r"^\[launch\.py:\d+:\w+\]|^\[\d+\] \[launch\.py|sigkill_handler")
_NCCL_LOG = re.compile(r"^NCCL (?:WARN|INFO|ERROR)\b")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b:?")


@dataclass(frozen=True)
class FailureText:
    """One failure line, stripped of the identity and time it carried in the rule's example."""

    text: str
    kernel: bool
    glog_level: str | None = None
    glog_srcloc: str | None = None
    pylog_level: str | None = None  # the example came through python logging at this level (I/W/E/F)


def strip_identity(line: str) -> str:
    """The line without identity prefixes; uses the ingest prefix parser when it is installed."""
    line = parse_prefixes(line).text
    # What the shared parser leaves as message text but examples carry as a writer's prefix.
    for _ in range(4):
        m = _RANK_PREFIX.match(line)
        if not m:
            break
        line = line[m.end() :]
    return line


def split_example(line: str) -> FailureText:
    kernel = bool(_KERNEL_HINT.search(line))
    text = line.strip()
    level = srcloc = None
    # Own patterns first: a torch/glog header's level and source location are kept for re-rendering,
    # and the shared prefix parser would consume them.
    changed = True
    while changed:
        changed = False
        for pattern in (_RANK_PREFIX, *_LEADING_TS):
            m = pattern.match(text)
            if m and m.end() > 0:
                text, changed = text[m.end() :], True
        m = _GLOG.match(text)
        if m:
            level, srcloc = m.group("level"), m.group("srcloc")
            text, changed = text[m.end() :], True
    text = strip_identity(text)
    pylog = None
    if not kernel and (m3 := _PYLOG_HEADER.match(text)) and m3.end() < len(text):
        name = m3["a"] or m3["b"]
        pylog = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "WARN": "W", "ERROR": "E", "CRITICAL": "F"}[name]
        text = text[m3.end() :]
    return FailureText(text=text.strip(), kernel=kernel, glog_level=level, glog_srcloc=srcloc, pylog_level=pylog)


def _replace_group(text: str, rule: Rule, name: str, value: str) -> str:
    """`text` with the first match of the rule's named group `name` replaced by `value`."""
    for pattern in [*rule.extract, *rule.patterns]:
        try:
            m = re.search(pattern, text, re.IGNORECASE if rule.caseless else 0)
        except re.error:
            continue
        if m and m.groupdict().get(name) is not None:
            start, end = m.span(name)
            return text[:start] + value + text[end:]
    return text


def _blames_another_rank(text: str, rule: Rule) -> bool:
    """Whether the rule reads, from this line, a rank other than the writer's as the culprit (`blame_rank`)."""
    for pattern in [*rule.patterns, *rule.extract]:
        try:
            m = re.search(pattern, text, re.IGNORECASE if rule.caseless else 0)
        except re.error:
            continue
        if m and m.groupdict().get("blame_rank") is not None:
            return True
    return False


def _substitute_identity(text: str, rule: Rule, proc: _Proc, blamed: _Proc | None = None) -> str:
    """Put the simulated process's identity where the rule extracts rank/local_rank/gpu/pid
    (and `blamed`'s rank where it extracts the rank the line blames)."""
    values = {"rank": str(proc.rank), "local_rank": str(proc.local_rank), "pid": str(proc.pid)}
    if blamed is not None:
        values["blame_rank"] = str(blamed.rank)
    spans: list[tuple[int, int, str]] = []
    for pattern in [*rule.patterns, *rule.extract]:
        try:
            compiled = re.compile(pattern, re.IGNORECASE if rule.caseless else 0)
        except re.error:
            continue
        m = compiled.search(text)
        if not m:
            continue
        for name in compiled.groupindex:
            start, end = m.span(name)
            if start < 0:
                continue
            current = m.group(name)
            if name in values and current.isdigit():
                spans.append((start, end, values[name]))
            elif name == "gpu" and current.isdigit():
                spans.append((start, end, proc.gpu))
    spans.sort()
    out, pos = [], 0
    for start, end, value in spans:
        if start < pos:
            continue
        out.append(text[pos:start])
        out.append(value)
        pos = end
    out.append(text[pos:])
    result = "".join(out)
    if _KERNEL_HINT.search(result):
        # Kernel lines name the process and device by pid and PCI address, not by rank.
        result = re.sub(r"\bpid=\d+", f"pid={proc.pid}", result)
        result = re.sub(r"Killed process \d+", f"Killed process {proc.pid}", result)
        result = re.sub(r"\b(PCI:)?0000:[0-9a-fA-F]{2}:00\b", lambda m: f"{m[1] or ''}0000:{proc.bus}:00", result)
    return result


# --- a string a regex matches (markers given only as patterns) --------------------------------

import re._constants as _sre_c
import re._parser as _sre_parse

_CATEGORY_SAMPLE = {
    _sre_c.CATEGORY_DIGIT: "0",
    _sre_c.CATEGORY_NOT_DIGIT: "a",
    _sre_c.CATEGORY_SPACE: " ",
    _sre_c.CATEGORY_NOT_SPACE: "x",
    _sre_c.CATEGORY_WORD: "a",
    _sre_c.CATEGORY_NOT_WORD: " ",
}


def _class_sample(items: list[tuple[Any, Any]]) -> str:
    if any(op is _sre_c.NEGATE for op, _ in items):
        excluded: set[str] = set()
        for op, av in items:
            if op is _sre_c.LITERAL:
                excluded.add(chr(av))
            elif op is _sre_c.RANGE:
                excluded.update(chr(c) for c in range(av[0], min(av[1], av[0] + 512) + 1))
        return next((c for c in "x0 _-.a:/" if c not in excluded), "x")
    for op, av in items:
        if op is _sre_c.LITERAL:
            return chr(av)
        if op is _sre_c.RANGE:
            return next((c for c in "a0A" if av[0] <= ord(c) <= av[1]), chr(av[0]))
        if op is _sre_c.CATEGORY:
            return _CATEGORY_SAMPLE.get(av, "a")
    return "x"


def _tree_sample(tree: Any, groups: dict[int, str]) -> str:
    out: list[str] = []
    for op, av in tree:
        if op is _sre_c.LITERAL:
            out.append(chr(av))
        elif op is _sre_c.NOT_LITERAL:
            out.append("x" if chr(av) != "x" else "y")
        elif op is _sre_c.ANY:
            out.append("x")
        elif op is _sre_c.IN:
            out.append(_class_sample(av))
        elif op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT, _sre_c.POSSESSIVE_REPEAT):
            low, _high, sub = av
            # `\s*` between words reads better as one space than as nothing.
            spacer = len(sub) == 1 and sub[0][0] is _sre_c.IN and any(
                o is _sre_c.CATEGORY and a is _sre_c.CATEGORY_SPACE for o, a in sub[0][1]
            )
            count = max(low, 1) if spacer else low
            out.append("".join(_tree_sample(sub, groups) for _ in range(count)))
        elif op is _sre_c.SUBPATTERN:
            group, _add, _del, sub = av
            text = _tree_sample(sub, groups)
            if group is not None:
                groups[group] = text
            out.append(text)
        elif op is _sre_c.ATOMIC_GROUP:
            out.append(_tree_sample(av, groups))
        elif op is _sre_c.BRANCH:
            out.append(_tree_sample(av[1][0], groups))
        elif op is _sre_c.GROUPREF:
            out.append(groups.get(av, ""))
        elif op is _sre_c.CATEGORY:
            out.append(_CATEGORY_SAMPLE.get(av, "a"))
        # AT, ASSERT, ASSERT_NOT consume nothing; the caller checks the result.
    return "".join(out)


def sample_matching(pattern: str, *, caseless: bool = False) -> str | None:
    """A short string `pattern` matches (checked with Python re), or None when none is found."""
    try:
        text = _tree_sample(_sre_parse.parse(pattern), {})
    except (re.error, RecursionError, TypeError, ValueError):
        return None
    return text if re.search(pattern, text, re.IGNORECASE if caseless else 0) else None


# --- choosing the rule --------------------------------------------------------------------------


def _signature_rules(ruleset: RuleSet, cls: str) -> list[Rule]:
    rules = [r for r in ruleset.signatures() if r.class_ == cls]
    # Plain pattern rules first: they need nothing else from the scenario to fire.
    return sorted(rules, key=lambda r: (r.metric is not None, r.absence is not None, r.sequence is not None, r.id))


_MATCHERS: dict[str, Any] = {}


@functools.lru_cache(maxsize=1)
def _default_ruleset() -> RuleSet:
    # Loading validates every pattern with hyperscan (seconds); a process simulating many jobs loads once.
    return load_ruleset()


def _matcher_for(ruleset: RuleSet) -> Any:
    from correlator.diagnosis.matcher import Matcher

    matcher = _MATCHERS.get(ruleset.version)
    if matcher is None:
        matcher = _MATCHERS[ruleset.version] = Matcher(ruleset)
    return matcher


def _best_class(ruleset: RuleSet, text: str) -> str | None:
    """The class of the most confident signature rule matching `text` ('' when classes tie at the top)."""
    matcher = _matcher_for(ruleset)
    best: dict[float, set[str]] = defaultdict(set)
    for hit in matcher.scan_buffer(text.encode("utf-8")):
        rule = matcher.rules[hit.rule_index]
        if hit.role == "main" and rule.kind == "signature" and rule.class_:
            best[rule.confidence].add(rule.class_)
    if not best:
        return None
    top = best[max(best)]
    return next(iter(top)) if len(top) == 1 else ""


def _rule_matches(ruleset: RuleSet, rule: Rule, text: str) -> bool:
    matcher = _matcher_for(ruleset)
    index = next(i for i, lr in enumerate(ruleset.rules) if lr.rule.id == rule.id)
    return bool(matcher.matches(index, text))


# --- the scenario ----------------------------------------------------------------------------------


class _Scenario:
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
        per_host = world_size // hosts
        width = max(2, len(str(hosts - 1)))
        self.hosts: list[_Host] = []
        for h in range(hosts):
            skew = 0.0 if skew_max_s <= 0 else round(self.rng.uniform(-skew_max_s, skew_max_s), 3)
            agent_pid = self.rng.randint(2_000, 90_000)
            host = _Host(name=f"node{h:0{width}d}", index=h, skew=skew, agent_pid=agent_pid)
            for lr in range(per_host):
                bus = _BUS_IDS[lr] if lr < len(_BUS_IDS) else f"{0x10 + lr * 0x11 & 0xff:02x}"
                host.procs.append(_Proc(h * per_host + lr, host.name, h, lr, agent_pid + 24 + lr, bus))
            self.hosts.append(host)
        self.procs = [p for h in self.hosts for p in h.procs]
        if initiator_rank is not None and not 0 <= initiator_rank < world_size:
            raise SimulateError(f"--initiator-rank {initiator_rank} is outside 0..{world_size - 1}")
        self.initiator = self.procs[initiator_rank if initiator_rank is not None else self.rng.randrange(world_size)]
        self.mode: Mode = (
            "all" if cls in ALL_RANK_CLASSES
            else "victims" if cls in VICTIM_CLASSES
            else "continue" if cls in CONTINUE_CLASSES
            else "hang" if cls in HANG_CLASSES
            else "crash"
        )  # fmt: skip
        self.lines: list[_Line] = []
        self.rule: Rule | None = None
        self.failure_lines: list[str] = []
        self.failure_t: float | None = None
        self.timeout_s = 600.0
        self.seq_base = self.rng.randint(200, 4000)
        self.op = self.rng.choice(["ALLREDUCE", "ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE"])
        self.numel = self.rng.choice([466119168, 160672064, 25690112, 1048576])

    # --- helpers ---

    def emit(self, t: float, proc: _Proc | None, style: Style, body: str, **kw: Any) -> _Line:
        host = proc.host if proc is not None else kw.pop("host")
        line = _Line(t=t, host=host, style=style, body=body, proc=proc, **kw)
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

    def chatter(self, start: float, steps: int, first_step: int, *, skip: Callable[[_Proc, int], bool] | None = None,
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
        self, metric: tuple[Rule, FailureText, str], proc: _Proc, *, normal: bool, value: str | None = None,
        step: int | None = None,
    ) -> str:
        """The metric rule's example line for `proc`: a normal value, `value`, or the example's own (normal=False)."""
        rule, failure, field_name = metric
        text = _substitute_identity(failure.text, rule, proc)
        if step is not None:
            text = _replace_group(text, rule, "step", str(step))
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
        rules = _signature_rules(self.ruleset, self.cls)
        if self.demo and self.cls == DEMO_CLASS:
            text = DEMO_XID_TEXT.format(bus=self.initiator.bus, pid=self.initiator.pid)
            rule = next((r for r in rules if _rule_matches(self.ruleset, r, text)), rules[0] if rules else None)
            return rule, [FailureText(text=text, kernel=True)]
        if self.mode == "hang":
            # A straggler prints no error: it starts a step like everyone (the absence rule's start marker,
            # when the library has one) and then never logs progress again.
            for rule in rules:
                if rule.absence is None:
                    continue
                for example in rule.examples.match:
                    marker = split_example(example)
                    if marker.text and _rule_matches(self.ruleset, rule, marker.text):
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
                if failure.text and _rule_matches(self.ruleset, rule, failure.text):
                    pairs.append((rule, failure))
        if not pairs:
            # The rules need context their prefix-less text lacks: ship an example as written.
            rule = candidates[self.rng.randrange(len(candidates))]
            example = rule.examples.match[0]
            return rule, [FailureText(text=strip_identity(example), kernel=bool(_KERNEL_HINT.search(example)))]
        # An example that a more confident rule of another class also matches stands for that class, not
        # this one; such overlaps are the rule library's to resolve, so prefer the examples without them.
        clear = [(r, f) for r, f in pairs if _best_class(self.ruleset, f.text) in (None, self.cls)]
        chosen = clear or pairs
        rule, failure = chosen[self.rng.randrange(len(chosen))]
        return rule, [failure]

    def failure_lines_for(self, t: float, proc: _Proc, rule: Rule | None, failures: Sequence[FailureText]) -> float:
        """Emit the failure on `proc` starting at `t`; returns the time of the last line."""
        for failure in failures:
            blamed = None
            if rule is not None and _blames_another_rank(failure.text, rule) and self.world_size > 1:
                # "Rank 0 is running X, but Rank 37 is running Y": a peer writes the line that names the culprit.
                blamed, proc = proc, self.procs[0 if proc.rank != 0 else 1]
            text = _substitute_identity(failure.text, rule, proc, blamed) if rule is not None else failure.text
            if rule is not None and not _rule_matches(self.ruleset, rule, text):
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
            if _LAUNCHER_LINE.search(text):
                text = re.sub(r"--local_rank=\d+", f"--local_rank={proc.local_rank}", text)
                text = re.sub(r"local_rank: \d+", f"local_rank: {proc.local_rank}", text)
                self.emit(t, None, "agent", text, host=proc.host)
            elif _NCCL_LOG.match(text):
                self.emit(t, proc, "nccl_raw", text, thread=proc.pid + 311)
            elif failure.glog_level:
                self.emit(t, proc, "rank_glog", text, level=failure.glog_level, srcloc=failure.glog_srcloc or "")
            elif failure.pylog_level:
                self.emit(t, proc, "rank_pylog", text, level=failure.pylog_level)
            elif _EXCEPTION_LINE.match(text):
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

    def sequence_marker(self, t: float, proc: _Proc, rule: Rule) -> None:
        if rule.sequence is None:
            return
        for pattern in rule.sequence.after:
            text = sample_matching(pattern, caseless=rule.caseless)
            if text:
                self.emit(t, proc, "rank_pylog", text)
                return

    # --- collateral ---

    def watchdog(self, t: float, p: _Proc, seq: int) -> None:
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

    def remote_error(self, t: float, p: _Proc) -> None:
        pg = f"PG ID 0 PG GUID 0(default_pg) Rank {p.rank}"
        self.emit(t, p, "rank_glog",
                  f"[{pg}] Process group watchdog thread terminated with exception: NCCL error: remote process exited "
                  f"or there was a network error, NCCL version {_NCCL_VERSION}",
                  level="E", srcloc="ProcessGroupNCCL.cpp:1609", thread=p.pid + 310)

    def teardown(self, host: _Host, t: float, failed: list[tuple[_Proc, int]], *, sigterm: Sequence[_Proc]) -> None:
        """torchelastic on `host`: SIGTERM to the survivors, then ChildFailedError naming the first failure."""
        api = "torch/distributed/elastic/multiprocessing/api.py"
        for p in sigterm:
            self.emit(t, None, "agent_glog", f"Sending process {p.pid} closing signal SIGTERM",
                      host=host.name, level="W", srcloc=f"{api}:897", thread=host.agent_pid, stream="stderr")
            t += 0.0002 + self.jitter(0.002)
        first, exitcode = failed[0]
        t += 0.3 + self.jitter(0.3)
        self.emit(t, None, "agent_glog",
                  f"failed (exitcode: {exitcode}) local_rank: {first.local_rank} (pid: {first.pid}) of binary: /usr/bin/python3",
                  host=host.name, level="E", srcloc=f"{api}:869", thread=host.agent_pid)
        when = _dt(t + host.skew).strftime("%Y-%m-%d_%H:%M:%S")
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
            field_name = metric[2]
            raw = re.search(r"(?i)nan|inf", failures[0].text)
            value = None if raw else f"{(rule.metric.spike_ratio if rule and rule.metric else 10) * 40:.4f}"
            body = self.metric_line(metric, init, normal=value is not None, value=value, step=last_step + 1)
            self.emit(fail_t, init, "rank_pylog", body, level="W")
            self.failure_lines.append(body)
            self.failure_t = fail_t
            del field_name
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
        host_down: dict[int, tuple[float, _Proc, int]] = {}
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


# --- writing ---------------------------------------------------------------------------------------


def _pod(job_id: str, host: _Host) -> str:
    return f"{job_id}-worker-{host.index}"


def _message(fmt: Format, sc: _Scenario, line: _Line, text: str, read_t: float, offset: int) -> dict[str, Any]:
    host = next(h for h in sc.hosts if h.name == line.host)
    local_read = read_t + host.skew
    pod = _pod(sc.job_id, host)
    container_file = f"/var/log/pods/training_{pod}_5f0c2a1e-{host.index:04d}/pytorch/0.log"
    kern = line.style == "kern"
    labels = {
        "training.kubeflow.org/job-name": sc.job_id,
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": str(host.index),
    }
    if fmt == "fluentbit":
        if kern:
            # tail of the node's kern.log, with the node name added by a record_modifier filter
            return {"@timestamp": round(local_read, 6), "log": text, "file": "/var/log/kern.log", "hostname": host.name}
        return {
            "@timestamp": round(local_read, 6),
            "time": _rfc3339(_dt(local_read)).replace("+00:00", "Z"),
            "stream": line.stream,
            "log": text,
            "kubernetes": {
                "pod_name": pod,
                "namespace_name": "training",
                "host": host.name,
                "container_name": "pytorch",
                "labels": labels,
            },
        }
    if fmt == "vector":
        ts = _dt(local_read).strftime("%Y-%m-%dT%H:%M:%S.") + f"{_dt(local_read).microsecond:06d}Z"
        if kern:
            return {"message": text, "timestamp": ts, "host": host.name, "file": "/var/log/kern.log", "source_type": "file"}
        return {
            "message": text,
            "timestamp": ts,
            "stream": line.stream,
            "source_type": "kubernetes_logs",
            "file": container_file,
            "kubernetes": {
                "pod_name": pod,
                "pod_namespace": "training",
                "pod_node_name": host.name,
                "container_name": "pytorch",
                "pod_labels": labels,
            },
        }
    if fmt == "filebeat":
        d = _dt(local_read)
        path = "/var/log/kern.log" if kern else f"/var/log/training/{sc.job_id}/{host.name}.log"
        return {
            "@timestamp": d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z",
            "message": text,
            "host": {"name": host.name},
            "log": {"file": {"path": path}, "offset": offset},
            "input": {"type": "filestream"},
            "agent": {"type": "filebeat", "version": "8.15.0"},
            "ecs": {"version": "8.0.0"},
        }
    raise AssertionError(fmt)


def _write(sc: _Scenario, fmt: Format, root: Path) -> list[str]:
    """Write the logs under root/<job id>/; returns their paths relative to root.

    The folder is named after the job so that `rootrank diagnose root/<job id>` names the job right.
    """
    job_dir = sc.job_id
    out = root / job_dir
    out.mkdir(parents=True, exist_ok=True)
    skew = {h.name: h.skew for h in sc.hosts}
    # File order = when the line reached the file (late lines were buffered); ties keep emit order.
    ordered = sorted(enumerate(sc.lines), key=lambda il: (il[1].t + il[1].delay, il[0]))
    files: list[str] = []
    if fmt == "plain":
        per_file: dict[str, list[str]] = {}
        for _, line in ordered:
            # A folder per host names the host for every file in it (the kernel log has no rank prefixes).
            name = f"{line.host}/kern.log" if line.style == "kern" else f"{line.host}/train.log"
            per_file.setdefault(name, []).append(_render(line, skew[line.host]))
        for name in sorted(per_file):
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text("\n".join(per_file[name]) + "\n", encoding="utf-8")
            files.append(f"{job_dir}/{name}")
        return files
    if fmt == "rsyslog":
        rows: list[tuple[float, int, str]] = []
        for i, line in ordered:
            read_t = line.t + line.delay + 0.002
            local = _dt(read_t + skew[line.host])
            text = _render(line, skew[line.host])
            if line.style == "kern":
                rows.append((read_t + 0.05, i, f"{_rfc3339(local)} {line.host} kernel: {line.body}"))
            else:
                rows.append((read_t + 0.05, i, f"{_rfc3339(local)} {line.host} train: {text}"))
        rows.sort()
        (out / "rsyslog.log").write_text("\n".join(r[2] for r in rows) + "\n", encoding="utf-8")
        return [f"{job_dir}/rsyslog.log"]
    messages: list[tuple[float, int, dict[str, Any]]] = []
    offsets: dict[str, int] = {}
    for i, line in ordered:
        read_t = line.t + line.delay + sc.rng.uniform(0.01, 0.25)
        text = _render(line, skew[line.host])
        key = f"{line.host}:{line.style == 'kern'}"
        offset = offsets.get(key, 0)
        offsets[key] = offset + len(text.encode("utf-8")) + 1
        arrival = read_t + sc.rng.uniform(0.005, 0.05)
        messages.append((arrival, i, _message(fmt, sc, line, text, read_t, offset)))
    messages.sort(key=lambda m: (m[0], m[1]))
    with (out / "messages.jsonl").open("w", encoding="utf-8") as fh:
        for _, _, msg in messages:
            fh.write(json.dumps(msg, ensure_ascii=False, separators=(",", ":")) + "\n")
    return [f"{job_dir}/messages.jsonl"]


def simulate(
    cls: str,
    *,
    world_size: int = 64,
    hosts: int = 8,
    seed: int = 0,
    skew_max_s: float = 3.0,
    fmt: str = "plain",
    noise_lines: int = 24,
    late_lines: int = 0,
    out: Path,
    initiator_rank: int | None = None,
    ruleset: RuleSet | None = None,
    demo: bool = False,
    start: datetime | None = None,
) -> Truth:
    """Write the logs of one simulated failing job into `out` and return (and write) its truth.

    noise_lines: training-chatter lines per rank before the failure (one per step).
    late_lines: lines (among those carrying a timestamp) that reach the file/forwarder 5-60 s late.
    demo: the bundled demo scenario's exact wording (Xid 79 "fallen off the bus").
    start: when the job started (default: 18:30 UTC yesterday). Year-less timestamps (glog, torch)
      are read as "the most recent such date", so a start in the recent past keeps every line's
      year unambiguous; pass a fixed start for byte-identical output across days.

    Layout (JOB = truth.job_id, e.g. sim-cuda-oom-3): out/JOB/<host>/train.log (+ out/JOB/<host>/kern.log)
    for plain, out/JOB/messages.jsonl for the JSON forwarders, out/JOB/rsyslog.log for rsyslog;
    out/truth.json beside the job's folder, so `rootrank diagnose out/JOB` reads logs only.
    """
    if fmt not in FORMATS:
        raise SimulateError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    rs = ruleset or _default_ruleset()
    sc = _Scenario(
        cls, world_size=world_size, hosts=hosts, seed=seed, skew_max_s=skew_max_s, noise_lines=noise_lines,
        late_lines=late_lines, initiator_rank=initiator_rank, ruleset=rs, demo=demo,
        start=start or default_start(),
    )
    sc.build()
    sc.make_late()
    out = Path(out)
    files = _write(sc, fmt, out)  # type: ignore[arg-type]
    init = sc.initiator
    initiator = (
        TruthInitiator(rank=None, all=True)
        if sc.mode == "all"
        else TruthInitiator(rank=None, unknown=True)
        if sc.mode == "victims"
        else TruthInitiator(rank=init.rank, host=init.host, local_rank=init.local_rank, pid=init.pid, gpu=init.gpu)
    )
    truth = Truth.model_validate(
        {
            "class": cls,
            "initiator": initiator,
            "world_size": world_size,
            "job_id": sc.job_id,
            "seed": seed,
            "skew_s": {h.name: h.skew for h in sc.hosts},
            "hosts": [h.name for h in sc.hosts],
            "format": fmt,
            "mode": sc.mode,
            "rule": sc.rule.id if sc.rule is not None else None,
            "failure_lines": sc.failure_lines[:8],
            "failure_ts": _rfc3339(_dt(sc.failure_t)).replace("+00:00", "Z") if sc.failure_t is not None else None,
            "files": files,
        }
    )
    (out / "truth.json").write_text(json.dumps(truth.to_json_dict(), indent=2) + "\n", encoding="utf-8")
    return truth


def default_start(now: datetime | None = None) -> datetime:
    """18:30 UTC the day before `now`: recent, in the past, and the same for a whole day."""
    now = now or datetime.now(UTC)
    return (now - timedelta(days=1)).replace(hour=18, minute=30, second=0, microsecond=0)


def simulate_demo(out: Path, *, fmt: str = "plain", seed: int = 0, start: datetime | None = None) -> Truth:
    """The bundled demo: 64 ranks on 8 hosts, the GPU of rank 37 falls off the bus (Xid 79)."""
    return simulate(
        DEMO_CLASS, world_size=64, hosts=8, seed=seed, fmt=fmt, out=out, initiator_rank=DEMO_RANK, demo=True, start=start
    )


def read_truth(folder: Path) -> Truth:
    return Truth.model_validate_json((Path(folder) / "truth.json").read_text(encoding="utf-8"))


def logs_dir(folder: Path, truth: Truth) -> Path:
    """The folder holding the simulated job's logs (what `rootrank diagnose` is pointed at)."""
    return Path(folder) / truth.job_id


def log_paths(folder: Path, truth: Truth) -> list[str]:
    return [str(Path(folder) / name) for name in truth.files]
