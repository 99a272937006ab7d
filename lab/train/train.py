"""A small data-parallel training job on CPU (gloo): torchrun, torch.multiprocessing.spawn or accelerate.

Usage: train.py --config job.json   (under torchrun / accelerate launch)
       train.py --config job.json --spawn N   (starts N processes itself)
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import trainlib as tl


def build_groups(cfg: tl.Config, rank: int, world: int) -> tuple[Any, Any]:
    """Tensor-parallel groups of `tp` consecutive ranks, data-parallel groups across them."""
    tp = int(cfg.raw.get("tp", 1))
    if tp <= 1:
        return None, None
    tp_group = dp_group = None
    timeout = timedelta(seconds=int(cfg.raw.get("pg_timeout", 15)))  # a new group's default is 30 minutes
    for start in range(0, world, tp):
        g = dist.new_group(list(range(start, start + tp)), timeout=timeout)
        if start <= rank < start + tp:
            tp_group = g
    for offset in range(tp):
        g = dist.new_group(list(range(offset, world, tp)), timeout=timeout)
        if rank % tp == offset:
            dp_group = g
    return tp_group, dp_group


def worker(cfg: tl.Config, rank: int, world: int, local_rank: int, accelerator: Any = None) -> None:
    rep = tl.Reporter(cfg.raw.get("logs", "logging-all"), rank)
    torch.manual_seed(1234)
    model = tl.MLP(int(cfg.raw.get("hidden", 32)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    tp_group, dp_group = build_groups(cfg, rank, world)
    start = tl.restore(cfg, model, opt, rank, rep)
    sync = cfg.raw.get("sync", "ddp")
    if accelerator is not None:
        model, opt = accelerator.prepare(model, opt)
    elif sync == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, process_group=dp_group)
    steps = int(cfg.steps)
    rep.info("world size %d, %d steps, batch %d per rank", world, steps, cfg.batch)
    data = tl.batches(cfg, rank)
    step = start
    try:
        for step in range(start, start + steps):
            tl.HAZARDS.at_step(cfg, rank, step)
            x, y = next(data)
            if cfg.raw.get("monitored_barrier") and step % 5 == 0:  # every rank has its batch: in step
                dist.monitored_barrier(timeout=timedelta(seconds=int(cfg.raw.get("pg_timeout", 15))))
            logits = model(x, tp_group) if tp_group is not None else model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            if cfg.raw.get("nan_guard") and not torch.isfinite(loss):
                raise FloatingPointError(cfg.nan_guard.format(step=step, loss=loss.item()))
            opt.zero_grad()
            if accelerator is not None:
                accelerator.backward(loss)
            else:
                loss.backward()
            extra = ""
            if sync == "manual":
                if tl.HAZARDS.due(cfg, rank, step, "grad_bitflip"):
                    tl.flip_bit(model.fc1.weight.grad)
                gnorm = tl.grad_norm(model)
                extra = f" grad_norm={gnorm:.4g}" if rep.style == "print-all" else f" | grad_norm {gnorm:.4g}"
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= world
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            counts = torch.bincount(y)  # label histogram of the step, summed over ranks
            dist.all_reduce(counts)
            rep.step(step, start + steps, loss.item(), extra)
            time.sleep(float(cfg.raw.get("step_sleep", 0.05)))
    except (ValueError, KeyError):  # bad data, not a broken process group: keep what we have
        if cfg.raw.get("on_error") == "emergency-save":
            rep.info("saving an emergency checkpoint (step %d)", step)
            tl.emergency_save(cfg, (model.module if hasattr(model, "module") else model).state_dict(), rank)
        raise
    rep.close()
    rep.info("training finished after %d steps", steps)
    if rank == 0 and cfg.raw.get("save_final", True):
        torch.save((model.module if hasattr(model, "module") else model).state_dict(), cfg.root / "final.pt")
    dist.barrier()
    dist.destroy_process_group()


def spawned(local_rank: int, cfg: tl.Config, nprocs: int) -> None:
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ["WORLD_SIZE"] = str(nprocs)
    tl.note_process(cfg, local_rank, local_rank)
    tl.init_gloo(cfg)
    worker(cfg, local_rank, nprocs, local_rank)


def main() -> None:
    cfg = tl.config_from_argv()
    os.chdir(cfg.root)
    if "--spawn" in sys.argv:
        n = int(sys.argv[sys.argv.index("--spawn") + 1])
        import torch.multiprocessing as mp
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        mp.spawn(spawned, args=(cfg, n), nprocs=n, join=True)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    tl.note_process(cfg, rank, local_rank)
    accelerator = None
    if cfg.raw.get("framework") == "accelerate":
        from accelerate import Accelerator, InitProcessGroupKwargs
        accelerator = Accelerator(
            cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=int(cfg.pg_timeout)))])
    else:
        tl.init_gloo(cfg)
    worker(cfg, rank, world, local_rank, accelerator)


if __name__ == "__main__":
    main()
