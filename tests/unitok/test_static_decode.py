"""The shape-stable decode path: a `StaticKVCache` read whole under a mask, and ``generate(compile=…)``
running every new token through one compiled step. It must give the growing-cache path's tokens.
The ordinary suite traces with ``aot_eager`` (Dynamo + AOTAutograd, no C++ warm-up);
``UNITOK_COMPILE_BACKEND=inductor`` runs the same checks through inductor."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest
import torch

from unitok.backbone import Backbone, BackboneConfig
from unitok.generate import GenerationConfig, generate
from unitok.layers import KVCache, StaticKVCache
from unitok.models import GPT, T5, GPTConfig, T5Config

BACKEND = os.environ.get("UNITOK_COMPILE_BACKEND", "aot_eager")


def tiny_gpt(sharpen: float = 1.0, **changes) -> GPT:
    """A random GPT; ``sharpen`` scales every weight, so that greedy decoding varies its tokens (a
    random model at init repeats one token, which hides a step computed from the wrong keys)."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name("gpt-nano", vocab_size=64, context_length=48, **changes)).eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.mul_(sharpen)
    return gpt


def test_decode_steps_over_a_static_cache_give_the_full_forward_logits():
    gpt = tiny_gpt()
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    full = gpt(ids).logits  # (2, 10, V)
    T = 16
    cache = StaticKVCache(gpt.config.n_layers, T)
    positions = torch.arange(10).expand(2, 10)
    keys = torch.arange(T)
    cache.index = torch.arange(4)  # a 4-token prompt, then one token at a time
    prompt_mask = (keys[None, :] <= torch.arange(4)[:, None])[None, None]  # (1, 1, 4, T)
    logits = [gpt.decode_step(ids[:, :4], positions[:, :4], prompt_mask, cache)]
    for t in range(4, 10):
        cache.index = torch.tensor([t])
        logits.append(gpt.decode_step(ids[:, t:t + 1], positions[:, t:t + 1], (keys <= t)[None, None, None], cache))
    torch.testing.assert_close(torch.stack(logits, 1), full[:, 3:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_compiled_greedy_decoding_gives_the_eager_tokens(padded):
    gpt = tiny_gpt(sharpen=3.0)
    ids = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    if padded:  # left padding: rows of 7, 4 and 6 real tokens
        mask[1, :3] = 0
        mask[2, :1] = 0
    eager = gpt.generate(ids, attention_mask=mask, max_new_tokens=12)
    compiled = gpt.generate(ids, attention_mask=mask, max_new_tokens=12, compile=BACKEND)
    assert compiled.shape == (3, 19)
    assert torch.equal(compiled, eager)
    assert all(len(set(row)) > 2 for row in eager[:, 7:].tolist())  # tokens that a wrong step would change


def test_compiled_decoding_stops_at_eos_and_samples_as_eager_with_one_seed():
    gpt = tiny_gpt(sharpen=3.0)
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    greedy = gpt.generate(ids, max_new_tokens=10)
    assert all(len(set(row)) > 2 for row in greedy[:, 5:].tolist())
    eos = int(greedy[0, 7])  # the third new token of row 0: that row must end there (or where it came first)
    end = 5 + int((greedy[0, 5:] == eos).nonzero()[0])
    eager = gpt.generate(ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    compiled = gpt.generate(ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=0, compile=BACKEND)
    assert torch.equal(compiled, eager)
    assert compiled[0, end] == eos and (compiled[0, end + 1:] == 0).all()
    draws = [gpt.generate(ids, max_new_tokens=10, strategy="sample", top_k=20, generator=torch.Generator().manual_seed(4),
                          compile=backend) for backend in (False, BACKEND)]
    assert torch.equal(draws[0], draws[1])


def test_compiled_decoding_steps_on_input_major_weights_where_timed_faster_and_gives_them_back(monkeypatch, timed):
    import unitok.generate as generate_module
    import unitok.layers.layout_timing as layout_timing
    from unitok.layers.decode_layout import can_pack

    lent = []  # how many weights each decoding laid out
    real = layout_timing.input_major_weights

    @contextlib.contextmanager
    def spy(model, rows):
        with real(model, rows) as count:
            lent.append(count)
            yield count

    monkeypatch.setattr(layout_timing, "input_major_weights", spy)
    gpt = tiny_gpt()
    before = {name: (p.data_ptr(), p.stride()) for name, p in gpt.named_parameters()}
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(6))
    eager = gpt.generate(ids, max_new_tokens=8, input_major=False)
    timed.wins = "input_major"
    compiled = gpt.generate(ids, max_new_tokens=8, compile=BACKEND)  # one row: proposed, even for 8 tokens
    assert lent == [7] and torch.equal(compiled, eager)  # per layer qkv, out, MLP in; the tied head
    assert timed.proposed() == [{"input_major"}]  # the copy alone: a traced step multiplies as F.linear does
    assert timed.steps == [None]  # chosen for any number of tokens: one layout, one graph
    assert {name: (p.data_ptr(), p.stride()) for name, p in gpt.named_parameters()} == before  # given back
    gpt.generate(ids, max_new_tokens=8, compile=BACKEND, input_major=False)  # not asked
    gpt.generate(ids.repeat(3, 1), max_new_tokens=8, compile=BACKEND)  # three rows: nothing gains
    assert lent == [7] and len(timed.asked) == 1  # neither proposed it
    timed.wins = None  # this CPU runs the weights as stored faster (an AMX Xeon's 480 MB of L3)
    assert torch.equal(gpt.generate(ids, max_new_tokens=8, compile=BACKEND), eager)
    assert lent == [7] and len(timed.asked) == 2  # proposed, timed, not lent
    gpt.generate(ids, max_new_tokens=1, compile=BACKEND)  # one new token: no step runs, nothing proposed
    assert len(timed.asked) == 2
    monkeypatch.setattr(generate_module, "MIN_COLD_BYTES", 0)  # as if out of cache: eager steps of 5 rows would
    gpt.generate(ids, max_new_tokens=20, strategy="beam")  # be proposed output-major and packed products...
    assert timed.proposed()[-1] == ({"output_major", "packed"} if can_pack() else {"output_major"})
    gpt.generate(ids, max_new_tokens=20, strategy="beam", compile=BACKEND)  # ...a traced step none of them
    assert len(timed.asked) == 3


def test_steps_after_the_first_evaluate_only_the_guards_that_tell_graphs_apart(monkeypatch):
    import torch._dynamo.eval_frame as eval_frame

    import unitok.generate as generate

    real, seen = generate._compiled_step, []

    def spy(backend, device, shapes):
        step = real(backend, device, shapes)

        def recording(*args):
            seen.append((eval_frame._stance.stance, eval_frame._stance.skip_guard_eval_unsafe))
            return step(*args)
        return recording

    monkeypatch.setattr(generate, "_compiled_step", spy)
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.current_thread()])  # (whatever earlier tests left)
    wide, narrow = tiny_gpt(sharpen=3.0), tiny_gpt(sharpen=3.0, d_model=48)
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(7))
    for gpt in (wide, narrow, wide):  # two models in turn: each decoding's first step runs every guard
        seen.clear()
        assert torch.equal(gpt.generate(ids, max_new_tokens=6, compile=BACKEND), gpt.generate(ids, max_new_tokens=6))
        assert seen == [("default", False)] + [("default", True)] * 4  # 5 steps: the 6th token is the last's
        assert not eval_frame._stance.skip_guard_eval_unsafe  # the stance given back
    seen.clear()
    with torch.compiler.set_stance("force_eager"):  # the caller's stance is kept: no compiled step at all
        assert torch.equal(wide.generate(ids, max_new_tokens=4, compile=BACKEND), wide.generate(ids, max_new_tokens=4))
        assert eval_frame._stance.stance == "force_eager"
    assert seen == [("force_eager", False)] * 3
    seen.clear()
    monkeypatch.undo()  # the real threads again, and the spy reinstated
    monkeypatch.setattr(generate, "_compiled_step", spy)
    release = threading.Event()
    other = threading.Thread(target=release.wait)  # another thread's compiled code would skip its guards too
    other.start()
    try:
        assert torch.equal(wide.generate(ids, max_new_tokens=4, compile=BACKEND), wide.generate(ids, max_new_tokens=4))
    finally:
        release.set()
        other.join()
    assert seen == [("default", False)] * 3  # every guard evaluated while it ran


def test_the_compiled_step_is_traced_once_for_every_new_token_and_prompt_length():
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    gpt = tiny_gpt()
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(5))
    gpt.generate(ids, max_new_tokens=20, compile=BACKEND)
    # a shorter prompt and fewer new tokens fit the same cache (28 and 18 positions written, both
    # rounded up to 32): nothing new to trace
    gpt.generate(ids[:, :5], max_new_tokens=14, compile=BACKEND)
    assert counters["stats"]["unique_graphs"] == 1
    assert gpt.new_static_cache(20).capacity == 32
    shorter = GPT(GPTConfig.from_name("gpt-nano", vocab_size=64, context_length=40))
    assert shorter.new_static_cache(35).capacity == 40  # 48, rounded, cut to the context length of 40
    with pytest.raises(ValueError, match="does not fit the context length 48"):
        gpt.new_static_cache(49)


def test_the_static_cache_holds_the_positions_written_up_to_the_context_edge(monkeypatch):
    gpt = tiny_gpt(sharpen=3.0)
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(4))
    asked: list[int] = []
    make = gpt.new_static_cache
    monkeypatch.setattr(gpt, "new_static_cache", lambda n: asked.append(n) or make(n))
    gpt.generate(ids, max_new_tokens=8, compile=BACKEND)
    assert asked == [16]  # 9 + 8 - 1: the last new token is never fed back; one cache of 16, not 32
    for options in (dict(), dict(strategy="beam", num_beams=2)):  # 9 + 39: the whole context of 48
        eager = gpt.generate(ids, max_new_tokens=39, **options)
        assert eager.shape == (1, 48)
        assert torch.equal(gpt.generate(ids, max_new_tokens=39, compile=BACKEND, **options), eager), options


@pytest.mark.parametrize("padded", [False, True])
def test_compiled_beam_search_gives_the_eager_beams(padded):
    gpt = tiny_gpt(sharpen=3.0)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :3] = 0  # left padding: rows of 7 and 4 real tokens
    for options in (dict(num_beams=3), dict(num_beams=4, greedy_floor=False), dict(num_beams=1)):
        eager = gpt.generate(ids, attention_mask=mask, max_new_tokens=9, strategy="beam", **options)
        compiled = gpt.generate(ids, attention_mask=mask, max_new_tokens=9, strategy="beam", compile=BACKEND,
                                **options)
        assert torch.equal(compiled, eager), options
    assert all(len(set(row)) > 2 for row in eager[:, 7:].tolist())  # tokens a wrongly reordered cache would change


def test_compiled_beam_search_stops_at_eos_as_eager():
    gpt = tiny_gpt(sharpen=3.0)
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(9))
    eos = int(gpt.generate(ids, max_new_tokens=4, strategy="beam", num_beams=3)[0, 7])  # a token the beams reach
    runs = [gpt.generate(ids, max_new_tokens=12, strategy="beam", num_beams=3, eos_token_id=eos, pad_token_id=0,
                         early_stopping=stop, compile=backend)
            for stop in (False, True) for backend in (False, BACKEND)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[2], runs[3])
    assert (runs[0][:, 5:] == eos).any()  # a beam ended there


def tiny_t5() -> T5:
    """A random T5 whose tokens vary along a decoding (a larger relative bias, weights scaled) and
    whose 3-beam answers differ from greedy's."""
    torch.manual_seed(1)
    t5 = T5(T5Config.from_name("t5-tiny", vocab_size=64)).eval()
    with torch.no_grad():
        for name, p in t5.named_parameters():
            p.normal_(0, 4.0) if "relative" in name else p.mul_(3.0)
    return t5


def test_compiled_t5_decoding_gives_the_eager_tokens_greedy_and_beam():
    t5 = tiny_t5()
    sources = torch.randint(2, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(sources)
    mask[1, 6:] = 0  # a padded source: the cross-attention's mask, checked once for the compiled step
    answers = []
    for options in (dict(), dict(strategy="beam", num_beams=3), dict(strategy="beam", num_beams=4, greedy_floor=False)):
        eager = t5.generate(sources, attention_mask=mask, max_new_tokens=10, eos_token_id=None, **options)
        compiled = t5.generate(sources, attention_mask=mask, max_new_tokens=10, eos_token_id=None, compile=BACKEND,
                               **options)
        assert torch.equal(compiled, eager), options
        answers.append(eager)
    assert all(len(set(row[1:])) >= 3 for answer in answers for row in answer.tolist())  # tokens that vary
    assert not torch.equal(answers[0], answers[1])  # the beams' answer is not greedy's: their reordering counts


def test_compiled_decoding_serves_any_number_of_source_lengths_and_models():
    # Dynamo keeps 8 graphs a code object, then fails under fullgraph: each step shape compiles its own
    # copy of the step, and a ninth model of one shape gets a fresh copy
    t5 = tiny_t5()
    for length in range(3, 12):  # nine source lengths (one past the limit): cross-attention's keys, a graph each
        sources = torch.randint(2, 64, (1, length), generator=torch.Generator().manual_seed(length))
        assert torch.equal(t5.generate(sources, max_new_tokens=4, eos_token_id=None, compile=BACKEND),
                           t5.generate(sources, max_new_tokens=4, eos_token_id=None))
    ids = torch.randint(0, 64, (1, 3), generator=torch.Generator().manual_seed(11))
    with torch._dynamo.config.patch(recompile_limit=1):  # one graph a copy: the second model's fills it
        for activation in ("gelu_tanh", "relu", "gelu"):  # models of one shape, each its own graph
            gpt = tiny_gpt(sharpen=3.0, activation=activation)
            assert torch.equal(gpt.generate(ids, max_new_tokens=3, compile=BACKEND),
                               gpt.generate(ids, max_new_tokens=3))


def test_the_relative_bias_at_a_static_cache_index_is_the_growing_caches():
    t5 = tiny_t5()
    bias = t5.decoder.relative_bias
    for index in (torch.tensor([0]), torch.tensor([5]), torch.arange(3, 7)):
        expected = bias(len(index), 16, int(index[0]))  # queries at index[0].., keys 0..15
        assert torch.equal(bias.at(index, 16), expected)


def test_compiled_beam_search_is_traced_once_for_every_length_and_any_number_of_beam_widths():
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    gpt = tiny_gpt(sharpen=3.0)
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(10))
    # eight lengths, 8 to 15 positions written (the last new token never is), in one cache of 16; Hugging Face's search (no greedy row): its
    # ids are views of longer sequences
    for new_tokens in range(3, 11):
        gpt.generate(ids, max_new_tokens=new_tokens, strategy="beam", num_beams=3, greedy_floor=False,
                     compile=BACKEND)
    assert counters["stats"]["unique_graphs"] == 1
    # one beam on one row: its (1, 1) ids are a view whose strides say the sequences' length
    for new_tokens in range(3, 11):
        gpt.generate(ids, max_new_tokens=new_tokens, strategy="beam", num_beams=1, compile=BACKEND)
    assert counters["stats"]["unique_graphs"] == 2
    for width in range(1, 11):  # ten row counts, each its own compiled step: no recompile limit reached
        compiled = gpt.generate(ids, max_new_tokens=4, strategy="beam", num_beams=width, compile=BACKEND)
        assert torch.equal(compiled, gpt.generate(ids, max_new_tokens=4, strategy="beam", num_beams=width))


def test_bad_compiled_decoding_requests_are_refused_early():
    ids = torch.randint(0, 64, (1, 5))
    with pytest.raises(ValueError, match="compile must be"):
        GenerationConfig(compile="")
    with pytest.raises(TypeError, match="compile must be bool \\| str, got 1"):
        GenerationConfig.from_dict({"compile": 1})
    with pytest.raises(TypeError, match="cuda_graph must be bool, got 'yes'"):
        GenerationConfig(compile=True, cuda_graph="yes")
    gpt = tiny_gpt()

    class EagerOnly:  # a `Decoder` with no decode_step: a growing cache only
        new_cache, next_token_logits = gpt.new_cache, gpt.next_token_logits

    for strategy in ("greedy", "beam"):
        with pytest.raises(ValueError, match="EagerOnly decodes with compile=False"):  # named by the model
            generate(EagerOnly(), ids, GenerationConfig(max_new_tokens=3, strategy=strategy, compile=BACKEND))


def test_a_static_cache_reorders_its_rows_in_place_and_copies_them_out_to_more():
    cache = StaticKVCache(1, 8)
    keys, values = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)  # 2 rows, 3 heads, 4 positions
    cache.index = torch.arange(4)
    buffer, _ = cache.update(0, keys, values)
    cache.reorder(torch.tensor([1, 1]), written=4)  # the same rows: in place, the buffer a compiled step reads kept
    cache.index = torch.tensor([4])
    k, v = cache.update(0, torch.zeros(2, 3, 1, 5), torch.zeros(2, 3, 1, 5))
    assert k is buffer and torch.equal(k[:, :, :4], keys[[1, 1]]) and torch.equal(v[:, :, :4], values[[1, 1]])
    cache.reorder(torch.tensor([0, 0, 1]))  # three rows from two: new buffers
    k, _ = cache.update(0, torch.ones(3, 3, 1, 5), torch.ones(3, 3, 1, 5))
    assert k.shape == (3, 3, 8, 5) and torch.equal(k[:, :, :4], keys[[1, 1, 1]])
    before = k.clone()
    cache.reorder(torch.tensor([2, 0, 1]))  # nothing said of what is written: the whole buffer moves
    cache.index = torch.tensor([7])  # (an unwritten position, written as it would read after the move)
    moved = before[[2, 0, 1]]
    assert torch.equal(cache.update(0, moved[:, :, 7:], moved[:, :, 7:])[0], moved)
    for bad in (-1, 9, 2.5):  # a slice would read -1 from the end, clamp 9, or fail later
        with pytest.raises(ValueError, match=f"written must be .*got {bad}"):
            cache.reorder(torch.tensor([0, 1, 2]), written=bad)


def test_a_static_cache_needs_its_write_positions_and_a_mask():
    backbone = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2, causal=True)).eval()
    x = torch.randn(1, 3, 16)
    cache = StaticKVCache(1, 8)
    with pytest.raises(ValueError, match="pass mask="):
        backbone(x, cache=cache)
    mask = torch.ones(1, 1, 3, 8, dtype=torch.bool)
    with pytest.raises(ValueError, match="set StaticKVCache.index to the 3 positions"):
        backbone(x, cache=cache, mask=mask)
    cache.index = torch.arange(2)
    with pytest.raises(ValueError, match="got \\(2,\\)"):
        backbone(x, cache=cache, mask=mask)
    with pytest.raises(ValueError, match="capacity must be an integer ≥ 1, got 0"):
        StaticKVCache(1, 0)
    t5_like = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2, causal=True, relative_buckets=8)).eval()
    with pytest.raises(ValueError, match="relative position bias reads the queries' positions from "
                                         "StaticKVCache.index: set it to the 3 positions being written, got None"):
        t5_like(x, cache=StaticKVCache(1, 8), mask=mask)
    cache = StaticKVCache(1, 8)
    cache.index = torch.arange(3)
    causal = (torch.arange(8)[None, :] <= torch.arange(3)[:, None])[None, None]  # (1, 1, 3, 8): keys up to each query
    static = t5_like(x, cache=cache, mask=causal).last_hidden_state  # the bias read where the queries are written
    torch.testing.assert_close(static, t5_like(x, cache=KVCache(1)).last_hidden_state, atol=1e-6, rtol=0)
