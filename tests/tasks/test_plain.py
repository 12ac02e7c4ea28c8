"""`tasks.plain`: what prediction records and recorded settings are written as."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from jsonargparse import Namespace

from tasks.plain import plain


def test_values_become_json_types_and_non_finite_numbers_none():
    value = {"t": torch.tensor([1.5, math.nan]), "n": np.float32(2.0), "a": np.arange(2), "p": Path("a/b"),
             "ns": Namespace(lr=0.1, sizes=(1, 2)), 3: (math.inf, True, None, "x")}
    assert plain(value) == {"t": [1.5, None], "n": 2.0, "a": [0, 1], "p": "a/b", "ns": {"lr": 0.1, "sizes": [1, 2]},
                            "3": [None, True, None, "x"]}
