"""bf16 mixed precision is first class: every recipe fits with ``--trainer.precision bf16-mixed``
(CPU autocast here; CUDA the same way), its training steps running under bf16 autocast, and bf16
training follows the fp32 loss curve.

bf16 keeps fp32's exponent range with 8 bits of mantissa: autocast runs matmuls in bf16 and
keeps reductions (softmax, norms, losses) in fp32, so a short run's losses stay within a few
percent of fp32's while the weights stay fp32.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

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


# What every module call inside a training step saw: (module, autocast on for the CPU, its
# dtype, the output's dtype when the output is a tensor).
Seen = list[tuple[str, bool, torch.dtype, torch.dtype | None]]


@contextlib.contextmanager
def autocast_in_training_steps() -> Iterator[Seen]:
    """Records the autocast state at every module call made by a training step: the hook is on
    inside `Strategy.training_step`, within the precision plugin's context, as Lightning runs it."""
    from lightning.pytorch.strategies import Strategy

    seen: Seen = []
    real = Strategy.training_step

    def record(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        seen.append((type(module).__name__, torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                     output.dtype if isinstance(output, torch.Tensor) else None))

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        handle = torch.nn.modules.module.register_module_forward_hook(record)
        try:
            return real(self, *args, **kwargs)
        finally:
            handle.remove()

    with mock.patch.object(Strategy, "training_step", training_step):
        yield seen


def fit(monkeypatch: pytest.MonkeyPatch, ws: Path, recipe: str, done: dict[str, Seen]) -> Path:
    """Fits ``recipe`` in bf16-mixed once (a fine-tuning recipe fits its pretraining first);
    ``done[recipe]`` keeps what its training steps saw."""
    from tasks.cli import main

    if recipe not in done:
        if recipe in NEEDS:
            fit(monkeypatch, ws, NEEDS[recipe], done)
        monkeypatch.chdir(ws)
        with autocast_in_training_steps() as seen:
            main(["fit", "--config", str(ROOT / "configs" / f"{recipe}.yaml"), *STEPS, *BF16,
                  *overrides(recipe, ws)])
        done[recipe] = seen
    return ws / recipe_root(recipe) / "latest"


_done: dict[str, Seen] = {}


@pytest.mark.parametrize("recipe", NAMES)
def test_every_recipe_fits_in_bf16_mixed(recipe, workspace, monkeypatch):
    assert len(CONFIGS) == len(NAMES) >= 20
    run = fit(monkeypatch, workspace, recipe, _done)
    assert (run / "checkpoints" / "last.ckpt").is_file()
    hparams = (run / "hparams.yaml").read_text() if (run / "hparams.yaml").is_file() else ""
    assert "bf16-mixed" in (run / "config.yaml").read_text() or "bf16" in hparams
    # and the training steps really ran under bf16 autocast: every module call inside them (none
    # opts out), and some layer's output is bf16 (the weights are fp32, so autocast cast it)
    seen = _done[recipe]
    assert seen, f"{recipe}: no module ran inside a training step"
    off = sorted({name for name, on, dtype, _ in seen if not (on and dtype == torch.bfloat16)})
    assert not off, f"{recipe}: these modules ran outside bf16 autocast in a training step: {off}"
    assert any(out == torch.bfloat16 for *_, out in seen), f"{recipe}: no bf16 activation in a training step"
    rows = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()]
    header, values = rows[0], rows[1:]
    losses = [float(r[i]) for r in values for i, name in enumerate(header)
              if name.endswith("loss") and name.startswith(("train", "digits", "speech", "text", "cartpole", "match",
                                                          "image_text", "audio_image")) and i < len(r) and r[i]]
    assert losses and all(math.isfinite(v) for v in losses), f"{recipe}: logged losses {losses}"


def _curve(model: torch.nn.Module, batches: list, loss_of, bf16: bool, steps: int,
           dtypes: set[torch.dtype] | None = None) -> list[float]:
    """The losses of ``steps`` AdamW steps; ``dtypes`` collects the dtypes of the model's layers'
    outputs."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)

    def record(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if dtypes is not None and isinstance(output, torch.Tensor):
            dtypes.add(output.dtype)

    hooks = [m.register_forward_hook(record) for m in model.modules()]
    losses = []
    for step in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(model, batches[step % len(batches)])
        losses.append(float(loss.detach()))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for hook in hooks:
        hook.remove()
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
    fp32_dtypes: set[torch.dtype] = set()
    bf16_dtypes: set[torch.dtype] = set()
    fp32 = _curve(fp32_model, batches, loss_of, bf16=False, steps=40, dtypes=fp32_dtypes)
    bf16 = _curve(bf16_model, batches, loss_of, bf16=True, steps=40, dtypes=bf16_dtypes)
    # bf16 took effect: layers computed in bf16 (and fp32 ones did not), and the curves differ by rounding
    assert torch.bfloat16 in bf16_dtypes and torch.bfloat16 not in fp32_dtypes, (fp32_dtypes, bf16_dtypes)
    assert bf16 != fp32, "the bf16 losses are fp32's to the bit"
    assert sum(fp32[-4:]) < 0.75 * sum(fp32[:4]), f"fp32 did not learn: {fp32}"
    for step, (a, b) in enumerate(zip(fp32, bf16, strict=True)):  # the same curve, within bf16's rounding
        assert abs(b - a) < 0.05 * a, f"step {step}: fp32 {a:.4f}, bf16 {b:.4f}"
    assert all(p.dtype == torch.float32 for p in bf16_model.parameters())  # weights stay fp32
    json.dumps(bf16)  # plain floats
