"""GPT on the shared backbone: causality, padding, KV cache, kernels, checkpoints, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from unitok.models import GPT, CheckpointMismatchError, GPTConfig


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    options = dict(vocab_size=50, context_length=32, d_model=32, n_layers=2, n_heads=4, eos_token_id=1)
    return GPT(GPTConfig(**{**options, **overrides})).eval()


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_changing_token_t_never_changes_logits_before_t(positions):
    model = tiny(positions=positions)
    ids = torch.randint(2, 50, (1, 12))
    changed = ids.clone()
    changed[0, 7] = (ids[0, 7] + 1) % 50
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=0, rtol=0)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_left_padded_batch_equals_unpadded_single_sequences():
    model = tiny()
    rows = [torch.randint(2, 50, (n,)) for n in (9, 4, 6)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    with torch.no_grad():
        batch = model(ids, attention_mask=mask).logits
        for i, r in enumerate(rows):
            single = model(r[None]).logits[0]
            torch.testing.assert_close(batch[i, width - len(r):], single, atol=1e-5, rtol=0)


def test_kv_cache_decoding_equals_full_forward():
    model = tiny()
    ids = torch.randint(2, 50, (2, 14))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        first = model(ids[:, :5], cache=cache).logits
        steps = [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 14)]
    incremental = torch.cat([first, *steps], dim=1)
    torch.testing.assert_close(incremental, full, atol=1e-5, rtol=0)
    assert cache.seq_len == 14


def test_kv_cache_with_left_padding_equals_full_forward():
    model = tiny()
    ids = torch.randint(2, 50, (2, 10))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        cache = model.new_cache()
        head = model(ids[:, :6], attention_mask=mask[:, :6], cache=cache).logits
        tail = [model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=cache).logits for t in range(6, 10)]
    got = torch.cat([head, *tail], dim=1)
    torch.testing.assert_close(got[mask.bool()], full[mask.bool()], atol=1e-5, rtol=0)


def test_sdpa_path_equals_reference_path_and_attention_maps_are_returned():
    model = tiny()
    ids = torch.randint(2, 50, (2, 11))
    with torch.no_grad():
        fused = model(ids).logits
        ref = model(ids, kernel="reference", output_attentions=True)
    torch.testing.assert_close(fused, ref.logits, atol=1e-5, rtol=0)
    assert len(ref.attentions) == 2 and ref.attentions[0].shape == (2, 4, 11, 11)
    weights = ref.attentions[1][0, 0]
    torch.testing.assert_close(weights.sum(-1), torch.ones(11))
    assert torch.triu(weights, diagonal=1).abs().max() == 0  # causal: nothing above the diagonal


def test_tokens_batch_input_equals_plain_tensors():
    from tokenizers_mm import collate

    model = tiny()
    batch = collate([[3, 4, 5], [6, 7]], pad_id=0, padding_side="left")
    with torch.no_grad():
        a = model(batch).logits
        b = model(batch.ids, attention_mask=batch.attention_mask).logits
    torch.testing.assert_close(a, b)


def test_lm_head_is_tied_to_the_token_embedding():
    model = tiny()
    assert model.lm_head.weight is model.tok_embed.weight
    untied = tiny(tie_embeddings=False)
    assert untied.lm_head.weight is not untied.tok_embed.weight


@pytest.mark.parametrize("tie", [True, False])
def test_save_load_round_trip_is_exact(tmp_path, tie):
    model = tiny(tie_embeddings=tie)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["family"] == "GPT"
    loaded = GPT.from_pretrained(tmp_path)
    assert loaded.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    ids = torch.randint(2, 50, (1, 8))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded.eval()(ids).logits)
    if tie:
        assert loaded.lm_head.weight is loaded.tok_embed.weight


def test_mismatched_checkpoint_lists_every_bad_key(tmp_path):
    tiny().save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state.pop("backbone.norm.bias")
    state["extra.weight"] = torch.zeros(2)
    state["pos_embed.weight"] = torch.zeros(7, 32)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointMismatchError) as info:
        GPT.from_pretrained(tmp_path)
    message = str(info.value)
    assert "missing keys: backbone.norm.bias" in message
    assert "unexpected keys: extra.weight" in message
    assert "pos_embed.weight (checkpoint (7, 32), model (32, 32))" in message


def test_loading_the_wrong_family_or_a_missing_folder_is_named(tmp_path):
    tiny().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "family": "BERT"}))
    with pytest.raises(ValueError, match="holds a BERT checkpoint"):
        GPT.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPT.from_pretrained(tmp_path / "nowhere")


def test_presets_are_data():
    small = GPTConfig.from_name("gpt2-small")
    assert (small.d_model, small.n_layers, small.n_heads, small.vocab_size) == (768, 12, 12, 50257)
    assert GPTConfig.from_name("gpt2-xl").d_model == 1600
    assert GPTConfig.from_name("gpt-nano", vocab_size=300).vocab_size == 300
    assert GPTConfig.from_dict(small.to_dict()) == small
    assert sum(p.numel() for p in GPT(GPTConfig.from_name("gpt-nano")).parameters()) > 0


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda m: m(torch.tensor([[3, 50]])), ValueError, r"token ids \[50\] are outside the vocabulary \[0, 50\)"),
        (lambda m: m(torch.randint(0, 50, (1, 33))), ValueError, "longer than the context length 32"),
        (lambda m: m(torch.zeros(1, 0, dtype=torch.long)), ValueError, "empty"),
        (lambda m: m(torch.zeros(4, dtype=torch.long)), ValueError, r"\(batch, tokens\)"),
        (lambda m: m.generate(torch.zeros(1, 0, dtype=torch.long)), ValueError, "empty prompt"),
        (lambda m: m.generate(torch.ones(1, 30, dtype=torch.long), max_new_tokens=5), ValueError,
         "exceeds the context length 32"),
        (lambda m: m.generate(torch.ones(1, 3, dtype=torch.long), strategy="nucleus"), ValueError, "unknown strategy"),
        (lambda m: m.generate(torch.ones(1, 3, dtype=torch.long), num_beam=2), ValueError, "did you mean 'num_beams'"),
        (lambda m: m.generate(torch.ones(1, 3, dtype=torch.long), strategy="sample", top_p=1.5), ValueError, "top_p"),
        (lambda m: m.generate(torch.ones(1, 3, dtype=torch.long), strategy="beam", greedy_floor="no"), TypeError,
         "greedy_floor must be bool, got 'no'"),
        (lambda m: m.generate(torch.ones(3, 4, dtype=torch.long), attention_mask=torch.tensor(
            [[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 1]]), max_new_tokens=2), ValueError, r"needs left padding: .* in row\(s\) \[1\]"),
        (lambda m: m.generate(torch.ones(3, 4, dtype=torch.long), attention_mask=torch.tensor(
            [[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]]), max_new_tokens=2, strategy="beam"), ValueError,
         r"prompt row\(s\) \[1, 2\] are empty \(all padding\)"),
        (lambda m: m(torch.ones(1, 3, dtype=torch.long), position_ids=torch.tensor([[0, 1, 32]])), ValueError,
         r"position ids \[32\] are outside 0..31 \(the model's positions\)"),
        (lambda m: m(torch.ones(1, 3, dtype=torch.long), position_ids=torch.tensor([[-1, 0, 1]])), ValueError,
         r"position ids \[-1\] are outside 0..31"),
        (lambda m: m(torch.ones(1, 3, dtype=torch.long), position_ids=torch.tensor([[0.0, 1.0, 2.0]])), TypeError,
         "position ids must be integers"),
        (lambda m: m(torch.ones(2, 1, dtype=torch.long), position_ids=torch.arange(5).expand(2, 5)), ValueError,
         r"position_ids must be \(2\|1, 1\), one per new token, got \(2, 5\)"),
        (lambda m: m(torch.ones(2, 3, dtype=torch.long), attention_mask=torch.tensor([[0.0, 0.0, 0.0], [-1e4, 0.0, 0.0]])),
         ValueError, r"attention_mask holds \[-10000.0\]: expected 1 for a real token and 0 for padding"),
        (lambda m: m(torch.ones(2, 3, dtype=torch.long), attention_mask=torch.tensor([[2, 2, 2], [0, 2, 2]])),
         ValueError, r"attention_mask holds \[2\]"),  # not positions counted twice as fast
        (lambda m: m(torch.ones(2, 20, dtype=torch.long), attention_mask=torch.full((2, 20), 2)),
         ValueError, r"attention_mask holds \[2\]"),  # counted twice as fast they would pass the table's end
        (lambda m: m(torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(1, 3)), ValueError,
         r"attention_mask must be \(batch, cached \+ new\) = \(2, 3\)"),
    ],
    ids=["id>=vocab", "too-long", "empty", "1-d", "empty-prompt", "prompt+new>context", "strategy", "typo", "top_p",
         "greedy_floor", "right-padded", "all-padding-row", "position>=context", "negative-position",
         "float-positions", "positions-for-other-tokens", "additive-mask", "mask-of-2", "mask-of-2-past-context",
         "mask-of-one-row"],
)
def test_bad_input_raises_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call(tiny())


def test_a_cached_step_with_positions_for_more_tokens_is_refused_before_the_cache_grows():
    model = tiny()
    prompt = torch.randint(2, 50, (2, 4))
    cache = model(prompt, use_cache=True).cache
    with pytest.raises(ValueError, match=r"position_ids must be \(2\|1, 1\)"):
        model(torch.randint(2, 50, (2, 1)), position_ids=torch.arange(5).expand(2, 5), cache=cache)
    assert cache.seq_len == 4  # not 5 positions appended for one token
    step = torch.tensor([[7], [9]])
    shared = model(step, position_ids=torch.tensor([[4]]), cache=cache).logits  # (1, N): every row's
    per_row = model(step, position_ids=torch.tensor([[4], [4]]), cache=model(prompt, use_cache=True).cache).logits
    torch.testing.assert_close(shared, per_row, rtol=0, atol=0)


def test_position_ids_are_checked_as_token_ids_are_deferred_on_a_gpu(monkeypatch):
    import unitok.checks as checks

    model = tiny()
    ids, positions = torch.tensor([[3, 4, 5]]), torch.tensor([[0, 2, 1]])
    expected = model(ids, position_ids=positions).logits
    monkeypatch.setattr(checks, "_DEFERRING_DEVICES", frozenset({"cpu", "cuda"}))  # CPU tensors defer as CUDA ones
    torch.testing.assert_close(model(ids, position_ids=positions).logits, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"position ids \[40\] are outside 0..31"):
        model(ids, position_ids=torch.tensor([[0, 1, 40]]))  # the gather read 31 meanwhile, not past the table


def test_a_decode_step_checks_the_prompts_positions_when_it_checks_its_ids():
    from unitok.layers import StaticKVCache

    model = tiny()
    cache = StaticKVCache(model.config.n_layers, 8)
    cache.index = torch.arange(2)
    mask = torch.ones(1, 1, 2, 8, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"position ids \[32\] are outside 0..31"):
        model.decode_step(torch.tensor([[3, 4]]), torch.tensor([[31, 32]]), mask, cache, check=True)


def test_config_typos_and_unknown_presets_are_named():
    with pytest.raises(ValueError, match="unknown GPTConfig preset 'gpt2-smal' \\(did you mean 'gpt2-small'\\?\\)"):
        GPTConfig.from_name("gpt2-smal")
    with pytest.raises(ValueError, match="unknown GPTConfig key\\(s\\): 'n_layer' \\(did you mean 'n_layers'\\?\\)"):
        GPTConfig.from_dict({"n_layer": 2})
    with pytest.raises(ValueError, match="eos_token_id=99 is outside"):
        GPTConfig(vocab_size=50, eos_token_id=99)


# ------------------------------------------------------------------ GPT-1's classifier
def test_the_classifier_reads_each_rows_last_real_token():
    torch.manual_seed(0)
    model = GPT.for_sequence_classification(tiny(), num_labels=3).eval()
    ids = torch.randint(2, 50, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # row 1: five real tokens, then padding
    out = model(ids, attention_mask=mask)
    assert out.class_logits.shape == (2, 3) and out.logits.shape == (2, 9, 50)
    torch.testing.assert_close(out.class_logits[1], model(ids[1:, :5]).class_logits[0])
    padded_otherwise = ids.clone()
    padded_otherwise[1, 5:] = 7
    torch.testing.assert_close(model(padded_otherwise, attention_mask=mask).class_logits, out.class_logits)
    cut_earlier = mask.clone()
    cut_earlier[1, 4] = 0
    assert not torch.allclose(model(ids, attention_mask=cut_earlier).class_logits[1], out.class_logits[1])
    assert tiny()(ids).class_logits is None  # no classifier, no class scores
    scores_only = model(ids, attention_mask=mask, return_logits=False)  # how the task and pipeline call it
    assert scores_only.logits is None and torch.equal(scores_only.class_logits, out.class_logits)


def test_a_classifier_on_a_pretrained_body_keeps_its_weights_and_round_trips(tmp_path):
    torch.manual_seed(0)
    body = tiny().eval()
    model = GPT.for_sequence_classification(body, num_labels=4, dropout=0.0)
    assert not model.training  # the mode of its body: a loaded (eval) body gives an eval model
    assert GPT.for_sequence_classification(tiny().train(), num_labels=4).training
    assert body.classifier is None and model.config.num_labels == 4 and model.config.dropout == 0.0
    assert model.lm_head.weight is model.tok_embed.weight  # the LM head stays (GPT-1's auxiliary loss)
    ids = torch.randint(2, 50, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, body(ids).logits)
        model.save_pretrained(tmp_path)
        loaded = GPT.from_pretrained(tmp_path)
        torch.testing.assert_close(loaded(ids).class_logits, model(ids).class_logits)
    with pytest.raises(ValueError, match=r"num_labels must be an integer ≥ 1, got 0"):
        GPT.for_sequence_classification(body, num_labels=0)
    with pytest.raises(ValueError, match="num_labels must be an int ≥ 0"):
        GPTConfig(num_labels=-1)
