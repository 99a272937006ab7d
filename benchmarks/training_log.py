"""A multi-rank log shaped like a real training job's, for `bench_matcher --shape training`.

What a 512-rank job's aggregated log is mostly made of (every line behind its launcher's `[rankN]:`
prefix, as torchrun `--tee` / `--log-line-prefix-template` writes it):
- about half metric and progress lines, in the formats the frameworks print: HF Trainer's dicts,
  Megatron's `iteration N/ M | ... lm loss ... | grad norm ... |`, DeepSpeed's step and timer lines,
  tqdm bars (HF and Lightning);
- about a third NCCL INFO lines and framework chatter (ProcessGroupNCCL, elastic agent, data loaders);
- the rest other INFO lines (checkpoint saves, throughput, wandb);
- one line in a thousand a failure, taken from the rule library's own examples.
"""

from __future__ import annotations

import random
from pathlib import Path

from correlator.diagnosis.rules import load_ruleset

RANKS = 512

# Metric and progress lines (about half of all lines).
ROUTINE = [
    "[rank{r}]:{{'loss': {loss:.4f}, 'grad_norm': {g:.4f}, 'learning_rate': {lr:.3e}, 'epoch': {ep:.2f}}}",
    ("[rank{r}]: iteration {s:>8}/  500000 | consumed samples: {cs:>12} | elapsed time per iteration (ms): {ms:.1f} | "
    "learning rate: {lr:.3E} | global batch size:   512 | lm loss: {loss:.6E} | loss scale: 1.0 | "
    "grad norm: {g:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |"),
    ("[rank{r}]:[2026-03-14 09:{mm:02d}:{ss:02d},{ms3:03d}] [INFO] [logging.py:96:log_dist] [Rank {r}] step={s}, "
    "skipped=0, lr=[{lr:.6g}], mom=[(0.9, 0.95)]"),
    ("[rank{r}]:[2026-03-14 09:{mm:02d}:{ss:02d},{ms3:03d}] [INFO] [timer.py:260:stop] epoch=0/micro_step={s}/"
    "global_step={s}, RunningAvgSamplesPerSec={sps:.2f}, CurrSamplesPerSec={sps:.2f}, MemAllocated=21.4GB, "
    "MaxMemAllocated=38.2GB"),
    "[rank{r}]:Epoch 0:  {p:>2}%|\u2588\u258d        | {s}/500150 [6:28:43<94:39:17,  1.37it/s, loss={loss:.3f}, v_num=95nc]",
    "[rank{r}]: {p:>2}%|\u2588\u258f        | {s}/10000 [25:11<3:04:52,  1.26s/it]",
    ("[rank{r}]:[I314 09:{mm:02d}:{ss:02d}.{us:06d} train.py:412] step {s} loss {loss:.4f} lr {lr:.2e} "
    "grad_norm {g:.3f} tokens/s 41234"),
]
# NCCL INFO and framework chatter (about a third).
CHATTER = [
    "[rank{r}]:{host}:{pid}:{tid} [{gpu}] NCCL INFO Channel {c:02d}/24 : {r}[{gpu}] -> {r1}[{gpu}] via P2P/CUMEM/read",
    "[rank{r}]:{host}:{pid}:{tid} [{gpu}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "[rank{r}]:{host}:{pid}:{pid} [{gpu}] NCCL INFO cudaDriverVersion 12040",
    "[rank{r}]:{host}:{pid}:{tid} [{gpu}] NCCL INFO NET/IB : Using [0]mlx5_{gpu}:1/IB [RO]; OOB eth0:10.0.{c}.{gpu}<0>",
    ("[rank{r}]:{host}:{pid}:{tid} [{gpu}] NCCL INFO {c} coll channels, {c} collnet channels, 0 nvls channels, "
    "32 p2p channels, 32 p2p channels per peer"),
    ("[rank{r}]:[W314 09:{mm:02d}:{ss:02d}.{us:06d} ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank {r}] using "
    "GPU {gpu} to perform barrier as devices used by this process are currently unknown."),
    "[rank{r}]:INFO:torch.distributed.elastic.agent.server.api:[default] Starting worker group",
    "[rank{r}]:Loading data shard {c} of 1024 from /data/tokens/shard-{pid}.bin ({ms3} MB)",
]
# Other INFO lines (the rest).
OTHER = [
    ("[rank{r}]:[2026-03-14 09:{mm:02d}:{ss:02d},{ms3:03d}] [INFO] [torch_checkpoint_engine.py:21:save] "
    "[Torch] Saving /ckpt/global_step{s}/mp_rank_00_model_states.pt..."),
    "[rank{r}]:wandb: logging step {s} to run smooth-sun-42 (https://wandb.ai/team/llm/runs/9x3k2p1q)",
    "[rank{r}]:throughput: {sps:.1f} samples/s, {ms:.1f} ms/iter, TFLOPs/GPU {tf:.1f}",
    "(RayWorkerWrapper pid={pid}, ip=10.0.{c}.{gpu}) INFO worker.py:1432 -- Task finished in 0.{ms3}s",
]


def _line(template: str, rng: random.Random, step: int) -> str:
    r = rng.randrange(RANKS)
    return template.format(
        r=r, r1=(r + 1) % RANKS, s=step, cs=step * 512, loss=rng.random() * 3, g=rng.random() * 2,
        lr=3e-4 * rng.random(), ep=step / 5000, ms=1200 + rng.random() * 400, mm=rng.randrange(60),
        ss=rng.randrange(60), ms3=rng.randrange(1000), us=rng.randrange(10**6), sps=300 + rng.random() * 50,
        p=rng.randrange(100), host=f"gpu-node-{r // 8:03d}", pid=30000 + r, tid=31000 + r, gpu=r % 8,
        c=rng.randrange(24), tf=150 + rng.random() * 20,
    )


def write_training_log(path: Path, size_bytes: int, *, failure_rate: float = 0.001, seed: int = 1,
                       block_lines: int = 100_000) -> int:
    """Write about `size_bytes` of training-shaped log to `path` (a block of `block_lines` lines,
    repeated with its steps moved on); returns the number of lines."""
    rng = random.Random(seed)
    failures = [line for lr in load_ruleset().rules if lr.rule.kind == "signature" for line in lr.rule.examples.match]
    block: list[tuple[str, int]] = []  # (template or failure line, 0) / (template, 1)
    for _ in range(block_lines):
        u = rng.random()
        if u < failure_rate:
            block.append((rng.choice(failures), 0))
        elif u < 0.5:
            block.append((rng.choice(ROUTINE), 1))
        elif u < 0.5 + 1 / 3:
            block.append((rng.choice(CHATTER), 1))
        else:
            block.append((rng.choice(OTHER), 1))
    lines = written = 0
    step = 0
    with path.open("wb") as fh:
        while written < size_bytes:
            out = []
            for i, (text, templated) in enumerate(block):
                out.append(_line(text, rng, step + i // RANKS) if templated else text)
            step += block_lines // RANKS
            data = ("\n".join(out) + "\n").encode()
            fh.write(data)
            written += len(data)
            lines += len(out)
    return lines

