"""Write the checkpoint a job resumes from, then damage it the way the scenario says.

Usage: python prepare.py --config job.json   (run once by the lab runner before the job starts)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import trainlib as tl


def truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def flip(path: Path, offset_from_end: int, n: int = 16) -> None:
    data = bytearray(path.read_bytes())
    start = len(data) - offset_from_end
    for i in range(start, start + n):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def main() -> None:
    cfg = tl.config_from_argv()
    ck = cfg.root / "ckpt"
    ck.mkdir(exist_ok=True)
    torch.manual_seed(7)
    world = int(cfg.world)
    fault = cfg.fault
    target = fault.get("rank")
    kind, variant = fault.get("kind"), fault.get("variant")
    hidden = int(cfg.raw.get("hidden", 32))
    for rank in range(world):
        hit = target is None or target == rank
        h = hidden
        if hit and kind == "state_dict" and variant == "shape":
            h = hidden * 2  # the checkpoint of a wider model
        model = tl.MLP(h)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model(torch.randn(4, tl.FEATURES)).sum().backward()
        opt.step()
        sd = model.state_dict()
        if hit and kind == "state_dict" and variant == "keys":
            # saved from a model whose layers were renamed (encoder./head.) in a later refactor
            sd = {k.replace("fc1", "encoder").replace("fc2", "head"): v for k, v in sd.items()}
        shard = ck / f"shard-{rank:05d}-of-{world:05d}.pt"
        torch.save({"model": sd, "optimizer": opt.state_dict(), "step": 100}, shard)
        from safetensors.torch import save_file
        st = ck / f"model-{rank:05d}-of-{world:05d}.safetensors"
        save_file({k: v.contiguous() for k, v in sd.items()}, str(st))
        rng = ck / f"rng_state_{rank}.pth"
        torch.save({"cpu": torch.get_rng_state()}, rng)
        if rank == 0:
            torch.save(sd, ck / "model.pt")
        if not hit:
            continue
        if kind == "ckpt_truncated":
            truncate(st if variant == "safetensors" else shard, 0.55)
        elif kind == "ckpt_corrupt":
            # bytes damaged in the zip's central directory (at the end) or in the pickle (at the start)
            if variant == "pickle":
                data = bytearray(shard.read_bytes())
                for i in range(70, 86):
                    data[i] ^= 0x5A
                shard.write_bytes(bytes(data))
            else:
                flip(shard, 200)
        elif kind == "ckpt_rng_empty":
            rng.write_bytes(b"")
    os.sync()


if __name__ == "__main__":
    main()
