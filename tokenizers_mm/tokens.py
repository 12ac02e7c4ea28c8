"""The `Tokens` batch: what every tokenizer produces and every model reads.

Axis legend: B batch, N tokens, F feature width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from tokenizers_mm.checks import check_int


@dataclass(frozen=True)
class Tokens:
    """A padded batch of token sequences of one modality.

    Exactly one of ``ids`` (B, N) integer ids or ``features`` (B, N, F) continuous vectors is set.
    ``attention_mask`` (B, N) is 1 for real tokens and 0 for padding; ``positions`` and
    ``segments`` (B, N) are optional per-token integers (position ids, segment/type ids).
    ``grid`` records the (rows, columns) layout of image patches, so models can place them.
    """

    ids: Tensor | None = None
    features: Tensor | None = None
    attention_mask: Tensor | None = None
    positions: Tensor | None = None
    segments: Tensor | None = None
    modality: str = "text"
    grid: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if (self.ids is None) == (self.features is None):
            raise ValueError("Tokens needs exactly one of `ids` (B, N) or `features` (B, N, F)")
        if self.ids is not None:
            if self.ids.dim() != 2:
                raise ValueError(f"Tokens.ids must be (batch, tokens), got shape {tuple(self.ids.shape)}")
            if self.ids.dtype.is_floating_point:
                raise ValueError(f"Tokens.ids must be integers, got {self.ids.dtype}")
        if self.features is not None and self.features.dim() != 3:
            raise ValueError(
                f"Tokens.features must be (batch, tokens, features), got shape {tuple(self.features.shape)}"
            )
        bn = self.shape
        for name in ("attention_mask", "positions", "segments"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != bn:
                raise ValueError(f"Tokens.{name} must have shape {bn}, got {tuple(value.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        """(batch, tokens)."""
        data = self.ids if self.ids is not None else self.features
        return tuple(data.shape[:2])  # type: ignore[union-attr,return-value]

    @property
    def batch_size(self) -> int:
        return self.shape[0]

    @property
    def seq_len(self) -> int:
        return self.shape[1]

    def to(self, device: torch.device | str) -> Tokens:
        """Move every tensor to ``device``."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return replace(self, **moved)

    def __len__(self) -> int:
        return self.batch_size


def collate(
    sequences: Sequence[Tokens | Tensor | Sequence[int]],
    pad_id: int = 0,
    padding_side: str = "right",
    modality: str | None = None,
) -> Tokens:
    """Pad variable-length sequences into one `Tokens` batch.

    Items may be 1-D id tensors / lists, 2-D (N, F) feature tensors, or single-row `Tokens`.
    Padding goes on the right (encoders, training) or on the left (batched generation), on the
    items' device. Image `Tokens` keep their patch ``grid`` when every item has the same one (they
    then need no padding); images of different grids are refused (resize them to one size).
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if len(sequences) == 0:
        raise ValueError("collate needs at least one sequence, got an empty list")
    pad_id = check_int("pad_id", pad_id, 0)  # an id: 0.5 or None would be cast or fail inside torch
    rows: list[dict[str, Tensor]] = []
    kind = None
    # image Tokens' positions are laid out by their patch grid: a batch keeps it only if it is every item's
    grids = {tuple(item.grid) if isinstance(item, Tokens) and item.grid is not None else None for item in sequences}
    if len(grids) > 1:
        raise ValueError(f"items of different patch grids {sorted(grids, key=str)} (None: no grid) cannot share a "
                         "batch: resize the images to one size")
    (grid,) = grids
    for i, item in enumerate(sequences):
        if isinstance(item, Tokens):
            if item.batch_size != 1:
                raise ValueError(f"collate takes single-row Tokens, item {i} has batch {item.batch_size}")
            mask = item.attention_mask[0] if item.attention_mask is not None else None
            row = {"data": (item.ids if item.ids is not None else item.features)[0]}
            if mask is not None:
                keep = mask.bool()
                row = {"data": row["data"][keep]}
            for name in ("positions", "segments"):
                value = getattr(item, name)
                if value is not None:
                    row[name] = value[0][keep] if mask is not None else value[0]
            modality = modality or item.modality
        else:
            row = {"data": torch.as_tensor(item)}
        data = row["data"]
        item_kind = "ids" if data.dim() == 1 else "features" if data.dim() == 2 else None
        if item_kind is None:
            raise ValueError(f"item {i}: expected 1-D ids or 2-D (tokens, features), got shape {tuple(data.shape)}")
        if kind is not None and item_kind != kind:
            raise ValueError(f"item {i} holds {item_kind} but earlier items hold {kind}")
        if data.shape[0] == 0:
            raise ValueError(f"item {i} is empty: every sequence needs at least one token")
        if item_kind == "features" and rows and data.shape[1] != rows[0]["data"].shape[1]:
            raise ValueError(f"item {i} has {data.shape[1]} features a token but item 0 has "
                             f"{rows[0]['data'].shape[1]}: one batch holds one feature width")
        kind = item_kind
        rows.append(row)

    longest = max(r["data"].shape[0] for r in rows)
    short = [r["data"].shape[0] for r in rows if grid is not None and r["data"].shape[0] != grid[0] * grid[1]]
    if short:
        raise ValueError(f"image Tokens of grid {grid[0]}×{grid[1]} must hold {grid[0] * grid[1]} unmasked "
                         f"patches, got {short[0]}: a grid's patches cannot be masked out or padded")
    batch: dict[str, list[Tensor]] = {"data": [], "attention_mask": []}
    extra = {name for r in rows for name in r if name != "data"}
    for name in extra:
        if not all(name in r for r in rows):
            raise ValueError(f"some items carry {name} and others do not")
        batch[name] = []
    for r in rows:
        n, device = r["data"].shape[0], r["data"].device
        pad = longest - n
        mask = torch.ones(n, dtype=torch.long, device=device)
        for name, value in r.items():
            fill = pad_id if name == "data" and kind == "ids" else 0
            shape = (pad, *value.shape[1:])
            padding = torch.full(shape, fill, dtype=value.dtype, device=value.device)
            batch[name].append(torch.cat([padding, value] if padding_side == "left" else [value, padding]))
        zeros = torch.zeros(pad, dtype=torch.long, device=device)
        batch["attention_mask"].append(torch.cat([zeros, mask] if padding_side == "left" else [mask, zeros]))
    stacked = {name: torch.stack(values) for name, values in batch.items()}
    data = stacked.pop("data")
    return Tokens(
        ids=data if kind == "ids" else None,
        features=data if kind == "features" else None,
        modality=modality or "text",
        grid=grid,
        **stacked,
    )
