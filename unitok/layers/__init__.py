"""Building blocks of the backbone: attention, MLPs, norms, activations, the KV cache."""

from unitok.layers.activations import make_activation
from unitok.layers.attention import (
    AttentionContext,
    SelfAttention,
    build_attention_mask,
    causal_mask,
    reference_attention,
    sdpa_attention,
)
from unitok.layers.kv_cache import KVCache, StaticKVCache
from unitok.layers.mlp import MLP
from unitok.layers.norms import RMSNorm, make_norm

__all__ = [
    "MLP", "AttentionContext", "KVCache", "StaticKVCache", "RMSNorm", "SelfAttention", "build_attention_mask",
    "causal_mask", "make_activation", "make_norm", "reference_attention", "sdpa_attention",
]
