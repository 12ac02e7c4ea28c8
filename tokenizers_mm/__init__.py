"""tokenizers_mm: parameter-free, picklable transforms from raw data to `Tokens` batches."""

from tokenizers_mm.audio import SpecAugment, SpectrogramConfig, SpectrogramTokenizer, read_audio
from tokenizers_mm.characters import CharacterVocabulary
from tokenizers_mm.clip_bpe import CLIPTokenizer
from tokenizers_mm.image import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImagePreprocessConfig,
    PatchTokenizer,
    patchify,
    unpatchify,
)
from tokenizers_mm.text import BPETokenizer, TextEncoding
from tokenizers_mm.tokens import Tokens, collate
from tokenizers_mm.trajectory import (
    Episode,
    TrajectoryTokenizer,
    TrajectoryWindows,
    episodes_from_arrays,
    episodes_to_arrays,
    returns_to_go,
)

__all__ = [
    "CharacterVocabulary", "SpecAugment", "SpectrogramConfig", "SpectrogramTokenizer", "read_audio",
    "IMAGENET_MEAN", "IMAGENET_STD", "BPETokenizer", "CLIPTokenizer", "ImagePreprocessConfig", "PatchTokenizer",
    "TextEncoding", "Tokens", "collate", "patchify", "unpatchify",
    "Episode", "TrajectoryTokenizer", "TrajectoryWindows", "episodes_from_arrays", "episodes_to_arrays",
    "returns_to_go",
]
