"""The context file: where a running `rootrank up` listens, for the other commands to find it.

Like a kubeconfig. `rootrank up` writes it once its stack answers and removes it when it stops;
`incidents`, `show`, `hosts`, `webhooks`, `ship` and `setup` read it for whatever no flag,
environment variable or config file sets. The file holds the local API token, so it is written
with mode 0600.

    {"broker": "127.0.0.1:9092", "es_url": "http://127.0.0.1:9200", "api_url": "http://127.0.0.1:6066",
     "token": "...", "pid": 4242, "data_dir": "/home/me/.rootrank-data", "started": "2026-12-01T10:00:00Z"}

Location: $ROOTRANK_CONTEXT, else $XDG_CONFIG_HOME/rootrank/context.json (~/.config/rootrank/context.json).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

CONTEXT_ENV = "ROOTRANK_CONTEXT"


@dataclass
class StackContext:
    broker: str
    es_url: str
    api_url: str
    token: str
    pid: int
    data_dir: str = ""
    started: str = ""

    def exports(self) -> str:
        """The same, as shell exports (`eval "$(rootrank up --print-env)"`)."""
        pairs = [
            ("ROOTRANK_KAFKA__BOOTSTRAP_SERVERS", self.broker),
            ("ROOTRANK_ELASTICSEARCH__URL", self.es_url),
            ("ROOTRANK_API_URL", self.api_url),
            ("ROOTRANK_API_TOKEN", self.token),
        ]
        return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in pairs)


def context_path() -> Path:
    explicit = os.environ.get(CONTEXT_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "rootrank" / "context.json"


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def read_context(path: Path | None = None, *, require_alive: bool = True) -> StackContext | None:
    """The context of the running stack; None when there is none, it is unreadable, or its process is
    gone (a stack killed hard leaves its file behind: it is ignored, never trusted)."""
    path = path or context_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        context = StackContext(**{k: raw[k] for k in StackContext.__dataclass_fields__ if k in raw})
    except (OSError, ValueError, TypeError):
        return None
    if require_alive and not pid_alive(context.pid):
        return None
    return context


def write_context(context: StackContext, path: Path | None = None) -> Path:
    path = path or context_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(asdict(context), handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)
    return path


def remove_context(pid: int, path: Path | None = None) -> None:
    """Remove the file if it is still the one process `pid` wrote."""
    path = path or context_path()
    current = read_context(path, require_alive=False)
    if current is not None and current.pid == pid:
        with contextlib.suppress(OSError):
            path.unlink()
