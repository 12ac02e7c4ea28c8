"""Weights in and out: the reference implementations <-> unitok models, outputs unchanged.

Import: `from_transformers` (Hugging Face) dispatches on the model class through a registry;
`from_timm` handles timm's ViT, DeiT and MLP-Mixer; `from_open_clip` open_clip's ViT CLIP models;
`from_torchaudio` torchaudio's Conformer.
Export, through the same key maps read backwards (`unitok.convert.keymap`): `to_transformers`
(GPT, BERT, T5, Decision Transformer), `to_timm` (ViT, DeiT, MLP-Mixer), `to_open_clip` (CLIP's
image and text towers), `to_torchaudio` (the Conformer blocks and the CTC head).
"""

from unitok.convert.open_clip import from_open_clip, to_open_clip
from unitok.convert.timm import from_timm, to_timm
from unitok.convert.torchaudio import TorchaudioConformer, from_torchaudio, to_torchaudio
from unitok.convert.transformers import (
    from_transformers,
    register_transformers_converter,
    register_transformers_exporter,
    to_transformers,
)

__all__ = ["TorchaudioConformer", "from_open_clip", "from_timm", "from_torchaudio", "from_transformers",
           "register_transformers_converter", "register_transformers_exporter", "to_open_clip", "to_timm",
           "to_torchaudio", "to_transformers"]
