"""A tiny GPT-2 trained with the Hugging Face Trainer on CPU (gloo), launched by torchrun.

Usage: torchrun ... train_hf.py --config job.json
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import torch
import trainlib as tl
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB = 128


class TokenShard(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """This rank's token records, one JSON object per line; DataLoader workers take every n-th line."""

    def __init__(self, cfg: tl.Config, rank: int) -> None:
        self.cfg = cfg
        self.rank = rank

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        fault = self.cfg.fault
        for i, line in enumerate(tl.json_lines(self.cfg, self.rank)):
            if i % nw != wid:
                continue
            if (fault.get("kind") == "dataloader_worker_kill" and fault.get("rank") == self.rank
                    and i >= fault.get("step", 0) * self.cfg.batch and info is not None):
                os.kill(os.getpid(), signal.SIGKILL)
            rec = json.loads(line)
            ids = torch.tensor([int(t) for t in rec["input_ids"]])
            yield {"input_ids": ids, "labels": ids}


def main() -> None:
    cfg = tl.config_from_argv()
    os.chdir(cfg.root)
    rank = int(os.environ.get("RANK", "0"))
    tl.note_process(cfg, rank, int(os.environ.get("LOCAL_RANK", "0")))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64))
    args = TrainingArguments(
        output_dir=str(cfg.root / "hf-out"),
        use_cpu=True,
        ddp_backend="gloo",
        ddp_timeout=int(cfg.raw.get("pg_timeout", 15)),
        per_device_train_batch_size=cfg.batch,
        max_steps=int(cfg.steps),
        logging_steps=int(cfg.raw.get("log_every", 5)),
        learning_rate=5e-4,
        report_to=[],
        save_strategy="no",
        dataloader_num_workers=int(cfg.raw.get("workers", 0)),
        accelerator_config={"dispatch_batches": False, "split_batches": False},
        disable_tqdm=bool(cfg.raw.get("no_tqdm", False)),
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=TokenShard(cfg, rank))
    trainer.train()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
