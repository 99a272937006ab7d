"""`rootrank rules`: validate, test and describe the signature library."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from correlator.diagnosis.rules import RuleSet

def load_ruleset_or_report(rules_dir: str | None) -> RuleSet | None:
    """The rule set, or None after printing each of its problems as file:line: what."""
    from correlator.diagnosis.rules import RuleError, load_ruleset

    try:
        return load_ruleset(Path(rules_dir) if rules_dir else None)
    except RuleError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return None


@click.group("rules", short_help="Validate and test the signature library.")
def rules() -> None:
    """Validate and test the signature library (rules/, one YAML rule per file)."""


@rules.command("validate", short_help="Check every rule file; problems print as file:line: what.")
@click.argument("rules_dir", metavar="[DIR]", required=False)
def validate(rules_dir: str | None) -> int:
    """Check every rule file in DIR (when not given: the installed library).

    Problems print as file:line: what.
    """
    ruleset = load_ruleset_or_report(rules_dir)
    if ruleset is None:
        return 1
    print(f"{len(ruleset.rules)} rules valid (rule set {ruleset.version}); {len(ruleset.classes)} classes")
    return 0


@rules.command("schema", short_help="Print the rule file JSON Schema (for editors and CI).")
def schema() -> int:
    """Print the rule file JSON Schema (for editors and CI)."""
    import json

    from correlator.diagnosis.rules import rule_json_schema

    print(json.dumps(rule_json_schema(), indent=2))
    return 0


@rules.command("test", short_help="Run every rule's match/no_match examples.")
@click.argument("rules_dir", metavar="[DIR]", required=False)
@click.option("--data", metavar="FILE", help="Also count hits per rule over this log file.")
def test(rules_dir: str | None, data: str | None) -> int:
    """Run every match/no_match example of the rules in DIR (when not given: the installed library)."""
    from correlator.diagnosis.matcher import Matcher
    from correlator.tooling.ruletest import run_data_file, run_examples

    ruleset = load_ruleset_or_report(rules_dir)
    if ruleset is None:
        return 1
    matcher = Matcher(ruleset)
    checked, failures = run_examples(ruleset, matcher)
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"{checked} examples in {len(ruleset.rules)} rules: {checked - len(failures)} passed, "
          f"{len(failures)} failed")
    if data:
        for rule_id, count in sorted(run_data_file(ruleset, Path(data), matcher).items(), key=lambda kv: -kv[1]):
            if count:
                print(f"{count:8d}  {rule_id}")
    return 1 if failures else 0
