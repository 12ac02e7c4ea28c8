"""Decoding strategies: filters, EOS, seeds, beams — on hand-built tables and a tiny GPT."""

from __future__ import annotations

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


def test_generation_leaves_training_mode_as_it_was():
    model = tiny_gpt().train()
    model.generate(torch.tensor([[3, 4]]), max_new_tokens=2)
    assert model.training
