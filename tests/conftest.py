"""Shared test setup: one torch thread (shared, noisy machines), small reference models."""

from __future__ import annotations

import os

import pytest
import torch

# With two threads a busy neighbour can make small models many times slower; one is steady.
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI a skipped test is a failure: what the tests need is installed by `make`, so a
    skip means part of the project went untested."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes") or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        reporter.write_line(f"CI: {len(skipped)} test(s) skipped; every test must run here (see -rs above)",
                            red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def tiny_t5():
    """A random unitok T5 (the t5-tiny preset at V = 100, eight relative-position buckets), seeded,
    in eval mode."""
    from unitok.models import T5, T5Config

    torch.manual_seed(0)
    return T5(T5Config.from_name("t5-tiny", vocab_size=100, dropout=0.0, relative_buckets=8,
                                 relative_max_distance=16)).eval()


def record_products(monkeypatch: pytest.MonkeyPatch, module, name: str) -> list[tuple[int, int]]:
    """Replace ``module.name`` (a decoding product: ``(x, fc) -> Tensor | None``) with a spy; every
    product it computes (not None) is recorded as (rows, out_features) in the returned list."""
    seen: list[tuple[int, int]] = []
    real = getattr(module, name)

    def spy(x, fc):
        out = real(x, fc)
        if out is not None:
            seen.append((x.numel() // fc.in_features, fc.out_features))
        return out

    monkeypatch.setattr(module, name, spy)
    return seen


def tiny_gpt(**overrides):
    """A random unitok GPT small enough for CPU tests (seeded: the same weights every call), in eval
    mode: V = 40, context 64, D = 32, two layers of four heads; ``overrides`` change the config."""
    from unitok.models import GPT, GPTConfig

    torch.manual_seed(0)
    options = dict(vocab_size=40, context_length=64, d_model=32, n_layers=2, n_heads=4)
    return GPT(GPTConfig(**{**options, **overrides})).eval()


def small_gpt2(**overrides):
    """A random Hugging Face GPT-2 small enough for CPU tests (no dropout)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    options = dict(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                   attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=1, eos_token_id=2,
                   pad_token_id=0)
    options.update(overrides)
    return GPT2LMHeadModel(GPT2Config(**options)).eval()
