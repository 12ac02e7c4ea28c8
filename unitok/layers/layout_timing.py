"""Which layout a decoding step's products run fastest in on this CPU, timed once per process.

`unitok.generate` proposes the layouts of `unitok.layers.decode_layout` from the layers' sizes and
the step's rows, rules measured on AMD Zen CPUs with 32 MB of L3, where a D=256 GPT's 21 MB of
weights ran at cold-cache speed. A CPU whose cache holds them runs the same products faster as
they are: on an AMX Xeon with 480 MB of L3, greedy decoding of that GPT took 128-144 ms on the
weights as stored against 146-156 input-major and 217-249 output-major, and its 4-beam search
140-149 ms against 146-163 packed. So the choice is timed where it is made: passes of the step's
rows through the model's linear layers, as a decoding step runs them one after the other (their
working set, their cache), under the baseline and under each proposed layout, and what lending it
costs (the copy, or the packing in the first pass). The layouts lent are those with the least
cost for the new tokens asked for: setup + tokens x pass; a proposal (a copy of the weights while
decoding) only where that beats the baseline's by `MIN_GAIN`. The timings are kept per (layer
shapes, rows, threads, candidates): one measurement a process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from unitok.layers.decode_layout import (
    decode_linear,
    input_major_weights,
    output_major_products,
    packed_products,
)
from unitok.layers.plain_linear import unhooked

LAYOUTS = ("input_major", "output_major", "packed")
# A proposal (a copy of the weights while decoding) is lent only where its cost is this much below
# the baseline's (timing noise on a busy machine is a few per cent).
MIN_GAIN = 1.05
# A choice kept for any number of steps (the compiled step's: its graph is traced for one layout)
# is made on the pass alone, which reads level within noise where the copy gains nothing: the Xeon
# timed a D=256 GPT's one-row pass input-major at 0.95-1.10x as stored over eight processes, and its
# compiled step ran 8 % slower on the copy; on a Zen 4 the copy made that step 1.6x faster.
MIN_GAIN_ANY_LENGTH = 1.15
PASSES = 3  # timed passes a layout (the fastest counts), after one that packs or warms up
# A proposal whose timed pass is this many times the baseline's cannot win: its timing stops there
# (output-major products of a GPT-124M-sized model's one-row steps take 2.2x as long on the Xeon).
GIVE_UP = 1.5
Layouts = frozenset[str]
_COSTS: dict[tuple, dict[Layouts, tuple[float, float]]] = {}


@contextlib.contextmanager
def lent(module: nn.Module, rows: int, layouts: Layouts, input_major_rows: int | None) -> Iterator[None]:
    """Lend ``layouts`` (names in `LAYOUTS`) to steps of ``rows`` rows until the block ends; the
    input-major copy covers `widening_linears` (``module``, ``input_major_rows``)."""
    unknown = set(layouts) - set(LAYOUTS)
    if unknown:
        raise ValueError(f"unknown decoding layouts {sorted(unknown)}; expected some of {LAYOUTS}")
    with contextlib.ExitStack() as stack:
        if "input_major" in layouts:
            stack.enter_context(input_major_weights(module, input_major_rows))
        if "output_major" in layouts:
            stack.enter_context(output_major_products())
        if "packed" in layouts:
            stack.enter_context(packed_products(rows))
        yield


def linears(module: nn.Module) -> list[nn.Linear]:
    """``module``'s ``nn.Linear`` layers in the order they were registered (a shared one once)."""
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def pass_seconds(module: nn.Module, rows: int, passes: int = PASSES,
                 give_up_above: float = float("inf")) -> tuple[float, float]:
    """(the first, the fastest of the next ``passes``) passes of ``rows`` rows through every linear
    layer of ``module``, each product the way a decoding step's runs it (`decode_linear`, else
    ``F.linear``: no forward hook sees these inputs), in seconds; the first packs the weights where
    packed. Fewer passes where one after the first takes over ``give_up_above`` seconds (none after
    it: ``passes=0``, a warm-up)."""
    layers = linears(module)
    g = torch.Generator().manual_seed(0)  # not the global one: a sampled decoding after this draws as it would
    inputs = {fc.in_features: torch.randn(rows, fc.in_features, generator=g).to(fc.weight.device, fc.weight.dtype)
              for fc in layers}
    times = []
    with torch.no_grad():
        for _ in range(passes + 1):
            start = time.perf_counter()
            for fc in layers:
                x = inputs[fc.in_features]
                if decode_linear(x, fc) is None:
                    F.linear(x, fc.weight, fc.bias)
            times.append(time.perf_counter() - start)
            if len(times) > 1 and times[-1] > give_up_above:
                break
    return times[0], min(times[1:], default=times[0])


Timer = Callable[..., tuple[float, float]]  # (module, rows, passes=, give_up_above=) -> (first, steady pass)


def layout_costs(module: nn.Module, rows: int, candidates: Sequence[Layouts], input_major_rows: int | None = None,
                 timer: Timer = pass_seconds) -> dict[Layouts, tuple[float, float]]:
    """{candidate: (seconds to lend it, seconds a step's products take under it)} for steps of ``rows``
    rows of ``module`` on this CPU, measured once per (layer shapes, rows, threads, candidates) in a
    process; ``timer`` (`pass_seconds`) gives a first and a steady pass, told to give up on a
    candidate `GIVE_UP` times slower than the first (the baseline)."""
    # what a layout can take: the shapes, and whether each layer is a plain contiguous unhooked one
    layers = tuple((fc.in_features, fc.out_features, fc.bias is not None, fc.weight.dtype, fc.weight.device.type,
                    type(fc) is nn.Linear and fc.weight.is_contiguous() and unhooked(fc)) for fc in linears(module))
    key = (layers, rows, torch.get_num_threads(), tuple(candidates), input_major_rows)
    if key not in _COSTS:
        # untimed: the first products of a process (lazy initialisation, cold caches) would count
        # as the first candidate's setup
        timer(module, rows, passes=0)
        costs = {}
        for layouts in candidates:
            start = time.perf_counter()
            with lent(module, rows, layouts, input_major_rows):
                copy = time.perf_counter() - start
                bound = GIVE_UP * costs[candidates[0]][1] if costs else float("inf")
                first, steady = timer(module, rows, give_up_above=bound)
            costs[layouts] = (copy + max(first - steady, 0.0), steady)
        _COSTS[key] = costs
    return _COSTS[key]


def fastest_layouts(module: nn.Module, rows: int, steps: int | None, baseline: Layouts, proposals: Sequence[Layouts],
                    input_major_rows: int | None = None, timer: Timer = pass_seconds) -> Layouts:
    """The layouts to lend for ``steps`` decoding steps of ``rows`` rows of ``module``: the proposal
    whose cost (`layout_costs`: setup + steps x pass) is least, where it is `MIN_GAIN` times below
    the baseline's; else the baseline. ``steps`` None: the pass alone counts, for any number of
    steps (one choice for every length), and must be `MIN_GAIN_ANY_LENGTH` times below the
    baseline's. Without proposals nothing is timed."""
    if not proposals:
        return baseline
    costs = layout_costs(module, rows, (baseline, *proposals), input_major_rows, timer)
    total = {layouts: step if steps is None else setup + steps * step for layouts, (setup, step) in costs.items()}
    best = min(proposals, key=total.__getitem__)
    gain = MIN_GAIN if steps is not None else MIN_GAIN_ANY_LENGTH
    return best if total[best] * gain <= total[baseline] else baseline


def forget_timings() -> None:
    """Time every choice again (after the machine, its load or the model's placement changed)."""
    _COSTS.clear()


__all__ = ["GIVE_UP", "LAYOUTS", "MIN_GAIN", "PASSES", "fastest_layouts", "forget_timings", "layout_costs", "lent", "linears", "pass_seconds"]
