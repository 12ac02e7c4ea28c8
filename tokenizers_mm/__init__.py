"""tokenizers_mm: parameter-free, picklable transforms from raw data to `Tokens` batches."""

from tokenizers_mm.text import BPETokenizer, TextEncoding
from tokenizers_mm.tokens import Tokens, collate

__all__ = ["BPETokenizer", "TextEncoding", "Tokens", "collate"]
