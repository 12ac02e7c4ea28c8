"""Task heads: small modules that turn backbone states into predictions."""

from unitok.heads.action import ActionHead
from unitok.heads.classification import ClassificationHead, Pooler, ReplacedTokenHead, SpanHead
from unitok.heads.ctc import CTCHead
from unitok.heads.lm import LMHead
from unitok.heads.mlm import MLMHead
from unitok.heads.pooling import Pooling, pool_tokens
from unitok.heads.projection import ProjectionHead
from unitok.heads.scalar_mix import ScalarMix

__all__ = ["ActionHead", "ClassificationHead", "CTCHead", "LMHead", "MLMHead", "Pooler", "Pooling",
           "ProjectionHead", "ReplacedTokenHead", "ScalarMix", "SpanHead", "pool_tokens"]
