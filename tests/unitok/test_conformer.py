"""ConformerCTC: ×4 subsampling and its lengths, padding that cannot leak into real frames,
checkpoints that keep the vocabulary and spectrogram settings, clear errors for bad frames."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tokenizers_mm import SpectrogramConfig, Tokens
from unitok.backbone import Backbone, BackboneConfig
from unitok.embed.frames import subsampled_length
from unitok.layers.attention import AttentionContext
from unitok.layers.conv_module import ConvModule
from unitok.models import ConformerConfig, ConformerCTC


def tiny(**overrides) -> ConformerCTC:
    options = dict(n_mels=16, d_model=32, n_layers=2, dropout=0.0, vocabulary=tuple("ab "), spectrogram={"n_mels": 16})
    config = ConformerConfig.from_name("conformer-digits", **{**options, **overrides})
    return ConformerCTC(config).eval()


def test_subsampling_shortens_four_times_and_reports_lengths():
    model = tiny()
    out = model(torch.randn(2, 101, 16), torch.tensor([101, 57]))
    assert out.logits.shape == (2, 24, 4)  # V = blank + 3 characters
    assert out.lengths.tolist() == subsampled_length(torch.tensor([101, 57])).tolist() == [24, 13]


def test_padding_content_does_not_change_real_frames():
    model = tiny()
    frames = torch.randn(2, 60, 16)
    lengths = torch.tensor([60, 31])
    other = frames.clone()
    other[1, 31:] = torch.randn(29, 16) * 10  # different padding
    a, b = model(frames, lengths), model(other, lengths)
    n = int(a.lengths[1])
    # Valid output frames of the unpadded ×4 convolutions read only real input frames; after that
    # the blocks mask padding (attention keys and the convolution module's input).
    torch.testing.assert_close(a.logits[1, :n], b.logits[1, :n])
    torch.testing.assert_close(a.logits[0], b.logits[0])


def channels_first(module: ConvModule, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """The convolution module as the paper draws it: Conv1d layers over (B, C, N)."""
    h = F.glu(module.pointwise_in(x.transpose(1, 2)), dim=1)
    h = h.masked_fill(~padding[:, None, :], 0.0)
    return module.pointwise_out(F.silu(module.conv_norm(module.depthwise(h)))).transpose(1, 2)


@pytest.mark.parametrize("norm", ["batchnorm", "groupnorm"])
def test_convolution_module_runs_channels_last_as_the_channels_first_convs(norm):
    # ConvModule keeps frames (B, N, C) throughout (Linear pointwise convs, a channels-last
    # depthwise conv); in training mode its outputs, gradients and BatchNorm statistics are the
    # Conv1d formulation's.
    torch.manual_seed(0)
    module = ConvModule(32, kernel_size=7, norm=norm).train()
    reference = copy.deepcopy(module)
    x = torch.randn(3, 20, 32)
    padding = torch.arange(20)[None, :] < torch.tensor([20, 13, 5])[:, None]
    ours_x, ref_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = module(ours_x, padding), channels_first(reference, ref_x, padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(ours_x.grad, ref_x.grad, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(module.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-5, msg=name)
    for (name, b), c in zip(module.named_buffers(), reference.buffers(), strict=True):
        torch.testing.assert_close(b, c, msg=name)


def test_the_convolution_sublayer_output_is_dropped_once_in_training():
    # torchaudio's convolution module ends in a dropout and its layer adds the result; the Block
    # drops each sublayer's output, so the module itself must not drop it again (p → 1 - (1-p)²)
    torch.manual_seed(0)
    config = BackboneConfig(d_model=32, n_layers=1, n_heads=2, block=("conv",), causal=False, dropout=0.5,
                            conv_kernel_size=3, conv_norm="groupnorm")
    block = Backbone(config).blocks[0].train()
    x = torch.randn(4, 64, 32)
    branch = block(x, AttentionContext()) - x  # pre-norm: x + drop(conv(norm(x)))
    dropped = (branch.abs() < 1e-7).float().mean().item()
    assert abs(dropped - 0.5) < 0.05, dropped  # twice would be 0.75


def test_block_is_the_one_backbone_with_conformer_sublayers():
    block = tiny().backbone.blocks[0]
    assert list(block.sublayers) == ["half_mlp0", "attn", "conv", "half_mlp3"] and block.norm is not None
    first = tiny(convolution_first=True).backbone.blocks[0]
    assert list(first.sublayers) == ["half_mlp0", "conv", "attn", "half_mlp3"]


def test_checkpoint_keeps_vocabulary_and_spectrogram_settings(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path)
    loaded = ConformerCTC.from_pretrained(tmp_path).eval()
    assert loaded.config.vocabulary == ("a", "b", " ") and loaded.config.spectrogram == SpectrogramConfig(n_mels=16).to_dict()
    frames = torch.randn(1, 40, 16)
    torch.testing.assert_close(loaded(frames).logits, model(frames).logits)


def test_a_config_with_global_statistics_equals_itself_read_back(tmp_path):
    # the statistics are tuples as given, lists after JSON: stored whole, as SpectrogramConfig gives them
    stats = {"normalize": "global", "global_mean": (0.5,) * 16, "global_std": (2.0,) * 16}
    model = tiny(spectrogram=stats)
    assert model.config.spectrogram == SpectrogramConfig(n_mels=16, **stats).to_dict()
    model.save_pretrained(tmp_path)
    loaded = ConformerCTC.from_pretrained(tmp_path)
    assert loaded.config == model.config
    assert loaded.processor.audio == SpectrogramConfig(n_mels=16, **stats)
    # given in part: the rest are SpectrogramConfig's defaults at this n_mels; none given stays empty
    assert tiny(spectrogram={"normalize": "speech"}).config.spectrogram == SpectrogramConfig(n_mels=16, normalize="speech").to_dict()
    assert tiny(spectrogram={}).config.spectrogram == {}
    with pytest.raises(ValueError, match="spectrogram n_mels=80 differs from n_mels=16"):
        tiny(spectrogram={"n_mels": 80})


def test_utterances_too_short_for_subsampling_are_named_with_their_frame_counts():
    # 25–60 ms clips pass the tokenizer and a manifest; the model names the rows it cannot read
    model = tiny()
    with pytest.raises(ValueError, match=r"rows \[1, 3\] have \[6, 3\] frames, too short for the ×4 subsampling "
                                         r"\(it needs at least 7 frames, 70 ms\)"):
        model(torch.randn(4, 40, 16), torch.tensor([40, 6, 7, 3]))
    assert model(torch.randn(2, 40, 16), torch.tensor([40, 7])).lengths.tolist() == [9, 1]


def test_bad_frames_are_refused():
    model = tiny()
    with pytest.raises(ValueError, match="expected 16 features per frame, got 80"):
        model(torch.randn(1, 40, 80))
    with pytest.raises(ValueError, match="NaN"):
        model(torch.full((1, 40, 16), float("nan")))
    with pytest.raises(ValueError, match="at least 7 frames"):
        model(torch.randn(1, 5, 16))
    with pytest.raises(ValueError, match="lengths must be"):
        model(torch.randn(2, 40, 16), torch.tensor([40, 41]))
    with pytest.raises(ValueError, match=r"lengths must be whole frame counts, got \[25\.7"):
        model(torch.randn(2, 40, 16), torch.tensor([25.7, 40.0]))  # not cut to 25
    frames = torch.randn(2, 40, 16)
    torch.testing.assert_close(model(frames, [25, 40]).logits, model(frames, torch.tensor([25, 40])).logits)
    with pytest.raises(ValueError, match="repeated"):
        ConformerConfig(vocabulary=("a", "a"))
    with pytest.raises(ValueError, match="must be odd"):
        ConformerCTC(ConformerConfig.from_name("conformer-digits", conv_kernel_size=8))
    backbone = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2, block=("conv", "mlp")))
    with pytest.raises(ValueError, match="cannot decode incrementally"):
        backbone(torch.randn(1, 3, 16), cache=backbone.new_cache())


def test_a_model_without_spectrogram_settings_reads_frames_of_its_own_width():
    """Empty settings mean the defaults at the model's n_mels, not the default 80 bins."""
    from unitok.models import ConformerConfig, ConformerCTC

    model = ConformerCTC(ConformerConfig.from_name("conformer-digits", n_mels=40, vocabulary=tuple("ab "))).eval()
    assert model.config.spectrogram == {} and model.processor.part("audio").n_mels == 40
    wave = 0.1 * torch.randn(8000, generator=torch.Generator().manual_seed(0))
    assert isinstance(model.transcribe(wave, sample_rate=16000)[0], str)


def test_an_audio_mask_of_other_values_than_1_and_0_is_refused_not_summed_into_lengths():
    # Tokens' mask sums to each utterance's frame count: a 0/2 mask would double it
    frames, mask = torch.randn(2, 40, 16), torch.tensor([[1] * 40, [2] * 20 + [0] * 20])
    with pytest.raises(ValueError, match=r"audio attention_mask holds \[2\]: expected 1 for a real token and 0"):
        tiny()(Tokens(features=frames, attention_mask=mask, modality="audio"))
