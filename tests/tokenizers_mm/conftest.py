"""Fixtures shared by the tokenizer tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tokenizers import Tokenizer

from tokenizers_mm import BPETokenizer, tiktoken_engine


@pytest.fixture
def hf_only() -> Callable[[Tokenizer], BPETokenizer]:
    """``hf_only(tokenizer)``: a BPETokenizer on the same vocabulary that never finds tiktoken, so
    its encode and batch_encode take the Hugging Face path (batch_encode: the Rust batch encoder)."""

    def make(tokenizer: Tokenizer) -> BPETokenizer:
        reference = BPETokenizer(tokenizer)
        with pytest.MonkeyPatch.context() as patch:  # undoes only this, not the test's own patches
            patch.setattr(tiktoken_engine, "tiktoken", None)
            # the engine looks for tiktoken once, now, and remembers it is not there
            assert reference._fast.encode(tokenizer, "x") is None
        assert reference._fast.encode(tokenizer, "x") is None  # still none with tiktoken back
        return reference

    return make
