"""open_clip -> unitok: `open_clip.CLIP` with a ViT image tower and its own text transformer.

Like the timm converter, this reads the module tree (and the few attributes open_clip keeps)
and refuses, by name, the options unitok does not implement instead of dropping them.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from unitok.models.base import load_state_dict_strict
from unitok.models.clip import CLIP, CLIP_VISION_DEFAULTS, CLIPConfig, CLIPTextConfig
from unitok.models.vit import ViTConfig

_ACTIVATIONS = {"GELU": "gelu", "QuickGELU": "quick_gelu"}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"open_clip model option not supported by unitok: {message}")


def _is_identity(module: Any) -> bool:
    return module is None or isinstance(module, nn.Identity)


def _check_blocks(blocks: nn.ModuleList, where: str) -> dict[str, Any]:
    """The shape of open_clip's ResidualAttentionBlocks, refusing what the backbone lacks."""
    block = blocks[0]
    _require(type(block).__name__ == "ResidualAttentionBlock",
             f"{where} block type {type(block).__name__} (custom attention blocks: qk-norm, scaled cosine, ...)")
    _require(_is_identity(block.ls_1) and _is_identity(block.ls_2), f"{where} layer scale (ls_init_value)")
    act = type(block.mlp.gelu).__name__
    if act == "GELU":
        _require(getattr(block.mlp.gelu, "approximate", "none") == "none", f"{where} tanh-approximated GELU")
    _require(act in _ACTIVATIONS, f"{where} activation {act}")
    _require(block.attn.in_proj_bias is not None and block.mlp.c_fc.bias is not None, f"{where} bias-free layers")
    return dict(n_layers=len(blocks), n_heads=block.attn.num_heads, d_model=block.attn.embed_dim,
                d_ff=block.mlp.c_fc.out_features, activation=_ACTIVATIONS[act], norm_eps=block.ln_1.eps)


def _blocks_state(blocks: nn.ModuleList, prefix: str) -> dict[str, Tensor]:
    names = {"ln_1": "attn.norm", "ln_2": "mlp.norm", "mlp.c_fc": "mlp.fc_in", "mlp.c_proj": "mlp.fc_out",
             "attn.out_proj": "attn.proj"}
    state: dict[str, Tensor] = {}
    for i, block in enumerate(blocks):
        own = block.state_dict()
        base = f"{prefix}.{i}.sublayers"
        # nn.MultiheadAttention keeps q, k, v stacked in one (3D, D) in_proj: our fused qkv layout.
        state[f"{base}.attn.qkv.weight"] = own["attn.in_proj_weight"]
        state[f"{base}.attn.qkv.bias"] = own["attn.in_proj_bias"]
        for theirs, ours in names.items():
            for leaf in ("weight", "bias"):
                state[f"{base}.{ours}.{leaf}"] = own[f"{theirs}.{leaf}"]
    return state


def _vision_config(visual: nn.Module, preprocess: dict[str, Any]) -> ViTConfig:
    _require(type(visual).__name__ == "VisionTransformer",
             f"image tower {type(visual).__name__} (only ViT towers; ModifiedResNet and timm towers are not)")
    _require(getattr(visual, "attn_pool", None) is None, "attentional pooling in the image tower")
    _require(visual.pool_type == "tok", f"image pool_type={visual.pool_type!r} (class-token pooling only)")
    _require(isinstance(visual.proj, nn.Parameter), "image tower without a projection")
    conv = visual.conv1
    _require(conv.kernel_size == conv.stride and conv.kernel_size[0] == conv.kernel_size[1],
             "non-square or overlapping patches")
    shape = _check_blocks(visual.transformer.resblocks, "image")
    _require(visual.ln_post.eps == shape["norm_eps"], "different LayerNorm eps inside one tower")
    fields = dict(
        image_size=tuple(visual.image_size), patch_size=conv.kernel_size[0], channels=conv.in_channels,
        num_classes=0, class_token=True, positions="learned", positions_cover_prefix=True, pool="cls",
        pre_norm=not _is_identity(visual.ln_pre), fc_norm=bool(visual.final_ln_after_pool),
        patch_bias=conv.bias is not None, **shape, **preprocess,
    )
    return ViTConfig.from_dict({**CLIP_VISION_DEFAULTS, **fields})


def _text_config(model: nn.Module) -> CLIPTextConfig:
    _require(model.text_pool_type in ("argmax", "eos"),
             f"text pool_type={model.text_pool_type!r} (pooling at the end-of-text token only)")
    _require(model.attn_mask is not None, "a bidirectional text tower (no_causal_mask)")
    shape = _check_blocks(model.transformer.resblocks, "text")
    vocab = model.token_embedding.num_embeddings
    # "argmax" pools at the largest id, which in CLIP's BPE is <end_of_text> (the last id).
    eot = vocab - 1 if model.text_pool_type == "argmax" else model.text_eos_id
    return CLIPTextConfig(vocab_size=vocab, context_length=model.positional_embedding.shape[0],
                          eot_token_id=eot, **shape)


def _preprocess(model: nn.Module) -> dict[str, Any]:
    cfg = getattr(model.visual, "preprocess_cfg", None) or {}
    out: dict[str, Any] = {"crop_pct": 1.0}
    if "mean" in cfg and "std" in cfg:
        out["mean"], out["std"] = tuple(cfg["mean"]), tuple(cfg["std"])
    if cfg.get("interpolation") in ("bicubic", "bilinear"):
        out["interpolation"] = cfg["interpolation"]
    return out


def from_open_clip(model: nn.Module) -> CLIP:
    """Convert an open_clip ``CLIP`` (ViT image tower, built-in text transformer) to unitok;
    ``encode_image`` / ``encode_text`` then give the same embeddings."""
    _require(type(model).__name__ == "CLIP",
             f"model class {type(model).__name__} (CustomTextCLIP / Hugging Face text towers, CoCa)")
    _require(getattr(model, "logit_bias", None) is None, "logit_bias (SigLIP's sigmoid loss)")
    _require(model.logit_scale.numel() == 1, "a non-scalar logit_scale")
    text_proj = model.text_projection
    _require(text_proj is not None, "a text tower without projection")
    _require(not (isinstance(text_proj, nn.Linear) and text_proj.bias is not None),
             "a bias on the text projection (proj_bias) but none on the image projection")
    vision = _vision_config(model.visual, _preprocess(model))
    text = _text_config(model)
    embed_dim = model.visual.proj.shape[1]
    config = CLIPConfig(embed_dim=embed_dim, vision=vision, text=text, init_logit_scale=float(model.logit_scale.detach()))
    ours = CLIP(config)

    visual = model.visual
    conv = visual.conv1
    state: dict[str, Tensor] = {
        "visual.patch_embed.weight": conv.weight.detach().reshape(conv.out_channels, -1),  # (D, C·P·P)
        "visual.cls_token": visual.class_embedding.detach().reshape(1, 1, -1),
        "visual.pos_embed": visual.positional_embedding.detach()[None],
        "visual_proj.weight": visual.proj.detach().T,  # open_clip multiplies x @ proj: (D, E)
        "text.token_embed.weight": model.token_embedding.weight.detach(),
        "text.pos_embed": model.positional_embedding.detach(),
        "logit_scale": model.logit_scale.detach().reshape(()),
    }
    if conv.bias is not None:
        state["visual.patch_embed.bias"] = conv.bias.detach()
    if not _is_identity(visual.ln_pre):
        state.update({f"visual.norm_pre.{k}": v for k, v in visual.ln_pre.state_dict().items()})
    post = "visual.fc_norm" if visual.final_ln_after_pool else "visual.backbone.norm"
    state.update({f"{post}.{k}": v for k, v in visual.ln_post.state_dict().items()})
    state.update({f"text.backbone.norm.{k}": v for k, v in model.ln_final.state_dict().items()})
    if isinstance(text_proj, nn.Linear):
        state["text_proj.weight"] = text_proj.weight.detach()
    else:
        state["text_proj.weight"] = text_proj.detach().T
    state.update(_blocks_state(visual.transformer.resblocks, "visual.backbone.blocks"))
    state.update(_blocks_state(model.transformer.resblocks, "text.backbone.blocks"))
    load_state_dict_strict(ours, state)
    return ours.to(next(model.parameters()).dtype)
