"""The failure classes the simulator knows (the taxonomy, rules/classes.yaml) and the demo's choices."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

DEMO_CLASS = "gpu_hardware_error"
DEMO_RANK = 37
DEMO_XID_TEXT = "NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pid}, GPU has fallen off the bus."


@functools.lru_cache(maxsize=1)
def taxonomy() -> tuple[str, ...]:
    """The class slugs of rules/classes.yaml, in file order. Only the list of names is read: the lines the
    simulator writes never come from the rule library."""
    from correlator.diagnosis.rules import default_rules_dir

    data = yaml.safe_load(Path(default_rules_dir(), "classes.yaml").read_text(encoding="utf-8"))
    return tuple(entry["slug"] for entry in data["classes"])
