"""The lectures' claims, reproduced over seeds at a fixed small budget (``make claims``).

Each claim (`benchmarks/claim.py`) trains both of its arms from the project's recipes on
built-in data and scores them on held-out data that shares nothing with training; this
script runs every claim for every seed, prints each arm's mean ± std and the gap, says
whether the claim holds at its target, and writes the Markdown table the README shows
(and the per-seed numbers as JSON). Claims that share a training run per seed live in one
module and run in one worker process; ``--jobs`` workers run side by side, one torch thread
each by default (on a shared 2-core machine more threads are slower, not faster).

Run::

    python benchmarks/claims.py                      # every claim, seeds 0 1 2, 2 workers
    python benchmarks/claims.py --claims b f --seeds 0 1 2 3 4
    python benchmarks/claims.py --list
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find claim.py
from claim import ROOT, Claim, gap, mean_std, scratch_runs, verdict  # noqa: E402
from timing import positive_int, seed_int  # noqa: E402

# One module per lecture claim, in the table's order; a module's claims share its runs.
MODULES = ("claims_pretraining", "claims_distillation", "claims_decoding", "claims_zero_shot", "claims_speech",
           "claims_control")
OUT = ROOT / "runs" / "claims" / "claims.md"


def load_claims(modules: Sequence[str] = MODULES) -> dict[str, tuple[str, Claim]]:
    """Every claim by key -> (its module, the claim)."""
    claims: dict[str, tuple[str, Claim]] = {}
    for name in modules:
        for claim in importlib.import_module(name).CLAIMS:
            if claim.key in claims:
                raise ValueError(f"claim key {claim.key!r} is defined twice ({claims[claim.key][0]} and {name})")
            claims[claim.key] = (name, claim)
    return claims


def select(claims: dict[str, tuple[str, Claim]], wanted: Sequence[str] | None) -> list[str]:
    """Claim keys to run: all, or those named (a key, or a prefix such as "a" for a-mlm and a-lm);
    ValueError for a name that is neither."""
    if not wanted:
        return list(claims)
    keys = []
    for w in wanted:
        hits = [k for k in claims if k == w or k.startswith(f"{w}-")]
        if not hits:
            raise ValueError(f"unknown claim {w!r}; known: {', '.join(claims)}")
        keys += [k for k in hits if k not in keys]
    return keys


def add_claim_options(p: argparse.ArgumentParser, claims: str = "all") -> None:
    """The options every way of running claims takes alike: ``--claims``, ``--seeds``, ``--threads``."""
    p.add_argument("--claims", nargs="*", default=None, help=f"claim keys or prefixes (default: {claims})")
    p.add_argument("--seeds", nargs="+", type=seed_int, default=[0, 1, 2],
                   help="seeds, each once, 0 to 2**32 - 1 (numpy's range)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads of each process that runs claims")


def parse_claim_args(p: argparse.ArgumentParser, argv: list[str] | None,
                     claims: dict[str, tuple[str, Claim]]) -> argparse.Namespace:
    """Parse ``argv`` with `add_claim_options`' options checked: no seed twice, every ``--claims``
    name a key or prefix of ``claims``; ``.keys``: the claim keys to run. Errors exit as argparse's (2)."""
    args = p.parse_args(argv)
    if len(args.seeds) != len(set(args.seeds)):
        p.error(f"--seeds repeats a seed: {args.seeds}")
    try:
        args.keys = select(claims, args.claims)
    except ValueError as e:
        p.error(f"--claims: {e}")
    return args


def check_out(p: argparse.ArgumentParser, out: Path) -> None:
    """Refuse an ``--out`` the run could not write at its end: not a .md file (its JSON goes
    next to it, ``.json``), a folder, or under a file."""
    if out.suffix != ".md":
        p.error(f"--out must name a .md file (the JSON is written next to it), got {str(out)!r}")
    for path in (out, out.with_suffix(".json")):
        if path.is_dir():
            p.error(f"--out: {str(path)!r} is a folder")
    folder = out.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        p.error(f"--out: {str(folder)!r} is a file, not a folder")


def run_unit(module: str, keys: Sequence[str], seed: int, threads: int) -> tuple[int, dict[str, dict[str, float]],
                                                                              float]:
    """In a worker: run ``keys`` (claims of one module) for one seed -> (seed, {key: result}, seconds)."""
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    claims = {c.key: c for c in importlib.import_module(module).CLAIMS}
    results = {}
    with scratch_runs(f"unitok-{module}-{seed}-"):  # the unit's run folders, removed when it ends
        for key in keys:
            print(f"[claims] {key} seed {seed} ...", flush=True)
            results[key] = {k: float(v) for k, v in claims[key].run(seed).items()}
            print(f"[claims] {key} seed {seed}: {results[key]}", flush=True)
    return seed, results, time.perf_counter() - start


def _fmt(values: Sequence[float]) -> str:
    mean, std = mean_std(values)
    return f"{mean:.4g} ± {std:.2g}"


def table(claims: dict[str, tuple[str, Claim]], results: dict[str, list[dict[str, float]]],
          seeds: Sequence[int]) -> str:
    """The Markdown summary (one row a claim) and the per-seed numbers below it."""
    lines = [f"Means ± std over seeds {', '.join(map(str, seeds))}.", "",
             "| claim | held-out metric | claimed arm | baseline | gap | target | holds |",
             "|---|---|---|---|---|---|---|"]
    for key, rows in results.items():
        claim = claims[key][1]
        ok, why = verdict(claim, rows)
        better = f"{claim.better}: {_fmt([r[claim.better] for r in rows])}"
        if claim.baseline is None:
            base, g = "—", "—"
            target = f"{'≥' if claim.higher_is_better else '≤'} {claim.bound:g}"
        else:
            base = f"{claim.baseline}: {_fmt([r[claim.baseline] for r in rows])}"
            g = _fmt([gap(claim, r[claim.better], r[claim.baseline]) for r in rows])
            target = f"gap ≥ {claim.min_gap:g}, stds below it" if claim.min_gap is not None else "gap ≥ 0"
        lines.append(f"| **{key}** {claim.title} | {claim.metric} | {better} | {base} | {g} | {target} | "
                     f"{'yes' if ok else 'no'} ({why}) |")
    lines += ["", "Per seed (every number each run returned):", ""]
    shown: dict[str, str] = {}  # claims that share their runs (same rows) show them once
    for key, rows in results.items():
        claim = claims[key][1]
        same = json.dumps(rows, sort_keys=True)
        if same in shown:
            lines += [f"*{key}* — the runs of *{shown[same]}*" + (f"; {claim.data}" if claim.data else ""), ""]
            continue
        shown[same] = key
        names = list(dict.fromkeys(n for r in rows for n in r))
        lines += [f"*{key}* — {claim.data}" if claim.data else f"*{key}*", "",
                  "| seed | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [f"| {s} | " + " | ".join(f"{r[n]:.4g}" if n in r else "—" for n in names) + " |"
                  for s, r in zip(seeds, rows, strict=True)]
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_claim_options(p)
    p.add_argument("--jobs", type=positive_int, default=2, help="worker processes side by side")
    p.add_argument("--out", type=Path, default=OUT, help="the Markdown table (JSON next to it)")
    p.add_argument("--list", action="store_true", help="list the claims and exit")
    args = parse_claim_args(p, argv, load_claims())
    check_out(p, args.out)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    claims = load_claims()
    if args.list:
        for key, (module, claim) in claims.items():
            print(f"{key:8} {claim.title} — {claim.metric} ({module})")
        return 0
    keys = args.keys
    units: dict[str, list[str]] = {}
    for key in keys:
        units.setdefault(claims[key][0], []).append(key)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the workers inherit it
    start = time.perf_counter()
    by_seed: dict[str, dict[int, dict[str, float]]] = {k: {} for k in keys}
    seconds: dict[str, list[float]] = {m: [] for m in units}
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(run_unit, m, ks, s, args.threads): m for m, ks in units.items() for s in args.seeds}
        for future, module in futures.items():
            seed, results, took = future.result()
            seconds[module].append(took)
            for key, values in results.items():
                by_seed[key][seed] = values
    results = {k: [by_seed[k][s] for s in args.seeds] for k in keys}
    text = table(claims, results, args.seeds)
    minutes = (time.perf_counter() - start) / 60
    timing = ", ".join(f"{m.removeprefix('claims_')} {sum(t) / len(t) / 60:.1f}" for m, t in seconds.items())
    text += (f"\n{minutes:.1f} minutes in all ({args.jobs} workers × {args.threads} thread); "
             f"minutes a seed: {timing}.\n")
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"seeds": args.seeds, "results": results, "minutes": minutes}, indent=2) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
