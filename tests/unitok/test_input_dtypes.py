"""Float input of another precision than the weights (float64 straight from numpy, half pixels into
a float32 model) is refused up front with a TypeError naming both dtypes and the fix, in every
family that reads float features; the same input converted runs, and under autocast float32,
float16 and bfloat16 mix as autocast casts them."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

from tokenizers_mm import Tokens
from unitok.models import (
    CLIP,
    T5,
    AudioModality,
    ClassifierHeadConfig,
    CLIPConfig,
    ConformerConfig,
    ConformerCTC,
    DecisionTransformer,
    DecisionTransformerConfig,
    ImageModality,
    MixerConfig,
    MLPMixer,
    MultimodalConfig,
    MultimodalTransformer,
    T5Config,
    ViT,
    ViTConfig,
)


def vit(x: torch.Tensor) -> object:
    return ViT(ViTConfig.from_name("deit-digits", n_layers=1)).eval()(x)


def vit_patches(x: torch.Tensor) -> object:
    model = ViT(ViTConfig.from_name("vit-digits", n_layers=1)).eval()
    return model(Tokens(features=x.reshape(2, 1, 4, 8, 4, 8).permute(0, 2, 4, 1, 3, 5).reshape(2, 16, 64),
                        grid=(4, 4), modality="image"))


def mixer(x: torch.Tensor) -> object:
    return MLPMixer(MixerConfig.from_name("mixer-digits", n_layers=1)).eval()(x)


def conformer(frames: torch.Tensor) -> object:
    config = ConformerConfig.from_name("conformer-digits", n_mels=16, d_model=32, n_layers=1,
                                       vocabulary=tuple("ab "), spectrogram={"n_mels": 16})
    return ConformerCTC(config).eval()(frames)


def t5_speech(frames: torch.Tensor) -> object:
    config = T5Config.from_name("t5-speech-tiny", n_mels=16, vocab_size=12, d_model=32, d_kv=8, n_layers=1,
                                n_decoder_layers=1, d_ff=64)
    return T5(config).eval().encode(frames)


def clip_audio(frames: torch.Tensor) -> object:
    audio = dict(n_mels=16, subsampling_channels=8, d_model=32, n_layers=1, n_heads=2, max_frames=64,
                 spectrogram={"n_mels": 16})
    vision = dict(image_size=(16, 16), patch_size=8, channels=1, d_model=32, n_layers=1, n_heads=2, mean=(0.5,),
                  std=(0.5,))
    config = CLIPConfig.from_dict(dict(embed_dim=16, vision=vision, audio=audio,
                                       text=dict(d_model=32, n_layers=1, n_heads=2, context_length=8)))
    return CLIP(config).eval().encode_audio(frames)


def decision_transformer(states: torch.Tensor) -> object:
    model = DecisionTransformer(DecisionTransformerConfig(state_dim=16, act_dim=3, d_model=32, n_layers=1, n_heads=2,
                                                          context_length=40)).eval()
    return model(states, torch.zeros(2, 40, 3, dtype=states.dtype), torch.ones(2, 40))


def multimodal_image(x: torch.Tensor) -> object:
    config = MultimodalConfig(modalities={"image": ImageModality(), "audio": AudioModality(n_mels=16, max_frames=64)},
                              heads={"digit": ClassifierHeadConfig(segment="image", num_classes=10)},
                              d_model=32, n_layers=1, n_heads=4)
    return MultimodalTransformer(config).eval()({"image": x})


def multimodal_audio(frames: torch.Tensor) -> object:
    config = MultimodalConfig(modalities={"audio": AudioModality(n_mels=16, max_frames=64)},
                              heads={"digit": ClassifierHeadConfig(segment="audio", num_classes=10, pool="mean")},
                              d_model=32, n_layers=1, n_heads=4)
    return MultimodalTransformer(config).eval()({"audio": Tokens(features=frames, modality="audio")})


# (model call, its float input's name in the error, a float32 input of the right shape)
FAMILIES: dict[str, tuple[Callable[[torch.Tensor], object], str, Callable[[], torch.Tensor]]] = {
    "vit": (vit, "pixel_values", lambda: torch.randn(2, 1, 32, 32)),
    "vit-patches": (vit_patches, "patch features", lambda: torch.randn(2, 1, 32, 32)),
    "mixer": (mixer, "pixel_values", lambda: torch.randn(2, 1, 32, 32)),
    "conformer": (conformer, "features", lambda: torch.randn(2, 40, 16)),
    "t5-speech": (t5_speech, "spectrogram frames", lambda: torch.randn(2, 40, 16)),
    "clip-audio": (clip_audio, "audio frames", lambda: torch.randn(2, 40, 16)),
    "decision-transformer": (decision_transformer, "states", lambda: torch.randn(2, 40, 16)),
    "multimodal-image": (multimodal_image, "segment 'image' pixels", lambda: torch.randn(2, 1, 32, 32)),
    "multimodal-audio": (multimodal_audio, "segment 'audio' frames", lambda: torch.randn(2, 40, 16)),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["f64", "bf16"])
def test_float_input_of_another_precision_is_refused_naming_both_dtypes(family, dtype):
    call, name, make = FAMILIES[family]
    torch.manual_seed(0)
    x = make()
    call(x)  # float32 as the weights: runs
    expected = f"{name} are {dtype} but the model's weights are torch.float32: convert them with .to(torch.float32)"
    with pytest.raises(TypeError, match=re.escape(expected)):
        call(x.to(dtype))
    call(x.to(dtype).to(torch.float32))  # the fix the message names


@pytest.mark.parametrize("family", ["vit", "conformer", "decision-transformer"])
def test_under_autocast_half_input_mixes_with_float32_weights_and_float64_does_not(family):
    call, name, make = FAMILIES[family]
    torch.manual_seed(0)
    x = make()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        call(x.to(torch.bfloat16))  # autocast casts it for every layer, as it casts float32
        with pytest.raises(TypeError, match=f"{name} are torch.float64"):
            call(x.to(torch.float64))  # autocast leaves float64 alone: the first layer would fail
