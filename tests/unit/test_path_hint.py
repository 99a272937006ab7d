"""`make install` and `make demo` end by saying how to get `rootrank` on PATH, and the README says it once,
before its first `rootrank` command (issue 31: the first step after `make demo` failed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from correlator.tooling.path_hint import path_hint

ROOT = Path(__file__).resolve().parents[2]


def _bin_with_rootrank(folder: Path) -> Path:
    folder.mkdir(parents=True)
    script = folder / "rootrank"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    return folder


def test_off_path_it_says_how(tmp_path: Path) -> None:
    venv_bin = _bin_with_rootrank(tmp_path / "checkout" / ".venv" / "bin")
    hint = path_hint(venv_bin, "/usr/bin:/bin", tmp_path / "checkout")
    assert "not on your PATH" in hint
    assert ". .venv/bin/activate" in hint and "pipx install ." in hint
    other = _bin_with_rootrank(tmp_path / "elsewhere")
    assert f"(the one on it is {other / 'rootrank'})" in path_hint(venv_bin, str(other), tmp_path / "checkout")
    assert f". {venv_bin}/activate" in path_hint(venv_bin, "/usr/bin", tmp_path / "another-folder")


def test_on_path_it_says_so(tmp_path: Path) -> None:
    venv_bin = _bin_with_rootrank(tmp_path / ".venv" / "bin")
    assert path_hint(venv_bin, f"/usr/bin:{venv_bin}", tmp_path) == f"rootrank is on your PATH ({venv_bin / 'rootrank'})."


def test_make_install_and_make_demo_end_with_it() -> None:
    dry = {target: subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, check=True,
                                  env={"PATH": "/usr/bin:/bin"}).stdout.strip().splitlines()
           for target in ("install", "demo")}
    assert dry["install"][-1].endswith("-m correlator.tooling.path_hint")
    assert dry["demo"][-1].endswith("-m correlator.tooling.demo")  # which prints it last (test_operator_path.py)
    printed = subprocess.run([sys.executable, "-m", "correlator.tooling.path_hint"], cwd=ROOT, capture_output=True,
                             text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    assert "activate" in printed and "pipx install ." in printed


def test_the_readme_says_it_once_before_the_first_rootrank_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    said = readme.index("`. .venv/bin/activate`")
    assert readme.count(". .venv/bin/activate") == 1
    blocks = [m.start() for m in re.finditer(r"^```\w*\n(?:(?!```).*\n)*?(?:\$ )?rootrank \w", readme, re.MULTILINE)]
    assert blocks and said < blocks[0]  # the first code block with a rootrank command ("What you get") is after it
