"""timm -> unitok: `VisionTransformer` (ViT), `VisionTransformerDistilled` (DeiT), `MlpMixer`.

The converters read the timm module tree (timm keeps no config object) and refuse options
that unitok does not implement rather than dropping them.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from unitok.models.base import load_state_dict_strict
from unitok.models.mixer import MixerConfig, MLPMixer
from unitok.models.vit import DeiT, ViT, ViTConfig

_ACTIVATIONS = {"GELU": "gelu", "QuickGELU": "quick_gelu", "ReLU": "relu", "SiLU": "silu"}


def from_timm(model: nn.Module) -> nn.Module:
    """Convert a timm ViT / DeiT (distilled too) / MLP-Mixer into the unitok family."""
    name = type(model).__name__
    converters = {"VisionTransformer": _convert_vit, "VisionTransformerDistilled": _convert_vit,
                  "MlpMixer": _convert_mixer}
    if name not in converters:
        raise ValueError(f"no converter for timm class {name}; supported: {', '.join(sorted(converters))}")
    return converters[name](model).to(next(model.parameters()).dtype)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"timm model option not supported by unitok: {message}")


def _is_identity(module: nn.Module | None) -> bool:
    return module is None or isinstance(module, nn.Identity)


def _activation(mlp: nn.Module) -> str:
    act = type(mlp.act).__name__
    if act == "GELU" and getattr(mlp.act, "approximate", "none") == "tanh":
        return "gelu_tanh"
    _require(act in _ACTIVATIONS, f"activation {act}")
    return _ACTIVATIONS[act]


def _preprocess(model: nn.Module) -> dict[str, Any]:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    out: dict[str, Any] = {}
    if "mean" in cfg and "std" in cfg:
        out["mean"], out["std"] = tuple(cfg["mean"]), tuple(cfg["std"])
    if cfg.get("interpolation") in ("bicubic", "bilinear", "nearest"):
        out["interpolation"] = cfg["interpolation"]
    if "crop_pct" in cfg:
        out["crop_pct"] = cfg["crop_pct"]
    return out


def _conv_as_linear(conv: nn.Conv2d) -> tuple[Tensor, Tensor | None]:
    """A stride-P Conv2d kernel (D, C, P, P) is a Linear (D, C·P·P) on (C, P, P)-flattened patches."""
    _require(conv.kernel_size == conv.stride and conv.padding in (0, (0, 0)), "overlapping patch embedding")
    weight = conv.weight.detach().reshape(conv.out_channels, -1)
    return weight, conv.bias.detach() if conv.bias is not None else None


def _block_state(blocks: nn.Module, names: dict[str, str], prefix: str = "backbone.blocks") -> dict[str, Tensor]:
    """Rename per-block timm parameters (``names``: timm sub-path -> unitok sublayer path)."""
    state = {}
    for i, block in enumerate(blocks):
        own = dict(block.state_dict())
        for theirs, ours in names.items():
            for leaf in ("weight", "bias"):
                key = f"{theirs}.{leaf}"
                if key in own:
                    state[f"{prefix}.{i}.sublayers.{ours}.{leaf}"] = own[key]
    return state


def _convert_vit(model: nn.Module) -> ViT:
    pe = model.patch_embed
    _require(_is_identity(getattr(pe, "norm", None)), "norm inside the patch embedding")
    _require(getattr(model, "attn_pool", None) is None, "attention pooling head (global_pool='map')")
    _require(model.global_pool in ("token", "avg"), f"global_pool={model.global_pool!r}")
    block0 = model.blocks[0]
    for part in ("ls1", "ls2"):
        _require(_is_identity(getattr(block0, part, None)), "layer scale (init_values)")
    for part in ("q_norm", "k_norm", "norm"):
        _require(_is_identity(getattr(block0.attn, part, None)), f"attention {part}")
    _require(_is_identity(getattr(block0.mlp, "norm", None)), "norm inside the MLP")
    _require(type(block0.mlp).__name__ == "Mlp", f"MLP type {type(block0.mlp).__name__} (gated MLPs)")
    _require(isinstance(block0.norm1, nn.LayerNorm), f"norm layer {type(block0.norm1).__name__}")
    linears = [block0.attn.qkv, block0.attn.proj, block0.mlp.fc1, block0.mlp.fc2]
    _require(len({m.bias is not None for m in linears}) == 1 and block0.norm1.bias is not None,
             "biases on some linear layers but not others (qkv_bias / proj_bias)")
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
        **_preprocess(model),
    )
    _require(conv.kernel_size[0] == conv.kernel_size[1], "non-square patches")
    ours = (DeiT if distilled else ViT)(config)
    weight, bias = _conv_as_linear(conv)
    state = {"patch_embed.weight": weight, "patch_embed.bias": bias}
    for theirs, key in (("cls_token", "cls_token"), ("dist_token", "dist_token"), ("reg_token", "reg_tokens"),
                        ("pos_embed", "pos_embed")):
        value = getattr(model, theirs, None)
        if value is not None:
            state[key] = value.detach()
    for theirs, key in (("norm_pre", "norm_pre"), ("norm", "backbone.norm"), ("fc_norm", "fc_norm"),
                        ("head", "head"), ("head_dist", "head_dist")):
        module = getattr(model, theirs, None)
        if module is not None and not _is_identity(module):
            for leaf, value in module.state_dict().items():
                state[f"{key}.{leaf}"] = value
    state.update(_block_state(model.blocks, {
        "norm1": "attn.norm", "attn.qkv": "attn.qkv", "attn.proj": "attn.proj",
        "norm2": "mlp.norm", "mlp.fc1": "mlp.fc_in", "mlp.fc2": "mlp.fc_out",
    }))
    state = {k: v for k, v in state.items() if v is not None}
    load_state_dict_strict(ours, state)
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
        norm_eps=block0.norm1.eps, **_preprocess(model),
    )
    ours = MLPMixer(config)
    weight, bias = _conv_as_linear(conv)
    state = {"patch_embed.weight": weight, "patch_embed.bias": bias}
    for leaf, value in model.norm.state_dict().items():
        state[f"backbone.norm.{leaf}"] = value
    if head is not None:
        state.update({f"head.{k}": v for k, v in head.state_dict().items()})
    state.update(_block_state(model.blocks, {
        "norm1": "token_mlp.norm", "mlp_tokens.fc1": "token_mlp.fc_in", "mlp_tokens.fc2": "token_mlp.fc_out",
        "norm2": "mlp.norm", "mlp_channels.fc1": "mlp.fc_in", "mlp_channels.fc2": "mlp.fc_out",
    }))
    load_state_dict_strict(ours, {k: v for k, v in state.items() if v is not None})
    return ours


