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
from tokenizers_mm.pairs import Truncation, encode_pair_ids, pad_pairs
from tokenizers_mm.processor import Processor
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
from tokenizers_mm.wave_augment import WaveAugment
from tokenizers_mm.wordpiece import PairEncoding, WordPieceTokenizer, align_word_labels

__all__ = [
    "align_word_labels", "BPETokenizer", "CharacterVocabulary", "CLIPTokenizer", "collate", "encode_pair_ids",
    "Episode", "episodes_from_arrays", "episodes_to_arrays", "IMAGENET_MEAN", "IMAGENET_STD",
    "ImagePreprocessConfig", "pad_pairs", "PairEncoding", "patchify", "PatchTokenizer", "Processor", "read_audio",
    "returns_to_go", "SpecAugment", "SpectrogramConfig", "SpectrogramTokenizer", "TextEncoding", "Tokens",
    "TrajectoryTokenizer", "TrajectoryWindows", "Truncation", "unpatchify", "WaveAugment", "WordPieceTokenizer"
]
