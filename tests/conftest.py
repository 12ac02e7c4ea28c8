"""Shared test setup: one torch thread (shared, noisy machines), small reference models."""

from __future__ import annotations

import os
import sys

import pytest
import torch

# With two threads a busy neighbour can make small models many times slower; one is steady.
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


# Outcomes that leave a test unchecked: (node id, reason) of each, gathered from the reports
# themselves (not the terminal reporter, which `-p no:terminal` removes).
_UNCHECKED: dict[str, list[tuple[str, str]]] = {"skipped": [], "xfailed": [], "xpassed": []}


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return report.wasxfail or "xfail"
    longrepr = report.longrepr
    why = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)  # (file, line, "Skipped: why")
    return why.removeprefix("Skipped: ")


def pytest_sessionstart(session: pytest.Session) -> None:
    for outcomes in _UNCHECKED.values():
        outcomes.clear()
    # oneDNN or PyTorch's own products for training, timed once here (on the tests' one thread): the
    # DDP workers and subprocesses the tests start inherit it, so they compute as this process does
    import unitok.layers.onednn_gemm as onednn_gemm

    onednn_gemm.preferred()


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped (a module-level importorskip or skip)
        _UNCHECKED["skipped"].append((report.nodeid, _reason(report)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    xfail = hasattr(report, "wasxfail")
    if report.skipped:
        _UNCHECKED["xfailed" if xfail else "skipped"].append((report.nodeid, _reason(report)))
    elif report.passed and xfail and report.when == "call":  # an xfail mark on a test that passes
        _UNCHECKED["xpassed"].append((report.nodeid, _reason(report)))


_CI_REPORT: list[str] = []  # what the CI guard found, for the terminal summary


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI a skipped or xfail test (xfailed, or xpassed: its outcome is ignored either way)
    is a failure: what the tests need is installed by `make`, so a skip means part of the project
    went untested. A run whose every test was skipped at collection counts too."""
    _CI_REPORT.clear()
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        return  # failing already
    counts = [f"{len(found)} test(s) {outcome}" for outcome, found in _UNCHECKED.items() if found]
    if not counts:
        return
    _CI_REPORT.append(f"CI: {', '.join(counts)}; every test must run here:")
    _CI_REPORT.extend(f"  {outcome} {nodeid}: {reason}" for outcome, found in _UNCHECKED.items()
                      for nodeid, reason in found)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if session.config.pluginmanager.get_plugin("terminalreporter") is None:  # -p no:terminal
        print("\n".join(_CI_REPORT), file=sys.stderr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    """The CI guard's findings, in the summary (after the progress line is ended)."""
    if _CI_REPORT:
        terminalreporter.write_sep("=", "CI", red=True)
        for line in _CI_REPORT:
            terminalreporter.write_line(line, red=True)


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


class TimedChoice:
    """Stands in for the timing of decoding layouts (`unitok.generate.fastest_layouts`): records each
    choice asked for as (rows, baseline, proposals) and picks the proposal that holds ``wins`` (None,
    or a layout not proposed: the baseline), as if this CPU had timed it fastest."""

    def __init__(self) -> None:
        self.wins: str | None = None
        self.asked: list[tuple[int, frozenset[str], tuple[frozenset[str], ...]]] = []
        self.steps: list[int | None] = []  # each choice's steps (None: for any number, the compiled step's)

    def __call__(self, module, rows, steps, baseline, proposals, input_major_rows=None, timer=None):
        self.asked.append((rows, baseline, tuple(proposals)))
        self.steps.append(steps)
        return next((p for p in proposals if self.wins in p), baseline)

    def proposed(self) -> list[set[str]]:
        """Each choice's proposals, as the layout each adds to its baseline."""
        return [{name for p in proposals for name in p - baseline} for _, baseline, proposals in self.asked]


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> TimedChoice:
    """Decoding layouts chosen by the test (``timed.wins = "packed"``) instead of by timing them."""
    import unitok.generate as generation

    choice = TimedChoice()
    monkeypatch.setattr(generation, "fastest_layouts", choice)
    return choice


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
