"""Scenarios as data: `lab/scenarios/*.yaml` validated into frozen models, and the labels they imply.

Nothing here imports torch: `make test` checks the scenarios, their coverage and their labels
without running a job. Errors read `file:line: scenario NAME: field: what`, the project's style.

A label comes from *where the fault was injected* (the scenario's data, plus the pid the injected
process had, read from the job's side files at run time), never from reading the job's logs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

LAB = Path(__file__).resolve().parent
SCENARIOS_DIR = LAB / "scenarios"
CLASSES_FILE = LAB.parent / "rules" / "classes.yaml"

# Point 3 of issue #26, item by item: every item is covered by at least one scenario (a unit test checks).
COVERAGE: dict[str, str] = {
    "bad_record": "an uncaught exception from a bad record in one rank's shard",
    "sigkill": "SIGKILL on one rank",
    "sigsegv": "SIGSEGV on one rank",
    "sigabrt": "SIGABRT on one rank",
    "sigbus_mmap": "SIGBUS: an mmap'd shard truncated under its reader",
    "dataloader_worker_killed": "a DataLoader worker killed",
    "ckpt_torch_save": "a truncated or corrupted torch.save checkpoint read by one rank",
    "ckpt_safetensors": "a truncated safetensors checkpoint read by one rank",
    "ckpt_rng_zero_byte": "a zero-byte per-rank RNG state file",
    "state_dict_mismatch": "state-dict key/shape mismatches",
    "hang_blocked_io": "a hang in one rank (blocked I/O: a FIFO with no writer)",
    "hang_subgroup": "a hang inside one process subgroup (new_group, TP x DP)",
    "collective_mismatch": "a collective mismatch",
    "rendezvous_misconfig": "a rendezvous misconfiguration on one host",
    "shm_exhausted": "/dev/shm exhaustion",
    "nan_from_data": "a NaN/Inf from one rank's data",
    "grad_norm_spike": "a one-rank grad-norm spike (bit flip) the job survives",
    "restarts": "--max-restarts with a different failure in each attempt",
    "trap_transient_recovered": "trap: a transient error retried and recovered (no incident)",
    "trap_warning_heavy_clean": "trap: a warning-heavy clean run (no incident)",
    "trap_collateral_first": "trap: a collateral connection error printed before the initiator's traceback",
}

FaultKind = Literal[
    "bad_record",            # a line of the rank's shard that its parser rejects (variant: json, keyerror, valueerror, token)
    "nan_input",             # a record whose features are NaN / overflow to inf (variant: nan, inf)
    "sigkill", "sigsegv", "sigabrt",
    "sigbus_mmap",           # the rank's mmap'd binary shard truncated under it
    "dataloader_worker_kill",
    "ckpt_truncated",        # variant: torch, safetensors
    "ckpt_corrupt",          # variant: zip (central directory), pickle
    "ckpt_rng_empty",
    "state_dict",            # variant: keys, shape; no rank = every rank's checkpoint
    "hang_fifo",             # a data part of the rank is a FIFO nobody writes
    "collective_mismatch",   # a label that makes the rank's metric all_reduce a different shape
    "grad_bitflip",          # an exponent bit of one gradient element flipped before the all_reduce
    "error_then_teardown",   # a bad record whose handler frees the process group, saves, then raises
    "rdzv_wrong_port",       # host: static rendezvous with a mistyped --master-port
    "rdzv_wrong_endpoint",   # host: c10d rendezvous with a mistyped --rdzv-endpoint port
    "shm_small",             # host: a 1 MiB /dev/shm under DataLoader workers
    "transient_reset",       # trap: the rank's first data request is reset, then retried
    "clean",                 # trap: nothing is injected
]
HOST_KINDS = {"rdzv_wrong_port", "rdzv_wrong_endpoint", "shm_small"}
UNTARGETED_KINDS = {"clean"}
Launcher = Literal["torchrun", "torchrun-logdir", "spawn", "accelerate", "hf-trainer", "lightning"]
Collect = Literal["per-host", "srun", "pdsh", "console"]
LogStyle = Literal["logging-all", "logging-rank0", "logging-ranked", "print-rank0", "print-all", "tqdm"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def host_name(i: int) -> str:
    return f"node{i + 1:02d}"


def known_classes() -> set[str]:
    data = yaml.safe_load(CLASSES_FILE.read_text())
    return {c["slug"] for c in data["classes"]}


class Fault(BaseModel):
    """One injected fault: what, in which rank (or host), at which training step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FaultKind
    rank: int | None = Field(None, ge=0)
    host: str | None = None
    step: int = Field(0, ge=0)
    variant: str | None = None

    @model_validator(mode="after")
    def _target(self) -> Fault:
        if self.kind in HOST_KINDS:
            if self.host is None or self.rank is not None:
                raise ValueError(f"a {self.kind} fault names a host (host: nodeNN), not a rank")
        elif self.host is not None:
            raise ValueError(f"a {self.kind} fault is injected in a rank, not a host")
        elif self.rank is None and not (self.kind in UNTARGETED_KINDS or self.kind == "state_dict"):
            raise ValueError(f"a {self.kind} fault needs the rank it is injected in")
        return self


class Label(BaseModel):
    """The truth the scenario's author states: the class, honest alternatives, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    class_: str = Field(alias="class")
    also_ok: tuple[str, ...] = ()
    initiator: Literal["fault", "all", "unknown"] = "fault"
    why: str = Field(min_length=10)


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    covers: tuple[str, ...] = Field(min_length=1)
    about: str = Field(min_length=10)
    hosts: int = Field(1, ge=1, le=4)
    procs: int = Field(ge=1, le=16)
    launcher: Launcher
    rdzv: Literal["static", "c10d"] = "static"
    collect: Collect = "per-host"
    clocks: dict[str, float] = {}
    logs: LogStyle = "logging-all"
    steps: int = Field(30, ge=5, le=200)
    batch: int = Field(8, ge=2, le=64)
    env: dict[str, str] = {}
    job: dict[str, Any] = {}
    fault: Fault | None = None
    attempts: tuple[Fault, ...] = ()
    max_restarts: int = Field(0, ge=0, le=3)
    pg_timeout: int = Field(15, ge=5, le=60)
    expect: Literal["fail", "ok"] = "fail"
    fired: tuple[str, ...] = Field(min_length=1)
    fired_order: tuple[str, ...] = ()  # patterns whose first lines must come in this order in one file
    label: Label
    file: str = ""
    line: int = 0

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("lower-case letters, digits and '-' only")
        return v

    @field_validator("covers")
    @classmethod
    def _covers(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [c for c in v if c not in COVERAGE]
        if unknown:
            raise ValueError(f"unknown coverage item(s) {unknown}; known: {sorted(COVERAGE)}")
        return v

    @field_validator("fired", "fired_order")
    @classmethod
    def _fired(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in v:
            re.compile(pattern)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if (self.fault is None) == (not self.attempts):
            raise ValueError("give either `fault` (one attempt) or `attempts` (one fault per attempt)")
        if self.attempts and len(self.attempts) != self.max_restarts + 1:
            raise ValueError(f"{len(self.attempts)} attempts need max_restarts: {len(self.attempts) - 1}")
        if self.fault is not None and self.max_restarts:
            raise ValueError("a job with restarts lists its faults under `attempts`")
        if not 2 <= self.world <= 16:
            raise ValueError(f"world size {self.world} (hosts x procs) must be 2-16")
        if self.launcher in ("spawn", "lightning") and self.hosts != 1:
            raise ValueError(f"the {self.launcher} launcher runs on one host")
        if self.collect == "console" and self.hosts != 1:
            raise ValueError("collect: console is one host's terminal; use per-host, srun or pdsh")
        if self.collect == "srun" and self.launcher in ("spawn", "lightning"):
            raise ValueError("srun output needs one launcher per host (torchrun, accelerate)")
        if self.max_restarts and self.launcher not in ("torchrun", "torchrun-logdir"):
            raise ValueError("restarts are torchrun's (--max-restarts)")
        if self.max_restarts and self.hosts > 1 and self.rdzv != "c10d":
            raise ValueError("restarts across hosts need the c10d rendezvous")
        names = set(self.host_names)
        for host in self.clocks:
            if host not in names:
                raise ValueError(f"clocks: no host {host!r} (hosts are {sorted(names)})")
        for f in self.faults:
            if f.rank is not None and f.rank >= self.world:
                raise ValueError(f"fault rank {f.rank} outside the world of {self.world}")
            if f.host is not None and f.host not in names:
                raise ValueError(f"fault host {f.host!r} not one of {sorted(names)}")
        if self.label.class_ == "none":
            if self.expect != "ok" or self.label.initiator != "unknown":
                raise ValueError("a `none` label is a job that ends well (expect: ok, initiator: unknown)")
        elif self.label.initiator == "fault" and self.last_fault.kind in UNTARGETED_KINDS:
            raise ValueError("initiator: fault needs a fault injected in a rank or host")
        if self.label.initiator == "fault" and self.last_fault.rank is None and self.last_fault.host is None:
            raise ValueError("the last attempt's fault has no rank or host: use initiator: all")
        return self

    # --- derived facts ---------------------------------------------------------------------------

    @property
    def world(self) -> int:
        return self.hosts * self.procs

    @property
    def host_names(self) -> list[str]:
        return [host_name(i) for i in range(self.hosts)]

    @property
    def faults(self) -> tuple[Fault, ...]:
        return (self.fault,) if self.fault is not None else self.attempts

    @property
    def last_fault(self) -> Fault:
        return self.faults[-1]

    @property
    def skewed(self) -> bool:
        return any(abs(v) >= 0.5 for v in self.clocks.values())

    def static_host_of(self, rank: int) -> str | None:
        """The host of a global rank when the launch fixes it (static rendezvous, or one host)."""
        if self.hosts == 1:
            return host_name(0)
        if self.rdzv == "static":
            return host_name(rank // self.procs)
        return None

    def ranks_on(self, host: str) -> list[int] | None:
        if self.hosts == 1:
            return list(range(self.world))
        if self.rdzv == "static":
            i = self.host_names.index(host)
            return list(range(i * self.procs, (i + 1) * self.procs))
        return None


def derive_initiator(s: Scenario, processes: dict[int, dict[str, Any]] | None = None) -> str:
    """The labels.tsv initiator of a scenario (see ../shared/corpus/README.md for the format).

    A fault in one rank: `rank=N`, with `local_rank=N` when the job has one host (the same process) and
    `host=H` when that host runs no other rank of the job: each term alone names the right process. (The
    pid is not a term: a diagnosis that names the right pid under the wrong rank sends the reader to the
    wrong rank.) A fault in a host: `host=H` and the ranks that ran there (any of them names the right
    machine); a rendezvous fault only `host=H` (no worker ever started there). `all` and `unknown` as the
    label says. `processes` maps a rank to its side-file record ({pid, host, local_rank}) in the last
    attempt: it gives the host of a rank, and the ranks of a host, when the c10d rendezvous chose them.
    """
    if s.label.initiator != "fault":
        return s.label.initiator
    f = s.last_fault
    terms: list[str] = []
    if f.host is not None:
        terms.append(f"host={f.host}")
        if f.kind.startswith("rdzv"):
            return "&".join(terms)
        ranks = s.ranks_on(f.host)
        if ranks is None and processes:
            ranks = sorted(r for r, p in processes.items() if p.get("host") == f.host)
        terms += [f"rank={r}" for r in ranks or []]
        return "&".join(terms)
    assert f.rank is not None
    terms.append(f"rank={f.rank}")
    proc = (processes or {}).get(f.rank) or {}
    if s.hosts == 1:
        terms.append(f"local_rank={f.rank}")
    host = proc.get("host") or s.static_host_of(f.rank)
    if host is not None and s.procs == 1:
        terms.append(f"host={host}")
    return "&".join(terms)


def label_row(s: Scenario, processes: dict[int, dict[str, Any]] | None = None) -> dict[str, str]:
    """One labels.tsv row (the corpus's columns; the note goes in source_url)."""
    note = f"lab:{s.name} ({','.join(s.covers)}) {s.label.why}"
    return {
        "file": s.name,
        "class": s.label.class_,
        "also_ok": ",".join(s.label.also_ok),
        "initiator": derive_initiator(s, processes),
        "strength": "strong",
        "multi_rank": "yes",
        "source_url": " ".join(note.split()),
    }


LABEL_COLUMNS = ("file", "class", "also_ok", "initiator", "strength", "multi_rank", "source_url")


# --- loading --------------------------------------------------------------------------------------

class ScenarioError(ValueError):
    """A scenario file that does not validate; the message is `file:line: what`."""


class _LineLoader(yaml.SafeLoader):
    """A YAML loader that remembers the line of every mapping (as the key `__line__`)."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _strip_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_lines(v) for k, v in value.items() if k != "__line__"}
    if isinstance(value, list):
        return [_strip_lines(v) for v in value]
    return value


def _line_of(raw: dict[str, Any], loc: tuple[Any, ...]) -> int:
    """The line of the deepest mapping on an error's path."""
    line = int(raw.get("__line__", 0))
    node: Any = raw
    for key in loc:
        in_dict = isinstance(node, dict) and key in node
        in_list = isinstance(node, list) and isinstance(key, int) and key < len(node)
        if in_dict or in_list:
            node = node[key]
        else:
            break
        if isinstance(node, dict) and "__line__" in node:
            line = int(node["__line__"])
    return line


def load_file(path: Path) -> list[Scenario]:
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_LineLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        raise ScenarioError(f"{path}:{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), list):
        raise ScenarioError(f"{path}:1: a scenario file is a mapping with a `scenarios:` list")
    classes = known_classes()
    out: list[Scenario] = []
    for raw in doc["scenarios"]:
        if not isinstance(raw, dict):
            raise ScenarioError(f"{path}:{doc.get('__line__', 1)}: each scenario is a mapping")
        line = int(raw.get("__line__", 0))
        name = raw.get("name", "?")
        data = _strip_lines(raw)
        data.update(file=str(path), line=line)
        try:
            scenario = Scenario.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "scenario"
            msg = err["msg"].removeprefix("Value error, ")
            raise ScenarioError(f"{path}:{_line_of(raw, tuple(err['loc']))}: scenario {name}: {where}: {msg}") from None
        for slug in (scenario.label.class_, *scenario.label.also_ok):
            if slug != "none" and slug not in classes:
                lab_line = _line_of(raw, ("label",))
                raise ScenarioError(f"{path}:{lab_line}: scenario {name}: label: unknown class {slug!r} "
                                    f"(see rules/classes.yaml)")
        out.append(scenario)
    return out


def load_all(directory: Path = SCENARIOS_DIR) -> list[Scenario]:
    scenarios: list[Scenario] = []
    seen: dict[str, Scenario] = {}
    for path in sorted(directory.glob("*.yaml")):
        for s in load_file(path):
            if s.name in seen:
                raise ScenarioError(f"{path}:{s.line}: scenario {s.name}: name already used at "
                                    f"{seen[s.name].file}:{seen[s.name].line}")
            seen[s.name] = s
            scenarios.append(s)
    return scenarios


def select(scenarios: list[Scenario], only: str | None) -> list[Scenario]:
    """`--only a,b` (names, or coverage items: every scenario that covers one)."""
    if not only:
        return scenarios
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    names = {s.name for s in scenarios}
    unknown = [w for w in wanted if w not in names and w not in COVERAGE]
    if unknown:
        raise ScenarioError(f"no scenario or coverage item named {', '.join(unknown)}")
    return [s for s in scenarios if s.name in wanted or any(c in wanted for c in s.covers)]
