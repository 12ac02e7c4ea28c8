"""The CLIP loss: symmetric InfoNCE equal to a direct computation, and under data parallelism
(2 CPU processes, gloo) the same loss and gradients as one process on the global batch."""

from __future__ import annotations

import copy
import socket

import lightning as L
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from tasks import CaptionedDigitsDataModule, ContrastiveTask, contrastive_loss
from tests.tasks.ddp_workers import RecordFirstStep, loss_worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _direct_loss(images, texts, scale):
    """CLIP's pseudo-code (Radford et al., Fig. 3) written out row by row."""
    image, text = F.normalize(images, dim=-1), F.normalize(texts, dim=-1)
    logits = scale.exp() * image @ text.T
    n = len(image)
    by_image = sum(-torch.log_softmax(logits[i], dim=0)[i] for i in range(n)) / n
    by_text = sum(-torch.log_softmax(logits[:, j], dim=0)[j] for j in range(n)) / n
    return (by_image + by_text) / 2


def test_loss_equals_the_direct_computation():
    images, texts = torch.randn(6, 16), torch.randn(6, 16)
    scale = torch.tensor(2.3)
    torch.testing.assert_close(contrastive_loss(images, texts, scale), _direct_loss(images, texts, scale))


def test_loss_is_symmetric_and_low_only_for_matched_pairs():
    x = torch.randn(8, 32)
    scale = torch.tensor(4.6)
    torch.testing.assert_close(contrastive_loss(x, x * 2, scale), contrastive_loss(x * 2, x, scale))
    matched = contrastive_loss(x, x, scale)
    shuffled = contrastive_loss(x, x.roll(1, dims=0), scale)
    assert matched < 0.1 < shuffled


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match=r"matching \(batch, dim\) embeddings, got \(4, 8\) and \(5, 8\)$"):
        contrastive_loss(torch.randn(4, 8), torch.randn(5, 8), torch.tensor(1.0))


@pytest.mark.slow
def test_two_processes_give_the_single_process_loss_and_gradients(tmp_path):
    images, texts = torch.randn(8, 12), torch.randn(8, 12)
    scale = torch.tensor(2.0)
    mp.spawn(loss_worker, args=(2, _free_port(), images, texts, scale, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    image, text, s = images.clone().requires_grad_(), texts.clone().requires_grad_(), scale.clone().requires_grad_()
    loss = contrastive_loss(image, text, s)
    loss.backward()
    # DDP averages gradients over the 2 ranks: the mean of their losses is what it optimises.
    torch.testing.assert_close((ranks[0]["loss"] + ranks[1]["loss"]) / 2, loss.detach())
    torch.testing.assert_close(torch.cat([r["image_grad"] for r in ranks]) / 2, image.grad)
    torch.testing.assert_close(torch.cat([r["text_grad"] for r in ranks]) / 2, text.grad)
    torch.testing.assert_close((ranks[0]["scale_grad"] + ranks[1]["scale_grad"]) / 2, s.grad)


@pytest.mark.slow
def test_lightning_ddp_step_equals_one_process_on_the_global_batch(tmp_path):
    L.seed_everything(0)
    task = ContrastiveTask(preset="clip-digits")
    reference = copy.deepcopy(task.model)
    data = CaptionedDigitsDataModule(batch_size=6)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_steps=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[RecordFirstStep(str(tmp_path))])
    trainer.fit(task, data)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    pixels = torch.cat([r["batch"]["pixel_values"] for r in ranks])
    ids = [r["batch"]["input_ids"] for r in ranks]
    width = max(i.shape[1] for i in ids)
    ids = torch.cat([F.pad(i, (0, width - i.shape[1])) for i in ids])  # ranks pad to their own longest
    reference.train()
    loss = contrastive_loss(reference.encode_image(pixels), reference.encode_text(ids), reference.logit_scale,
                            gather=False)
    loss.backward()
    torch.testing.assert_close((ranks[0]["loss"] + ranks[1]["loss"]) / 2, loss.detach())
    grads = {f"model.{n}": p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert set(ranks[0]["grads"]) == set(grads)
    for name, grad in grads.items():
        for r in ranks:  # DDP leaves every rank with the same averaged gradient
            # (rounded otherwise: halves of the batch against the whole, then averaged; up to 2.3e-6 apart
            # through MKL's products, 1e-6 through oneDNN's)
            torch.testing.assert_close(r["grads"][name], grad, atol=1e-5, rtol=1e-4, msg=name)
