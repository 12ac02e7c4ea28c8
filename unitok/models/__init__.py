"""The model families, each a thin composition over the one backbone."""

from unitok.models.base import CheckpointMismatchError, PretrainedModel
from unitok.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "CheckpointMismatchError", "GPTConfig", "PretrainedModel"]
