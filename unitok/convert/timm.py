"""timm <-> unitok: `VisionTransformer` (ViT), `VisionTransformerDistilled` (DeiT), `MlpMixer`.

The importers read the timm module tree (timm keeps no config object) and refuse options
that unitok does not implement rather than dropping them. `to_timm` builds the timm model
from a unitok config (refusing, by field, what timm cannot express) and fills it through
the same key maps (`vit_rules`, `mixer_rules`) read backwards.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from unitok.convert.dropout import one_rate
from unitok.convert.keymap import (
    KeyRule,
    load_reference,
    mlp_ratio,
    placed_like,
    refuse_unmapped,
    renames,
    to_ours,
    to_theirs,
)
from unitok.models.base import load_state_dict_strict
from unitok.models.mixer import MixerConfig, MLPMixer
from unitok.models.vision import ImageConfig
from unitok.models.vit import DeiT, ViT, ViTConfig

_NOT_SUPPORTED = "timm model option not supported by unitok"
_ACTIVATIONS = {"GELU": "gelu", "QuickGELU": "quick_gelu", "ReLU": "relu", "SiLU": "silu"}
# Per-block names: timm sub-path -> unitok sublayer path.
_VIT_BLOCK_KEYS = {"norm1": "attn.norm", "attn.qkv": "attn.qkv", "attn.proj": "attn.proj",
                   "norm2": "mlp.norm", "mlp.fc1": "mlp.fc_in", "mlp.fc2": "mlp.fc_out"}
_MIXER_BLOCK_KEYS = {"norm1": "token_mlp.norm", "mlp_tokens.fc1": "token_mlp.fc_in",
                     "mlp_tokens.fc2": "token_mlp.fc_out", "norm2": "mlp.norm", "mlp_channels.fc1": "mlp.fc_in",
                     "mlp_channels.fc2": "mlp.fc_out"}


def from_timm(model: nn.Module) -> nn.Module:
    """Convert a timm ViT / DeiT (distilled too) / MLP-Mixer into the unitok family. Dropout
    rates come along where unitok drops at the same sites; others (drop_path_rate, drop_rate,
    a proj_drop_rate that would also drop the MLP's hidden layer, ...) are refused by name."""
    name = type(model).__name__
    converters = {"VisionTransformer": _convert_vit, "VisionTransformerDistilled": _convert_vit,
                  "MlpMixer": _convert_mixer}
    if name not in converters:
        raise ValueError(f"no converter for timm class {name}; supported: {', '.join(sorted(converters))}")
    return converters[name](model).to(next(model.parameters()).dtype).eval()


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"{_NOT_SUPPORTED}: {message}")


def _is_identity(module: nn.Module | None) -> bool:
    return module is None or isinstance(module, nn.Identity)


def _activation(mlp: nn.Module) -> str:
    act = type(mlp.act).__name__
    if act == "GELU" and getattr(mlp.act, "approximate", "none") == "tanh":
        return "gelu_tanh"
    _require(act in _ACTIVATIONS, f"activation {act}")
    return _ACTIVATIONS[act]


def _preprocess(model: nn.Module, channels: int) -> dict[str, Any]:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    out: dict[str, Any] = {}
    if not ("mean" in cfg and "std" in cfg) and channels != 3:  # ImageNet's RGB statistics fit 3 channels only
        out["mean"], out["std"] = (0.5,) * channels, (0.5,) * channels
    if "mean" in cfg and "std" in cfg:
        mean, std = tuple(cfg["mean"]), tuple(cfg["std"])
        if len(mean) != channels or len(std) != channels:
            # timm keeps its pretrained config's RGB values for a model made with in_chans=1 (or
            # another count): each channel takes their average
            mean, std = (sum(mean) / len(mean),) * channels, (sum(std) / len(std),) * channels
        out["mean"], out["std"] = mean, std
    if cfg.get("interpolation") in ("bicubic", "bilinear", "nearest"):
        out["interpolation"] = cfg["interpolation"]
    if "crop_pct" in cfg:
        out["crop_pct"] = cfg["crop_pct"]
    return out


def _state(rules: list[KeyRule], model: nn.Module, ours: nn.Module) -> dict[str, Any]:
    """``model``'s state dict in unitok's keys; a reference tensor no rule reads is an option unitok
    does not have, refused by name rather than dropped."""
    theirs = model.state_dict()
    refuse_unmapped(rules, theirs, _NOT_SUPPORTED)
    return to_ours(rules, theirs, ours.state_dict())


def _rate(module: nn.Module | None) -> float:
    """A dropout module's rate: nn.Dropout's ``p``, DropPath's ``drop_prob``, PatchDropout's ``prob``."""
    if _is_identity(module):
        return 0.0
    names = [name for name in ("p", "drop_prob", "prob") if hasattr(module, name)]
    _require(bool(names), f"dropout module {type(module).__name__}")
    return float(getattr(module, names[0]))


def _dropout(model: nn.Module, shared: dict[str, list[float]], absent: dict[str, list[float]], where: str) -> float:
    """The one ``dropout`` rate of a timm model (see `unitok.convert.dropout`), refusing rates
    unitok cannot reproduce by their timm option and value."""
    paths = [_rate(getattr(b, name)) for b in model.blocks
             for name in ("drop_path", "drop_path1", "drop_path2") if hasattr(b, name)]
    absent = {**absent, "drop_rate (before the head)": [_rate(getattr(model, "head_drop", None))],
              "drop_path_rate (stochastic depth)": paths}
    rate, rejected = one_rate(shared, absent)
    _require(not rejected, f"dropout {', '.join(rejected)}: {where}")
    return rate


def _vit_dropout(model: nn.Module) -> float:
    """timm's pos_drop_rate, attn_drop_rate and proj_drop_rate as unitok's one rate, if they fit it."""
    blocks = model.blocks
    shared = {"pos_drop_rate": [_rate(model.pos_drop)],
              "attn_drop_rate": [_rate(b.attn.attn_drop) for b in blocks],
              "proj_drop_rate (attention output)": [_rate(b.attn.proj_drop) for b in blocks],
              "proj_drop_rate (MLP output)": [_rate(b.mlp.drop2) for b in blocks]}
    absent = {"proj_drop_rate (MLP hidden layer)": [_rate(b.mlp.drop1) for b in blocks],
              "patch_drop_rate": [_rate(getattr(model, "patch_drop", None))]}
    return _dropout(model, shared, absent, "unitok's ViT drops at one rate (dropout) after the positions, on "
                    "attention weights and on each sublayer's output, and nowhere else")


def _mixer_dropout(model: nn.Module) -> float:
    """0, or a refusal: unitok's Mixer rate also drops the patch embeddings, which timm never
    does, and not the channel MLP's hidden layer, which timm's proj_drop_rate does."""
    mlps = [mlp for b in model.blocks for mlp in (b.mlp_tokens, b.mlp_channels)]
    return _dropout(model, {}, {"proj_drop_rate": [_rate(m.drop1) for m in mlps] + [_rate(m.drop2) for m in mlps]},
                    "unitok's MLP-Mixer drops at one rate (dropout) the patch embeddings too, and not the channel "
                    "MLP's hidden layer: only rate 0 converts exactly")


def _check_patch_conv(conv: nn.Conv2d) -> None:
    """A stride-P Conv2d kernel (D, C, P, P) is a Linear (D, C·P·P) on (C, P, P)-flattened patches."""
    _require(conv.kernel_size == conv.stride and conv.padding in (0, (0, 0)), "overlapping patch embedding")
    _require(conv.kernel_size[0] == conv.kernel_size[1], "non-square patches")


def _block_rules(n_layers: int, names: dict[str, str]) -> list[KeyRule]:
    """Per-block rules (``names``: timm sub-path -> unitok sublayer path)."""
    return [rule for i in range(n_layers)
            for rule in renames(names, f"blocks.{i}.", f"backbone.blocks.{i}.sublayers.")]


def vit_rules(n_layers: int) -> list[KeyRule]:
    """The key map of a timm `VisionTransformer` / `VisionTransformerDistilled`."""
    rules = [KeyRule("patch_embed.proj.weight", "patch_embed.weight", reshape=True),
             KeyRule("patch_embed.proj.bias", "patch_embed.bias")]
    rules += [KeyRule(theirs, ours) for theirs, ours in (("cls_token", "cls_token"), ("dist_token", "dist_token"),
                                                        ("reg_token", "reg_tokens"), ("pos_embed", "pos_embed"))]
    rules += renames({"norm_pre": "norm_pre", "norm": "backbone.norm", "fc_norm": "fc_norm", "head": "head",
                      "head_dist": "head_dist"})
    return rules + _block_rules(n_layers, _VIT_BLOCK_KEYS)


def mixer_rules(n_layers: int) -> list[KeyRule]:
    """The key map of a timm `MlpMixer`."""
    return [KeyRule("stem.proj.weight", "patch_embed.weight", reshape=True),
            KeyRule("stem.proj.bias", "patch_embed.bias"),
            *renames({"norm": "backbone.norm", "head": "head"}), *_block_rules(n_layers, _MIXER_BLOCK_KEYS)]


def _convert_vit(model: nn.Module) -> ViT:
    pe = model.patch_embed
    _require(_is_identity(getattr(pe, "norm", None)), "norm inside the patch embedding")
    _require(getattr(model, "attn_pool", None) is None, "attention pooling head (global_pool='map')")
    _require(model.global_pool in ("token", "avg"), f"global_pool={model.global_pool!r}")
    _require(not getattr(model, "pool_include_prefix", False), "pool_include_prefix=True (averaging the class token)")
    block0 = model.blocks[0]
    # the pre-norm block and plain attention unitok implements; others share their attribute names
    _require(type(block0).__name__ == "Block", f"block type {type(block0).__name__}")
    _require(type(block0.attn).__name__ == "Attention" and getattr(block0.attn, "gate", None) is None,
             f"attention type {type(block0.attn).__name__}{' (gated)' if getattr(block0.attn, 'gate', None) else ''}")
    for part in ("ls1", "ls2"):
        _require(_is_identity(getattr(block0, part, None)), "layer scale (init_values)")
    for part in ("q_norm", "k_norm", "norm"):
        _require(_is_identity(getattr(block0.attn, part, None)), f"attention {part}")
    _require(_is_identity(getattr(block0.mlp, "norm", None)), "norm inside the MLP")
    _require(type(block0.mlp).__name__ == "Mlp", f"MLP type {type(block0.mlp).__name__} (gated MLPs)")
    _require(isinstance(block0.norm1, nn.LayerNorm), f"norm layer {type(block0.norm1).__name__}")
    linears = {"qkv_bias": block0.attn.qkv, "proj_bias": block0.attn.proj, "mlp fc1 bias": block0.mlp.fc1,
               "mlp fc2 bias": block0.mlp.fc2}
    without = [name for name, m in linears.items() if m.bias is None]
    # unitok's `bias` switches every linear's and LayerNorm's bias together: all of them, or none
    _require(not without if block0.norm1.bias is not None else len(without) == len(linears),
             f"{' / '.join(without)}=False beside LayerNorms with biases" if without
             else "linear biases beside LayerNorms without them")
    _require(not (_is_identity(model.norm) and _is_identity(model.fc_norm)), "final_norm=False")
    distilled = type(model).__name__ == "VisionTransformerDistilled"
    conv = pe.proj
    head = model.head if isinstance(model.head, nn.Linear) else None
    use_fc_norm = not _is_identity(model.fc_norm)
    config = ViTConfig(
        image_size=tuple(pe.img_size) if pe.img_size is not None else (224, 224),
        patch_size=conv.kernel_size[0], channels=conv.in_channels,
        num_classes=head.out_features if head is not None else 0,
        d_model=conv.out_channels, n_layers=len(model.blocks), n_heads=block0.attn.num_heads,
        d_ff=block0.mlp.fc1.out_features, activation=_activation(block0.mlp),  # type: ignore[arg-type]
        norm_eps=block0.norm1.eps, bias=block0.attn.qkv.bias is not None,
        class_token=model.cls_token is not None, distill_token=distilled,
        num_registers=model.reg_token.shape[1] if getattr(model, "reg_token", None) is not None else 0,
        positions="learned" if model.pos_embed is not None else "none",
        positions_cover_prefix=not model.no_embed_class,
        pool="cls" if model.global_pool == "token" else "avg",
        pre_norm=not _is_identity(model.norm_pre), fc_norm=use_fc_norm, patch_bias=conv.bias is not None,
        dropout=_vit_dropout(model), **_preprocess(model, conv.in_channels),
    )
    _check_patch_conv(conv)
    ours = (DeiT if distilled else ViT)(config)
    load_state_dict_strict(ours, _state(vit_rules(config.n_layers), model, ours))
    return ours


def _convert_mixer(model: nn.Module) -> MLPMixer:
    _require(_is_identity(getattr(model.stem, "norm", None)), "norm inside the patch embedding")
    _require(model.global_pool == "avg", f"global_pool={model.global_pool!r}")
    block0 = model.blocks[0]
    _require(type(block0).__name__ == "MixerBlock", f"block type {type(block0).__name__} (gMLP/ResMLP)")
    _require(type(block0.mlp_tokens).__name__ == "Mlp" and type(block0.mlp_channels).__name__ == "Mlp",
             "gated MLPs")
    _require(isinstance(block0.norm1, nn.LayerNorm), f"norm layer {type(block0.norm1).__name__}")
    conv = model.stem.proj
    head = model.head if isinstance(model.head, nn.Linear) else None
    config = MixerConfig(
        image_size=tuple(model.stem.img_size), patch_size=conv.kernel_size[0], channels=conv.in_channels,
        num_classes=head.out_features if head is not None else 0, d_model=conv.out_channels,
        n_layers=len(model.blocks), token_mlp_dim=block0.mlp_tokens.fc1.out_features,
        d_ff=block0.mlp_channels.fc1.out_features, activation=_activation(block0.mlp_channels),  # type: ignore[arg-type]
        norm_eps=block0.norm1.eps, dropout=_mixer_dropout(model), **_preprocess(model, conv.in_channels),
    )
    _check_patch_conv(conv)
    ours = MLPMixer(config)
    load_state_dict_strict(ours, _state(mixer_rules(config.n_layers), model, ours))
    return ours


def _act_layer(activation: str) -> Any:
    """timm's activation layer for one of ours (tanh GELU as ``nn.GELU(approximate="tanh")``,
    the form `_activation` reads back)."""
    from timm.layers import get_act_layer

    return partial(nn.GELU, approximate="tanh") if activation == "gelu_tanh" else get_act_layer(activation)


def _pretrained_cfg(config: ImageConfig) -> dict[str, Any]:
    """The preprocessing timm keeps in ``pretrained_cfg`` (what `from_timm` reads back)."""
    return dict(input_size=(config.channels, *config.image_size), mean=config.mean, std=config.std,
                interpolation=config.interpolation, crop_pct=config.crop_pct, num_classes=config.num_classes)


def _timm_vit(config: ViTConfig) -> nn.Module:
    """An empty timm ViT / DeiT with ``config``'s shape; ValueError naming a field timm cannot express."""
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    if not config.bias:
        raise ValueError("ViTConfig.bias=False: timm's ViT keeps biases in its LayerNorms (and unitok's import "
                         "needs them); only bias=True exports")
    if config.positions == "sincos":
        raise ValueError("ViTConfig.positions='sincos' has no timm ViT equivalent (pos_embed is 'learn' or 'none')")
    if config.distill_token:
        for name, ok, want in (("pool", config.pool == "cls", "'cls'"), ("num_registers", not config.num_registers, "0"),
                               ("positions", config.positions == "learned", "'learned'"),
                               ("positions_cover_prefix", config.positions_cover_prefix, "True")):
            if not ok:
                raise ValueError(f"ViTConfig.{name}={getattr(config, name)!r}: timm's distilled ViT needs {name}={want}")
    cls = VisionTransformerDistilled if config.distill_token else VisionTransformer
    model = cls(
        img_size=config.image_size, patch_size=config.patch_size, in_chans=config.channels,
        num_classes=config.num_classes, global_pool="token" if config.pool == "cls" else "avg",
        embed_dim=config.d_model, depth=config.n_layers, num_heads=config.n_heads,
        mlp_ratio=mlp_ratio(config.backbone_config().hidden_dim, config.d_model), qkv_bias=True,
        class_token=config.class_token, pos_embed="learn" if config.positions == "learned" else "none",
        no_embed_class=not config.positions_cover_prefix, reg_tokens=config.num_registers,
        pre_norm=config.pre_norm, fc_norm=config.use_fc_norm, act_layer=_act_layer(config.activation),
        norm_layer=partial(nn.LayerNorm, eps=config.norm_eps), pos_drop_rate=config.dropout,
        proj_drop_rate=config.dropout, attn_drop_rate=config.dropout,
    )
    for block in model.blocks:  # proj_drop_rate also drops timm's MLP hidden layer, where unitok's ViT drops nothing
        block.mlp.drop1.p = 0.0
    conv = model.patch_embed.proj  # timm ties the patch bias to pre_norm; unitok has a field for it
    if config.patch_bias and conv.bias is None:
        conv.bias = nn.Parameter(conv.weight.new_zeros(conv.out_channels))
    elif not config.patch_bias and conv.bias is not None:
        conv.bias = None
    return model


def _timm_mixer(config: MixerConfig) -> nn.Module:
    """An empty timm `MlpMixer` with ``config``'s shape."""
    from timm.models.mlp_mixer import MlpMixer

    ratios = (mlp_ratio(config.token_mlp_dim, config.d_model), mlp_ratio(config.d_ff, config.d_model))
    return MlpMixer(
        num_classes=config.num_classes, img_size=config.image_size, in_chans=config.channels,
        patch_size=config.patch_size, num_blocks=config.n_layers, embed_dim=config.d_model, mlp_ratio=ratios,
        norm_layer=partial(nn.LayerNorm, eps=config.norm_eps), act_layer=_act_layer(config.activation),
        proj_drop_rate=config.dropout, global_pool="avg",
    )


def to_timm(model: nn.Module) -> nn.Module:
    """Convert a unitok `ViT` / `DeiT` / `MLPMixer` to timm's ``VisionTransformer`` /
    ``VisionTransformerDistilled`` / ``MlpMixer`` with the same logits (eval mode, at the
    configured image size); the preprocessing goes into ``pretrained_cfg``."""
    if isinstance(model, ViT):
        reference, rules = _timm_vit(model.config), vit_rules(model.config.n_layers)
    elif isinstance(model, MLPMixer):
        reference, rules = _timm_mixer(model.config), mixer_rules(model.config.n_layers)
    else:
        raise TypeError(f"to_timm cannot convert a {type(model).__name__}; supported unitok classes: "
                        "ViT, DeiT, MLPMixer")
    load_reference(reference, to_theirs(rules, model.state_dict(), reference.state_dict()))
    reference.pretrained_cfg = _pretrained_cfg(model.config)
    return placed_like(reference, model)
