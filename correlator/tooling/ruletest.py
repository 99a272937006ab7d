"""Run every rule's examples: each `match` line must hit the rule, each `no_match` line must not."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.rules import RuleSet


@dataclass(frozen=True)
class ExampleFailure:
    where: str
    rule_id: str
    kind: str
    line: str

    def __str__(self) -> str:
        verb = "does not match" if self.kind == "match" else "matches, but is listed under no_match"
        return f"{self.where}: example {verb}: {self.line[:160]!r}"


def run_examples(ruleset: RuleSet, matcher: Matcher | None = None) -> tuple[int, list[ExampleFailure]]:
    matcher = matcher or Matcher(ruleset)
    failures: list[ExampleFailure] = []
    checked = 0
    for index, loaded in enumerate(ruleset.rules):
        rule = loaded.rule
        for kind in ("match", "no_match"):
            for i, line in enumerate(getattr(rule.examples, kind)):
                checked += 1
                hit = matcher.matches(index, line)
                if hit != (kind == "match"):
                    failures.append(ExampleFailure(loaded.where(loaded.example_lines[kind][i]), rule.id, kind, line))
    return checked, failures


def run_data_file(ruleset: RuleSet, data: Path, matcher: Matcher | None = None) -> dict[str, int]:
    """Hits per rule id over a log file: how a rule behaves on real text before it ships."""
    matcher = matcher or Matcher(ruleset)
    counts: dict[str, int] = {lr.rule.id: 0 for lr in ruleset.rules}
    for hit in matcher.scan_buffer(data.read_bytes()):
        if hit.role == "main":
            counts[matcher.rules[hit.rule_index].id] += 1
    return counts
