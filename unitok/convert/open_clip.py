"""open_clip <-> unitok: `open_clip.CLIP` with a ViT image tower and its own text transformer.

Like the timm converter, the importer reads the module tree (and the few attributes open_clip
keeps) and refuses, by name, the options unitok does not implement instead of dropping them.
`to_open_clip` builds an open_clip ``CLIP`` from a unitok config (refusing, by field, what
open_clip cannot hold: an audio tower, projection biases, ...) and fills it through the same
key map (`clip_rules`) read backwards.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from unitok.convert.keymap import (
    KeyRule,
    leaves,
    load_reference,
    mlp_ratio,
    placed_like,
    refuse_unmapped,
    renames,
    to_ours,
    to_theirs,
)
from unitok.models.base import load_state_dict_strict
from unitok.models.clip import CLIP, CLIP_VISION_DEFAULTS, CLIPConfig, CLIPTextConfig
from unitok.models.vit import ViTConfig

_NOT_SUPPORTED = "open_clip model option not supported by unitok"
_ACTIVATIONS = {"GELU": "gelu", "QuickGELU": "quick_gelu"}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"{_NOT_SUPPORTED}: {message}")


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
    # open_clip's towers drop nothing; unitok's one rate would also drop each sublayer's output
    rate = max(b.attn.dropout for b in blocks)
    _require(not rate, f"{where} attention dropout={rate:g}")
    return dict(n_layers=len(blocks), n_heads=block.attn.num_heads, d_model=block.attn.embed_dim,
                d_ff=block.mlp.c_fc.out_features, activation=_ACTIVATIONS[act], norm_eps=block.ln_1.eps)


# Per-block names: open_clip sub-path -> unitok sublayer path (besides the fused in_proj).
_BLOCK_KEYS = {"ln_1": "attn.norm", "ln_2": "mlp.norm", "mlp.c_fc": "mlp.fc_in", "mlp.c_proj": "mlp.fc_out",
               "attn.out_proj": "attn.proj"}


def _block_rules(theirs: str, ours: str, n_layers: int) -> list[KeyRule]:
    rules: list[KeyRule] = []
    for i in range(n_layers):
        src, dst = f"{theirs}.{i}.", f"{ours}.{i}.sublayers."
        # nn.MultiheadAttention keeps q, k, v stacked in one (3D, D) in_proj: our fused qkv layout.
        rules += [KeyRule(f"{src}attn.in_proj_weight", f"{dst}attn.qkv.weight"),
                  KeyRule(f"{src}attn.in_proj_bias", f"{dst}attn.qkv.bias"), *renames(_BLOCK_KEYS, src, dst)]
    return rules


def clip_rules(vision_layers: int, text_layers: int, final_ln_after_pool: bool = False,
               linear_text_projection: bool = False) -> list[KeyRule]:
    """The key map of an open_clip ``CLIP`` (``linear_text_projection``: its ``text_projection``
    is a bias-free ``nn.Linear`` rather than a (D, E) parameter)."""
    post = "visual.fc_norm" if final_ln_after_pool else "visual.backbone.norm"
    text_proj = KeyRule("text_projection.weight", "text_proj.weight") if linear_text_projection \
        else KeyRule("text_projection", "text_proj.weight", transpose=True)  # open_clip multiplies x @ proj
    return [
        KeyRule("visual.conv1.weight", "visual.patch_embed.weight", reshape=True),  # (D, C·P·P)
        KeyRule("visual.conv1.bias", "visual.patch_embed.bias"),
        KeyRule("visual.class_embedding", "visual.cls_token", reshape=True),
        KeyRule("visual.positional_embedding", "visual.pos_embed", reshape=True),
        KeyRule("visual.proj", "visual_proj.weight", transpose=True),  # open_clip multiplies x @ proj: (D, E)
        KeyRule("token_embedding.weight", "text.token_embed.weight"),
        KeyRule("positional_embedding", "text.pos_embed"),
        KeyRule("logit_scale", "logit_scale", reshape=True),
        *leaves("visual.ln_pre", "visual.norm_pre"), *leaves("visual.ln_post", post),
        *leaves("ln_final", "text.backbone.norm"), text_proj,
        *_block_rules("visual.transformer.resblocks", "visual.backbone.blocks", vision_layers),
        *_block_rules("transformer.resblocks", "text.backbone.blocks", text_layers),
    ]


def _vision_config(visual: nn.Module, preprocess: dict[str, Any]) -> ViTConfig:
    _require(type(visual).__name__ == "VisionTransformer",
             f"image tower {type(visual).__name__} (only ViT towers; ModifiedResNet and timm towers are not)")
    _require(getattr(visual, "attn_pool", None) is None, "attentional pooling in the image tower")
    _require(visual.pool_type == "tok", f"image pool_type={visual.pool_type!r} (class-token pooling only)")
    _require(isinstance(visual.proj, nn.Parameter), "image tower without a projection")
    patch_dropout = getattr(getattr(visual, "patch_dropout", None), "prob", 0.0)
    _require(not patch_dropout, f"patch_dropout={patch_dropout:g} (unitok's ViT drops no patches)")
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
    """open_clip's evaluation preprocessing as the image config stores it: ``resize_mode``
    "shortest" (the default) resizes the shorter side and centre-crops (crop_pct 1.0), "squash"
    resizes plainly (crop_pct None); "longest" pads, which unitok does not, and is refused."""
    cfg = getattr(model.visual, "preprocess_cfg", None) or {}
    mode = cfg.get("resize_mode") or "shortest"
    _require(mode in ("shortest", "squash"), f"resize_mode {mode!r} (pads the longer side to the image size)")
    out: dict[str, Any] = {"crop_pct": 1.0 if mode == "shortest" else None}
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

    rules = clip_rules(vision.n_layers, text.n_layers, bool(model.visual.final_ln_after_pool),
                       isinstance(text_proj, nn.Linear))
    theirs = model.state_dict()
    refuse_unmapped(rules, theirs, _NOT_SUPPORTED)
    load_state_dict_strict(ours, to_ours(rules, theirs, ours.state_dict()))
    return ours.to(next(model.parameters()).dtype).eval()


def _refuse(condition: bool, field: str, value: Any, why: str) -> None:
    if condition:
        raise ValueError(f"CLIPConfig.{field}={value!r}: {why}")


def to_open_clip(model: nn.Module) -> nn.Module:
    """Convert a unitok `CLIP` to an open_clip ``CLIP`` (eval mode) whose ``encode_image`` /
    ``encode_text`` give the same embeddings. Not carried: dropout (open_clip's towers have
    none) and the audio tower (open_clip has none: such a model is refused)."""
    from open_clip.model import CLIP as OpenCLIP
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    if not isinstance(model, CLIP):
        raise TypeError(f"to_open_clip cannot convert a {type(model).__name__}; supported unitok classes: CLIP")
    c = model.config
    v, t = c.vision, c.text
    _refuse(c.audio is not None, "audio", "(an audio tower)", "open_clip's CLIP holds image and text towers only")
    _refuse(c.projection_bias, "projection_bias", True, "open_clip's image projection has no bias")
    _refuse(not v.bias, "vision.bias", v.bias, "open_clip's blocks have biases")
    _refuse(v.num_registers != 0, "vision.num_registers", v.num_registers, "open_clip's ViT has no registers")
    _refuse(v.positions != "learned", "vision.positions", v.positions, "open_clip's ViT learns its positions")
    _refuse(not v.positions_cover_prefix, "vision.positions_cover_prefix", False,
            "open_clip's positions cover the class token")
    for name, tower in (("vision", v), ("text", t)):
        _refuse(tower.activation not in _ACTIVATIONS.values(), f"{name}.activation", tower.activation,
                f"open_clip's towers use {sorted(set(_ACTIVATIONS.values()))}")
    _refuse(v.activation != t.activation, "text.activation", t.activation,
            f"open_clip uses one activation for both towers, and vision.activation={v.activation!r}")
    vocab, eot = t.vocab_size, t.eot_token_id
    vision_cfg = CLIPVisionCfg(
        layers=v.n_layers, width=v.d_model, head_width=v.d_model // v.n_heads,
        mlp_ratio=mlp_ratio(v.backbone_config().hidden_dim, v.d_model), patch_size=v.patch_size,
        image_size=v.image_size, no_ln_pre=not v.pre_norm, final_ln_after_pool=v.use_fc_norm,
        norm_kwargs=dict(eps=v.norm_eps),
    )
    text_cfg = CLIPTextCfg(
        context_length=t.context_length, vocab_size=vocab, width=t.d_model, heads=t.n_heads, layers=t.n_layers,
        mlp_ratio=mlp_ratio(t.backbone_config().hidden_dim, t.d_model), norm_kwargs=dict(eps=t.norm_eps),
        # "argmax" pools at the largest id: the end-of-text token when it is the last id (CLIP's BPE).
        pool_type="argmax" if eot == vocab - 1 else "eos", eos_id=eot,
    )
    reference = OpenCLIP(embed_dim=c.embed_dim, vision_cfg=vision_cfg, text_cfg=text_cfg,
                         quick_gelu=v.activation == "quick_gelu", init_logit_scale=float(model.logit_scale.detach()))
    visual = reference.visual
    if v.channels != 3 or v.patch_bias:  # open_clip builds a 3-channel, bias-free patch conv; its forward takes any
        visual.conv1 = nn.Conv2d(v.channels, v.d_model, v.patch_size, stride=v.patch_size, bias=v.patch_bias)
    rules = clip_rules(v.n_layers, t.n_layers, v.use_fc_norm)
    load_reference(reference, to_theirs(rules, model.state_dict(), reference.state_dict()))
    visual.preprocess_cfg = dict(size=v.image_size, mode="RGB" if v.channels == 3 else "L", mean=v.mean,
                                 std=v.std, interpolation=v.interpolation, resize_mode="shortest", fill_color=0)
    return placed_like(reference, model)
