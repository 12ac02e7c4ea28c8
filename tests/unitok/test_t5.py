"""The unitok T5: KV-cached decoding equals the full decoder, cross-attention keys/values are
computed once, relative buckets equal T5's, checkpoints round-trip, bad input is refused."""

from __future__ import annotations

import pytest
import torch

from unitok.backbone import Backbone, BackboneConfig
from unitok.embed import relative_position_bucket
from unitok.models import GPT, T5, GPTConfig, T5Config


def tiny(**overrides) -> T5:
    config = T5Config.from_name("t5-tiny", vocab_size=50, dropout=0.0, relative_buckets=8,
                                relative_max_distance=16, **overrides)
    return T5(config).eval()


def test_cached_decoding_step_by_step_equals_the_full_decoder():
    model = tiny(gated=True, activation="gelu_tanh", tie_embeddings=False)
    src = torch.randint(2, 50, (2, 9))
    mask = torch.ones_like(src)
    mask[1, 6:] = 0
    tgt = torch.randint(2, 50, (2, 7))
    with torch.no_grad():
        full = model(src, mask, decoder_input_ids=tgt).logits
        memory = model.encode(src, mask).last_hidden_state
        cache = model.decoder.new_cache(0)
        steps = [model.decode(tgt[:, i : i + 1], memory, mask, cache=cache)[0] for i in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert set(cache.cross) == {0, 1}  # one cross-attention entry per decoder layer, computed on step one


def test_relative_buckets_equal_t5s_function():
    from transformers.models.t5.modeling_t5 import T5Attention

    offsets = torch.arange(-300, 300)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 16)):
            ours = relative_position_bucket(offsets, bidirectional, buckets, distance)
            theirs = T5Attention._relative_position_bucket(offsets, bidirectional, buckets, distance)
            assert torch.equal(ours, theirs)


def test_shift_right_and_labels():
    model = tiny()
    labels = torch.tensor([[5, 6, 1, -100]])
    assert model.shift_right(labels).tolist() == [[0, 5, 6, 1]]
    torch.testing.assert_close(model(torch.tensor([[3, 4, 1]]), labels=labels).logits,
                               model(torch.tensor([[3, 4, 1]]), decoder_input_ids=torch.tensor([[0, 5, 6, 1]])).logits)


def test_generation_starts_from_the_start_token_and_pads_after_eos():
    model = tiny(tie_embeddings=False)  # (tied, this random model would keep choosing the start token, 0 = pad)
    with torch.no_grad():
        model.lm_head.weight[1] *= 1.5  # EOS (id 1) likely enough that one row of three ends early
    source = torch.randint(2, 50, (3, 5))
    out = model.generate(source, max_new_tokens=6, strategy="beam", num_beams=2).tolist()
    assert [row[0] for row in out] == [0, 0, 0] and len(out[0]) == 7  # two rows run the whole 6 tokens
    ended = [i for i, row in enumerate(out) if 1 in row[1:]]
    assert len(ended) == 1
    row = out[ended[0]]
    end = row.index(1, 1)
    assert end < 6 and row[end + 1:] == [0] * (6 - end)  # that row padded after its EOS
    unended = model.generate(source, max_new_tokens=6, strategy="beam", num_beams=2, eos_token_id=None)
    assert (unended[ended[0], end + 1:] != 0).all()  # where, not stopped, it goes on
    sampled = model.generate(torch.randint(2, 50, (2, 5)), max_new_tokens=4, strategy="sample", top_k=5,
                             generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (2, 5)


def test_save_and_load_round_trip(tmp_path):
    for tie in (True, False):
        model = tiny(tie_embeddings=tie)
        model.save_pretrained(tmp_path / str(tie))
        loaded = T5.from_pretrained(tmp_path / str(tie)).eval()
        src, tgt = torch.randint(2, 50, (2, 6)), torch.randint(2, 50, (2, 4))
        torch.testing.assert_close(loaded(src, decoder_input_ids=tgt).logits, model(src, decoder_input_ids=tgt).logits)
    GPT(GPTConfig.from_name("gpt-nano")).save_pretrained(tmp_path / "gpt")
    with pytest.raises(ValueError, match="GPT checkpoint, not a T5"):
        T5.from_pretrained(tmp_path / "gpt")


def test_v1_1_shapes_allow_heads_times_width_unequal_to_d_model():
    config = T5Config.from_name("t5-v1_1-small")
    assert config.n_heads * config.d_kv != config.d_model and config.gated and not config.tie_embeddings
    model = T5(config.replace(n_layers=1, vocab_size=100, d_ff=64))
    assert model.decoder.blocks[0].sublayers["attn"].qkv.out_features == 3 * 6 * 64


def test_bad_input_is_refused():
    model = tiny(max_decoder_length=8)
    src = torch.randint(2, 50, (1, 4))
    with pytest.raises(ValueError, match="target has 9 tokens, more than max_decoder_length=8"):
        model(src, decoder_input_ids=torch.randint(2, 50, (1, 9)))
    with pytest.raises(ValueError, match="exceeds max_decoder_length=8"):
        model.generate(src, max_new_tokens=8)
    with pytest.raises(ValueError, match="decoder_input_ids or labels"):
        model(src)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[3, 60]]), decoder_input_ids=torch.tensor([[0]]))
    with pytest.raises(ValueError, match="eos_token_id=60 is outside"):
        T5Config.from_name("t5-tiny", vocab_size=50, eos_token_id=60)
    backbone = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2, block=("attn", "cross_attn", "mlp")))
    with pytest.raises(ValueError, match="needs encoder states"):
        backbone(torch.randn(1, 3, 16))


@pytest.mark.parametrize("kernel", ["sdpa", "reference"])
def test_an_empty_source_is_refused_by_the_forward_and_decode_as_by_generate(kernel):
    # Its decoder rows would attend to no encoder state: NaN (reference kernel, bf16) or a number
    # Hugging Face does not compute (fp32 SDPA), depending on the kernel.
    model = tiny()
    src = torch.randint(2, 50, (3, 6))
    mask = torch.ones_like(src)
    mask[1] = 0
    mask[2, 3:] = 0
    empty = r"source row\(s\) \[1\] are empty \(all padding"
    with pytest.raises(ValueError, match=empty):
        model(src, mask, decoder_input_ids=torch.randint(2, 50, (3, 4)), kernel=kernel)
    with pytest.raises(ValueError, match=empty):
        model.decode(torch.randint(2, 50, (3, 1)), model.encode(src, mask).last_hidden_state, mask, kernel=kernel)
    with pytest.raises(ValueError, match=empty):
        model.generate(src, mask, max_new_tokens=2)
    mask[1, 0] = 1  # one real token is enough
    assert torch.isfinite(model(src, mask, decoder_input_ids=torch.randint(2, 50, (3, 4)), kernel=kernel).logits).all()


def test_labels_without_a_batch_axis_are_refused_naming_their_shape():
    with pytest.raises(ValueError, match=r"labels must be \(batch, tokens\) target ids, got \(3,\); one example's "
                                         r"targets need a batch axis"):
        tiny()(torch.tensor([[3, 4, 1]]), labels=torch.tensor([7, 8, 1]))


def test_a_speech_t5_names_the_utterances_too_short_for_subsampling():
    config = T5Config.from_name("t5-speech-tiny", n_mels=16, vocab_size=12, d_model=32, d_kv=8, n_layers=1,
                                n_decoder_layers=1, d_ff=64)
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, 5:] = 0
    with pytest.raises(ValueError, match=r"rows \[1\] have \[5\] frames, too short for the ×4 subsampling"):
        T5(config).encode(torch.randn(3, 20, 16), mask)


def test_a_speech_t5_refuses_a_frame_mask_of_other_values_or_shape():
    # the mask's sum is each utterance's frame count: a 0/2 mask would double it
    config = T5Config.from_name("t5-speech-tiny", n_mels=16, vocab_size=12, d_model=32, d_kv=8, n_layers=1,
                                n_decoder_layers=1, d_ff=64)
    model = T5(config)
    with pytest.raises(ValueError, match=r"attention_mask holds \[2\]: expected 1 for a real token and 0 for padding"):
        model.encode(torch.randn(2, 20, 16), torch.tensor([[1] * 20, [2] * 10 + [0] * 10]))
    with pytest.raises(ValueError, match=r"attention_mask must be \(2, 20\) \(batch, keys\), got \(2, 19\)"):
        model.encode(torch.randn(2, 20, 16), torch.ones(2, 19, dtype=torch.long))


def test_whisper_style_t5_reads_spectrogram_frames_and_learns_to_transcribe():
    torch.manual_seed(0)
    config = T5Config.from_name("t5-speech-tiny", n_mels=16, vocab_size=12, d_model=32, d_kv=8, n_layers=2,
                                n_decoder_layers=1, d_ff=64, dropout=0.0)
    model = T5(config)
    frames = torch.randn(4, 40, 16)
    mask = torch.ones(4, 40, dtype=torch.long)
    mask[3, 30:] = 0  # a shorter utterance in the batch
    targets = torch.tensor([[3, 4, 5, 1], [6, 7, 1, 0], [8, 1, 0, 0], [9, 10, 11, 1]])
    labels = targets.masked_fill(targets == 0, -100)
    enc = model.encode(frames, mask)
    assert enc.last_hidden_state.shape == (4, 9, 32) and enc.attention_mask[3].sum() == 6  # ×4 subsampled
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        logits = model(frames, mask, labels=labels).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05
    out = model.generate(frames, mask, max_new_tokens=5)
    assert out[:, 1:5].tolist() == targets.tolist()  # each utterance's own transcript
    with pytest.raises(ValueError, match="reads spectrogram frames"):
        model.encode(torch.randint(0, 12, (1, 40)))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_the_cached_bucket_table_gives_the_buckets_of_every_offset(bidirectional):
    """A decoder asks for one query row per token; the cached (query, key) table must give what
    computing the buckets from scratch gives, for every offset, and grow past its first size."""
    from unitok.embed.relative import RelativePositionBias, relative_position_bucket

    bias = RelativePositionBias(n_heads=2, num_buckets=8, max_distance=20, bidirectional=bidirectional)
    for n_queries, n_keys, offset in ((5, 5, 0), (1, 7, 6), (1, 100, 99), (3, 130, 127), (30, 40, 0)):
        queries = torch.arange(offset, offset + n_queries)[:, None]
        expected = relative_position_bucket(torch.arange(n_keys)[None, :] - queries, bidirectional, 8, 20)
        assert torch.equal(bias.buckets(n_queries, n_keys, offset), expected)
    assert bias._table is not None and bias._table.shape[0] >= 130


def test_buckets_first_built_under_inference_mode_serve_training():
    """Validation (inference_mode) may build the table first; training must still backprop."""
    from unitok.embed.relative import RelativePositionBias

    bias = RelativePositionBias(n_heads=2, num_buckets=8, max_distance=20)
    with torch.inference_mode():
        bias(4, 4)
    bias(4, 4).sum().backward()
    assert bias.weight.grad is not None and bias.weight.grad.abs().sum() > 0
