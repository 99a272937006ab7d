"""What every lab training program shares: its config, logging styles, data readers, model, checkpoints.

This file is copied into each job's folder next to the entry script, so tracebacks show a user's
`trainlib.py`, never the lab. It imports torch: it runs only inside a job (never in `make test`).

Faults are injected by the environment wherever that is possible (a bad line in a rank's shard, a
FIFO where a data part should be, a truncated checkpoint, a tiny /dev/shm, a reset HTTP connection);
the few that need the process's own hand (a signal, a truncation under an mmap, a bit flip) happen in
`Hazards.at_step`, which prints nothing: the log holds only what the libraries and the user code print.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

FEATURES = 8
CLASSES = 4  # labels in the data are 0-2; 3 is a class that is rare in the data

log = logging.getLogger("train")


# --- config ---------------------------------------------------------------------------------------

class Config:
    """The job's config file (written by the lab runner), with the fault of the current attempt."""

    def __init__(self, path: str) -> None:
        self.path = Path(path).resolve()
        self.root = self.path.parent
        self.raw: dict[str, Any] = json.loads(self.path.read_text())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "raw":  # unpickling (mp.spawn) looks these up before __init__
            raise AttributeError(name)
        try:
            return self.raw[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def attempt(self) -> int:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    @property
    def fault(self) -> dict[str, Any]:
        faults = self.raw.get("faults") or [{}]
        return faults[min(self.attempt, len(faults) - 1)]


def config_from_argv() -> Config:
    args = sys.argv[1:]
    path = args[args.index("--config") + 1] if "--config" in args else "job.json"
    return Config(path)


def note_process(cfg: Config, rank: int, local_rank: int) -> None:
    """Tell the lab runner which pid holds which rank (a side file, never the log)."""
    side = cfg.root / "pids"
    side.mkdir(exist_ok=True)
    tmp = side / f".a{cfg.attempt}-r{rank}"
    tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "rank": rank,
                               "local_rank": local_rank, "attempt": cfg.attempt}))
    tmp.rename(side / f"a{cfg.attempt}-r{rank}.json")


# --- logging --------------------------------------------------------------------------------------

class Reporter:
    """How this job's user code talks: python logging on every rank or rank 0 only, or plain prints."""

    def __init__(self, style: str, rank: int) -> None:
        self.style = style
        self.rank = rank
        if style == "logging-all":
            logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                                format="%(asctime)s - %(levelname)s - %(name)s - %(message)s")
        elif style == "logging-rank0":
            logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stdout,
                                format="[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] "
                                       "%(message)s")
        elif style == "logging-ranked":
            logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                                format=f"%(asctime)s.%(msecs)03d [RANK {rank}] %(levelname)s %(message)s",
                                datefmt="%Y-%m-%d %H:%M:%S")
        else:  # print-rank0, print-all, tqdm: warnings still go through logging (no time)
            logging.basicConfig(level=logging.WARNING, format="%(levelname)s:%(name)s:%(message)s")
        self.bar: Any = None

    def info(self, msg: str, *args: Any) -> None:
        if self.style.startswith("logging"):
            log.info(msg, *args)
        elif self.style == "print-all":
            print(f"[rank {self.rank}] " + (msg % args if args else msg), flush=True)
        elif self.rank == 0:
            text = msg % args if args else msg
            if self.bar is not None:
                self.bar.write(text)
            else:
                print(text, flush=True)

    def step(self, step: int, total: int, loss: float, extra: str = "") -> None:
        if self.style == "tqdm":
            if self.rank == 0:
                if self.bar is None:
                    from tqdm import tqdm
                    self.bar = tqdm(total=total, desc="train", dynamic_ncols=False, ncols=90)
                self.bar.update(1)
                self.bar.set_postfix(loss=f"{loss:.4f}")
            return
        if self.style == "print-rank0" and self.rank == 0:
            print(f"step {step:4d}/{total} | loss {loss:.4f}{extra}", flush=True)
        elif self.style == "print-all":
            print(f"[rank {self.rank}] step {step} loss={loss:.4f}{extra}", flush=True)
        elif self.style.startswith("logging"):
            log.info("step %d/%d loss %.4f%s", step, total, loss, extra)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --- data -----------------------------------------------------------------------------------------

def rank_dir(cfg: Config, rank: int) -> Path:
    return cfg.root / "data" / f"rank{rank:02d}"


def parse_record(line: str) -> tuple[list[float], int]:
    rec = json.loads(line)
    features = [float(v) for v in rec["features"]]
    if len(features) != FEATURES:
        raise ValueError(f"record {rec.get('id')}: expected {FEATURES} features, got {len(features)}")
    return features, int(rec["label"])


def _fetch(url: str, retries: int = 4) -> str:
    """Read one data part over HTTP, as object-store readers do: retried with a back-off."""
    delay = 0.5
    for attempt in range(1, retries + 1):
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return resp.read().decode()
        except (ConnectionError, urllib.error.URLError, OSError) as exc:
            if attempt == retries:
                raise
            log.warning("GET %s failed (attempt %d/%d): %s; retrying in %.1fs", url, attempt, retries, exc,
                        delay, exc_info=True)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def json_lines(cfg: Config, rank: int) -> Iterator[str]:
    """The rank's records, part after part (a part may come over HTTP, or be a pipe from a decoder)."""
    parts = sorted(p.name for p in rank_dir(cfg, rank).iterdir() if p.name.startswith("part-"))
    for name in parts:
        if cfg.raw.get("http_data"):
            text = _fetch(f"{cfg.http_data}/rank{rank:02d}/{name}")
            yield from text.splitlines()
            continue
        with open(rank_dir(cfg, rank) / name, encoding="utf-8") as fh:
            yield from fh


def json_batches(cfg: Config, rank: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    xs: list[list[float]] = []
    ys: list[int] = []
    for line in json_lines(cfg, rank):
        x, y = parse_record(line)
        xs.append(x)
        ys.append(y)
        if len(xs) == cfg.batch:
            yield torch.tensor(xs, dtype=torch.float32), torch.tensor(ys)
            xs, ys = [], []


class MappedShard:
    """A binary shard of float32 features mapped into memory (labels follow the features)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh = open(path, "rb")  # noqa: SIM115 (open as long as the mapping)
        self.map = mmap.mmap(self.fh.fileno(), 0, access=mmap.ACCESS_READ)
        (self.rows,) = struct.unpack_from("<q", self.map, 0)

    def batch(self, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (index * size) % max(self.rows - size, 1)
        feat = 8 + start * FEATURES * 4
        x = torch.frombuffer(self.map, dtype=torch.float32, count=size * FEATURES, offset=feat).clone()
        lab = 8 + self.rows * FEATURES * 4 + start * 8
        y = torch.frombuffer(self.map, dtype=torch.int64, count=size, offset=lab).clone()
        return x.view(size, FEATURES), y


class WideDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Samples with a large side tensor (an image-sized crop), served by DataLoader worker processes."""

    def __init__(self, cfg: Config, rank: int) -> None:
        self.lines = list(json_lines(cfg, rank))
        self.side = int(cfg.raw.get("side_elems", 4096))

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y = parse_record(self.lines[i])
        g = torch.Generator().manual_seed(i)
        return torch.tensor(x), torch.tensor(y), torch.randn(self.side, generator=g)


def batches(cfg: Config, rank: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    kind = cfg.raw.get("loader", "json")
    if kind == "json":
        yield from json_batches(cfg, rank)
    elif kind == "mmap":
        shard = MappedShard(rank_dir(cfg, rank) / "features.bin")
        HAZARDS.mapped = shard
        for i in range(10**9):
            yield shard.batch(i, cfg.batch)
    elif kind == "workers":
        if cfg.raw.get("sharing"):  # e.g. file_system, the usual cure for "too many open files"
            torch.multiprocessing.set_sharing_strategy(cfg.sharing)
        loader = torch.utils.data.DataLoader(WideDataset(cfg, rank), batch_size=cfg.batch,
                                             num_workers=int(cfg.raw.get("workers", 2)), shuffle=False)
        it = iter(loader)
        HAZARDS.loader_iter = it
        for x, y, side in it:
            yield x + 0.0 * side[:, :FEATURES], y
    else:
        raise ValueError(f"unknown loader {kind!r}")


# --- model ----------------------------------------------------------------------------------------

class MLP(torch.nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, hidden)
        self.fc2 = torch.nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor, tp_group: Any = None) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if tp_group is not None:  # tensor-parallel style: partial activations summed over the TP group
            summed = h.detach().clone()
            dist.all_reduce(summed, group=tp_group)
            h = h + (summed - h).detach()
        return self.fc2(h)


# --- checkpoints ----------------------------------------------------------------------------------

def restore(cfg: Config, model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, rep: Reporter) -> int:
    """Resume from `ckpt/`: each rank restores its own shard, RNG state and weights file."""
    what = cfg.raw.get("resume") or []
    if not what:
        return 0
    ck = cfg.root / "ckpt"
    step = 0
    rep.info("resuming from %s", ck)
    if "weights" in what:
        sd = torch.load(ck / "model.pt", weights_only=True)
        model.load_state_dict(sd)
    if "shard" in what:
        shard = torch.load(ck / f"shard-{rank:05d}-of-{cfg.world:05d}.pt", weights_only=True)
        model.load_state_dict(shard["model"])
        opt.load_state_dict(shard["optimizer"])
        step = int(shard["step"])
    if "safetensors" in what:
        from safetensors.torch import load_file
        model.load_state_dict(load_file(str(ck / f"model-{rank:05d}-of-{cfg.world:05d}.safetensors")))
    if "rng" in what:
        state = torch.load(ck / f"rng_state_{rank}.pth", weights_only=True)
        torch.set_rng_state(state["cpu"])
    rep.info("resumed at step %d", step)
    return step


def emergency_save(cfg: Config, weights: dict[str, Any], rank: int) -> None:
    """Write what we have before dying (to slow storage: it takes a while)."""
    out = cfg.root / "emergency"
    out.mkdir(exist_ok=True)
    torch.save(weights, out / f"rank{rank}.pt")
    time.sleep(float(cfg.raw.get("emergency_save_s", 2.5)))


# --- hazards: the faults that need the process's own hand -----------------------------------------

class Hazards:
    mapped: MappedShard | None = None
    loader_iter: Any = None

    def due(self, cfg: Config, rank: int, step: int, kind: str) -> bool:
        f = cfg.fault
        return f.get("kind") == kind and f.get("rank") == rank and f.get("step", 0) == step

    def at_step(self, cfg: Config, rank: int, step: int) -> None:
        f = cfg.fault
        if f.get("rank") != rank or f.get("step", 0) != step:
            return
        kind = f.get("kind")
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "sigsegv":
            _copy_from_native(16, 64)
        elif kind == "sigabrt":
            _release_pinned_twice()
        elif kind == "sigbus_mmap" and self.mapped is not None:
            # another process rewrites the shard in place while this rank has it mapped
            subprocess.run(["truncate", "-s", "0", str(self.mapped.path)], check=True)
        elif kind == "dataloader_worker_kill" and self.loader_iter is not None:
            workers = getattr(self.loader_iter, "_workers", [])
            if workers:
                os.kill(workers[0].pid, signal.SIGKILL)


HAZARDS = Hazards()


def _copy_from_native(address: int, n: int) -> bytes:
    return ctypes.string_at(address, n)


def _release_pinned_twice() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    buf = libc.malloc(256)
    libc.free(buf)
    libc.free(buf)


def flip_bit(t: torch.Tensor, bit: int = 30) -> None:
    """One bit of the tensor's largest element flipped (an exponent bit: x * 2**128 or so)."""
    flat = t.view(-1)
    i = int(flat.abs().argmax())
    as_int = flat.view(torch.int32)
    as_int[i] ^= 1 << bit


def grad_norm(model: torch.nn.Module) -> float:
    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += float(p.grad.double().pow(2).sum())
    return math.sqrt(total)


def init_gloo(cfg: Config) -> None:
    timeout = timedelta(seconds=int(cfg.raw.get("pg_timeout", 15)))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0:
        dist.init_process_group("gloo", timeout=timeout)
        return
    # A restarted worker group reuses the elastic agent's store, and torch 2.13 adds no per-attempt prefix
    # (rendezvous.py assumes a new store per retry): gloo's full mesh would dial the dead attempt's
    # addresses ("connectFullMesh failed ... Connection refused"). Keep each attempt's keys apart.
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"/attempt_{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=world, timeout=timeout)
