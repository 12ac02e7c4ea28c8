"""CLIPTokenizer: open_clip's ids, padded to the longest caption, with a truncation policy
instead of open_clip's silent cut, and errors for empty captions."""

from __future__ import annotations

import pickle

import open_clip
import pytest
import torch

from tokenizers_mm import CLIPTokenizer, Tokens

CAPTIONS = ["a photo of the number seven.", "A diagram of a cat, sitting on a mat!", "hello   world", "ünïcödé café 42"]


def test_called_like_open_clip_it_gives_open_clips_ids():
    tok = CLIPTokenizer()
    assert torch.equal(tok(CAPTIONS), open_clip.tokenize(CAPTIONS))
    assert tok(CAPTIONS).shape == (4, 77)


def test_batch_encode_pads_to_the_longest_caption_with_a_mask():
    tok = CLIPTokenizer()
    batch = tok.batch_encode(CAPTIONS)
    assert isinstance(batch, Tokens)
    lengths = batch.attention_mask.sum(dim=1)
    assert batch.ids.shape == (4, int(lengths.max()))
    for row, n in zip(batch.ids, lengths.tolist(), strict=True):
        assert row[0] == tok.sot_id and row[n - 1] == tok.eot_id and (row[n:] == 0).all()
    assert torch.equal(batch.ids, open_clip.tokenize(CAPTIONS)[:, : batch.ids.shape[1]])


def test_decode_recovers_lower_cased_text():
    tok = CLIPTokenizer()
    assert tok.decode(tok.encode("A handwritten Seven.")) == "a handwritten seven ."


def test_captions_longer_than_the_context_are_an_error_by_default():
    long = "one two three four five six seven eight nine ten"
    with pytest.raises(ValueError, match="more than context_length=8"):
        CLIPTokenizer(context_length=8).encode(long)


def test_truncation_warns_and_keeps_the_end_token_like_open_clip():
    long = "one two three four five six seven eight nine ten"
    with pytest.warns(UserWarning, match="cut to 8"):
        ids = CLIPTokenizer(context_length=8, truncation="warn")([long])
    assert torch.equal(ids, open_clip.tokenize([long], context_length=8))
    assert ids[0, -1] == CLIPTokenizer().eot_id


@pytest.mark.parametrize("bad", ["", "   ", "&nbsp;", "\x00", "\n&amp;nbsp;\t"])
def test_captions_empty_once_cleaned_are_refused(bad):
    with pytest.raises(ValueError, match="empty"):
        CLIPTokenizer().encode(bad)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="truncation"):
        CLIPTokenizer(truncation="drop")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list of captions"):
        CLIPTokenizer().batch_encode("one caption")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty list"):
        CLIPTokenizer().batch_encode([])


def test_pickles_for_data_loader_workers():
    tok = pickle.loads(pickle.dumps(CLIPTokenizer(context_length=20, truncation="warn")))
    assert tok.context_length == 20 and tok.truncation == "warn"
    assert torch.equal(tok(CAPTIONS[:1]), open_clip.tokenize(CAPTIONS[:1], context_length=20))


LONG_CAPTION = " ".join(["cat"] * 90)  # 92 ids with start and end: longer than 77


@pytest.mark.parametrize("context_length", [8, 100])
def test_called_with_a_context_length_it_cuts_and_pads_like_open_clip(context_length):
    captions = [CAPTIONS[0], LONG_CAPTION, "hi"]
    expected = open_clip.tokenize(captions, context_length=context_length)
    assert torch.equal(CLIPTokenizer(truncation="silent")(captions, context_length=context_length), expected)
    kept = min(92, context_length)  # all 92 ids fit in 100; cut to 8, the caption keeps its end token
    assert int((expected[1] != 0).sum()) == kept and expected[1, kept - 1] == CLIPTokenizer().eot_id


def test_a_call_context_length_sets_the_limit_of_the_truncation_policy():
    assert torch.equal(CLIPTokenizer()([LONG_CAPTION], context_length=100),
                       open_clip.tokenize([LONG_CAPTION], context_length=100))
    with pytest.raises(ValueError, match="more than context_length=8"):
        CLIPTokenizer()(CAPTIONS, context_length=8)


@pytest.mark.parametrize("bad", [0, -5, 2, 7.0])
def test_a_context_length_that_cannot_hold_a_caption_is_refused(bad):
    with pytest.raises(ValueError, match=f"context_length must be an integer ≥ 3 .*got {bad}"):
        CLIPTokenizer()(CAPTIONS, context_length=bad)
    with pytest.raises(ValueError, match="context_length must be an integer ≥ 3"):
        CLIPTokenizer(context_length=bad)


def test_decode_takes_one_caption_and_batch_decode_a_batch():
    tok = CLIPTokenizer()
    ids = tok(CAPTIONS[:2])
    with pytest.raises(ValueError, match="decode takes one caption.*use batch_decode"):
        tok.decode(ids)
    assert tok.batch_decode(ids) == [tok.decode(row) for row in ids] == ["a photo of the number seven .",
                                                                         "a diagram of a cat , sitting on a mat !"]


def test_clip_tokenizers_are_equal_when_they_cut_the_same_context():
    assert CLIPTokenizer() == CLIPTokenizer() and hash(CLIPTokenizer()) == hash(CLIPTokenizer())
    assert CLIPTokenizer(context_length=32) != CLIPTokenizer()
    assert CLIPTokenizer(truncation="silent") != CLIPTokenizer()


def test_decode_drops_the_padding_after_the_end_token_even_when_keeping_special_tokens():
    tok = CLIPTokenizer()
    padded = tok(["a photo", "hi"])  # (2, 77), padded with id 0, which is also "!"
    kept = tok.batch_decode(padded, skip_special_tokens=False)
    assert kept == ["<start_of_text>a photo <end_of_text>", "<start_of_text>hi <end_of_text>"]
    from open_clip.tokenizer import SimpleTokenizer  # open_clip's own decode of the unpadded ids

    assert kept[0] == SimpleTokenizer().decode(tok.encode("a photo").tolist()).strip()
    assert tok.decode(padded[0]) == "a photo"
    # with no end token, id 0 is text: nothing marks it as padding
    assert tok.decode([tok.sot_id, 320, 0, 0], skip_special_tokens=False).endswith("!!")


@pytest.mark.parametrize("bad", [[True, 320], [49406, 320.0]], ids=["bool", "float"])
def test_decode_refuses_ids_that_are_not_integers(bad):
    with pytest.raises(TypeError, match=r"ids must be integers, got \[(True|320.0)\]"):
        CLIPTokenizer().decode(bad)  # True would read as id 1 ('"')


@pytest.mark.parametrize("bad", [True, 5.5, "8", 0])
def test_pad_to_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=f"pad_to must be an integer ≥ 1 or None, got {bad!r}"):
        CLIPTokenizer().batch_encode(CAPTIONS, pad_to=bad)
