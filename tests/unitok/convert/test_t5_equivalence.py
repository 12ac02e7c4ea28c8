"""from_transformers for T5: random Hugging Face T5 (v1.0: ReLU, tied head with the d^-0.5
rescale; v1.1: gated-GELU, untied head; noise on every weight, so each norm matters) gives the
same encoder states and decoder logits, with padding, and the same greedy and beam-search outputs
as Hugging Face's ``generate``."""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config as HFT5Config
from transformers import T5EncoderModel, T5ForConditionalGeneration

from tests.unitok.convert.perturb import perturbed
from unitok.convert import from_transformers
from unitok.models import T5, T5Encoder

VARIANTS = {"v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
            "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)}


def hf_t5(variant: str, **overrides) -> T5ForConditionalGeneration:
    options = dict(vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
                   decoder_start_token_id=0, **VARIANTS[variant])
    options.update(overrides)
    model = T5ForConditionalGeneration(HFT5Config(**options)).eval()
    if variant == "v1.1":
        # transformers 5 ties the head even for v1.1 (keeping only the no-rescale part); released
        # v1.1 checkpoints have their own head, so give this one its own weights.
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.05)
    return model


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 99, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:], mask[2, 4:] = 0, 0  # right padding, as T5 tokenizers pad
    return ids, mask


def until_eos(rows: torch.Tensor, eos: int = 1) -> list[list[int]]:
    """Each row up to and including its first EOS (what both libraries generated)."""
    out = []
    for row in rows.tolist():
        out.append(row[: row.index(eos, 1) + 1] if eos in row[1:] else row)
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_encoder_states_and_decoder_logits_match_with_padding(variant):
    torch.manual_seed(0)
    hf = perturbed(hf_t5(variant, num_decoder_layers=3))  # unequal depths are allowed
    ours = from_transformers(hf)
    assert isinstance(ours, T5) and ours.config.tie_embeddings == ours.config.scales_output == (variant == "v1.0")
    ids, mask = batch()
    targets = torch.randint(2, 99, (3, 6))
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=targets)
        got = ours(ids, mask, decoder_input_ids=targets)
    real = mask.bool()
    torch.testing.assert_close(got.encoder_last_hidden_state[real], expected.encoder_last_hidden_state[real],
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # labels path: HF shifts them right the same way
        labels = targets.masked_fill(targets > 90, -100)
        torch.testing.assert_close(ours(ids, mask, labels=labels).logits,
                                   hf(input_ids=ids, attention_mask=mask, labels=labels).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_and_beam_search_match_hugging_face_generate(variant):
    torch.manual_seed(1)
    hf = perturbed(hf_t5(variant))
    ours = from_transformers(hf)
    ids, mask = batch()
    greedy_hf = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, num_beams=1)
    greedy = ours.generate(ids, mask, max_new_tokens=8)
    assert greedy.tolist() == greedy_hf.tolist()
    for options in (dict(num_beams=3, length_penalty=0.7), dict(num_beams=4, length_penalty=1.5, early_stopping=True)):
        beam_hf = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, **options)
        beam = ours.generate(ids, mask, max_new_tokens=8, strategy="beam", **options)
        # Hugging Face fills finished beams with EOS when pad_token_id is 0 (`pad or eos`); we use pad.
        assert until_eos(beam) == until_eos(beam_hf)
        assert beam.shape == beam_hf.shape
        plain = ours.generate(ids, mask, max_new_tokens=8, strategy="beam", greedy_floor=False, **options)
        assert until_eos(plain) == until_eos(beam_hf)  # Hugging Face's search, W rows


def test_an_eos_hit_ends_beams_like_hugging_face():
    torch.manual_seed(0)
    hf = perturbed(hf_t5("v1.0"))
    with torch.no_grad():  # make EOS (id 1) likely so hypotheses finish at different lengths
        hf.shared.weight[1] *= 3.0
    ours = from_transformers(hf)
    ids, mask = batch()
    beam_hf = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, num_beams=3, do_sample=False)
    beam = ours.generate(ids, mask, max_new_tokens=10, strategy="beam", num_beams=3)
    assert until_eos(beam) == until_eos(beam_hf)
    assert any(1 in row[1:] for row in beam.tolist())


def test_encoder_model_matches():
    torch.manual_seed(0)
    hf = perturbed(T5EncoderModel(HFT5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                             dropout_rate=0.0, feed_forward_proj="gated-gelu")))
    ours = from_transformers(hf)
    assert isinstance(ours, T5Encoder)
    ids, mask = batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=1e-5)
