"""How to run `rootrank` from a shell: `make install` and `make demo` end by printing this.

`make install` puts `rootrank` in the checkout's virtual environment (`.venv/bin`), which no shell has on
its PATH until it is activated: say so, and the two ways to get it (activate, or pipx).

    python -m correlator.tooling.path_hint
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def path_hint(bin_dir: Path, path_env: str | None, cwd: Path) -> str:
    """What to tell a user whose PATH is `path_env` about the `rootrank` installed in `bin_dir`."""
    installed = bin_dir / "rootrank"
    found = shutil.which("rootrank", path=path_env or "")
    if found is not None and Path(found).resolve() == installed.resolve():
        return f"rootrank is on your PATH ({found})."
    try:
        shown = os.path.relpath(bin_dir, cwd) if bin_dir.is_relative_to(cwd) else str(bin_dir)
    except ValueError:
        shown = str(bin_dir)
    other = f" (the one on it is {found})" if found else ""
    ways = ((f". {shown}/activate", "in this shell (`deactivate` leaves it)"),
            ("pipx install .", "in every shell: from this checkout, in an environment of its own"))
    width = max(len(command) for command, _ in ways) + 3
    return "\n".join((
        f"rootrank is installed in {shown}/, which is not on your PATH{other}. To run `rootrank`:",
        *(f"  {command.ljust(width)}# {what}" for command, what in ways),
    ))


def main() -> int:
    print(path_hint(Path(sys.executable).parent, os.environ.get("PATH"), Path.cwd()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
