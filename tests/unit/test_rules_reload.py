"""Hot reload of the rule library (correlator/rules_reload.py), on a real (small) rule folder:
a new rule is picked up, a broken rule is refused with `file:line` while the last good set keeps
matching, SIGHUP forces a reload, and incidents carry the version of the set that made them."""

from __future__ import annotations

import asyncio
import shutil
import signal
import textwrap
from pathlib import Path

import pytest

from correlator.config import EngineSettings, Settings
from correlator.diagnosis.engine import JobState
from correlator.diagnosis.rules import RuleSet, default_rules_dir
from correlator.stream.app import Pipeline
from correlator.stream.rules_reload import LiveRules, RuleReloader, pipeline_reloader
from ingest.event import LogEvent

RULES = default_rules_dir()
SEED_RULES = ["gpu/cuda-oom-pytorch.yaml", "distributed/nccl-watchdog-collective-timeout.yaml"]
CANARY = "ROOTRANK_RELOAD_CANARY disk controller wedged"

CANARY_RULE = textwrap.dedent("""\
    id: reload-canary
    title: "Reload canary"
    class: cuda_oom
    severity: critical
    role: cause
    patterns:
      - 'ROOTRANK_RELOAD_CANARY'
    mechanism: "A rule added while the worker runs."
    fix:
      - "None: it is a test."
    verify:
      - "None."
    references:
      - "https://example.org/reload-canary"
    source:
      - url: "https://example.org/reload-canary"
    examples:
      match:
        - "ROOTRANK_RELOAD_CANARY disk controller wedged"
        - "[rank3]: ROOTRANK_RELOAD_CANARY again"
      no_match:
        - "all good"
        - "ROOTRANK RELOAD CANARY spelled apart"
""")


def rules_folder(tmp_path: Path) -> Path:
    root = tmp_path / "rules"
    for rel in ["classes.yaml", *SEED_RULES]:
        if not (RULES / rel).exists():
            pytest.skip(f"{rel} not in the rule library")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(RULES / rel, root / rel)
    return root


def matches(pipeline: Pipeline, text: str) -> list[str]:
    event = LogEvent(job_id="j", host="h", rank=3, line=text)
    return [s.rule_id for s in pipeline.extractor.from_events([event])]


def test_new_rule_broken_rule_and_sighup(tmp_path: Path) -> None:
    root = rules_folder(tmp_path)
    pipeline = Pipeline(Settings(engine=EngineSettings(rules_dir=str(root))))
    first = pipeline.ruleset.version
    reloader = pipeline_reloader(pipeline)
    assert pipeline_reloader(pipeline) is reloader  # one per process
    swapped: list[str] = []
    reloader.subscribe(lambda live: swapped.append(live.ruleset.version))

    assert asyncio.run(reloader.check()) is None  # nothing changed
    assert matches(pipeline, CANARY) == []

    # A new rule file: picked up, and the pipeline's extractor and engine are the new set's.
    (root / "test").mkdir()
    (root / "test" / "reload-canary.yaml").write_text(CANARY_RULE)
    outcome = asyncio.run(reloader.check())
    assert outcome is not None and outcome.applied and outcome.version != first
    second = outcome.version
    assert pipeline.ruleset.version == second == swapped[-1]
    assert matches(pipeline, CANARY) == ["reload-canary"]
    state = JobState(job_id="j")
    for s in pipeline.extractor.from_events([LogEvent(job_id="j", host="h", rank=3, line=CANARY)]):
        state.add(s)
    (incident,) = pipeline.engine.diagnose(state)
    assert incident.rule_set_version == second

    # A broken rule: refused with file:line, and the last good set keeps matching.
    broken = root / "test" / "broken.yaml"
    broken.write_text(CANARY_RULE.replace("reload-canary", "broken-rule").replace("severity: critical",
                                                                                  "severity: apocalyptic"))
    outcome = asyncio.run(reloader.check())
    assert outcome is not None and not outcome.applied
    assert outcome.version == second and pipeline.ruleset.version == second
    assert any(p.startswith(f"{broken}:4:") and "severity" in p for p in outcome.problems), outcome.problems
    assert matches(pipeline, CANARY) == ["reload-canary"]
    assert asyncio.run(reloader.check()) is None  # the same broken files are reported once, not every tick

    # A YAML syntax error is refused the same way.
    broken.write_text("id: broken-rule\ntitle: [unclosed\n")
    outcome = asyncio.run(reloader.check())
    assert outcome is not None and not outcome.applied and any(p.startswith(f"{broken}:") for p in outcome.problems)

    # Fixed, then SIGHUP: a reload even though nothing changed since.
    broken.unlink()
    assert asyncio.run(reloader.check()) is not None  # the removal is a change: back to the good set
    count = len(swapped)
    reloader.request()
    outcome = asyncio.run(reloader.check())
    assert outcome is not None and outcome.applied and len(swapped) == count + 1
    assert outcome.version == second  # same files, same digest


def test_sighup_reaches_the_reloader_through_the_event_loop(tmp_path: Path) -> None:
    root = rules_folder(tmp_path)
    def build(ruleset: RuleSet) -> LiveRules:
        raise AssertionError("SIGHUP only asks for a reload; the reload happens at the next tick")

    reloader = RuleReloader(root, build)

    async def main() -> None:
        reloader.install_hup()
        signal.raise_signal(signal.SIGHUP)
        await asyncio.sleep(0.05)
        assert reloader.hup_requested
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    asyncio.run(main())
