"""A failure class's story: what the failing process prints, how it dies, and what the truth accepts.

Each class of rules/classes.yaml has one story, registered with `@story(...)` in stories_*.py. A story's
`write(sc, t, proc)` prints the failure on `proc` from true time `t` through the scenario's emitters (in
the libraries' own formats) and returns an `Outcome`; the scenario then plays the consequences on the
other ranks (watchdog timeouts, aborts, torchelastic's teardown) from that outcome.

What a story may use of the scenario is the `Stage` below, not the `Scenario` class: the scenario imports
the stories (to register them) and this module, so the dependency runs one way (scenario -> stories ->
story), and a story cannot reach into the phases that play the rest of the job.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    from correlator.tooling.simulate.job import Host, Process
    from correlator.tooling.simulate.upstream import Env

T = TypeVar("T")

# crash: one process fails, the others are its victims; all: every rank fails the same way (a bad file or
# config); continue: the job goes on after the event; hang: one rank stops without an error line;
# mismatch: one rank issues another collective; victims: only consequences are logged;
# serve: an inference server's story (no training loop).
# launch / launch_all: the failure comes before training starts (no NCCL init, no steps).
Mode = Literal["crash", "all", "continue", "hang", "mismatch", "victims", "serve", "serve_all", "launch", "launch_all"]


@dataclass
class Outcome:
    headline: str  # the line that says what failed (truth.failure_lines)
    exitcode: int = 1  # what the launcher sees (negative: killed by that signal)
    immediate: bool = False  # the process is gone at once (a signal): its host is torn down right away
    story: str = ""  # which variant of the class's story was told
    host_level: bool = False  # a host's launcher failed, not a rank (the truth names the host only)


class Stage(Protocol):
    """The scenario as a story sees it: the job's layout and software, its collective in flight, the
    emitters that write a line in one library's format (each returns the time after its lines), and the
    per-job choices."""

    rng: random.Random
    env: Env
    hosts: list[Host]
    procs: list[Process]
    world_size: int
    demo: bool  # `rootrank simulate`'s demo job: the story tells its fixed variant
    seq: int  # the collective in flight when the job fails: its SeqNum, OpType and element count
    op: str
    numel: int
    step: int  # the training step reached
    odd_collective: tuple[str, int] | None  # set by a mismatch story: the initiator's own (OpType, Numel)
    desync_report: bool  # set by a story whose rank 0 prints c10d's desync report

    def rank(self, t: float, p: Process, lines: Sequence[str]) -> float: ...
    def pylog(self, t: float, p: Process, body: str, level: str = "E", logger: str = "train") -> float: ...
    def glog(self, t: float, p: Process, level: str, srcloc: str, body: str) -> float: ...
    def ds(self, t: float, p: Process, level: str, srcloc: str, body: str) -> float: ...
    def nccl(self, t: float, p: Process, body: str, level: str = "WARN") -> float: ...
    def kern(self, t: float, host: str, body: str) -> float: ...
    def vllm(self, t: float, p: Process | None, level: str, srcloc: str, body: str,
             host: str | None = None) -> float: ...
    def trtllm(self, t: float, p: Process, level: str, body: str) -> float: ...
    def agent(self, t: float, host: Host, level: str, srcloc: str, body: str) -> float: ...
    def raw(self, t: float, host: str, lines: Sequence[str]) -> float: ...
    def pick(self, key: str, options: Sequence[T]) -> T: ...
    def jitter(self, scale: float = 0.08) -> float: ...


Writer = Callable[[Stage, float, "Process"], Outcome]


@dataclass(frozen=True)
class Story:
    cls: str
    mode: Mode
    write: Writer
    accepted: tuple[str, ...] = ()  # classes a diagnosis may name instead (the truth lists them)
    # an earlier attempt that sets the failure up: "disk_full" (an interrupted save, then a restart) or
    # "preempted" (the scheduler cancels the job mid-save; it is requeued hours later)
    before: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


STORIES: dict[str, Story] = {}


def story(cls: str, mode: Mode = "crash", *, accepted: tuple[str, ...] = (), before: str | None = None
          ) -> Callable[[Writer], Writer]:
    def register(fn: Writer) -> Writer:
        if cls in STORIES:
            raise AssertionError(f"two stories for {cls}")
        STORIES[cls] = Story(cls, mode, fn, accepted, before)
        return fn

    return register
