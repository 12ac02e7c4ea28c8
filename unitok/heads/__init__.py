"""Task heads: small modules that turn backbone states into predictions."""

from unitok.heads.classification import ClassificationHead, Pooler, ReplacedTokenHead, SpanHead
from unitok.heads.mlm import MLMHead
from unitok.heads.scalar_mix import ScalarMix

__all__ = ["ClassificationHead", "MLMHead", "Pooler", "ReplacedTokenHead", "ScalarMix", "SpanHead"]
