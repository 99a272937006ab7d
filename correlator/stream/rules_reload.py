"""Hot reload of the rule library in a running worker: on a change of the rule files (polled) or
on SIGHUP.

A reload builds the whole new set (load and validate every rule, compile the hyperscan database,
the extractor and the engine) off the event loop, then swaps it in between two batches. If any
rule is broken the new set is refused as a whole: every problem is logged as `file:line: what`,
and the last good set keeps running (a half-edited library never runs, and a broken file never
takes the worker down). Each incident records `rule_set_version`, the digest of the set that
produced it, so an incident can always be traced to the rules it came from.

One reloader per process (the roles of `rootrank worker --role all` share it): the match role's
extractor and the correlate role's engine change together.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from correlator.diagnosis.rules import RuleError, RuleSet, default_rules_dir, load_ruleset

log = logging.getLogger(__name__)

RELOADS = Counter("rootrank_rule_reloads_total", "rule-set reloads, by outcome (applied, rejected)", ["outcome"])

Fingerprint = tuple[tuple[str, int, int, int], ...]


def rules_fingerprint(root: Path) -> Fingerprint:
    """(path, mtime, size, inode) of every YAML file under `root`: changes when a rule is edited,
    added, removed or replaced by a rename (editors, `kubectl cp`, ConfigMap symlink swaps)."""
    out = []
    for path in sorted([*root.rglob("*.yaml"), *root.rglob("*.yml")]):
        try:
            st = path.stat()
        except OSError:  # removed while we looked
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


@dataclass
class ReloadOutcome:
    applied: bool
    version: str
    problems: list[str] = field(default_factory=list)


@dataclass
class LiveRules:
    """What is built from one rule set; swapped as a unit."""

    ruleset: RuleSet
    matcher: Any
    extractor: Any
    engine: Any


class RuleReloader:
    """Watches `rules_dir` and swaps a new rule set into the running pipeline.

    `build(ruleset) -> LiveRules` makes the matcher/extractor/engine of a set; `subscribe(fn)`
    registers a callback run on the event loop with each new LiveRules (the agents re-point their
    extractor or engine there)."""

    def __init__(self, rules_dir: str | Path | None, build: Callable[[RuleSet], LiveRules], *,
                 current_version: Callable[[], str | None] = lambda: None) -> None:
        self.root = Path(rules_dir) if rules_dir else default_rules_dir()
        self.build = build
        self.current_version = current_version
        self.subscribers: list[Callable[[LiveRules], None]] = []
        self.seen = rules_fingerprint(self.root)
        self.version: str | None = None
        self.lock: asyncio.Lock | None = None
        self.hup_installed = False
        self.hup_requested = False

    def subscribe(self, callback: Callable[[LiveRules], None]) -> None:
        self.subscribers.append(callback)

    def load(self) -> LiveRules | list[str]:
        """The new LiveRules, or the problems (`file:line: what`) that refuse it. Blocking (seconds)."""
        try:
            ruleset = load_ruleset(self.root, strict=True)
        except RuleError as exc:
            return list(exc.problems)
        except Exception as exc:  # noqa: BLE001 - an unreadable folder, a YAML bomb: still not a reason to stop
            return [f"{self.root}:1: {type(exc).__name__}: {exc}"]
        try:
            return self.build(ruleset)
        except Exception as exc:  # noqa: BLE001 - e.g. hyperscan refusing the database as a whole
            return [f"{self.root}:1: the rule set does not compile: {type(exc).__name__}: {exc}"]

    def apply(self, live: LiveRules) -> None:
        """Swap in `live` (call on the event loop thread, between batches)."""
        for callback in self.subscribers:
            callback(live)
        self.version = live.ruleset.version

    async def check(self, *, force: bool = False) -> ReloadOutcome | None:
        """Reload if the files changed (or `force`); None when there was nothing to do."""
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            force = force or self.hup_requested
            self.hup_requested = False
            now = await asyncio.get_running_loop().run_in_executor(None, rules_fingerprint, self.root)
            if now == self.seen and not force:
                return None
            self.seen = now
            result = await asyncio.get_running_loop().run_in_executor(None, self.load)
            old = self.version or self.current_version() or "?"
            if isinstance(result, list):
                RELOADS.labels("rejected").inc()
                for problem in result:
                    log.error("rules reload refused, still running rule set %s: %s", old, problem)
                return ReloadOutcome(False, old, result)
            self.apply(result)
            RELOADS.labels("applied").inc()
            log.warning("rules reloaded from %s: rule set %s -> %s (%d rules)", self.root, old,
                        result.ruleset.version, len(result.ruleset.rules))
            return ReloadOutcome(True, result.ruleset.version)

    def request(self) -> None:
        """SIGHUP: reload at the next tick even if no file looks changed."""
        self.hup_requested = True

    def install(self, app: Any, interval_s: float) -> None:
        """A timer on `app` that polls the files every `interval_s` (0: only on SIGHUP), and the
        SIGHUP handler (once per process)."""
        tick = interval_s if interval_s > 0 else 1.0

        @app.timer(tick, name=f"{app.conf.id}.rules_reload")  # type: ignore[untyped-decorator]  # faust's decorators carry no types
        async def rules_reload() -> None:
            self.install_hup()
            if interval_s > 0 or self.hup_requested:
                await self.check()

    def install_hup(self) -> None:
        if self.hup_installed:
            return
        self.hup_installed = True
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.request)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no SIGHUP here
            log.debug("rules reload: no SIGHUP handler in this process")


def pipeline_reloader(pipeline: Any) -> RuleReloader:
    """The process's reloader for an app.Pipeline (created on first use); swapping also replaces
    the pipeline's cached ruleset/matcher/extractor/engine, so code that reads them later sees the
    new set."""
    existing: RuleReloader | None = pipeline.__dict__.get("_rule_reloader")
    if existing is not None:
        return existing
    settings = pipeline.settings

    def build(ruleset: RuleSet) -> LiveRules:
        from correlator.diagnosis.engine import Engine
        from correlator.diagnosis.matcher import Matcher
        from correlator.diagnosis.signals import SignalExtractor

        matcher = Matcher(ruleset)
        return LiveRules(ruleset, matcher, SignalExtractor(ruleset, matcher), Engine(ruleset))

    def current() -> str | None:
        ruleset = pipeline.__dict__.get("ruleset")
        return getattr(ruleset, "version", None)

    reloader = RuleReloader(settings.engine.rules_dir, build, current_version=current)

    def repoint_pipeline(live: LiveRules) -> None:
        pipeline.__dict__.update(ruleset=live.ruleset, matcher=live.matcher, extractor=live.extractor,
                                 engine=live.engine)
        try:
            from correlator.stream.metrics import allow_ruleset
        except ImportError:
            return
        try:
            allow_ruleset(live.ruleset)
        except Exception:  # metrics labels are not worth a half-swapped rule set
            log.exception("rules reload: could not update the metrics' rule labels")

    reloader.subscribe(repoint_pipeline)
    pipeline.__dict__["_rule_reloader"] = reloader
    return reloader
