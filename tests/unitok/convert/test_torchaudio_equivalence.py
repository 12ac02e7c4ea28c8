"""from_torchaudio: a random torchaudio Conformer (+ a linear CTC head; noise on every weight,
so each norm and bias matters) gives the same outputs in unitok, with padded batches, BatchNorm
or GroupNorm, attention-first or convolution-first."""

from __future__ import annotations

import pytest
import torch
import torchaudio

from tests.unitok.convert.perturb import perturbed
from unitok.convert import from_torchaudio
from unitok.models import ConformerCTC


def reference(use_group_norm: bool = False, convolution_first: bool = False) -> torchaudio.models.Conformer:
    # noise on every weight and non-trivial BatchNorm statistics, so every norm and bias matters
    return perturbed(torchaudio.models.Conformer(input_dim=32, num_heads=4, ffn_dim=64, num_layers=2,
                                                 depthwise_conv_kernel_size=7, use_group_norm=use_group_norm,
                                                 convolution_first=convolution_first))


@pytest.mark.parametrize("use_group_norm, convolution_first", [(False, False), (True, False), (False, True)],
                         ids=["batchnorm", "groupnorm", "convolution_first"])
def test_outputs_match_with_padding(use_group_norm, convolution_first):
    torch.manual_seed(0)
    ref = reference(use_group_norm, convolution_first)
    head = perturbed(torch.nn.Linear(32, 6))
    ours = from_torchaudio(ref, head, vocabulary=list("abcde")).eval()
    assert isinstance(ours, ConformerCTC) and ours.config.vocabulary == tuple("abcde")
    frames, lengths = torch.randn(3, 20, 32), torch.tensor([20, 13, 7])
    with torch.no_grad():
        expected, expected_lengths = ref(frames, lengths)
        got = ours(frames, lengths)
    real = torch.arange(20)[None, :] < lengths[:, None]
    assert torch.equal(got.lengths, expected_lengths)
    torch.testing.assert_close(got.last_hidden_state[real], expected[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.logits[real], head(expected)[real], atol=1e-5, rtol=1e-5)


def test_encoder_without_a_head_and_head_vocabulary_mismatch():
    torch.manual_seed(0)
    ref = reference()
    ours = from_torchaudio(ref).eval()
    frames, lengths = torch.randn(2, 9, 32), torch.tensor([9, 9])
    with torch.no_grad():
        torch.testing.assert_close(ours(frames, lengths).last_hidden_state, ref(frames, lengths)[0],
                                   atol=1e-5, rtol=1e-5)
    assert ours(frames, lengths).logits is None
    with pytest.raises(ValueError, match="6 outputs but the vocabulary 3 characters"):
        from_torchaudio(ref, torch.nn.Linear(32, 6), vocabulary=list("abc"))
    with pytest.raises(ValueError, match="Conformer only"):
        from_torchaudio(torch.nn.Linear(2, 2))


def test_the_vocabulary_may_be_a_character_vocabulary_as_the_readme_builds_it():
    from tokenizers_mm import CharacterVocabulary

    chars = CharacterVocabulary.build(["abc", "de"])
    ours = from_torchaudio(reference(), torch.nn.Linear(32, 6), vocabulary=chars)
    assert ours.config.vocabulary == chars.chars == tuple("abcde")
