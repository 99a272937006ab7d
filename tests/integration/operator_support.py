"""A new user's shell for the operator tests: a fresh HOME and working folder, `rootrank` on PATH (this
checkout's code), no ROOTRANK_* variables, and `rootrank up` started and stopped on free ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Shell:
    """Runs command lines with bash, as written in the README, in a clean environment under `home`."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.cwd = home / "work"
        self.cwd.mkdir(parents=True, exist_ok=True)
        bin_dir = home / "bin"
        bin_dir.mkdir(exist_ok=True)
        shim = bin_dir / "rootrank"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m correlator.cli "$@"\n')
        shim.chmod(0o755)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ROOTRANK_") and k not in ("XDG_CONFIG_HOME", "PYTHONPATH")}
        env.update(HOME=str(home), PATH=f"{bin_dir}:{os.path.dirname(sys.executable)}:{env.get('PATH', '')}",
                   PYTHONPATH=str(ROOT), COLUMNS="120", NO_COLOR="1")
        self.env = env
        self.up_process: subprocess.Popen[bytes] | None = None

    def run(self, command: str, timeout: float = 120.0, check: bool = False) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=self.cwd, env=self.env,
                                capture_output=True, text=True, timeout=timeout, check=False)
        if check:
            assert result.returncode == 0, f"{command!r} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        return result

    @property
    def context_file(self) -> Path:
        return self.home / ".config" / "rootrank" / "context.json"

    def start_up(self, *flags: str, timeout: float = 90.0) -> str:
        """`rootrank up` on free ports, in the background; returns the flags it was given once it is ready."""
        ports = (f"--kafka-port {free_port()} --es-port {free_port()} --web-port {free_port()} "
                 f"--data-dir {self.home / 'up-data'}")
        log = (self.home / "up.log").open("wb")
        self.up_process = subprocess.Popen(
            ["bash", "-c", f"exec rootrank up {ports} {' '.join(flags)}"], cwd=self.cwd, env=self.env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.up_process.poll() is not None:
                raise AssertionError(f"rootrank up exited {self.up_process.returncode}:\n{self.up_log()}")
            if self.context_file.exists():
                return ports
            time.sleep(0.3)
        raise AssertionError(f"rootrank up was not ready in {timeout:.0f}s:\n{self.up_log()}")

    def up_log(self) -> str:
        try:
            return (self.home / "up.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop_up(self) -> int | None:
        proc, self.up_process = self.up_process, None
        if proc is None:
            return None
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        return proc.returncode


@contextmanager
def new_user_shell(home: Path) -> Iterator[Shell]:
    shell = Shell(home)
    try:
        yield shell
    finally:
        shell.stop_up()
