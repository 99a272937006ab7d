"""The rule library: schema, file:line errors, examples of every rule, coverage of the taxonomy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.rules import RuleError, load_classes, load_ruleset, rule_json_schema
from correlator.tooling.ruletest import run_examples

RULESET = load_ruleset()
MATCHER = Matcher(RULESET)
SHARED_TAXONOMY = Path(__file__).resolve().parents[3] / "shared" / "taxonomy.yaml"


@pytest.mark.parametrize("loaded", RULESET.rules, ids=lambda lr: lr.rule.id)
def test_rule_examples(loaded) -> None:  # type: ignore[no-untyped-def]
    index = RULESET.rules.index(loaded)
    for line in loaded.rule.examples.match:
        assert MATCHER.matches(index, line), f"{loaded.where()}: should match: {line}"
    for line in loaded.rule.examples.no_match:
        assert not MATCHER.matches(index, line), f"{loaded.where()}: should not match: {line}"


def test_every_class_has_a_signature_rule() -> None:
    covered = {r.class_ for r in RULESET.signatures()}
    missing = sorted(set(RULESET.classes) - covered)
    assert not missing, f"classes without a rule: {missing}"


def test_signature_rules_carry_the_encyclopedia() -> None:
    for rule in RULESET.signatures():
        assert rule.mechanism and rule.fix and rule.verify and rule.references, rule.id


@pytest.mark.skipif(not SHARED_TAXONOMY.exists(), reason="../shared/taxonomy.yaml is not beside this checkout")
def test_project_classes_equal_shared_taxonomy() -> None:
    ours = load_classes(Path(RULESET.rules[0].path).parents[1] / "classes.yaml")
    theirs = {c["slug"]: c for c in yaml.safe_load(SHARED_TAXONOMY.read_text())["classes"]}
    assert set(ours) == set(theirs)
    for slug, cls in ours.items():
        assert cls.model_dump() == {k: theirs[slug][k] for k in cls.model_dump()}, slug


def test_run_examples_reports_file_and_line(tmp_path: Path) -> None:
    rules = tmp_path / "rules" / "gpu"
    rules.mkdir(parents=True)
    (tmp_path / "rules" / "classes.yaml").write_text((Path(RULESET.rules[0].path).parents[1] / "classes.yaml").read_text())
    (rules / "bad-example.yaml").write_text(
        "id: bad-example\ntitle: A rule whose example is wrong\nclass: cuda_oom\npatterns: ['out of memory']\n"
        "mechanism: m\nfix: [f]\nverify: [v]\nreferences: ['https://example.org']\nsource: [{url: 'https://example.org'}]\n"
        "examples:\n  match:\n    - 'CUDA out of memory'\n    - 'this line does not hit'\n"
        "  no_match: ['a', 'b']\n"
    )
    rs = load_ruleset(tmp_path / "rules")
    checked, failures = run_examples(rs)
    assert checked == 4
    assert [str(f).split(": ")[0] for f in failures] == [f"{rules / 'bad-example.yaml'}:13"]


@pytest.mark.parametrize(
    "body, line, needle",
    [
        ("id: x\ntitle: broken yaml\npatterns: [unclosed\n", 4, "YAML syntax"),
        (("id: wrong-name\ntitle: t t t\nclass: cuda_oom\npatterns: ['a']\nmechanism: m\nfix: [f]\nverify: [v]\n"
         "references: ['https://x.org']\nsource: [{url: 'https://x.org'}]\n"
         "examples: {match: [a, a], no_match: [b, b]}\n"), 1, "must equal the file name"),
        (("id: x\ntitle: t t t\nclass: not_a_class\npatterns: ['a']\nmechanism: m\nfix: [f]\nverify: [v]\n"
         "references: ['https://x.org']\nsource: [{url: 'https://x.org'}]\n"
         "examples: {match: [a, a], no_match: [b, b]}\n"), 3, "unknown class"),
        (("id: x\ntitle: t t t\nclass: cuda_oom\npatterns:\n  - 'ok'\n  - '(?<=look)behind'\nmechanism: m\n"
         "fix: [f]\nverify: [v]\nreferences: ['https://x.org']\nsource: [{url: 'https://x.org'}]\n"
         "examples: {match: [a, a], no_match: [b, b]}\n"),
         6, "hyperscan cannot compile"),
        (("id: x\ntitle: t t t\nclass: cuda_oom\npatterns: ['a']\nseverity: apocalyptic\nmechanism: m\nfix: [f]\n"
         "verify: [v]\nreferences: ['https://x.org']\nsource: [{url: 'https://x.org'}]\n"
         "examples: {match: [a, a], no_match: [b, b]}\n"), 5, "severity"),
        (("id: x\ntitle: t t t\nclass: cuda_oom\npatterns: ['a']\nmechanism: m\nfix: [f]\nverify: [v]\n"
         "references: ['https://x.org']\nsource: [{url: 'https://x.org'}]\n"
         "examples:\n  match: [a]\n  no_match: [b, b]\n"), 11, "examples.match"),
        (("id: x\ntitle: t t t\nclass: cuda_oom\npatterns: ['a']\nmechanism: m\nfix: [f]\nverify: [v]\n"
         "references: ['https://x.org']\nexamples: {match: [a, a], no_match: [b, b]}\n"), 1, "needs source"),
        (("id: x\ntitle: t t t\nclass: cuda_oom\npatterns: ['a']\nyields_to: [no_such_class]\nmechanism: m\n"
         "fix: [f]\nverify: [v]\nreferences: ['https://x.org']\nsource: [{url: 'https://x.org'}]\n"
         "examples: {match: [a, a], no_match: [b, b]}\n"), 5, "yields_to: unknown class"),
        (("id: x\ntitle: t t t\nclass: cuda_oom\npatterns: ['a']\nmechanism: m\nfix: [f]\nverify: [v]\n"
         "references: ['https://x.org']\nsource: [{repo: pytorch/pytorch}]\n"
         "examples: {match: [a, a], no_match: [b, b]}\n"), 9, "repo` and `path"),
    ],
)
def test_broken_rule_is_reported_as_file_line_what(tmp_path: Path, body: str, line: int, needle: str) -> None:
    (tmp_path / "x.yaml").write_text(body)
    with pytest.raises(RuleError) as err:
        load_ruleset(tmp_path)
    problem = err.value.problems[0]
    assert problem.startswith(f"{tmp_path / 'x.yaml'}:{line}: "), problem
    assert needle in problem


def test_non_strict_load_keeps_good_rules(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("id: broken\n")
    good = Path(RULESET.rules[0].path)
    (tmp_path / good.name).write_text(good.read_text())
    rs = load_ruleset(tmp_path, strict=False)
    assert [lr.rule.id for lr in rs.rules] == [good.stem]


def test_json_schema_is_exported() -> None:
    schema = rule_json_schema()
    assert "patterns" in schema["properties"] and "class" in schema["properties"]


def test_a_rule_folder_under_a_hidden_folder_is_read_and_hidden_entries_inside_it_are_not(tmp_path: Path) -> None:
    """A library installed in ~/.venv or ~/.local lives under a hidden folder: its rules load. Inside the
    folder, editor drafts and hidden folders are not rules."""
    library = Path(__file__).resolve().parents[2] / "rules"
    root = tmp_path / ".venv" / "lib" / "rules"
    chosen = ["gpu/cuda-oom-pytorch.yaml", "distributed/nccl-watchdog-collective-timeout.yaml"]
    for name in chosen:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((library / name).read_text())
    (root / ".drafts").mkdir()
    (root / ".drafts" / "broken.yaml").write_text("id: [not a rule\n")
    (root / "gpu" / ".#editing.yaml").write_text("id: [not a rule\n")
    loaded = load_ruleset(root, use_cache=False)
    assert sorted(str(rule.path.relative_to(root)) for rule in loaded.rules) == sorted(chosen)
