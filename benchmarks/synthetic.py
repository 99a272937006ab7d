"""A large synthetic training log: realistic chatter from many ranks with ~0.1% failure lines.

Failure lines are taken from the rule library's own examples, so every rule class appears.
"""

from __future__ import annotations

import random
from pathlib import Path

from correlator.diagnosis.rules import load_ruleset

CHATTER = [
    "[rank{r}]:[I{md} {hms}.{us} train.py:412] step {s} loss {loss:.4f} lr 3.0e-04 grad_norm {g:.3f} tokens/s 41234",
    "{host}:{pid}:{tid} [{gpu}] NCCL INFO Channel {c:02d}/24 : 0[{gpu}] -> 1[{gpu}] via P2P/CUMEM/read",
    "Epoch {e}:  {p}%|████▍     | {s}/500150 [6:28:43<94:39:17,  1.37it/s, loss={loss:.3f}, v_num=95nc]",
    ("[default{lr}]:[2026-03-14 09:{mm:02d}:{ss:02d},{ms:03d}] [INFO] [logging.py:96:log_dist] [Rank {r}] step={s}, "
     "skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]"),
    "[rank{r}]: {{'loss': {loss:.4f}, 'grad_norm': {g:.4f}, 'learning_rate': 2.9e-05, 'epoch': 1.{s}}}",
    "{host}:{pid}:{pid} [{gpu}] NCCL INFO cudaDriverVersion 12040",
    "(RayWorkerWrapper pid={pid}, ip=10.0.{c}.{gpu}) INFO worker.py:1432 -- Task finished in 0.{ms}s",
]


def write_log(path: Path, size_bytes: int, *, failure_rate: float = 0.001, seed: int = 1) -> int:
    """Write about `size_bytes` of log to `path`; returns the number of lines."""
    rng = random.Random(seed)
    failures = [line for lr in load_ruleset().rules if lr.rule.kind == "signature" for line in lr.rule.examples.match]
    block: list[str] = []
    for i in range(20000):
        if rng.random() < failure_rate:
            block.append(rng.choice(failures))
            continue
        r = rng.randrange(512)
        block.append(
            rng.choice(CHATTER).format(
                r=r, lr=r % 8, md="0314", hms=f"09:{rng.randrange(60):02d}:{rng.randrange(60):02d}",
                us=rng.randrange(10**6), s=i, loss=rng.random() * 3, g=rng.random() * 2, host=f"gpu-node-{r // 8:03d}",
                pid=30000 + r, tid=31000 + r, gpu=r % 8, c=rng.randrange(24), e=rng.randrange(9), p=rng.randrange(100),
                mm=rng.randrange(60), ss=rng.randrange(60), ms=rng.randrange(1000),
            )
        )
    chunk = ("\n".join(block) + "\n").encode()
    lines = 0
    with path.open("wb") as fh:
        written = 0
        while written < size_bytes:
            fh.write(chunk)
            written += len(chunk)
            lines += len(block)
    return lines
