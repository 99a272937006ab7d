"""A small classifier trained with Lightning's own DDP launcher on CPU (it starts the other ranks itself).

Usage: python train_lightning.py --config job.json
"""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch
import trainlib as tl


class Shard(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """This rank's records, parsed when a batch asks for them."""

    def __init__(self, cfg: tl.Config, rank: int) -> None:
        self.lines = list(tl.json_lines(cfg, rank))

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = tl.parse_record(self.lines[i])
        return torch.tensor(x), torch.tensor(y)


class Classifier(L.LightningModule):
    def __init__(self, cfg: tl.Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.net = tl.MLP(int(cfg.raw.get("hidden", 32)))

    def setup(self, stage: str) -> None:
        tl.note_process(self.cfg, self.global_rank, self.local_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        tl.HAZARDS.at_step(self.cfg, self.global_rank, batch_idx)
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def train_dataloader(self) -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
        return torch.utils.data.DataLoader(Shard(self.cfg, self.global_rank), batch_size=self.cfg.batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    cfg = tl.config_from_argv()
    os.chdir(cfg.root)
    trainer = L.Trainer(accelerator="cpu", devices=int(cfg.procs), strategy="ddp", max_steps=int(cfg.steps),
                        logger=False, enable_checkpointing=False, use_distributed_sampler=False,
                        log_every_n_steps=5)
    trainer.fit(Classifier(cfg))


if __name__ == "__main__":
    main()
