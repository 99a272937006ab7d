"""Logs of one line family each, for `bench_families`: what a healthy training job prints most.

Each family is written from its library's own message format (the source named beside it), with
several ranks interleaved and the launchers' prefixes where they put one. None is taken from the
corpus or from the rules' examples. A family file holds no failure: it measures what the routine lines
cost. The mixed log is `benchmarks/training_log.py` (half metric and progress lines, 512 ranks).

- `hf_trainer`: transformers' Trainer `log()`, printed by ProgressCallback.on_log as `str(logs)`:
  `{'loss': ..., 'grad_norm': ..., 'learning_rate': ..., 'epoch': ...}` every logging step, an eval dict
  now and then and the closing `{'train_runtime': ..., 'train_samples_per_second': ..., ...}`. Rank 0
  prints them (no prefix, as a plain `torchrun ... > log` captures them); every other block comes from a
  job that prints them on every rank behind torchrun's `[rankN]:` prefix.
- `megatron`: Megatron-LM's `training_log` (` iteration      100/  500000 | consumed samples: ... |`), the
  memory report (`[Rank N] (after 10 iterations) memory (MB) | allocated: ...`) and the timers
  (`    forward-backward ...: (min, max)`), from the last pipeline stage's ranks, `[rankN]:` prefixed.
- `deepspeed`: DeepSpeed's `log_dist` step line (`[Rank 0] step=..., skipped=..., lr=[...], mom=[...]`),
  the `timer.py` throughput line and the `time (ms) | fwd_microstep: ...` line, behind the pdsh runner's
  `host: ` prefix.
- `progress_bars`: tqdm bars (`  12%|█▏        | 120/1000 [00:30<03:40,  4.00it/s]`) and Lightning's
  (`Epoch 0:  12%|...| 120/1000 [00:30<03:40, 4.00it/s, v_num=0, train_loss=2.340]` and the older
  `loss=2.34`), each redraw after a `\r`, a newline when the bar closes; some ranks `[rankN]:` prefixed.
- `nccl_info`: NCCL_DEBUG=INFO chatter (`host:pid:tid [dev] NCCL INFO ...`): a communicator's init burst
  (channels, rings, trees, `Init COMPLETE`) now and then, and the COLL subsystem's line per collective
  (`AllReduce: opCount 1a2 sendbuff ... count ... datatype ... comm 0x... [nranks=64] stream 0x...`).
- `torchelastic`: the elastic agent's lines in glog form (`I1204 10:15:32.123456 140234
  torch/distributed/elastic/agent/server/api.py:872] [default] ...`) and in logging's default form
  (`INFO:torch.distributed.elastic.agent.server.api:[default] ...`), rendezvous and health chatter.
- `python_logging`: Python logging INFO lines of a training script (`2026-12-04 10:15:32,123 - INFO -
  __main__ - ...`, the Hydra form `[2026-12-04 10:15:32,123][__main__][INFO] - ...`), step lines with a
  loss among data-loading, checkpoint and evaluation lines, `[rankN]:` prefixed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

FAMILIES = ("hf_trainer", "megatron", "deepspeed", "progress_bars", "nccl_info", "torchelastic", "python_logging")
RANKS = 64

_BAR = "▏▎▍▌▋▊▉█"


def _stamp(rng: random.Random, step: int, sep: str = ",") -> str:
    """A wall-clock time that moves with the step: `2026-12-04 10:15:32,123`."""
    seconds = 36000 + step * 2 + rng.random()
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"2026-12-04 {h % 24:02d}:{m:02d}:{s:02d}{sep}{int((seconds % 1) * 1000):03d}"


def _glog(rng: random.Random, step: int, level: str = "I") -> str:
    seconds = 36000 + step * 2 + rng.random()
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{level}1204 {h % 24:02d}:{m:02d}:{s:02d}.{int((seconds % 1) * 1e6):06d}"


def _hf_trainer(rng: random.Random, step: int) -> list[str]:
    """One logging step of a Trainer: a dict per printing rank; an eval dict and a run's summary sometimes."""
    # every other block: a job that prints on every rank, behind torchrun's prefix
    ranks = [None] if _plain(step) else rng.sample(range(RANKS), 8)
    out = []
    epoch = round(step / 4000, 2)
    lr = 2e-05 * (1 - (step % 40000) / 40000)
    for r in ranks:
        loss = round(2.5 * rng.random() + 0.5, 4)
        text = (f"{{'loss': {loss}, 'grad_norm': {rng.random() * 3 + 0.2!r}, 'learning_rate': {lr!r}, "
                f"'epoch': {epoch}}}")
        out.append(text if r is None else f"[rank{r}]:{text}")
    if step % 97 == 0:
        out.append(f"{{'eval_loss': {rng.random() + 1!r}, 'eval_runtime': {rng.random() * 90 + 10:.4f}, "
                   f"'eval_samples_per_second': {rng.random() * 50 + 20:.3f}, 'eval_steps_per_second': "
                   f"{rng.random() * 5 + 1:.3f}, 'epoch': {epoch}}}")
    if step % 997 == 0:
        out.append(f"{{'train_runtime': {rng.random() * 9000 + 1000:.4f}, 'train_samples_per_second': "
                   f"{rng.random() * 50 + 10:.3f}, 'train_steps_per_second': {rng.random():.3f}, 'total_flos': "
                   f"{rng.random() * 1e18:.6e}, 'train_loss': {rng.random() + 1!r}, 'epoch': {epoch}}}")
    return out


def _plain(step: int) -> bool:
    """Every other block of a family is captured without the launcher's prefix (torchrun's default, a
    plain `srun`): one writer, no identity in front of its lines."""
    return (step // 200) % 2 == 0


def _megatron(rng: random.Random, step: int) -> list[str]:
    """`training_log` of the last pipeline stage: one rank per data-parallel replica behind `[rankN]:`, or
    the one last rank of a log captured without prefixes."""
    out = []
    plain = _plain(step)
    for r in (63,) if plain else (7, 15, 23, 31, 39, 47, 55, 63):
        loss = 2.0 + rng.random()
        head = "" if plain else f"[rank{r}]:"
        out.append(
            f"{head} [{_stamp(rng, step, '.')[:19]}] iteration {step:>8}/  500000 | consumed samples: "
            f"{step * 512:>12} | elapsed time per iteration (ms): {4000 + rng.random() * 300:.1f} | throughput per "
            f"GPU (TFLOP/s/GPU): {170 + rng.random() * 20:.1f} | learning rate: {3e-4 * rng.random():.6E} | global "
            f"batch size:   512 | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {rng.random() + 0.2:.3f} | "
            f"number of skipped iterations:   0 | number of nan iterations:   0 |")
    if step % 10 == 0:
        r = 63 if plain else rng.choice((7, 15, 23, 31))
        head = "" if plain else f"[rank{r}]:"
        out.append(f"{head}[Rank {r}] (after {step} iterations) memory (MB) | allocated: "
                   f"{20000 + rng.random() * 1000:.1f} | max allocated: {38000 + rng.random() * 1000:.1f} | "
                   f"reserved: 41236.0 | max reserved: 41236.0")
        for name in ("forward-backward", "forward-compute", "backward-compute", "optimizer", "batch-generator"):
            low = rng.random() * 4000
            out.append(f"{head}    {name} {'.' * (40 - len(name))}: ({low:.2f}, {low + rng.random() * 10:.2f})")
    return out


def _deepspeed(rng: random.Random, step: int) -> list[str]:
    """log_dist's step line and the throughput timer of each node's first rank, behind pdsh's `host: `
    prefix (the multi-node runner), or one node's log without it."""
    out = []
    plain = _plain(step)
    for node in (0,) if plain else rng.sample(range(8), 4):
        rank = node * 8
        at = _stamp(rng, step)
        lr = 3e-4 * rng.random()
        head = "" if plain else f"gpu-node-{node:03d}: "
        out.append(f"{head}[{at}] [INFO] [logging.py:96:log_dist] [Rank {rank}] step={step}, "
                   f"skipped=0, lr=[{lr}, {lr}], mom=[(0.9, 0.95), (0.9, 0.95)]")
        sps = 300 + rng.random() * 50
        out.append(f"{head}[{at}] [INFO] [timer.py:260:stop] epoch=0/micro_step={step * 4}/"
                   f"global_step={step}, RunningAvgSamplesPerSec={sps:.10f}, CurrSamplesPerSec={sps + rng.random():.10f}, "
                   f"MemAllocated=21.4GB, MaxMemAllocated=38.2GB")
        if step % 5 == 0:
            out.append(f"{head}[{at}] [INFO] [logging.py:96:log_dist] [Rank {rank}] time (ms) | "
                       f"fwd_microstep: {rng.random() * 200:.2f} | bwd_microstep: {rng.random() * 400:.2f} | "
                       f"bwd_inner_microstep: {rng.random() * 300:.2f} | bwd_allreduce_microstep: "
                       f"{rng.random() * 100:.2f} | step_microstep: {rng.random() * 50:.2f}")
    return out


def _bar(n: int, total: int, elapsed: float, rate: float, post: str = "", desc: str = "") -> str:
    frac = n / total
    full = int(frac * 10)
    part = _BAR[int((frac * 10 - full) * 8)] if full < 10 else ""
    bar = ("█" * full + part).ljust(10)
    remaining = (total - n) / rate if rate else 0
    em, es = divmod(int(elapsed), 60)
    rm, rs = divmod(int(remaining), 60)
    head = f"{desc}: " if desc else ""
    return f"{head}{frac * 100:3.0f}%|{bar}| {n}/{total} [{em:02d}:{es:02d}<{rm:02d}:{rs:02d}, {rate:5.2f}it/s{post}]"


def _progress_bars(rng: random.Random, step: int) -> list[str]:
    """Bars redrawn after `\\r`: one physical line holds the redraws until the bar closes or a rank's
    next line; Lightning's (rank 0, no prefix) and tqdm's of a few ranks behind `[rankN]:`."""
    out = []
    total = 1000
    n = (step * 7) % total
    redraws = rng.randint(5, 40)
    rate = 3.5 + rng.random()
    if step % 2 == 0:  # Lightning, new style (train_loss in the postfix) and old style (loss=)
        old = step % 4 == 0
        parts = []
        for k in range(redraws):
            at = min(total, n + k)
            post = (f", loss={2 + rng.random():.3f}, v_num=0" if old
                    else f", v_num=0, train_loss={2 + rng.random():.3f}")
            parts.append(_bar(at, total, at / rate, rate, post, desc=f"Epoch {step // 1000}"))
        out.append("\r".join(parts))
    else:
        for r in rng.sample(range(8), 3):
            parts = [_bar(min(total, n + k), total, (n + k) / rate, rate) for k in range(redraws // 2 + 1)]
            out.append(f"[rank{r}]:" + "\r".join(parts))
    if step % 50 == 0:
        out.append(_bar(50, 50, 5.1, 9.8, desc="Validation DataLoader 0"))
    return out


def _nccl_info(rng: random.Random, step: int) -> list[str]:
    """The COLL line per collective of several ranks, a communicator's init burst every so often."""
    out = []
    ranks = rng.sample(range(RANKS), 8)
    for r in ranks:
        host, pid, dev = f"gpu-node-{r // 8:03d}", 40000 + r, r % 8
        prefix = f"[rank{r}]:" if r % 2 else ""
        op = rng.choice(("AllReduce", "AllGather", "ReduceScatter", "Broadcast"))
        out.append(f"{prefix}{host}:{pid}:{pid + 112} [{dev}] NCCL INFO {op}: opCount {step:x} sendbuff "
                   f"0x7f{rng.getrandbits(32):08x}00 recvbuff 0x7f{rng.getrandbits(32):08x}00 count "
                   f"{rng.choice((1048576, 262144, 4194304))} datatype 7 op 0 root 0 comm 0x55d{r:03x}a0 "
                   f"[nranks={RANKS}] stream 0x55d{r:03x}f0")
    if step % 40 == 0:  # a new communicator (a pipeline stage's p2p pair, a subgroup): its init burst
        comm = rng.getrandbits(48)
        for r in rng.sample(range(RANKS), 4):
            host, pid, dev = f"gpu-node-{r // 8:03d}", 40000 + r, r % 8
            prefix = f"[rank{r}]:" if r % 2 else ""
            head = f"{prefix}{host}:{pid}:{pid + 112 + step % 7} [{dev}] NCCL INFO"
            out += [
                f"{head} Channel {c:02d}/24 : {r}[{dev}] -> {(r + 1) % RANKS}[{(dev + 1) % 8}] via P2P/CUMEM/read"
                for c in range(4)]
            out += [
                f"{head} Trees [0] {(r + 1) % RANKS}/-1/-1->{r}->{(r - 1) % RANKS} [1] -1/-1/-1->{r}->{(r + 1) % RANKS}",
                f"{head} P2P Chunksize set to 524288",
                f"{head} Connected all rings",
                f"{head} Connected all trees",
                f"{head} threadThresholds 8/8/64 | 512/8/64 | 512 | 512",
                f"{head} 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer",
                (f"{head} comm 0x55d{comm:012x} rank {r} nranks {RANKS} cudaDev {dev} nvmlDev {dev} busId "
                 f"{0x18000 + dev * 0x11000:x} commId 0x{comm:x} - Init COMPLETE"),
            ]
    return out


def _torchelastic(rng: random.Random, step: int) -> list[str]:
    """The elastic agent's messages of 8 hosts as it starts and watches its workers (glog form on some
    hosts, logging's default form on others); a rendezvous result block now and then."""
    out = []
    for host in rng.sample(range(8), 4):
        pid = 21000 + host
        run = f"none_{rng.getrandbits(32):08x}"
        node = f"gpu-node-{host:03d}_{pid}_0"
        if host % 2:
            def head(path: str, lines: tuple[int, ...], pid: int = pid) -> str:
                return f"{_glog(rng, step)} {pid} torch/distributed/elastic/{path}:{rng.choice(lines)}] "
            out += [
                f"{head('agent/server/api.py', (844, 852))}[default] starting workers for entrypoint: python",
                f"{head('agent/server/api.py', (677, 680))}[default] Rendezvous'ing worker group",
                (f"{head('rendezvous/dynamic_rendezvous.py', (1124, 1131))}The node '{node}' attempts to join the "
                 f"next round of the rendezvous 'llm-{step}'."),
                (f"{head('rendezvous/dynamic_rendezvous.py', (1180, 1187))}The node '{node}' has joined round 0 of "
                 f"the rendezvous 'llm-{step}' as rank {host} in a world of size 8."),
                f"{head('agent/server/api.py', (860, 866))}[default] Starting worker group",
                (f"{head('agent/server/local_elastic_agent.py', (299, 303))}Environment variable "
                 "'TORCHELASTIC_ENABLE_FILE_TIMER' not found. Do not start FileTimerServer."),
            ]
            out += [(f"{head('agent/server/local_elastic_agent.py', (194, 197))}Setting worker{k} reply file to: "
                     f"/tmp/torchelastic_{run}/{run}/attempt_0/{k}/error.json") for k in range(8)]
        else:
            agent = "INFO:torch.distributed.elastic.agent.server"
            out += [
                f"{agent}.local_elastic_agent:log directory set to: /tmp/torchelastic_{run}/{run}",
                f"{agent}.api:[default] starting workers for entrypoint: python",
                f"{agent}.api:[default] Rendezvous'ing worker group",
                f"{agent}.api:[default] Starting worker group",
                ("INFO:torch.distributed.elastic.agent.server.local_elastic_agent:Environment variable "
                 "'TORCHELASTIC_ENABLE_FILE_TIMER' not found. Do not start FileTimerServer."),
                ("INFO:torch.distributed.elastic.multiprocessing:Setting worker0 reply file to: "
                 f"/tmp/torchelastic_{run}/{run}/attempt_0/0/error.json"),
            ]
        if step % 25 == 0:
            out += [
                (f"{_glog(rng, step)} {pid} torch/distributed/elastic/agent/server/api.py:{rng.choice((520, 525))}] "
                 "[default] Rendezvous complete for workers. Result:"),
                "  restart_count=0",
                "  master_addr=gpu-node-000",
                "  master_port=29500",
                f"  group_rank={host}",
                "  group_world_size=8",
                "  local_ranks=[0, 1, 2, 3, 4, 5, 6, 7]",
                f"  role_ranks=[{', '.join(str(host * 8 + k) for k in range(8))}]",
                f"  global_ranks=[{', '.join(str(host * 8 + k) for k in range(8))}]",
                f"  role_world_sizes=[{', '.join(['64'] * 8)}]",
                f"  global_world_sizes=[{', '.join(['64'] * 8)}]",
                "",
            ]
    return out


def _python_logging(rng: random.Random, step: int) -> list[str]:
    """A training script's logging INFO lines in logging's two common layouts, `[rankN]:` prefixed, or
    one rank's without a prefix."""
    out = []
    plain = _plain(step)
    for r in rng.sample(range(RANKS), 2 if plain else 6):
        at = _stamp(rng, step)
        launcher = "" if plain else f"[rank{r}]:"
        head = f"{launcher}[{at}][__main__][INFO] - " if r % 3 == 0 else f"{launcher}{at} - INFO - train - "
        kind = rng.random()
        if kind < 0.45:
            out.append(f"{head}Epoch {step // 2000} | step {step} | loss {2 + rng.random():.4f} | "
                       f"lr {3e-4 * rng.random():.3e} | {300 + rng.random() * 40:.1f} samples/s")
        elif kind < 0.7:
            out.append(f"{head}Loaded batch {step} from shard /data/tokens/shard-{rng.randrange(4096):05d}.bin "
                       f"({rng.randrange(1000, 9000)} sequences, {rng.random() * 40:.1f} ms)")
        elif kind < 0.85:
            out.append(f"{head}Prefetch queue depth {rng.randrange(2, 16)}, host memory {rng.random() * 200:.1f} GiB "
                       f"free, pinned pool {rng.randrange(8, 64)} buffers")
        elif kind < 0.95:
            out.append(f"{head}Evaluating on {rng.randrange(500, 5000)} samples: accuracy "
                       f"{rng.random():.4f}, perplexity {rng.random() * 20 + 5:.3f}")
        else:
            out.append(f"{head}Wrote model weights to /ckpt/run-7/step-{step}/model.safetensors "
                       f"({rng.random() * 20 + 10:.1f} GB in {rng.random() * 60:.1f} s)")
    return out


GENERATORS: dict[str, Callable[[random.Random, int], list[str]]] = {
    "hf_trainer": _hf_trainer,
    "megatron": _megatron,
    "deepspeed": _deepspeed,
    "progress_bars": _progress_bars,
    "nccl_info": _nccl_info,
    "torchelastic": _torchelastic,
    "python_logging": _python_logging,
}


def write_family(name: str, path: Path, size_bytes: int, *, seed: int = 1) -> int:
    """Write about `size_bytes` of family `name` to `path` (whole lines); returns the number of lines."""
    make = GENERATORS[name]
    rng = random.Random(f"{name}-{seed}")
    written = lines = 0
    step = 1
    with path.open("wb") as fh:
        while written < size_bytes:
            block: list[str] = []
            for _ in range(200):
                block += make(rng, step)
                step += 1
            data = ("\n".join(block) + "\n").encode("utf-8")
            fh.write(data)
            written += len(data)
            lines += len(block)
    return lines
