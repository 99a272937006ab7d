"""A failure class's story: what the failing process prints, how it dies, and what the truth accepts.

Each class of rules/classes.yaml has one story, registered with `@story(...)` in stories_*.py. A story's
`write(sc, t, proc)` prints the failure on `proc` from true time `t` through the scenario's emitters (in
the libraries' own formats) and returns an `Outcome`; the scenario then plays the consequences on the
other ranks (watchdog timeouts, aborts, torchelastic's teardown) from that outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from correlator.tooling.simulate.job import Process
    from correlator.tooling.simulate.scenario import Scenario

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


Writer = Callable[["Scenario", float, "Process"], Outcome]


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
