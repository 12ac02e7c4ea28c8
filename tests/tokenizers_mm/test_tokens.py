"""Tokens batches and collate: padding sides, masks, features, and refusing malformed batches."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch

from tokenizers_mm import PatchTokenizer, Tokens, collate


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
    """Every tensor field goes to the device (the meta device: no data, but a device no tensor
    starts on), keeping its shape and dtype; the modality and grid stay as they were."""
    B, N = 2, 4
    per_token = dict(attention_mask=torch.ones(B, N, dtype=torch.long), positions=torch.arange(N).expand(B, N),
                     segments=torch.zeros(B, N, dtype=torch.long))
    text = Tokens(ids=torch.zeros(B, N, dtype=torch.long), **per_token)
    image = Tokens(features=torch.rand(B, N, 48), modality="image", grid=(2, 2), **per_token)
    tensor_fields = {f.name for f in fields(Tokens) if "Tensor" in str(f.type)}
    assert tensor_fields == {"ids", "features", "attention_mask", "positions", "segments"}  # all covered below
    for tokens in (text, image):
        moved = tokens.to("meta")
        for name in tensor_fields:
            before, after = getattr(tokens, name), getattr(moved, name)
            if before is None:
                assert after is None, name
                continue
            assert after.device.type == "meta", name
            assert (after.shape, after.dtype) == (before.shape, before.dtype), name
        assert (moved.modality, moved.grid) == (tokens.modality, tokens.grid)


def test_collate_keeps_the_grid_of_image_tokens_so_the_batch_decodes():
    tok = PatchTokenizer(patch_size=4)
    images = torch.rand(2, 3, 8, 12)
    batch = collate([tok(images[0]), tok(images[1])])
    assert batch.grid == (2, 3) and batch.modality == "image" and batch.attention_mask.eq(1).all()
    torch.testing.assert_close(tok.decode(batch), images)


def test_collate_refuses_image_tokens_of_different_grids_naming_them():
    tok = PatchTokenizer(patch_size=4)
    with pytest.raises(ValueError, match=r"different patch grids \[\(2, 2\), \(2, 3\)\].*resize the images"):
        collate([tok(torch.rand(3, 8, 8)), tok(torch.rand(3, 8, 12))])
    with pytest.raises(ValueError, match=r"different patch grids \[\(2, 2\), None\] \(None: no grid\)"):
        collate([tok(torch.rand(3, 8, 8)), torch.rand(4, 48)])
    masked = Tokens(features=torch.rand(1, 4, 48), attention_mask=torch.tensor([[1, 1, 1, 0]]), modality="image",
                    grid=(2, 2))
    with pytest.raises(ValueError, match=r"grid 2×2 must hold 4 unmasked patches, got 3"):
        collate([masked, tok(torch.rand(3, 8, 8))])


def test_collate_pads_on_the_items_device():
    # "meta" stands for any device other than the CPU: padding and mask made on the CPU would not join them
    batch = collate([torch.tensor([1, 2], device="meta"), torch.tensor([3], device="meta")])
    assert batch.ids.device.type == "meta" and batch.attention_mask.device.type == "meta"
    features = collate([torch.ones(3, 4, device="meta"), torch.ones(1, 4, device="meta")], padding_side="left")
    assert features.features.shape == (2, 3, 4) and features.attention_mask.device.type == "meta"


def test_collate_refuses_a_pad_id_that_is_no_id_and_rows_of_other_feature_widths():
    with pytest.raises(ValueError, match="pad_id must be an integer ≥ 0, got None"):
        collate([[1, 2], [3]], pad_id=None)
    with pytest.raises(ValueError, match="pad_id must be an integer ≥ 0, got 0.5"):
        collate([[1, 2], [3]], pad_id=0.5)
    assert collate([[1, 2], [3]], pad_id=np.int64(7)).ids.tolist() == [[1, 2], [3, 7]]
    with pytest.raises(ValueError, match="item 1 has 3 features a token but item 0 has 4"):
        collate([torch.zeros(2, 4), torch.zeros(5, 3)])
