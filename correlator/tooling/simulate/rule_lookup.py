"""Which signature rules a class has, and what the rule library makes of a line (hyperscan matcher)."""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

from correlator.diagnosis.rules import Rule, RuleSet, load_ruleset


def signature_rules(ruleset: RuleSet, cls: str) -> list[Rule]:
    rules = [r for r in ruleset.signatures() if r.class_ == cls]
    # Plain pattern rules first: they need nothing else from the scenario to fire.
    return sorted(rules, key=lambda r: (r.metric is not None, r.absence is not None, r.sequence is not None, r.id))


_MATCHERS: dict[str, Any] = {}


@functools.lru_cache(maxsize=1)
def default_ruleset() -> RuleSet:
    # Loading validates every pattern with hyperscan (seconds); a process simulating many jobs loads once.
    return load_ruleset()


def _matcher_for(ruleset: RuleSet) -> Any:
    from correlator.diagnosis.matcher import Matcher

    matcher = _MATCHERS.get(ruleset.version)
    if matcher is None:
        matcher = _MATCHERS[ruleset.version] = Matcher(ruleset)
    return matcher


def best_class(ruleset: RuleSet, text: str) -> str | None:
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


def rule_matches(ruleset: RuleSet, rule: Rule, text: str) -> bool:
    matcher = _matcher_for(ruleset)
    index = next(i for i, lr in enumerate(ruleset.rules) if lr.rule.id == rule.id)
    return bool(matcher.matches(index, text))

