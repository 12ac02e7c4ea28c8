"""The one way the conversion tests make a random model non-trivial before comparing it.

Freshly built reference models (transformers, timm, open_clip, torchaudio) and unitok's own start
with zero biases, unit norm weights and, for BatchNorm, zero-mean unit-variance running statistics:
a converter that swaps two norms or two biases of the same shape, or drops a bias, still gives the
same outputs on such a model. After `perturbed`, every one of those weights matters."""

from __future__ import annotations

import torch

# Additive noise of this size keeps a norm weight near 1 ± 0.05 and a bias near N(0, 0.05²): far
# above the comparisons' atol (1e-5) once mapped wrongly, small enough to keep outputs well-scaled.
SCALE = 0.05


def perturbed(model: torch.nn.Module, scale: float = SCALE) -> torch.nn.Module:
    """Add N(0, scale²) noise to every parameter (a tied weight once) and give every BatchNorm
    non-trivial running statistics; returns the model in eval mode. Uses torch's global RNG, so
    seed it first for a reproducible model."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
        for module in model.modules():  # eval-mode BatchNorm normalises with these
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                module.running_mean.normal_()
                module.running_var.uniform_(0.5, 2.0)
    return model.eval()
