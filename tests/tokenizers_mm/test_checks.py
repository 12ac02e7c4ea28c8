"""`check_int`: the one check every package uses for a count — a whole number at least its
minimum, refused by name otherwise (never rounded, never read as "from the end")."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tokenizers_mm.checks import check_int


def test_whole_numbers_pass_as_python_ints():
    assert check_int("n", 3) == 3
    assert type(check_int("n", np.int64(3))) is int  # numpy's integers, as arrays hand them out
    assert check_int("n", 0, at_least=0) == 0
    assert check_int("n", None, or_none=True) is None


@pytest.mark.parametrize("bad", [0, -2, 2.5, 2.0, True, "3", None, np.float32(3)])
def test_anything_else_is_refused_with_the_name_the_minimum_and_the_value(bad):
    with pytest.raises(ValueError, match=re.escape(f"batch_size must be an integer ≥ 1, got {bad!r}")):
        check_int("batch_size", bad)


def test_the_message_says_what_a_value_means_and_that_none_is_allowed():
    with pytest.raises(ValueError, match=r"num_beams must be an integer ≥ 1 \(1: no beam search\), got 0"):
        check_int("num_beams", 0, note="(1: no beam search)")
    with pytest.raises(ValueError, match=r"max_length must be an integer ≥ 1 or None, got -1"):
        check_int("max_length", -1, or_none=True)



def test_check_number_refuses_nan_infinity_non_numbers_and_values_out_of_bounds():
    from tokenizers_mm.checks import check_number

    assert check_number("rate", 0.5, 0.0, 1.0) == 0.5 and check_number("rate", 1, 0.0, 1.0) == 1.0
    for bad, message in ((float("nan"), "rate must be a finite number in \\[0, 1\\], got nan"),  # a bare `< 0` lets NaN pass
                         (float("inf"), "got inf"), (True, "got True"), ("0.5", "got '0.5'"), (1.5, "got 1.5")):
        with pytest.raises(ValueError, match=message):
            check_number("rate", bad, 0.0, 1.0)
    with pytest.raises(ValueError, match="beta must be a finite number in \\[0, 1\\), got 1.0"):
        check_number("beta", 1.0, 0.0, 1.0, high_open=True)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0, got 0.0"):
        check_number("temperature", 0.0, 0.0, low_open=True)
    with pytest.raises(ValueError, match="penalty must be a finite number, got nan"):
        check_number("penalty", float("nan"))
