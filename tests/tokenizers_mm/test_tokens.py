"""Tokens batches and collate: padding sides, masks, features, and refusing malformed batches."""

from __future__ import annotations

import pytest
import torch

from tokenizers_mm import Tokens, collate


def test_collate_ids_right_padding():
    batch = collate([[5, 6, 7], [8]], pad_id=0)
    assert batch.ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.modality == "text"


def test_collate_ids_left_padding():
    batch = collate([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_id=9, padding_side="left")
    assert batch.ids.tolist() == [[5, 6, 7], [9, 9, 8]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_collate_features_pads_with_zeros():
    batch = collate([torch.ones(3, 4), torch.ones(1, 4)], modality="audio")
    assert batch.features.shape == (2, 3, 4) and batch.ids is None
    assert batch.features[1, 1:].eq(0).all() and batch.modality == "audio"


def test_collate_single_row_tokens_keeps_segments():
    a = Tokens(ids=torch.tensor([[1, 2]]), segments=torch.tensor([[0, 1]]))
    b = Tokens(ids=torch.tensor([[3]]), segments=torch.tensor([[1]]))
    batch = collate([a, b])
    assert batch.segments.tolist() == [[0, 1], [1, 0]]


def test_tokens_validation_names_the_problem():
    with pytest.raises(ValueError, match="exactly one"):
        Tokens()
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        Tokens(ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="integers"):
        Tokens(ids=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="empty"):
        collate([[1], []])
    with pytest.raises(ValueError, match="at least one"):
        collate([])
    with pytest.raises(ValueError, match="padding_side"):
        collate([[1]], padding_side="middle")


def test_to_moves_every_tensor():
    t = Tokens(ids=torch.zeros(1, 2, dtype=torch.long), attention_mask=torch.ones(1, 2)).to("cpu")
    assert t.ids.device.type == "cpu" and t.attention_mask.device.type == "cpu"
