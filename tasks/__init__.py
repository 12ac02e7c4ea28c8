"""tasks: Lightning training for unitok models (losses, metrics, data modules, the CLI)."""

from tasks.callbacks import ExportPretrained, PrintPredictions
from tasks.causal_lm import CausalLMTask
from tasks.clip_data import CaptionedDigitsDataModule, ImageCaptionDataModule
from tasks.contrastive import ContrastiveTask, contrastive_loss
from tasks.ctc_asr import CTCSpeechTask, ctc_loss
from tasks.decision_transformer import DecisionTransformerTask, action_loss, save_return_plot
from tasks.image_classification import (
    ImageClassificationTask,
    hard_distillation_loss,
    soft_distillation_loss,
)
from tasks.image_data import DigitsDataModule, ImageFolderDataModule
from tasks.rl_data import (
    TrajectoryDataModule,
    builtin_trajectories,
    load_trajectories,
    record_episodes,
    save_trajectories,
)
from tasks.seq2seq import Seq2SeqTask, exact_match
from tasks.span_corruption import (
    SpanCorruptionCollator,
    random_spans_noise_mask,
    restore_spans,
    sentinel_tokens,
    span_corrupt,
)
from tasks.speech_data import ManifestDataModule, SpokenDigitsDataModule, spoken_digits_corpus
from tasks.t5_data import SpanCorruptionDataModule, TextToTextDataModule, train_t5_tokenizer
from tasks.teachers import SmallCNN, train_cnn_teacher
from tasks.text_data import TextDataModule, stdlib_source_files

__all__ = [
    "Seq2SeqTask", "SpanCorruptionCollator", "SpanCorruptionDataModule", "TextToTextDataModule", "exact_match",
    "random_spans_noise_mask", "restore_spans", "sentinel_tokens", "span_corrupt", "train_t5_tokenizer",
    "CTCSpeechTask", "ManifestDataModule", "SpokenDigitsDataModule", "ctc_loss", "spoken_digits_corpus",
    "CaptionedDigitsDataModule", "ContrastiveTask", "ImageCaptionDataModule", "contrastive_loss",
    "CausalLMTask", "DigitsDataModule", "ExportPretrained", "ImageClassificationTask", "ImageFolderDataModule",
    "PrintPredictions", "SmallCNN", "TextDataModule", "hard_distillation_loss", "soft_distillation_loss",
    "stdlib_source_files", "train_cnn_teacher",
    "DecisionTransformerTask", "TrajectoryDataModule", "action_loss", "builtin_trajectories", "load_trajectories",
    "record_episodes", "save_return_plot", "save_trajectories",
]
