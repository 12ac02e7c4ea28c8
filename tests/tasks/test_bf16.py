"""bf16 mixed precision is first class: every recipe fits with ``--trainer.precision bf16-mixed``
(CPU autocast here; CUDA the same way), and bf16 training follows the fp32 loss curve.

bf16 keeps fp32's exponent range with 8 bits of mantissa: autocast runs matmuls in bf16 and
keeps reductions (softmax, norms, losses) in fp32, so a short run's losses stay within a few
percent of fp32's while the weights stay fp32.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.tasks.test_predict import (
    CONFIGS,
    NAMES,
    NEEDS,
    ROOT,
    STEPS,
    overrides,
    recipe_root,
    users_files,
)
from unitok.models import GPT, GPTConfig, ViT, ViTConfig

BF16 = ["--trainer.precision", "bf16-mixed"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bf16")
    users_files(root)
    return root


def fit(monkeypatch: pytest.MonkeyPatch, ws: Path, recipe: str, done: set[str]) -> Path:
    from tasks.cli import main

    if recipe not in done:  # once (a fine-tuning recipe fits its pretraining first)
        if recipe in NEEDS:
            fit(monkeypatch, ws, NEEDS[recipe], done)
        monkeypatch.chdir(ws)
        main(["fit", "--config", str(ROOT / "configs" / f"{recipe}.yaml"), *STEPS, *BF16, *overrides(recipe, ws)])
        done.add(recipe)
    return ws / recipe_root(recipe) / "latest"


_done: set[str] = set()


@pytest.mark.parametrize("recipe", NAMES)
def test_every_recipe_fits_in_bf16_mixed(recipe, workspace, monkeypatch):
    assert len(CONFIGS) == len(NAMES) >= 20
    run = fit(monkeypatch, workspace, recipe, _done)
    assert (run / "checkpoints" / "last.ckpt").is_file()
    hparams = (run / "hparams.yaml").read_text() if (run / "hparams.yaml").is_file() else ""
    assert "bf16-mixed" in (run / "config.yaml").read_text() or "bf16" in hparams
    rows = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()]
    header, values = rows[0], rows[1:]
    losses = [float(r[i]) for r in values for i, name in enumerate(header)
              if name.endswith("loss") and name.startswith(("train", "digits", "speech", "text", "cartpole", "match",
                                                          "image_text", "audio_image")) and i < len(r) and r[i]]
    assert losses and all(math.isfinite(v) for v in losses), f"{recipe}: logged losses {losses}"


def _curve(model: torch.nn.Module, batches: list, loss_of, bf16: bool, steps: int) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for step in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(model, batches[step % len(batches)])
        losses.append(float(loss.detach()))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return losses


@pytest.mark.parametrize("family", ["gpt", "vit"])
def test_bf16_training_follows_the_fp32_loss_curve(family):
    torch.manual_seed(0)
    if family == "gpt":
        config = GPTConfig.from_name("gpt-nano", vocab_size=128, dropout=0.0)
        make = lambda: GPT(config)  # noqa: E731
        # a repeating pattern per row (learnable), four batches (no single-batch memorising)
        period = torch.randint(0, 128, (32, 5))
        batches = list(period.repeat(1, 7)[:, :33].split(8))
        loss_of = lambda m, ids: F.cross_entropy(m(ids[:, :-1]).logits.float().flatten(0, 1), ids[:, 1:].flatten())  # noqa: E731
    else:
        config = ViTConfig.from_name("vit-digits")
        make = lambda: ViT(config)  # noqa: E731
        pixels, labels = torch.randn(64, 1, 32, 32), torch.randint(0, 10, (64,))
        pixels = pixels + labels[:, None, None, None].float() / 3  # a learnable signal
        batches = list(zip(pixels.split(16), labels.split(16), strict=True))
        loss_of = lambda m, b: F.cross_entropy(m(b[0]).logits.float(), b[1])  # noqa: E731
    torch.manual_seed(1)
    fp32_model = make()
    bf16_model = make()
    bf16_model.load_state_dict(fp32_model.state_dict())
    fp32 = _curve(fp32_model, batches, loss_of, bf16=False, steps=40)
    bf16 = _curve(bf16_model, batches, loss_of, bf16=True, steps=40)
    assert sum(fp32[-4:]) < 0.75 * sum(fp32[:4]), f"fp32 did not learn: {fp32}"
    for step, (a, b) in enumerate(zip(fp32, bf16, strict=True)):  # the same curve, within bf16's rounding
        assert abs(b - a) < 0.05 * a, f"step {step}: fp32 {a:.4f}, bf16 {b:.4f}"
    assert all(p.dtype == torch.float32 for p in bf16_model.parameters())  # weights stay fp32
    json.dumps(bf16)  # plain floats
