"""Frozen parts train in eval mode on purpose: Lightning's "module(s) in eval mode" warning is
silenced for them, and still raised for any other module left in eval mode."""

from __future__ import annotations

import warnings

import lightning as L
import torch
from torch import nn

from tasks.callbacks import FrozenInEval, frozen_in_eval

torch.set_num_threads(1)
EVAL_WARNING = "module(s) in eval mode at the start of training"


class Tiny(L.LightningModule):
    """A frozen body (in eval mode, as BERT's and CLIP's frozen parts are) under a trained head."""

    def __init__(self, stray_eval: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.ReLU())
        self.body.requires_grad_(False)
        self.body.eval()
        self.head = nn.Sequential(nn.Linear(8, 2), nn.Dropout(0.1))
        if stray_eval:  # a trained module someone left in eval mode: its dropout would be off
            self.head[1].eval()

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.head(self.body(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.head.parameters(), lr=0.1)


def fit(module: L.LightningModule, tmp_path) -> tuple[list[str], list[tuple]]:
    """Train two steps -> (the warnings raised, the warning filters added and left behind)."""
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[FrozenInEval()])
    with warnings.catch_warnings(record=True) as caught:  # restores the filters on exit: compare inside
        warnings.simplefilter("always")
        before = list(warnings.filters)
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
        left = [f for f in warnings.filters if f not in before]
    return [str(w.message) for w in caught], left


def test_modules_inside_a_frozen_part_are_frozen_and_others_are_not():
    frozen, other = frozen_in_eval(Tiny())
    assert frozen == ["body", "body.0", "body.1", "body.2"] and other == []
    frozen, other = frozen_in_eval(Tiny(stray_eval=True))
    assert frozen == ["body", "body.0", "body.1", "body.2"] and other == ["head.1"]


def test_a_frozen_body_in_eval_mode_trains_without_the_warning(tmp_path):
    messages, left = fit(Tiny(), tmp_path)
    assert not [m for m in messages if EVAL_WARNING in m], messages
    assert left == []  # the silencing ends when training starts


def test_any_other_module_in_eval_mode_still_warns(tmp_path):
    messages, _ = fit(Tiny(stray_eval=True), tmp_path)
    assert [m for m in messages if m.startswith("Found 5 " + EVAL_WARNING)], messages
