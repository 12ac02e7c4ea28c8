"""tasks: Lightning training for unitok models (losses, metrics, data modules, the CLI)."""

from tasks.bert_finetune import (
    QuestionAnsweringTask,
    SequenceClassificationTask,
    TokenClassificationTask,
)
from tasks.binding import BindTask
from tasks.callbacks import Compile, ExportPretrained, FrozenInEval, PrintPredictions
from tasks.causal_lm import CausalLMTask
from tasks.contrastive import ContrastiveTask, contrastive_loss
from tasks.ctc_asr import CTCSpeechTask, ctc_loss
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
from tasks.data.span_corruption import (
    SpanCorruptionCollator,
    random_spans_noise_mask,
    restore_spans,
    sentinel_tokens,
    span_corrupt,
)
from tasks.data.speech import ManifestDataModule, SpokenDigitsDataModule, spoken_digits_corpus
from tasks.data.t5 import SpanCorruptionDataModule, TextToTextDataModule, train_t5_tokenizer
from tasks.data.text import TextDataModule, stdlib_source_files
from tasks.data.trajectories import (
    TrajectoryDataModule,
    builtin_trajectories,
    load_trajectories,
    record_episodes,
    save_trajectories,
)
from tasks.decision_transformer import DecisionTransformerTask, action_loss, save_return_plot
from tasks.image_classification import (
    ImageClassificationTask,
    hard_distillation_loss,
    soft_distillation_loss,
)
from tasks.masked_lm import ElectraTask, MaskedLMTask
from tasks.multitask import MultiTaskTask
from tasks.objectives import (
    ImageAudioMatch,
    ImageClassification,
    LanguageModelling,
    Objective,
    ReturnConditionedControl,
    SpeechRecognition,
)
from tasks.predictions import PredictionWriter
from tasks.resume import ResumableRNG, ResumedBest, resume_callbacks
from tasks.seq2seq import Seq2SeqTask, exact_match
from tasks.teachers import SmallCNN, train_cnn_teacher

__all__ = [
    "action_loss", "BERTDataModule", "builtin_trajectories", "CaptionedDigitsDataModule", "CausalLMTask",
    "CodeTokensDataModule", "contrastive_loss", "ContrastiveTask", "ctc_loss", "CTCSpeechTask",
    "DecisionTransformerTask", "DigitsDataModule", "DocstringDataModule", "DocstringQADataModule", "ElectraTask",
    "exact_match", "Compile", "ExportPretrained", "FrozenInEval", "hard_distillation_loss", "ImageCaptionDataModule",
    "ImageClassificationTask", "ImageFolderDataModule", "load_trajectories", "ManifestDataModule", "mask_tokens",
    "MaskedLMTask", "MaskingCollator", "PrintPredictions", "QuestionAnsweringTask", "random_spans_noise_mask",
    "record_episodes", "restore_spans", "save_return_plot", "save_trajectories", "sentinel_tokens", "Seq2SeqTask",
    "SequenceClassificationTask", "SmallCNN", "soft_distillation_loss", "span_corrupt", "SpanCorruptionCollator",
    "SpanCorruptionDataModule", "spoken_digits_corpus", "SpokenDigitsDataModule", "stdlib_source_files",
    "TextDataModule", "TextToTextDataModule", "TokenClassificationTask", "train_cnn_teacher",
    "train_t5_tokenizer", "TrajectoryDataModule", "ImageAudioMatch", "ImageAudioPairsDataModule",
    "ImageClassification", "LanguageModelling", "MultiTaskDataModule", "MultiTaskTask", "Objective",
    "ReturnConditionedControl", "SpeechRecognition", "AudioImageManifestDataModule", "BindTask", "PredictionWriter",
    "ResumableRNG", "ResumedBest", "resume_callbacks"
]
