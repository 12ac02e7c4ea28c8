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
