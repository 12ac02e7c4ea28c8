"""What a reproduced claim is, and how one recipe run is measured for it.

A `Claim` compares two arms (the one the lectures say is better, and its baseline) on one
metric over seeds, or checks one arm against an absolute bound. Its ``run(seed)`` trains
whatever the claim needs, from the project's recipes at a fixed small budget, and returns
each arm's held-out metric (plus any extra numbers worth printing). `benchmarks/claims.py`
runs the claims over seeds and writes the table the README shows.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
CACHE = ROOT / "runs" / "claims" / "cache"
_SCRATCH: Path | None = None  # where `fit_recipe` makes its run folders (None: the system's temp folder)


@dataclass(frozen=True)
class Claim:
    """One claim of the lectures, measured as ``better`` vs ``baseline`` on ``metric``.

    Args:
        key: short name on the command line ("a-mlm", "b", …).
        title: the claim in words, as the table shows it.
        metric: the held-out metric and its unit ("accuracy (%)").
        better / baseline: the arms' names as ``run`` returns them. ``baseline`` None: an
            absolute claim (``better``'s mean against ``bound``).
        higher_is_better: the metric's direction.
        min_gap: the target: ``better`` beats ``baseline`` by at least this much (metric units,
            in the metric's direction). None: only the sign is claimed.
        bound: for absolute claims, the value ``better``'s mean must reach (≥ when higher is
            better, ≤ otherwise).
        run: seed -> {arm or extra number: value}; must contain ``better`` (and ``baseline``).
        data: one line on the held-out data (what makes the comparison fair).
    """

    key: str
    title: str
    metric: str
    better: str
    run: Callable[[int], dict[str, float]]
    baseline: str | None = None
    higher_is_better: bool = True
    min_gap: float | None = None
    bound: float | None = None
    data: str = ""
    extra: Sequence[str] = field(default_factory=tuple)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def gap(claim: Claim, better: float, baseline: float) -> float:
    """How much ``better`` beats ``baseline`` in the metric's direction (positive = as claimed)."""
    return better - baseline if claim.higher_is_better else baseline - better


def verdict(claim: Claim, results: Sequence[dict[str, float]]) -> tuple[bool, str]:
    """Whether the claim holds over ``results`` (one dict a seed), and why in a few words."""
    b_mean, b_std = mean_std([r[claim.better] for r in results])
    if claim.baseline is None:
        if claim.bound is None:
            raise ValueError(f"claim {claim.key} has neither a baseline nor a bound")
        ok = b_mean >= claim.bound if claim.higher_is_better else b_mean <= claim.bound
        return ok, f"mean {b_mean:.4g} {'≥' if claim.higher_is_better else '≤'} {claim.bound:g}"
    gaps = [gap(claim, r[claim.better], r[claim.baseline]) for r in results]
    g_mean = statistics.fmean(gaps)
    base_std = mean_std([r[claim.baseline] for r in results])[1]
    if claim.min_gap is None:  # a sign-only claim (beam ≥ greedy): the mean gap decides; noise is named
        tie = "; within the arms' stds: a tie" if max(b_std, base_std) >= abs(g_mean) else ""
        return g_mean >= 0.0, f"gap {g_mean:+.3g} (need ≥ 0{tie})"
    ok = g_mean >= claim.min_gap and max(b_std, base_std) < g_mean
    return ok, f"gap {g_mean:+.3g} (need ≥ {claim.min_gap:g}, each arm's std below it)"


@contextlib.contextmanager
def scratch_runs(prefix: str = "unitok-claim-") -> Iterator[Path]:
    """Within the block, the run folders `fit_recipe` makes (no ``root`` given) go into one
    temporary folder, removed with everything in it when the block ends: a claim needs its runs'
    checkpoints and logs only while it measures them (each is ~14 MB; ``make claims`` makes ~60)."""
    global _SCRATCH
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        previous, _SCRATCH = _SCRATCH, Path(folder)
        try:
            yield _SCRATCH
        finally:
            _SCRATCH = previous


def run_folder() -> Path:
    """A new, empty folder for one run: inside `scratch_runs`' folder when one is open."""
    return Path(tempfile.mkdtemp(prefix="claim-", dir=_SCRATCH))


def fit_recipe(
    config: str | Path,
    overrides: Sequence[str] = (),
    seed: int | None = None,
    root: str | Path | None = None,
    test: bool = True,
) -> tuple[Any, dict[str, float]]:
    """Fit a shipped recipe in this process, then score it on its held-out split.

    ``config`` is a path or a name under ``configs/`` ("deit/digits_distill"). The run
    writes under ``root`` (default: a fresh temporary folder), with no progress bar, its data
    cache shared in ``runs/claims/cache`` unless ``$UNITOK_CACHE_DIR`` says otherwise; the
    returned metrics are ``trainer.test``'s (``test=False``: ``trainer.validate``'s), taken
    from the last step's weights. -> (the CLI object, {metric: value}).
    """
    import lightning as L

    from tasks.cli import UnitokCLI

    # one data cache for every claim run (built-in corpora are made once, not once a run)
    os.environ.setdefault("UNITOK_CACHE_DIR", str(CACHE))

    path = Path(config)
    if not path.suffix:
        path = CONFIGS / f"{config}.yaml"
    root = run_folder() if root is None else Path(root)
    args = ["--config", str(path), "--trainer.default_root_dir", str(root),
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            *(["--seed_everything", str(seed)] if seed is not None else []), *overrides]
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    cli = UnitokCLI(L.LightningModule, L.LightningDataModule, subclass_mode_model=True,
                    subclass_mode_data=True, run=False, args=args)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    score = cli.trainer.test if test else cli.trainer.validate
    results = score(cli.model, datamodule=cli.datamodule, verbose=False)
    return cli, {k: float(v) for r in results for k, v in r.items()}


def finite(values: dict[str, float]) -> dict[str, float]:
    """``values`` with every number checked finite (a NaN metric is a failed run, not a result)."""
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    if bad:
        raise RuntimeError(f"non-finite metrics {bad}")
    return values


def not_a_script(claims: Sequence[Claim] = ()) -> NoReturn:
    """What a claim module does when run as a script (it has no command line): one line pointing at
    `benchmarks/claims.py` with its claims' letter, and exit status 2, argparse's for a bad call."""
    letters = " ".join(dict.fromkeys(c.key.split("-")[0] for c in claims))
    how = f"--claims {letters}" if letters else "--list"
    print(f"{Path(sys.argv[0]).name} is a part of claims.py, not a script: run "
          f"`python benchmarks/claims.py {how}`", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    not_a_script()
