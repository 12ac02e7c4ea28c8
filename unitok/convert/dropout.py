"""Dropout rates across a conversion. Eval outputs never depend on them, but a converted model
fine-tuned should regularise as the reference would: a unitok config drops at one rate at a
set of sites (embeddings, attention weights, each sublayer's output, ...), so the reference's
rates at those sites must agree, and its rates at sites unitok never drops at must be 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def _shown(name: str, rates: Iterable[float]) -> str:
    values = sorted(set(rates))
    return f"{name}={values[0]:g}" if len(values) == 1 else f"{name}={values[0]:g}…{values[-1]:g}"


def one_rate(shared: Mapping[str, Iterable[float]],
             absent: Mapping[str, Iterable[float]] | None = None) -> tuple[float, list[str]]:
    """(the one rate, the reference's rates it cannot carry as ``name=value``: empty if exact).

    ``shared``: the reference's rates (one per layer, or one) at the sites the unitok field
    drops at, named by the reference's option; they must all be equal. ``absent``: its rates
    at sites unitok never drops at; they must be 0.
    """
    agreed = {name: [float(r) for r in rates] for name, rates in shared.items()}
    distinct = {r for rates in agreed.values() for r in rates}
    rejected = [_shown(name, rates) for name, rates in agreed.items()] if len(distinct) > 1 else []
    for name, rates in (absent or {}).items():
        nonzero = [float(r) for r in rates]
        if any(nonzero):
            rejected.append(_shown(name, nonzero))
    return (distinct.pop() if len(distinct) == 1 else 0.0), rejected
