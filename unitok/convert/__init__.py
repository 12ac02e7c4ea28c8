"""Import weights from the reference implementations into unitok models, outputs unchanged.

`from_transformers` (Hugging Face) dispatches on the model class through a registry;
`from_timm` handles timm's ViT, DeiT and MLP-Mixer; `from_open_clip` open_clip's ViT CLIP models;
`from_torchaudio` torchaudio's Conformer.
"""

from unitok.convert.open_clip import from_open_clip
from unitok.convert.timm import from_timm
from unitok.convert.torchaudio import from_torchaudio
from unitok.convert.transformers import from_transformers, register_transformers_converter

__all__ = ["from_open_clip", "from_timm", "from_torchaudio", "from_transformers", "register_transformers_converter"]
