"""Key maps shared by both directions of conversion: one table per family says where each
reference tensor lives in the unitok model, and `to_ours` / `to_theirs` read it either way.

A `KeyRule` names the reference key (or several, concatenated along dim 0 into one of our
fused projections), our key, and how the tensor changes shape on the way: ``transpose``
(GPT-2's Conv1D, open_clip's ``x @ proj``) or ``reshape`` to the other side's shape (a stride-P
Conv2d kernel as a Linear on flattened patches, a (D,) class embedding as (1, 1, D)). A rule
whose source keys are all absent is skipped, so one table covers optional parts (a pooler,
a classifier head); the strict loaders then say what is missing, and `refuse_unmapped` what
no rule reads (a part of the reference unitok would otherwise drop without a word).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from unitok.models.base import load_state_dict_strict


@dataclass(frozen=True)
class KeyRule:
    """Reference key(s) ``theirs`` <-> unitok key ``ours`` (see the module docstring)."""

    theirs: str | tuple[str, ...]
    ours: str
    transpose: bool = False
    reshape: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.theirs, tuple) and (self.transpose or self.reshape):
            raise ValueError("a fused rule (several reference keys) is neither transposed nor reshaped")
        if self.transpose and self.reshape:
            raise ValueError("a rule transposes or reshapes, not both")

    @property
    def sources(self) -> tuple[str, ...]:
        return self.theirs if isinstance(self.theirs, tuple) else (self.theirs,)


def leaves(theirs: str, ours: str, names: Iterable[str] = ("weight", "bias")) -> list[KeyRule]:
    """One rule per parameter of a module: ``theirs.weight -> ours.weight`` and so on."""
    return [KeyRule(f"{theirs}.{leaf}", f"{ours}.{leaf}") for leaf in names]


def renames(table: Mapping[str, str], theirs_prefix: str = "", ours_prefix: str = "",
            names: Iterable[str] = ("weight", "bias")) -> list[KeyRule]:
    """`leaves` for every module of a ``{their sub-path: our sub-path}`` table under two prefixes."""
    names = tuple(names)
    return [rule for theirs, ours in table.items()
            for rule in leaves(f"{theirs_prefix}{theirs}", f"{ours_prefix}{ours}", names)]


def invert(mapping: Mapping[str, str]) -> dict[str, str]:
    """``{reference name: ours}`` -> ``{ours: the first reference name}`` (activation tables)."""
    out: dict[str, str] = {}
    for theirs, ours in mapping.items():
        out.setdefault(ours, theirs)
    return out


def mlp_ratio(hidden: int, dim: int) -> float:
    """A ratio whose ``int(dim * ratio)`` (how timm and open_clip size their MLPs) is ``hidden``."""
    ratio = hidden / dim
    return ratio if int(dim * ratio) == hidden else (hidden + 0.5) / dim


def to_ours(rules: Iterable[KeyRule], theirs: Mapping[str, Tensor], ours: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A reference state dict -> unitok keys; ``ours`` (the target's state dict) gives shapes."""
    out: dict[str, Tensor] = {}
    for rule in rules:
        present = [k in theirs for k in rule.sources]
        if not any(present):
            continue
        if not all(present):
            missing = [k for k, here in zip(rule.sources, present) if not here]
            raise KeyError(f"reference state dict has part of fused {rule.ours}: missing {missing}")
        value = torch.cat([theirs[k].detach() for k in rule.sources]) if len(rule.sources) > 1 \
            else theirs[rule.sources[0]].detach()
        if rule.transpose:
            value = value.t().contiguous()
        if rule.reshape and rule.ours in ours:
            value = value.reshape(ours[rule.ours].shape)
        out[rule.ours] = value
    return out


def unmapped(rules: Iterable[KeyRule], theirs: Mapping[str, Tensor]) -> list[str]:
    """Reference keys no rule reads: a part of the reference the key map does not know (a gate,
    a different attention), which `to_ours` would drop without a word."""
    read = {key for rule in rules for key in rule.sources}
    return sorted(key for key in theirs if key not in read)


def refuse_unmapped(rules: Iterable[KeyRule], theirs: Mapping[str, Tensor], source: str,
                    ignore: Iterable[str] = ()) -> None:
    """ValueError naming the `unmapped` reference keys (``source`` first) unless ``ignore`` lists
    them: tensors that are known not to be parameters of the model (a buffer the reference
    rebuilds, a tied alias of a tensor a rule reads, a tensor the converter reads itself). An
    ``ignore`` entry matches a key whole or as its dotted tail ("attn.bias": every layer's)."""
    ignore = tuple(ignore)
    left = [key for key in unmapped(rules, theirs)
            if not any(key == tail or key.endswith(f".{tail}") for tail in ignore)]
    if left:
        more = f" … ({len(left)} in all)" if len(left) > 6 else ""
        raise ValueError(f"{source}: parameters unitok has no place for: {', '.join(left[:6])}{more}")


def to_theirs(rules: Iterable[KeyRule], ours: Mapping[str, Tensor], theirs: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A unitok state dict -> reference keys; ``theirs`` (the target's state dict) gives shapes."""
    out: dict[str, Tensor] = {}
    for rule in rules:
        if rule.ours not in ours:
            continue
        value = ours[rule.ours].detach()
        if rule.transpose:
            value = value.t().contiguous()
        if len(rule.sources) > 1:
            sizes = [theirs[k].shape[0] for k in rule.sources]
            out.update(zip(rule.sources, torch.split(value, sizes)))
            continue
        key = rule.sources[0]
        if rule.reshape and key in theirs:
            value = value.reshape(theirs[key].shape)
        out[key] = value
    return out


def aliased_keys(module: nn.Module) -> tuple[str, ...]:
    """State-dict keys whose tensor is an earlier key's (tied weights): loading one fills both."""
    seen: set[tuple] = set()
    aliased = []
    for key, value in module.state_dict(keep_vars=True).items():
        ident = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape)) if value.numel() \
            else (id(value),)
        if ident in seen:
            aliased.append(key)
        seen.add(ident)
    return tuple(aliased)


def placed_like(reference: nn.Module, model: nn.Module) -> nn.Module:
    """``reference`` moved to ``model``'s device and dtype, in eval mode (what exporters return)."""
    param = next(model.parameters())
    return reference.to(device=param.device, dtype=param.dtype).eval()


def load_reference(module: nn.Module, state: dict[str, Tensor], ignore: tuple[str, ...] = ()) -> None:
    """Strictly copy ``state`` into a reference model (tied aliases and ``ignore`` may be absent)."""
    load_state_dict_strict(module, state, ignore=aliased_keys(module) + ignore)
