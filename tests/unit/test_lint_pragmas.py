"""A silenced check says why (issue 25): every `# noqa: CODE` in code ruff checks, and every
`# type: ignore[code]` in code mypy checks, names its codes and carries a reason after them, so the next
maintainer can judge whether it still holds. Ruff refuses a bare noqa and mypy a bare ignore (PGH, and
mypy's ignore-without-code); this test asks for the words."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOQA = re.compile(r"#\s*noqa\b(?::\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<why>.*)$")
IGNORE = re.compile(r"#\s*type:\s*ignore\b(?:\[[^\]]*\])?(?P<why>.*)$")
# (pragma, folders): ruff runs over all five; mypy over correlator and ingest, benchmarks and scripts are
# typed by the same habits. The tests are not type-checked: an ignore there silences nothing.
CHECKED = ((NOQA, ("correlator", "ingest", "tests", "benchmarks", "scripts")),
           (IGNORE, ("correlator", "ingest", "benchmarks", "scripts")))


def _comments(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return [(tok.start[0], tok.string) for tok in tokens if tok.type == tokenize.COMMENT]


def test_every_silenced_check_says_why() -> None:
    unexplained = [
        f"{path.relative_to(REPO)}:{line}: {comment}"
        for pragma, folders in CHECKED
        for folder in folders
        for path in sorted((REPO / folder).rglob("*.py"))
        for line, comment in _comments(path)
        if (m := pragma.search(comment)) is not None and not re.search(r"[A-Za-z]{3}", m["why"])
    ]
    assert not unexplained, "say why after the codes (`# noqa: B010 - ...`, `# type: ignore[x]  # ...`):\n" + \
        "\n".join(unexplained)
