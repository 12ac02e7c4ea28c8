"""Decoding layouts chosen by timing them on this CPU: the cost of a choice is its setup (the copy,
the packing) plus a step's products for every new token; a proposal is lent only where that beats
the baseline by MIN_GAIN; each measurement is made once per layer shapes, rows and threads."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

import unitok.layers.decode_layout as decode_layout
from tests.conftest import tiny_gpt
from unitok.layers import layout_timing
from unitok.layers.layout_timing import (
    GIVE_UP,
    MIN_GAIN,
    MIN_GAIN_ANY_LENGTH,
    fastest_layouts,
    forget_timings,
    layout_costs,
    lent,
    pass_seconds,
)

PLAIN, COPY = frozenset(), frozenset({"input_major"})


@pytest.fixture(autouse=True)
def _fresh_timings():
    forget_timings()
    yield
    forget_timings()


class Timer:
    """A stand-in for `pass_seconds`: (first pass, steady pass) by the layout lent — told apart by
    the head's strides (input-major) and the context variables — and a record of its timings (the
    untimed warm-up, ``passes=0``, counted apart)."""

    def __init__(self, **seconds: tuple[float, float]) -> None:
        self.seconds, self.calls, self.bounds, self.warm_ups = seconds, [], [], 0

    def __call__(self, module: nn.Module, rows: int, passes: int = 3,
                 give_up_above: float = float("inf")) -> tuple[float, float]:
        if passes == 0:
            self.warm_ups += 1
            return 1.0, 1.0
        if module.lm_head.weight.stride()[0] == 1:
            name = "input_major"
        elif decode_layout._PACKED.get() is not None:
            name = "packed"
        else:
            name = "output_major" if decode_layout._OUTPUT_MAJOR.get() else "plain"
        self.calls.append((name, rows))
        self.bounds.append(give_up_above)
        return self.seconds[name]


def test_the_cheapest_for_the_tokens_asked_for_wins_from_one_measurement():
    model = tiny_gpt()
    # the copy: a first pass 2 ms slower, then 0.8 ms a step against 1 ms as stored. 5 steps: 5 ms
    # against 6; 11: 11 against 10.8, not MIN_GAIN less; 64: 64 against 53.2
    timer = Timer(plain=(1e-3, 1e-3), input_major=(2.8e-3, 0.8e-3))
    for steps, expected in ((5, PLAIN), (64, COPY), (11, PLAIN), (1000, COPY)):
        assert fastest_layouts(model, 1, steps, PLAIN, [COPY], input_major_rows=1, timer=timer) == expected, steps
    # steps=None (the compiled step: one layout for every length): the pass alone, 0.8 against 1 ms,
    # at least MIN_GAIN_ANY_LENGTH faster
    assert fastest_layouts(model, 1, None, PLAIN, [COPY], input_major_rows=1, timer=timer) == COPY
    assert timer.calls == [("plain", 1), ("input_major", 1)] and timer.warm_ups == 1  # measured once, then kept
    costs = layout_costs(model, 1, (PLAIN, COPY), 1, timer)
    # nothing to lend: no first-pass excess, only entering the block, read on the wall clock (tens of
    # microseconds; bounded loosely, as a loaded CI machine once took 0.11 ms)
    assert costs[PLAIN][0] < 1e-3 and costs[PLAIN][1] == 1e-3 and costs[COPY][1] == 0.8e-3
    # setup: the first pass's excess, 2 ms, and the copy's own time (a tiny model's: microseconds)
    assert 2e-3 < costs[COPY][0] < 10e-3


def test_a_proposal_must_beat_the_baseline_by_min_gain():
    model = tiny_gpt()
    step = 1e-3
    slightly = Timer(plain=(step, step), output_major=(step / (MIN_GAIN - 0.01), step / (MIN_GAIN - 0.01)))
    assert fastest_layouts(model, 5, 64, PLAIN, [frozenset({"output_major"})], timer=slightly) == PLAIN
    assert fastest_layouts(model, 5, None, PLAIN, [frozenset({"output_major"})], timer=slightly) == PLAIN
    forget_timings()  # any number of steps: the pass alone, MIN_GAIN_ANY_LENGTH faster than the baseline's
    level = Timer(plain=(step, step), output_major=(step, step / (MIN_GAIN_ANY_LENGTH - 0.01)))
    assert fastest_layouts(model, 5, 1000, PLAIN, [frozenset({"output_major"})], timer=level) == {"output_major"}
    assert fastest_layouts(model, 5, None, PLAIN, [frozenset({"output_major"})], timer=level) == PLAIN
    forget_timings()
    clearly = Timer(plain=(step, step), output_major=(step / (MIN_GAIN + 0.1), step / (MIN_GAIN + 0.1)))
    assert fastest_layouts(model, 5, 64, PLAIN, [frozenset({"output_major"})], timer=clearly) == {"output_major"}


def test_the_fastest_of_several_proposals_and_what_the_packing_costs(monkeypatch):
    # the lending itself read on a stopped clock: the break-even below is 0.1 ms wide, and a loaded
    # machine's real packing of the tiny model once took longer
    monkeypatch.setattr(layout_timing, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    model = tiny_gpt()
    # packing: a first pass of 30 ms (the packing), then 0.5 ms; output-major 0.7 ms from the start
    timer = Timer(plain=(1e-3, 1e-3), output_major=(0.7e-3, 0.7e-3), packed=(30e-3, 0.5e-3))
    proposals = [frozenset({"output_major"}), frozenset({"packed"})]
    assert fastest_layouts(model, 5, 64, PLAIN, proposals, timer=timer) == {"output_major"}  # 45 vs 62 ms
    assert fastest_layouts(model, 5, 1000, PLAIN, proposals, timer=timer) == {"packed"}  # 0.53 vs 0.70 s
    setup, step = layout_costs(model, 5, (PLAIN, *proposals), None, timer)[frozenset({"packed"})]
    assert step == 0.5e-3 and setup == pytest.approx(29.5e-3, abs=1e-12)  # the packing, counted once
    # break-even with output-major: 29.5 + 0.5 n = 0.7 n at n = 147.5 steps
    assert fastest_layouts(model, 5, 147, PLAIN, proposals, timer=timer) == {"output_major"}
    assert fastest_layouts(model, 5, 148, PLAIN, proposals, timer=timer) == {"packed"}
    assert [name for name, _ in timer.calls] == ["plain", "output_major", "packed"]
    # the baseline timed in full; a proposal GIVE_UP times slower than it would stop early
    assert timer.bounds == [float("inf"), GIVE_UP * 1e-3, GIVE_UP * 1e-3]


def test_a_pass_far_slower_than_the_bound_ends_the_timing(monkeypatch):
    model = tiny_gpt()
    products = []
    real = layout_timing.decode_linear
    monkeypatch.setattr(layout_timing, "decode_linear", lambda x, fc: products.append(fc) or real(x, fc))
    layers = len(layout_timing.linears(model))
    pass_seconds(model, 1, passes=3)
    assert len(products) == 4 * layers  # a first pass and three timed
    products.clear()
    first, steady = pass_seconds(model, 1, passes=3, give_up_above=0.0)
    assert len(products) == 2 * layers and 0 < steady  # the first timed pass is over the bound: done


def test_the_first_products_of_a_process_are_a_warm_up_not_the_baselines_setup():
    """A process's first pass carries one-off costs (1.5-3.7 ms for the D=256 GPT's, against
    0.02-0.2 ms later): counted as the baseline's setup they would let a proposal that does nothing
    beat it at a few tokens. An untimed pass runs first."""
    model = tiny_gpt()
    warm = []
    real = layout_timing.pass_seconds

    def timer(module, rows, passes=3, give_up_above=float("inf")):
        warm.append(passes == 0)
        return real(module, rows, passes, give_up_above)

    layout_costs(model, 2, (PLAIN, frozenset({"output_major"})), 2, timer)
    assert warm == [True, False, False]


def test_measurements_are_kept_per_shapes_rows_and_threads():
    timer = Timer(plain=(1e-3, 1e-3), output_major=(0.5e-3, 0.5e-3))
    proposals = [frozenset({"output_major"})]
    fastest_layouts(tiny_gpt(), 5, 64, PLAIN, proposals, timer=timer)
    fastest_layouts(tiny_gpt(), 5, 64, PLAIN, proposals, timer=timer)  # another model, the same shapes
    assert len(timer.calls) == 2
    fastest_layouts(tiny_gpt(), 6, 64, PLAIN, proposals, timer=timer)  # other rows
    fastest_layouts(tiny_gpt(d_model=64), 5, 64, PLAIN, proposals, timer=timer)  # other shapes
    assert len(timer.calls) == 6
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:
        fastest_layouts(tiny_gpt(), 5, 64, PLAIN, proposals, timer=timer)  # other threads
    finally:
        torch.set_num_threads(before)
    assert len(timer.calls) == 8
    assert fastest_layouts(tiny_gpt(), 5, 64, PLAIN, [], timer=timer) == PLAIN and len(timer.calls) == 8
    hooked = tiny_gpt()
    hooked.lm_head.register_forward_hook(lambda *args: None)  # its head takes no layout: timed apart
    fastest_layouts(hooked, 5, 64, PLAIN, proposals, timer=timer)
    assert len(timer.calls) == 10


def test_timing_passes_run_every_linear_layer_without_hooks_and_leave_the_weights_as_they_were():
    model = tiny_gpt()
    before = {name: (p.data_ptr(), p.stride(), p.detach().clone()) for name, p in model.named_parameters()}
    heard = []
    model.lm_head.register_forward_hook(lambda *args: heard.append(args))
    rng = torch.get_rng_state()
    layers = layout_timing.linears(model)
    assert len(layers) == 4 * model.config.n_layers + 1  # qkv, attention output, MLP up and down; the tied head
    for layouts in (PLAIN, COPY, frozenset({"output_major"}), frozenset({"packed"})):
        with lent(model, 5 if "packed" in layouts else 1, layouts, 1):
            first, steady = pass_seconds(model, 5 if "packed" in layouts else 1, passes=2)
        assert 0 < steady and 0 < first
    assert heard == []  # random rows are not the model's input: no hook sees them
    assert torch.equal(torch.get_rng_state(), rng)  # drawn from a generator of their own
    for name, p in model.named_parameters():
        ptr, stride, values = before[name]
        assert (p.data_ptr(), p.stride()) == (ptr, stride) and torch.equal(p, values), name


def test_unknown_layouts_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown decoding layouts \['transposed'\]; expected some of "
                                         r"\('input_major', 'output_major', 'packed'\)"):
        with lent(tiny_gpt(), 1, frozenset({"transposed", "packed"}), 1):
            pass


def test_generate_lends_what_timing_finds_fastest_and_gives_the_same_tokens(monkeypatch):
    """With the real timer (the tiny model as if out of cache): whatever wins, the tokens are those
    of the weights as stored, and the choice is among the proposals and the baseline."""
    import unitok.generate as generation

    chosen = []

    def spy(*args, **kwargs):
        chosen.append((args[3], args[4], fastest_layouts(*args, **kwargs)))
        return chosen[-1][2]

    monkeypatch.setattr(generation, "fastest_layouts", spy)
    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)
    model = tiny_gpt()
    prompts = torch.randint(2, 40, (5, 6), generator=torch.Generator().manual_seed(2))
    for rows in (1, 2, 5):
        for strategy in ("greedy", "beam"):
            options = dict(max_new_tokens=20, strategy=strategy, num_beams=3, eos_token_id=None)
            expected = model.generate(prompts[:rows], input_major=False, output_major=False, packed=False, **options)
            assert torch.equal(model.generate(prompts[:rows], **options), expected), (rows, strategy)
    assert len(chosen) == 6
    for baseline, proposals, choice in chosen:
        assert choice == baseline or choice in proposals


def test_nothing_is_proposed_where_no_step_runs_or_no_layer_takes_a_layout(monkeypatch, timed):
    import unitok.generate as generation

    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)  # as if out of cache
    model = tiny_gpt()
    prompts = torch.randint(2, 40, (5, 6), generator=torch.Generator().manual_seed(2))
    model.generate(prompts, max_new_tokens=1)  # the prompt's logits give the one token: no step
    model.to(torch.bfloat16).generate(prompts, max_new_tokens=20)  # output-major and packed take float32 only
    model.generate(prompts[:1], max_new_tokens=20, input_major=False)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):  # a mode that sees every op would count (or fake) the timing
        model.float().generate(prompts, max_new_tokens=20)
    assert timed.asked == []
    model.float().generate(prompts, max_new_tokens=20)
    assert timed.proposed() == [{"output_major", "packed"}]


def test_an_encoder_decoders_steps_are_timed_without_cross_attentions_keys_and_values():
    """Those are computed once from the source: no step runs them, so no layout serves them."""
    from tests.conftest import tiny_t5
    from unitok.models.t5 import _DecodingSession

    model = tiny_t5()
    source = torch.randint(2, 100, (1, 7), generator=torch.Generator().manual_seed(2))
    session = _DecodingSession(model, model.encode(source).last_hidden_state, None)
    stepping = [name for name, m in model.decoder.named_modules()
                if isinstance(m, nn.Linear) and not name.endswith("cross_attn.kv")]
    timed_layers = layout_timing.linears(session.weights)
    assert len(timed_layers) == len(stepping) + 1 and timed_layers[-1] is model.lm_head
    assert not any(fc is block.sublayers.cross_attn.kv for block in model.decoder.blocks for fc in timed_layers)
