"""Decoding strategies: filters, EOS, seeds, beams — on hand-built tables and a tiny GPT."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from unitok.generate import GenerationConfig, filter_top_k, filter_top_p, generate
from unitok.layers import KVCache
from unitok.models import GPT, GPTConfig


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    kept = filter_top_k(logits, 2)
    assert torch.isfinite(kept).tolist() == [[False, True, False, True, False]]


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = torch.isfinite(filter_top_p(probs.log(), 0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 + 0.3 ≥ 0.7
    assert torch.isfinite(filter_top_p(probs.log(), 0.01)).sum() == 1  # always the top token


class TableDecoder:
    """A fake model whose next-token log-probabilities depend only on the last token."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(1, capacity)

    def next_token_logits(self, new_ids, attention_mask, cache):
        return self.table[new_ids[:, -1]].log()


def test_beam_search_finds_the_better_path_that_greedy_misses():
    # From 0: token 1 (p=.6) then anything at ≤ .4; token 2 (p=.4) then 3 at p=1.0.
    eps = 1e-6
    table = torch.full((5, 5), eps)
    table[0, 1], table[0, 2] = 0.6, 0.4
    table[1, 3], table[1, 4] = 0.4, 0.4
    table[1, 0] = 0.2
    table[2, 4] = 1.0
    table[3:, 4] = 1.0
    table = table / table.sum(-1, keepdim=True)
    prompt = torch.tensor([[0]])
    greedy = generate(TableDecoder(table), prompt, GenerationConfig(max_new_tokens=2, eos_token_id=4))
    beam = generate(TableDecoder(table), prompt, GenerationConfig(max_new_tokens=2, strategy="beam",
                                                                  num_beams=2, eos_token_id=4))
    assert greedy.tolist() == [[0, 1, 3]]  # 0.6 × 0.4 = 0.24
    assert beam.tolist() == [[0, 2, 4]]  # 0.4 × 1.0 = 0.40


def test_beam_search_returns_greedy_where_the_beam_loses_the_greedy_path():
    # From 0: A=1 (p=.5), B=2 (.3). After A the best is 6 (.28, then EOS for sure: .14 in all);
    # after B two tokens at .5 each (.15 > .14), so a beam of 2 keeps only B's branches — whose
    # continuations are flat (≤ .045 in all). Hugging Face's search returns one of those; ours
    # returns greedy's 0 1 6 EOS, which scores higher on the search's own score.
    table = torch.full((10, 10), 1e-6)
    table[0, 1], table[0, 2], table[0, 9] = 0.5, 0.3, 0.2
    table[1, 6], table[1, 3], table[1, 4], table[1, 7] = 0.28, 0.24, 0.24, 0.24
    table[2, 3], table[2, 4] = 0.5, 0.5
    table[3:5, 5], table[3:5, 7], table[3:5, 8], table[3:5, 9] = 0.1, 0.3, 0.3, 0.3
    table[6, 5] = 1.0
    table[7:, :] = 0.1
    table = table / table.sum(-1, keepdim=True)
    prompt = torch.tensor([[0]])
    greedy = generate(TableDecoder(table), prompt, GenerationConfig(max_new_tokens=3, eos_token_id=5))
    assert greedy.tolist() == [[0, 1, 6, 5]]
    for length_penalty in (0.0, 1.0):
        beam = generate(TableDecoder(table), prompt, GenerationConfig(
            max_new_tokens=3, strategy="beam", num_beams=2, eos_token_id=5, length_penalty=length_penalty))
        assert beam.tolist() == greedy.tolist(), length_penalty


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, context_length=64, d_model=32, n_layers=2, n_heads=4)).eval()


def test_generation_stops_at_eos_and_pads_finished_rows():
    model = tiny_gpt()
    prompt = torch.randint(2, 40, (2, 3))
    free = model.generate(prompt, max_new_tokens=10)
    eos = int(free[0, 5])  # a token row 0 emits at step 3
    out = model.generate(prompt, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    row = out[0, 3:].tolist()
    assert eos in row
    after = row[row.index(eos) + 1 :]
    assert all(t == 0 for t in after)


def test_sampling_is_reproducible_with_a_generator_and_greedy_at_low_temperature():
    model = tiny_gpt()
    prompt = torch.randint(2, 40, (1, 4))
    a = model.generate(prompt, max_new_tokens=8, strategy="sample", generator=torch.Generator().manual_seed(1))
    b = model.generate(prompt, max_new_tokens=8, strategy="sample", generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    cold = model.generate(prompt, max_new_tokens=8, strategy="sample", temperature=1e-4,
                          generator=torch.Generator().manual_seed(2))
    assert torch.equal(cold, model.generate(prompt, max_new_tokens=8))
    top1 = model.generate(prompt, max_new_tokens=8, strategy="sample", top_k=1,
                          generator=torch.Generator().manual_seed(3))
    assert torch.equal(top1, model.generate(prompt, max_new_tokens=8))


def test_beam_of_one_is_greedy_and_batched_beams_equal_single_rows():
    model = tiny_gpt()
    prompts = torch.randint(2, 40, (2, 4))
    assert torch.equal(model.generate(prompts, max_new_tokens=6, strategy="beam", num_beams=1),
                       model.generate(prompts, max_new_tokens=6))
    batched = model.generate(prompts, max_new_tokens=6, strategy="beam", num_beams=3)
    for i in range(2):
        single = model.generate(prompts[i : i + 1], max_new_tokens=6, strategy="beam", num_beams=3)
        assert torch.equal(batched[i, : single.shape[1]], single[0])


def test_beam_search_runs_the_prompt_once_per_input_then_steps_every_beam():
    """The prompt's keys and values are the same for every beam of an input: one forward of B rows
    fills the cache, shared out to the W beams (and the greedy row); each step then runs them all.
    Left padding included, the answers are each prompt's own."""
    model = tiny_gpt()
    prompts = torch.randint(2, 40, (2, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(prompts)
    mask[1, :2] = 0  # the second prompt is 4 tokens, left-padded
    shapes = []
    real = model.next_token_logits
    model.next_token_logits = lambda ids, attention_mask, cache: (shapes.append(tuple(ids.shape)),
                                                                 real(ids, attention_mask, cache))[1]
    out = model.generate(prompts, attention_mask=mask, max_new_tokens=6, strategy="beam", num_beams=3,
                         eos_token_id=None)
    assert shapes == [(2, 6)] + [(2 * 4, 1)] * 5  # 3 beams and the greedy row for each prompt
    del model.next_token_logits
    for i, prompt in enumerate((prompts[:1], prompts[1:, 2:])):
        alone = model.generate(prompt, max_new_tokens=6, strategy="beam", num_beams=3, eos_token_id=None)
        assert torch.equal(out[i, -6:], alone[0, -6:])


def test_generation_leaves_training_mode_as_it_was():
    model = tiny_gpt().train()
    model.generate(torch.tensor([[3, 4]]), max_new_tokens=2)
    assert model.training


def beam_scores(model: GPT, prompts: torch.Tensor, out: torch.Tensor, eos: int, length_penalty: float) -> torch.Tensor:
    """(B,) the beam search's own score of each continuation: its log-probability up to and
    including EOS over (that many tokens) ** length_penalty."""
    S = prompts.shape[1]
    with torch.no_grad():
        logp = model(out).logits.float().log_softmax(-1)[:, S - 1 : -1]  # predicts out[:, S:]
    new = out[:, S:]
    token_logp = logp.gather(-1, new[..., None])[..., 0]
    scores = []
    for row, values in zip(new.tolist(), token_logp):
        n = row.index(eos) + 1 if eos in row else len(row)
        scores.append(float(values[:n].sum()) / n**length_penalty)
    return torch.tensor(scores)


@pytest.mark.parametrize("num_beams,length_penalty,early", [(2, 1.0, False), (4, 0.0, False), (3, 0.5, True)])
def test_beam_search_never_scores_below_greedy(num_beams, length_penalty, early):
    # A random model sharpened (weights × 3) so that paths differ; on 100 prompts a width-W
    # beam loses the greedy path on several of them (Hugging Face's search then returns worse).
    model = tiny_gpt()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    prompts = torch.randint(2, 40, (100, 4), generator=torch.Generator().manual_seed(0))
    options = dict(max_new_tokens=10, eos_token_id=1, pad_token_id=0)
    greedy = model.generate(prompts, **options)
    beam = model.generate(prompts, strategy="beam", num_beams=num_beams, length_penalty=length_penalty,
                          early_stopping=early, **options)
    beam_score = beam_scores(model, prompts, beam, 1, length_penalty)
    greedy_score = beam_scores(model, prompts, greedy, 1, length_penalty)
    assert bool((beam_score >= greedy_score - 1e-4).all()), (beam_score - greedy_score).min()
    assert float((beam_score - greedy_score).mean()) > 0.01  # and beam search does find better answers


@pytest.mark.parametrize("name", ["greedy_floor", "early_stopping"])
def test_a_switch_built_directly_must_be_a_bool(name):
    # from_dict checks types; a config built directly must not take "no" (truthy) for True.
    with pytest.raises(TypeError, match=f"GenerationConfig.{name} must be bool, got 'no' \\(str\\)"):
        GenerationConfig(**{name: "no"})


@pytest.mark.parametrize("options", [dict(eos_token_id=40), dict(eos_token_id=-1), dict(pad_token_id=40),
                                     dict(pad_token_id=-1)])
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_special_ids_outside_the_vocabulary_are_refused_before_decoding(options, strategy):
    # A pad id is fed back once a row ends (on a GPU an out-of-range gather is a device-side
    # assert); an EOS id outside the vocabulary would never stop anything.
    from unitok.models import T5, T5Config

    (name, value), = options.items()
    prompt = torch.randint(2, 40, (2, 3))
    with pytest.raises(ValueError, match=rf"{name}={value} is not a token id of the vocabulary \[0, 40\)"):
        tiny_gpt().generate(prompt, max_new_tokens=4, strategy=strategy, **options)
    t5 = T5(T5Config.from_name("t5-tiny", vocab_size=40)).eval()
    with pytest.raises(ValueError, match=rf"{name}={value} is not a token id of the vocabulary \[0, 40\)"):
        t5.generate(prompt, max_new_tokens=4, strategy=strategy, **options)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.bool])
def test_ids_of_a_dtype_the_embedding_cannot_gather_are_named(dtype):
    with pytest.raises(TypeError, match=f"token ids must be integers \\(torch.long or torch.int32\\), got {dtype}"):
        tiny_gpt().generate(torch.ones(1, 3, dtype=dtype), max_new_tokens=2)
    as_long = tiny_gpt().generate(torch.ones(1, 3, dtype=torch.long), max_new_tokens=2)
    assert torch.equal(tiny_gpt().generate(torch.ones(1, 3, dtype=torch.int32), max_new_tokens=2), as_long)


def test_prompts_that_are_not_a_batch_of_ids_on_the_models_device_are_refused():
    from unitok.models import T5, T5Config

    t5 = T5(T5Config.from_name("t5-tiny", vocab_size=40)).eval()
    for model in (tiny_gpt(), t5):
        with pytest.raises(TypeError, match=r"input_ids must be a \(batch, tokens\) tensor of token ids, got list"):
            model.generate([[1, 2, 3]], max_new_tokens=2)
        for strategy in ("greedy", "beam"):
            with pytest.raises(ValueError, match=r"input_ids has no rows \(a batch of 0 prompts\)"):
                model.generate(torch.zeros(0, 3, dtype=torch.long), max_new_tokens=2, strategy=strategy)
        # ids elsewhere than the weights (a CPU prompt for a model on a GPU): named, with the fix
        with pytest.raises(ValueError, match=r"input_ids is on meta but the model is on cpu: move it with .to\('cpu'\)"):
            model.generate(torch.ones(1, 3, dtype=torch.long, device="meta"), max_new_tokens=2)
        with pytest.raises(ValueError, match=r"attention_mask is on meta but the model is on cpu"):
            model.generate(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, device="meta"), max_new_tokens=2)
        cuda_generator = SimpleNamespace(device=torch.device("cuda", 0))  # what torch.Generator("cuda") reports
        with pytest.raises(ValueError, match=r"the generator is on cuda:0 but the model is on cpu: make it with "
                                             r"torch.Generator\('cpu'\)"):
            model.generate(torch.ones(1, 3, dtype=torch.long), max_new_tokens=2, strategy="sample",
                           generator=cuda_generator)


def test_t5_refuses_a_source_row_that_is_all_padding_as_gpt_refuses_an_empty_prompt():
    from unitok.models import T5, T5Config

    t5 = T5(T5Config.from_name("t5-tiny", vocab_size=40)).eval()
    ids = torch.randint(2, 40, (2, 5))
    mask = torch.ones_like(ids)
    mask[1] = 0
    with pytest.raises(ValueError, match=r"source row\(s\) \[1\] are empty \(all padding\)"):
        t5.generate(ids, mask, max_new_tokens=3)
    mask[1, 0] = 1
    assert t5.generate(ids, mask, max_new_tokens=3).shape == (2, 4)


def test_numpy_ids_and_masks_of_the_wrong_type_are_judged_by_what_they_are():
    import numpy as np

    model = GPT(GPTConfig.from_name("gpt-nano", vocab_size=97, context_length=32)).eval()
    ids = torch.randint(3, 97, (1, 4))
    expected = model.generate(ids, max_new_tokens=3, eos_token_id=2, pad_token_id=0)
    # a numpy integer is a token id: not "outside the vocabulary"
    assert model.generate(ids, max_new_tokens=3, eos_token_id=np.int64(2), pad_token_id=np.int64(0)).tolist() == \
        expected.tolist()
    for mask in ([[1, 1, 1, 1]], np.ones((1, 4), dtype=np.int64)):
        with pytest.raises(TypeError, match=f"attention_mask must be a \\(batch, tokens\\) tensor of 1s and 0s, got "
                                            f"{type(mask).__name__}"):
            model.generate(ids, attention_mask=mask, max_new_tokens=3)
    for bad in (-1, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="top_k"):
            model.generate(ids, max_new_tokens=3, strategy="sample", top_k=bad)



@pytest.mark.parametrize("compile_", [False, True])
@pytest.mark.parametrize("mask", [[[0.0, -1e4, 0.0], [0.0, 0.0, 0.0]], [[0, 2, 2], [1, 1, 1]]],
                         ids=["additive", "two"])
def test_a_prompt_mask_of_other_values_than_1_and_0_is_refused_on_every_path(mask, compile_):
    # the compiled path's static cache reads the mask itself: it must not take 2 or -10000 for "real"
    model = tiny_gpt()
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(ValueError, match=r"attention_mask holds \[.*\]: expected 1 for a real token and 0 for padding"):
        model.generate(ids, attention_mask=torch.tensor(mask), max_new_tokens=2, compile=compile_)


def test_a_decoding_step_does_not_judge_the_prompts_mask_again(monkeypatch):
    # the prompt pass checks the padding mask's values; each later step reads it once, for the kernel
    import unitok.backbone as backbone

    calls = []
    judge = backbone.check_padding_mask
    monkeypatch.setattr(backbone, "check_padding_mask", lambda *a, **k: calls.append(1) or judge(*a, **k))
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    tiny_gpt().generate(ids, attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]), max_new_tokens=6,
                        eos_token_id=None)
    assert len(calls) == 1  # the prompt's pass only, not one a token
