"""Data modules: users' files and the built-in data (the standard library's text, digit scans,
spoken digits, CartPole trajectories, image–caption and image–audio pairs), all serving their
splits through `SplitDataModule`, and `MultiTaskDataModule` to combine them."""

from tasks.data.base import Split, SplitDataModule
from tasks.data.bert import BERTDataModule, MaskingCollator, mask_tokens
from tasks.data.captions import CaptionedDigitsDataModule, ImageCaptionDataModule
from tasks.data.combined import MultiTaskDataModule
from tasks.data.image import DigitsDataModule, ImageFolderDataModule
from tasks.data.image_audio import AudioImageManifestDataModule, ImageAudioPairsDataModule
from tasks.data.labelled_text import (
    CodeTokensDataModule,
    DocstringDataModule,
    DocstringQADataModule,
)
from tasks.data.speech import ManifestDataModule, SpokenDigitsDataModule, spoken_digits_corpus
from tasks.data.t5 import SpanCorruptionDataModule, TextToTextDataModule
from tasks.data.text import TextDataModule
from tasks.data.trajectories import TrajectoryDataModule

__all__ = [
    "AudioImageManifestDataModule", "BERTDataModule", "CaptionedDigitsDataModule", "CodeTokensDataModule",
    "DigitsDataModule", "DocstringDataModule", "DocstringQADataModule", "ImageAudioPairsDataModule",
    "ImageCaptionDataModule", "ImageFolderDataModule", "ManifestDataModule", "MaskingCollator", "mask_tokens",
    "MultiTaskDataModule", "SpanCorruptionDataModule", "Split", "SplitDataModule", "spoken_digits_corpus",
    "SpokenDigitsDataModule", "TextDataModule", "TextToTextDataModule", "TrajectoryDataModule",
]
