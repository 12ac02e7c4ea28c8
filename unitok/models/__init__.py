"""The model families, each a thin composition over the one backbone."""

from unitok.models.base import CheckpointMismatchError, PretrainedModel
from unitok.models.bert import BERT, BERTConfig, BERTOutput
from unitok.models.clip import CLIP, CLIPAudioConfig, CLIPConfig, CLIPTextConfig
from unitok.models.conformer import ConformerConfig, ConformerCTC
from unitok.models.decision_transformer import (
    DecisionTransformer,
    DecisionTransformerConfig,
    DecisionTransformerOutput,
)
from unitok.models.electra import ELECTRA, ELECTRAConfig, ELECTRAOutput
from unitok.models.gpt import GPT, GPTConfig
from unitok.models.mixer import MixerConfig, MLPMixer
from unitok.models.multimodal import (
    ActionHeadConfig,
    AudioModality,
    ClassifierHeadConfig,
    CTCHeadConfig,
    ImageModality,
    LMHeadConfig,
    MultimodalConfig,
    MultimodalOutput,
    MultimodalTransformer,
    ProjectionHeadConfig,
    TextModality,
    TrajectoryModality,
)
from unitok.models.t5 import T5, T5Config, T5Encoder
from unitok.models.vit import DeiT, ViT, ViTConfig

__all__ = [
    "BERT", "BERTConfig", "BERTOutput", "CheckpointMismatchError", "CLIP", "CLIPAudioConfig", "CLIPConfig", "CLIPTextConfig",
    "ConformerConfig", "ConformerCTC", "DecisionTransformer", "DecisionTransformerConfig",
    "DecisionTransformerOutput", "DeiT", "ELECTRA", "ELECTRAConfig", "ELECTRAOutput", "GPT", "GPTConfig",
    "MixerConfig", "MLPMixer", "PretrainedModel", "ActionHeadConfig", "AudioModality", "ClassifierHeadConfig",
    "CTCHeadConfig", "ImageModality", "LMHeadConfig", "MultimodalConfig", "MultimodalOutput",
    "MultimodalTransformer", "ProjectionHeadConfig", "TextModality", "TrajectoryModality", "T5", "T5Config", "T5Encoder", "ViT", "ViTConfig"
]
