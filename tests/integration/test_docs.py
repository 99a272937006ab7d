"""The documented commands work as written (issue 17).

Every shell block (```sh, ```bash, ```console) of README.md and docs/*.md is checked:

- a block after the marker line `<!-- rootrank-doc: run -->` is *run*, in order, with bash (`set -e`,
  `pipefail`) in a new user's shell (tests/integration/operator_support.py) while `rootrank up` runs
  on free ports: every command must exit 0;
- every other block is *parsed*: each `rootrank ...` command in it must be one the CLI accepts
  (command, options and values, as `rootrank` would parse them), since it needs real services
  (Kubernetes, Docker, a production cluster) or files that are only examples.

The marker is documented in DEVELOPERS.md.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from tests.fixtures.cli import parse_command_line
from tests.integration.operator_support import ROOT, new_user_shell

RUN_MARKER = "<!-- rootrank-doc: run -->"
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
OPERATORS = {"&&", "||", "|", ";", "&"}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

pytestmark = pytest.mark.timeout(400)


@dataclass
class Block:
    path: Path
    line: int
    text: str
    run: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def shell_blocks(path: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if fence.group(1) not in SHELL_LANGUAGES:
            continue
        previous = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        blocks.append(Block(path, start + 1, "\n".join(body), previous == RUN_MARKER))
    return blocks


def rootrank_commands(text: str) -> list[list[str]]:
    """The `rootrank` command lines of a block, as argument lists (prompts, comments, pipes stripped)."""
    commands: list[list[str]] = []
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip().removeprefix("$ ")
        if not line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:
            continue
        segment: list[str] = []
        for token in [*tokens, ";"]:
            if token in OPERATORS:
                if segment and segment[0] == "rootrank":
                    commands.append(segment[1:])
                segment = []
            else:
                segment.append(token)
    return commands


ALL_BLOCKS = [block for path in DOCS for block in shell_blocks(path)]
RUN_BLOCKS = [b for b in ALL_BLOCKS if b.run]
PARSE_BLOCKS = [b for b in ALL_BLOCKS if not b.run]


def test_the_docs_have_runnable_blocks() -> None:
    assert RUN_BLOCKS, f"no block is marked {RUN_MARKER}"


@pytest.mark.parametrize("block", PARSE_BLOCKS, ids=lambda b: b.where)
def test_every_documented_command_parses(block: Block) -> None:
    for argv in rootrank_commands(block.text):
        try:
            parse_command_line(argv)
        except click.exceptions.Exit:
            pass  # --help, --version
        except click.UsageError as exc:
            pytest.fail(f"{block.where}: `rootrank {shlex.join(argv)}`: {exc.format_message()}")


def _noida_available() -> bool:
    from correlator.tooling.embedded import noida_binary

    return noida_binary() is not None


@pytest.mark.skipif(not _noida_available(), reason="noida-db is not installed (make install)")
def test_runnable_blocks_run_against_the_embedded_stack(tmp_path: Path) -> None:
    with new_user_shell(tmp_path) as sh:
        sh.start_up()
        for block in RUN_BLOCKS:
            script = f"set -e -o pipefail\n{block.text}\n"
            result = sh.run(script, timeout=180)
            assert result.returncode == 0, (
                f"{block.where} failed ({result.returncode}):\n{block.text}\n--- stdout\n{result.stdout[-3000:]}"
                f"\n--- stderr\n{result.stderr[-3000:]}"
            )
