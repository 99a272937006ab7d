"""The validated rule set and its compiled databases are kept on disk, keyed by the rules' content:
a second start-up reads one file, and a changed rule file is picked up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from correlator.diagnosis import rules as rules_module
from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.rules import default_rules_dir, load_ruleset

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def rules_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ROOTRANK_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), root, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return root


def _no_full_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("the rule files were parsed again instead of read from the cache")

    monkeypatch.setattr(rules_module, "_load_ruleset_files", refuse)


def test_second_load_reads_the_cache_with_the_compiled_databases(rules_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_ruleset(rules_copy)
    assert first.cache_key is not None
    Matcher(first)  # compiles, and stores its databases with the rule set's cache entry
    entries = list((rules_copy.parent / "cache").glob("ruleset-*.pickle"))
    assert len(entries) == 1

    rules_module._DATABASES.clear()  # as in a new process
    _no_full_load(monkeypatch)
    second = load_ruleset(rules_copy)
    assert second == first and second.version == first.version
    assert rules_module._DATABASES[second.cache_key]  # the databases came with it

    for loose in (rules_copy.parent / "cache").glob("hs-*.db"):
        loose.unlink()  # a compile would write these again
    matcher = Matcher(second)
    assert not list((rules_copy.parent / "cache").glob("hs-*.db"))
    assert matcher.scan_buffer(first.rules[0].rule.examples.match[0].encode())


def test_a_changed_rule_file_is_picked_up(rules_copy: Path) -> None:
    before = load_ruleset(rules_copy)
    matcher = Matcher(before)
    novel = "rootrank cache test: a failure no rule knows yet"
    assert not [h for h in matcher.scan_buffer(novel.encode()) if h.role == "main"]

    path = next(p for p in sorted(rules_copy.rglob("*.yaml")) if p.name != "classes.yaml")
    rule_id = path.stem
    text = path.read_text(encoding="utf-8")
    assert "\npatterns:\n" in text, path
    path.write_text(text.replace("\npatterns:\n", "\npatterns:\n  - 'rootrank cache test: a failure no rule knows'\n", 1),
                    encoding="utf-8")

    after = load_ruleset(rules_copy)
    assert after.cache_key != before.cache_key and after.version != before.version
    changed = after.by_id()[rule_id]
    assert changed.patterns[0] == "rootrank cache test: a failure no rule knows"
    hits = [h for h in Matcher(after).scan_buffer(novel.encode()) if h.role == "main"]
    assert [after.rules[h.rule_index].rule.id for h in hits] == [rule_id]


def test_the_same_rules_elsewhere_report_their_own_paths(rules_copy: Path) -> None:
    first = load_ruleset(rules_copy)
    moved = rules_copy.parent / "moved"
    shutil.copytree(rules_copy, moved)
    second = load_ruleset(moved)
    assert second.cache_key != first.cache_key
    assert all(str(lr.path).startswith(str(moved)) for lr in second.rules)


def test_a_broken_rule_is_reported_even_when_an_earlier_set_was_cached(rules_copy: Path) -> None:
    load_ruleset(rules_copy)
    path = next(p for p in sorted(rules_copy.rglob("*.yaml")) if p.name != "classes.yaml")
    path.write_text(path.read_text(encoding="utf-8") + "\nnot_a_field: 1\n", encoding="utf-8")
    with pytest.raises(rules_module.RuleError, match="not_a_field"):
        load_ruleset(rules_copy)


def test_diagnose_imports_no_streaming_stack(tmp_path: Path) -> None:
    log = tmp_path / "one.log"
    log.write_text("[rank0]: step 1 loss 2.5\n", encoding="utf-8")
    probe = (
        "import sys\n"
        "from correlator.cli import main\n"
        f"code = main(['diagnose', {str(log)!r}])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('faust', 'kafka', 'aiokafka', 'elasticsearch', 'aiohttp', 'mode', 'jinja2'))\n"
        "print('HEAVY', heavy, code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "ROOTRANK_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "HEAVY [] 0" in done.stdout, done.stdout
