"""Run a scenario as a real job: one launcher per simulated host, faults in place, logs collected.

Each host is a launcher (torchrun, accelerate, ...) started under `unshare --uts --mount` with its own
host name, its own /etc/hosts (node01 = 127.0.0.1, node02 = 127.0.0.2, ...: every host shares the
network namespace but talks from its own loopback address), and, when the scenario says so, its own
small /dev/shm and a clock skewed with Debian's libfaketime. The launchers' consoles are read line by
line as they are produced and written the way users and clusters keep them: one file per host, one
Slurm file with `srun --label` task prefixes, one pdsh-style file with `host: ` prefixes, or (with
`torchrun --log-dir`) each host's whole log tree beside its console.

A scenario errors (never passes) when its fault did not fire: a `fired` pattern is missing from the
logs, a failing job exited 0 (or a trap job failed), or the job outlived the harness timeout.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from lab.scenario import LABEL_COLUMNS, Scenario, host_name, label_row

LAB = Path(__file__).resolve().parent
TRAIN_DIR = LAB / "train"
CLOCKFIX_DIR = LAB / "clockfix"
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
HARNESS_TIMEOUT_S = 90.0
STEPS_PER_PART = 5
RUN_COLUMNS = ("scenario", "status", "fired", "exit_codes", "duration_s", "ranks", "hosts", "skew", "error")


# --- small helpers --------------------------------------------------------------------------------

def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def job_id(name: str) -> str:
    """A neutral folder name for a scenario's job (the scenario's name would tell what broke)."""
    return "job-" + hashlib.sha1(name.encode()).hexdigest()[:8]


def become_subreaper() -> None:
    """Orphans of the jobs re-parent to this process, so a timed-out job can be found and ended."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or no prctl: orphans go to init
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def end_leftovers() -> int:
    """SIGKILL every process this runner started that is still alive (by pid), then reap them."""
    killed = 0
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if not descendants(os.getpid()):
                break
            time.sleep(0.05)
    return killed


# --- the job's folder -----------------------------------------------------------------------------

def _record(i: int, rank: int) -> dict[str, Any]:
    # deterministic features; labels cycle 0-2 so every batch of a step holds each of them
    return {"id": rank * 100000 + i, "features": [round(((i * 7 + k * 3 + rank) % 17) / 8.5 - 1.0, 4)
                                                  for k in range(8)], "label": i % 3}


def _bad_line(variant: str | None, rec: dict[str, Any]) -> str:
    if variant == "keyerror":
        rec = {k: v for k, v in rec.items() if k != "label"}
        rec["lable"] = 1
        return json.dumps(rec)
    if variant == "valueerror":
        rec = dict(rec, features=[*rec["features"][:5], "n/a", *rec["features"][6:]])
        return json.dumps(rec)
    # json: a line cut short by an interrupted writer
    text = json.dumps(rec)
    return text[: len(text) // 2]


def write_data(s: Scenario, root: Path, fault_for: dict[int, list[Any]]) -> None:
    """Every rank's shard: JSONL parts (and a binary copy for mmap readers), faults placed in them."""
    per_part = STEPS_PER_PART * s.batch
    total_steps = s.steps + 10
    parts = -(-total_steps // STEPS_PER_PART)
    hf = s.launcher == "hf-trainer"
    for rank in range(s.world):
        d = root / "data" / f"rank{rank:02d}"
        d.mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(parts * per_part):
            if hf:
                lines.append(json.dumps({"id": i, "input_ids": [(i * 31 + k * 7 + rank) % 128 for k in range(32)]}))
            else:
                lines.append(json.dumps(_record(i, rank)))
        fifo_parts: set[int] = set()
        for f in fault_for.get(rank, []):
            idx = f.step * s.batch + 3  # the fourth record of the fault's step
            if f.kind in ("bad_record", "error_then_teardown"):
                if hf:
                    rec = json.loads(lines[idx])
                    rec["input_ids"][5] = "<unk>"
                    lines[idx] = json.dumps(rec)
                else:
                    lines[idx] = _bad_line(f.variant, _record(idx, rank))
            elif f.kind == "nan_input":
                rec = _record(idx, rank)
                rec["features"][2] = float("nan") if f.variant != "inf" else 3.0e39
                lines[idx] = json.dumps(rec)  # json writes NaN / 3e+39 as Python reads them back
            elif f.kind == "collective_mismatch":
                rec = _record(idx, rank)
                rec["label"] = 3
                lines[idx] = json.dumps(rec)
            elif f.kind == "hang_fifo":
                fifo_parts.add(f.step // STEPS_PER_PART)
        for p in range(parts):
            path = d / f"part-{p:03d}.jsonl"
            if p in fifo_parts:
                os.mkfifo(path)
            else:
                path.write_text("\n".join(lines[p * per_part:(p + 1) * per_part]) + "\n")
        rows = total_steps * s.batch
        recs = [_record(i, rank) for i in range(rows)]
        with open(d / "features.bin", "wb") as fh:
            fh.write(struct.pack("<q", rows))
            fh.writelines(struct.pack("<8f", *r["features"]) for r in recs)
            fh.writelines(struct.pack("<q", r["label"]) for r in recs)


def job_config(s: Scenario, root: Path, extra: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "steps": s.steps, "batch": s.batch, "pg_timeout": s.pg_timeout, "logs": s.logs, "world": s.world,
        "procs": s.procs, "faults": [f.model_dump(exclude_none=True) for f in s.faults],
    }
    cfg.update(s.job)
    cfg.update(extra)
    (root / "job.json").write_text(json.dumps(cfg, indent=1))
    return cfg


# --- hosts and launchers --------------------------------------------------------------------------

def hosts_file(s: Scenario, i: int, path: Path) -> None:
    lines = [f"127.0.0.{i + 1}\t{host_name(i)}", "127.0.0.1\tlocalhost"]
    lines += [f"127.0.0.{j + 1}\t{host_name(j)}" for j in range(s.hosts) if j != i]
    lines.append("127.0.0.100\tdatastore")
    path.write_text("\n".join(lines) + "\n")


def launcher_argv(s: Scenario, i: int, root: Path, ports: dict[str, int]) -> list[str]:
    bindir = Path(sys.executable).parent
    py = sys.executable
    host = host_name(i)
    fault = s.last_fault
    port = ports["master"]
    if fault.kind == "rdzv_wrong_port" and fault.host == host:
        port = ports["wrong"]
    if s.launcher == "spawn":
        return [py, "train.py", "--config", "job.json", "--spawn", str(s.procs)]
    if s.launcher == "lightning":
        return [py, "train_lightning.py", "--config", "job.json"]
    script = "train_hf.py" if s.launcher == "hf-trainer" else "train.py"
    if s.launcher == "accelerate":
        argv = [str(bindir / "accelerate"), "launch", "--multi_gpu", "--num_processes", str(s.world),
                "--num_machines", str(s.hosts), "--machine_rank", str(i), "--main_process_ip", host_name(0),
                "--main_process_port", str(port)]
        if s.rdzv == "c10d":
            argv += ["--rdzv_backend", "c10d"]
        return [*argv, script, "--config", "job.json"]
    argv = [str(bindir / "torchrun"), "--nnodes", str(s.hosts), "--nproc_per_node", str(s.procs)]
    rdzv_conf = s.job.get("rdzv_conf")
    if s.rdzv == "c10d":
        endpoint_port = ports["wrong"] if (fault.kind == "rdzv_wrong_endpoint" and fault.host == host) else port
        argv += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{host_name(0)}:{endpoint_port}",
                 "--rdzv_id", job_id(s.name)]
    else:
        argv += ["--node_rank", str(i), "--master_addr", host_name(0), "--master_port", str(port)]
    if rdzv_conf:
        argv += ["--rdzv_conf", rdzv_conf]
    if s.max_restarts:
        argv += ["--max_restarts", str(s.max_restarts)]
    if s.launcher == "torchrun-logdir":
        argv += ["--log_dir", str(root / "logs" / host), "--redirects", "3"]
    else:
        argv += ["--tee", "3"]
    return [*argv, script, "--config", "job.json"]


def host_env(s: Scenario, i: int, ports: dict[str, int], root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAB_", "FAKETIME", "PYTEST"))}
    env.pop("LD_PRELOAD", None)
    env.update({
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(root / "hf-home"), "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
        "TERM": "xterm", "COLUMNS": "120",
    })
    if s.launcher in ("spawn", "lightning"):
        env.update({"MASTER_ADDR": host_name(0), "MASTER_PORT": str(ports["master"])})
    env.update(s.env)
    skew = s.clocks.get(host_name(i), 0.0)
    if skew:
        env.update({
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME": f"{skew:+g}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            # libfaketime 0.9.10 breaks Python 3.11's time.sleep under DONT_FAKE_MONOTONIC (its
            # clock_nanosleep(TIMER_ABSTIME) passes a negative time: wolfcw/libfaketime#426); this
            # sitecustomize re-implements time.sleep with select() for the skewed host's processes
            "PYTHONPATH": str(CLOCKFIX_DIR),
        })
    return env


def wrap_host(s: Scenario, i: int, hosts_path: Path, argv: list[str]) -> list[str]:
    host = host_name(i)
    setup = [f"hostname {host}", f"mount --bind {hosts_path} /etc/hosts"]
    if s.last_fault.kind == "shm_small" and s.last_fault.host == host:
        setup.append("mount -t tmpfs -o size=1m,mode=1777 tmpfs /dev/shm")
    script = " && ".join(setup) + ' && exec "$@"'
    return ["unshare", "--uts", "--mount", "sh", "-c", script, "sh", *argv]


# --- a data server for the transient-error trap ---------------------------------------------------

class _DataHandler(http.server.SimpleHTTPRequestHandler):
    reset_paths: ClassVar[set[str]] = set()
    lock: ClassVar[threading.Lock] = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            reset = self.path in self.reset_paths
            self.reset_paths.discard(self.path)
        if reset:  # the connection dies under the reader (RST), once
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def start_data_server(root: Path, reset: set[str]) -> tuple[http.server.ThreadingHTTPServer, int]:
    handler = type("Handler", (_DataHandler,), {"reset_paths": set(reset), "lock": threading.Lock()})
    server = http.server.ThreadingHTTPServer(
        ("0.0.0.0", 0), lambda *a, **k: handler(*a, directory=str(root / "data"), **k))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


# --- collecting the consoles ----------------------------------------------------------------------

@dataclass
class Console:
    lines: list[tuple[int, int, bytes]] = field(default_factory=list)  # (seq, host index, line)
    lock: threading.Lock = field(default_factory=threading.Lock)
    seq: int = 0

    def reader(self, i: int, stream: Any) -> threading.Thread:
        def run() -> None:
            for line in iter(stream.readline, b""):
                with self.lock:
                    self.lines.append((self.seq, i, line))
                    self.seq += 1
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


def _srun_width(ntasks: int) -> int:
    # Slurm's step_io.c _wid(): digits of the largest task id; labels are "%0*d: "
    return len(str(max(ntasks - 1, 0)))


def _line(b: bytes) -> bytes:
    return b if b.endswith(b"\n") else b + b"\n"


def write_case(s: Scenario, console: Console, case: Path, root: Path) -> None:
    if case.exists():
        shutil.rmtree(case)
    case.mkdir(parents=True)
    lines = sorted(console.lines)
    if s.collect == "per-host":
        for i in range(s.hosts):
            (case / f"{host_name(i)}.log").write_bytes(b"".join(_line(b) for _, h, b in lines if h == i))
    elif s.collect == "console":
        (case / "console.log").write_bytes(b"".join(_line(b) for _, _, b in lines))
    elif s.collect == "srun":
        w = _srun_width(s.hosts)
        jid = int(hashlib.sha1(s.name.encode()).hexdigest()[:6], 16) % 900000 + 100000
        (case / f"slurm-{jid}.out").write_bytes(
            b"".join(f"{h:0{w}d}: ".encode() + _line(b) for _, h, b in lines))
    elif s.collect == "pdsh":
        (case / "train.log").write_bytes(
            b"".join(f"{host_name(h)}: ".encode() + _line(b) for _, h, b in lines))
    if s.launcher == "torchrun-logdir" and (root / "logs").is_dir():
        for host_dir in sorted((root / "logs").iterdir()):
            shutil.copytree(host_dir, case / host_dir.name, dirs_exist_ok=True)


def case_text(case: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(case.rglob("*")) if p.is_file())


# --- one scenario ---------------------------------------------------------------------------------

@dataclass
class RunResult:
    name: str
    status: str  # ok | error
    error: str
    fired: bool
    exit_codes: dict[str, int | None]
    duration_s: float
    processes: dict[int, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "error": self.error, "fired": self.fired,
                "exit_codes": self.exit_codes, "duration_s": round(self.duration_s, 1),
                "processes": {str(k): v for k, v in self.processes.items()}}


def processes_of(meta: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(k): v for k, v in (meta.get("processes") or {}).items()}


def _processes(root: Path, attempt: int | None) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    side = root / "pids"
    if not side.is_dir():
        return found
    records = [json.loads(p.read_text()) for p in side.glob("a*-r*.json")]
    if not records:
        return found
    last = max(r["attempt"] for r in records) if attempt is None else attempt
    for r in records:
        if r["attempt"] == last:
            found[int(r["rank"])] = {k: r[k] for k in ("pid", "host", "local_rank")}
    return found


def _in_order(patterns: tuple[str, ...], text: str) -> bool:
    pos = -1
    for p in patterns:
        m = re.search(p, text, re.MULTILINE)
        if m is None or m.start() <= pos:
            return False
        pos = m.start()
    return True


def check_fired(s: Scenario, case: Path, codes: dict[str, int | None]) -> str:
    """Why the scenario's fault did not show (empty when it did)."""
    text = case_text(case)
    missing = [p for p in s.fired if not re.search(p, text, re.MULTILINE)]
    if missing:
        return "fault did not fire: no line matches " + "; ".join(f"/{p}/" for p in missing)
    if s.fired_order:
        files = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(case.rglob("*")) if p.is_file()]
        if not any(_in_order(s.fired_order, t) for t in files):
            return "the lines did not come in the order the scenario needs: " + " before ".join(
                f"/{p}/" for p in s.fired_order)
    failed = any(c not in (0, None) for c in codes.values())
    if s.expect == "fail" and not failed:
        return "the job exited 0 on every host: the fault did not break it"
    if s.expect == "ok" and failed:
        return "the job was expected to end well but exited " + ", ".join(f"{h}={c}" for h, c in codes.items())
    return ""


def run_scenario(s: Scenario, out: Path, *, keep_work: bool = False) -> RunResult:
    started = time.monotonic()
    root = out / "work" / job_id(s.name)
    case = out / "cases" / s.name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for src in TRAIN_DIR.glob("*.py"):
        shutil.copy(src, root / src.name)
    error = ""
    codes: dict[str, int | None] = {}
    processes: dict[int, dict[str, Any]] = {}
    server = None
    try:
        if s.clocks and not LIBFAKETIME.exists():
            raise RuntimeError(f"{LIBFAKETIME} is missing: apt-get install faketime (lab/install.sh does)")
        fault_for: dict[int, list[Any]] = {}
        for f in s.faults:
            if f.rank is not None:
                fault_for.setdefault(f.rank, []).append(f)
        write_data(s, root, fault_for)
        ports = dict(zip(("master", "wrong"), free_ports(2), strict=False))
        extra: dict[str, Any] = {}
        resets = {f"/rank{f.rank:02d}/part-000.jsonl" for f in s.faults if f.kind == "transient_reset"}
        if resets or s.job.get("loader") == "http":
            server, http_port = start_data_server(root, resets)
            extra["http_data"] = f"http://datastore:{http_port}"
        job_config(s, root, extra)
        if s.job.get("resume"):
            prep = subprocess.run([sys.executable, "prepare.py", "--config", "job.json"], cwd=root,
                                  capture_output=True, text=True, timeout=60, check=False,
                                  env=dict(os.environ, OMP_NUM_THREADS="1"))
            if prep.returncode != 0:
                raise RuntimeError(f"prepare.py failed: {prep.stderr.strip()[-400:]}")
        console = Console()
        procs: list[subprocess.Popen[bytes]] = []
        readers = []
        for i in range(s.hosts):
            hp = root / f"hosts.{host_name(i)}"
            hosts_file(s, i, hp)
            argv = wrap_host(s, i, hp, launcher_argv(s, i, root, ports))
            p = subprocess.Popen(argv, cwd=root, env=host_env(s, i, ports, root), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(p)
            readers.append(console.reader(i, p.stdout))
        deadline = started + HARNESS_TIMEOUT_S
        timed_out = False
        for i, p in enumerate(procs):
            try:
                codes[host_name(i)] = p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            end_leftovers()
            for i, p in enumerate(procs):
                codes[host_name(i)] = p.poll()
            error = f"harness timeout: the job ran longer than {HARNESS_TIMEOUT_S:.0f} s"
        for t in readers:
            t.join(timeout=5)
        end_leftovers()
        write_case(s, console, case, root)
        processes = _processes(root, None)
        if not error:
            error = check_fired(s, case, codes)
    except Exception as exc:  # noqa: BLE001 (any harness failure is this scenario's ERROR)
        error = f"harness error: {type(exc).__name__}: {exc}"
        end_leftovers()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    if not keep_work and not error:
        shutil.rmtree(root, ignore_errors=True)
    return RunResult(name=s.name, status="error" if error else "ok", error=error, fired=not error,
                     exit_codes=codes, duration_s=time.monotonic() - started, processes=processes)


# --- the lab's tables -----------------------------------------------------------------------------

def meta_path(out: Path, name: str) -> Path:
    return out / "meta" / f"{name}.json"


def save_result(out: Path, result: RunResult) -> None:
    path = meta_path(out, result.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=1))


def load_result(out: Path, name: str) -> dict[str, Any] | None:
    path = meta_path(out, name)
    return json.loads(path.read_text()) if path.exists() else None


def write_tables(out: Path, scenarios: list[Scenario]) -> None:
    """labels.tsv (every scenario that ran and fired) and runs.tsv (every scenario that ran)."""
    labels, runs = [], []
    for s in scenarios:
        meta = load_result(out, s.name)
        if meta is None:
            continue
        if meta["status"] == "ok":
            labels.append(label_row(s, processes_of(meta)))
        runs.append({
            "scenario": s.name, "status": meta["status"], "fired": "yes" if meta["fired"] else "no",
            "exit_codes": ",".join(f"{h}={c}" for h, c in meta["exit_codes"].items()),
            "duration_s": meta["duration_s"], "ranks": s.world, "hosts": s.hosts,
            "skew": ",".join(f"{h}{v:+g}s" for h, v in s.clocks.items()), "error": meta["error"],
        })
    for name, rows, cols in (("labels.tsv", labels, LABEL_COLUMNS), ("runs.tsv", runs, RUN_COLUMNS)):
        with open(out / name, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(cols), delimiter="\t", lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
