"""Callbacks: export a trained model as a safetensors folder, print predictions."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_only


class ExportPretrained(L.Callback):
    """At the end of ``fit``, write the task's model (``save_pretrained``) and the data module's
    tokenizer into ``dirpath`` (default: ``<log dir>/pretrained``) — the folder `unitok sample`
    and ``GPT.from_pretrained`` read."""

    def __init__(self, dirpath: str | None = None) -> None:
        self.dirpath = dirpath

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        folder = Path(self.dirpath or Path(trainer.log_dir or trainer.default_root_dir) / "pretrained")
        pl_module.model.save_pretrained(folder)  # type: ignore[operator]
        datamodule = trainer.datamodule
        what = "model"
        if hasattr(getattr(datamodule, "tokenizer", None), "save"):  # CLIP's BPE ships with open_clip
            datamodule.tokenizer.save(folder)
            what = "model and tokenizer"
        print(f"exported {what} to {folder}")


class PrintPredictions(L.Callback):
    """Print what ``unitok predict`` returns, one prediction per block."""

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        for text in outputs:
            print(f"{text}\n{'-' * 40}")
