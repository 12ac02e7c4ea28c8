"""tasks: Lightning training for unitok models (losses, metrics, data modules, the CLI)."""

from tasks.callbacks import ExportPretrained, PrintPredictions
from tasks.causal_lm import CausalLMTask
from tasks.text_data import TextDataModule, stdlib_source_files

__all__ = ["CausalLMTask", "ExportPretrained", "PrintPredictions", "TextDataModule", "stdlib_source_files"]
