"""Code that runs inside spawned DDP processes (importable by the children, unlike test modules
loaded with pytest's importlib mode)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor

from tasks.contrastive import contrastive_loss


def loss_worker(rank: int, world: int, port: int, images: Tensor, texts: Tensor, scale: Tensor, out: str) -> None:
    """One process of a raw torch.distributed run: local loss and gradients on this rank's rows."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        image = images.chunk(world)[rank].clone().requires_grad_()
        text = texts.chunk(world)[rank].clone().requires_grad_()
        s = scale.clone().requires_grad_()
        loss = contrastive_loss(image, text, s)
        loss.backward()
        torch.save({"loss": loss.detach(), "image_grad": image.grad, "text_grad": text.grad, "scale_grad": s.grad},
                   Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


class RecordFirstStep(L.Callback):
    """Saves each rank's first batch, loss and (DDP-averaged) gradients to ``out/rank{r}.pt``."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.grads: dict[str, Tensor] = {}

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == 0:
            record = {"batch": {k: v.cpu() for k, v in batch.items()}, "loss": outputs["loss"].detach().cpu(),
                      "grads": {k: v.cpu() for k, v in self.grads.items()}}
            torch.save(record, Path(self.out) / f"rank{trainer.global_rank}.pt")


class RecordDrawnTasks(L.Callback):
    """Saves, per training step, the tasks whose loss that step computed on this rank (read from
    `MultiTaskTask._task_loss` as `training_step` calls it, not from the sampler) and the final
    weights to ``out/tasks{r}.pt``."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.trained: dict[int, list[str]] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        task_loss = pl_module._task_loss

        def recorded(name: str, batch: Any) -> Any:
            if pl_module.training:  # validation and testing compute losses too
                self.trained.setdefault(trainer.global_step, []).append(name)
            return task_loss(name, batch)

        pl_module._task_loss = recorded  # the instance's, in this process

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        drawn = [self.trained.get(step, []) for step in range(trainer.global_step)]
        torch.save({"drawn": drawn, "weights": {n: p.detach().clone() for n, p in pl_module.named_parameters()}},
                   Path(self.out) / f"tasks{trainer.global_rank}.pt")


class EchoPredictions(L.LightningModule):
    """``predict_step`` gives one record per item: the item itself as the prediction (so a
    record's prediction tells which input it came from) and the rank that predicted it."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def predict_step(self, batch: Tensor, batch_idx: int) -> list[dict]:
        return [{"prediction": int(x), "score": 1.0, "rank": self.global_rank} for x in batch]
