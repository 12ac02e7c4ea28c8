"""CTC decoding: greedy collapses repeats and drops blanks along the best path; prefix beam
search scores each labelling by the sum over all of its alignments, so on hand-built tables it
finds the most probable labelling where greedy does not, matches brute-force enumeration on
small random tables, and with beam 1 equals greedy on peaky (trained-model-like) outputs."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from unitok.ctc import Lexicon, ctc_decode, ctc_greedy_decode, ctc_prefix_beam_search


def table(rows: list[list[float]]) -> torch.Tensor:
    """Per-frame probabilities (T, V) -> log-probabilities (1, T, V)."""
    return torch.tensor(rows).log()[None]


def collapse(path: tuple[int, ...], blank: int = 0) -> tuple[int, ...]:
    out, previous = [], None
    for label in path:
        if label != previous and label != blank:
            out.append(label)
        previous = label
    return tuple(out)


def most_probable_labelling(probs: torch.Tensor) -> tuple[tuple[int, ...], float]:
    """Brute force over every alignment of a (T, V) table: the labelling with the largest total probability."""
    totals: dict[tuple[int, ...], float] = {}
    T, V = probs.shape
    for path in itertools.product(range(V), repeat=T):
        p = math.prod(float(probs[t, v]) for t, v in enumerate(path))
        key = collapse(path)
        totals[key] = totals.get(key, 0.0) + p
    best = max(totals, key=totals.get)
    return best, totals[best]


def peaky(T: int, V: int, seed: int, top: float = 0.8) -> torch.Tensor:
    """(1, T, V) log-probabilities where one label per frame holds ≥ ``top`` of the mass."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(T, V, generator=g), -1) * (1 - top)
    probs[torch.arange(T), torch.randint(0, V, (T,), generator=g)] += top
    return probs.log()[None]


# --------------------------------------------------------------------------- greedy


def test_greedy_collapses_repeats_and_drops_blanks():
    #          a    a    -    a    b    b    -
    best = [1, 1, 0, 1, 2, 2, 0]
    log_probs = torch.full((1, 7, 3), -5.0)
    log_probs[0, torch.arange(7), torch.tensor(best)] = 0.0
    assert ctc_greedy_decode(log_probs) == [[1, 1, 2]]  # a blank separates the two a's


def test_greedy_ignores_frames_past_each_length():
    log_probs = torch.full((2, 4, 3), -5.0)
    log_probs[:, :, 2] = 0.0  # every frame says "b"
    log_probs[0, 0, 1] = 1.0  # frame 0 of row 0 says "a"
    assert ctc_greedy_decode(log_probs, torch.tensor([1, 0])) == [[1], []]


# --------------------------------------------------------------------------- prefix beam search


def test_beam_search_finds_the_labelling_greedy_misses():
    # Two frames, blank 0.6 / "a" 0.4 each. Greedy takes blank-blank: "" with probability 0.36.
    # "a" has three alignments (a-a, a-blank, blank-a): 0.16 + 0.24 + 0.24 = 0.64.
    log_probs = table([[0.6, 0.4], [0.6, 0.4]])
    assert ctc_greedy_decode(log_probs) == [[]]
    assert ctc_prefix_beam_search(log_probs, beam_size=2) == [[1]]
    assert most_probable_labelling(log_probs[0].exp())[0] == (1,)


def test_beam_search_finds_the_best_labelling_over_three_labels_where_greedy_does_not():
    #       blank   a     b
    rows = [[0.50, 0.30, 0.20],
            [0.50, 0.30, 0.20],
            [0.10, 0.45, 0.45],
            [0.50, 0.10, 0.40]]
    log_probs = table(rows)
    best, p_best = most_probable_labelling(torch.tensor(rows))
    greedy = ctc_greedy_decode(log_probs)[0]
    assert tuple(greedy) != best  # greedy's best single path collapses to a less probable labelling
    assert ctc_prefix_beam_search(log_probs, beam_size=8) == [list(best)]
    assert p_best > 0.2


@pytest.mark.parametrize("seed", range(6))
def test_wide_beam_search_equals_brute_force_enumeration(seed):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(5, 3, generator=g) * 1.5, -1)
    best, _ = most_probable_labelling(probs)
    assert ctc_prefix_beam_search(probs.log()[None], beam_size=64) == [list(best)]


def test_beam_one_equals_greedy_on_peaky_outputs():
    # A trained CTC model is peaky: one label dominates each frame. There the single best prefix
    # and the best path agree. (On flat tables they can differ even with beam 1: beam search
    # ranks prefixes by the sum over alignments, greedy follows one path.)
    for seed in range(200):
        log_probs = peaky(T=12, V=5, seed=seed)
        assert ctc_prefix_beam_search(log_probs, beam_size=1) == ctc_greedy_decode(log_probs), seed


def test_beam_search_decodes_a_batch_with_padding_ignored():
    one = peaky(T=6, V=4, seed=1)
    two = peaky(T=9, V=4, seed=2)
    padded = torch.full((2, 9, 4), math.log(0.25))
    padded[0, :6], padded[1] = one[0], two[0]
    expected = ctc_prefix_beam_search(one, beam_size=4) + ctc_prefix_beam_search(two, beam_size=4)
    assert ctc_prefix_beam_search(padded, torch.tensor([6, 9]), beam_size=4) == expected


def test_a_blank_other_than_zero_and_pruning_are_supported():
    log_probs = table([[0.4, 0.6], [0.4, 0.6]])  # blank is label 1 here: "0" wins, as in the first test
    assert ctc_prefix_beam_search(log_probs, beam_size=2, blank=1) == [[0]]
    assert ctc_greedy_decode(log_probs, blank=1) == [[]]
    assert ctc_prefix_beam_search(log_probs, beam_size=2, blank=1, prune=math.log(0.5)) == [[]]


def test_bad_decoder_input_is_refused():
    with pytest.raises(ValueError, match="batch, frames, labels"):
        ctc_greedy_decode(torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"lengths must be \(batch,\) values in \[0, 4\]"):
        ctc_prefix_beam_search(torch.zeros(1, 4, 3), torch.tensor([5]))
    with pytest.raises(ValueError, match="beam_size must be an integer ≥ 1, got 0"):
        ctc_prefix_beam_search(torch.zeros(1, 4, 3), beam_size=0)
    with pytest.raises(ValueError, match="blank=3"):
        ctc_greedy_decode(torch.zeros(1, 4, 3), blank=3)


# --------------------------------------------------------------------------- lexicon

# ids: 0 blank, 1 "e", 2 "n", 3 "o", 4 "t", 5 "w", 6 " " (the delimiter)
ONE, TWO, SPACE = (3, 2, 1), (4, 5, 3), 6


def lexicon() -> Lexicon:
    return Lexicon([ONE, TWO], delimiter=SPACE)


def spelled(*frames: int, sure: float = 0.6) -> torch.Tensor:
    """(1, T, 7) log-probabilities: each frame's label holds ``sure`` of the mass, the rest spread."""
    probs = torch.full((len(frames), 7), (1 - sure) / 6)
    probs[torch.arange(len(frames)), torch.tensor(frames)] = sure
    return probs.log()[None]


def words(path: list[int]) -> list[tuple[int, ...]]:
    out, word = [], []
    for label in path + [SPACE]:
        if label == SPACE:
            out.append(tuple(word))
            word = []
        else:
            word.append(label)
    return out


def test_a_lexicon_turns_a_half_heard_word_into_the_likeliest_lexicon_word():
    heard = spelled(3, 0, 2, 0, 5)  # "o n w": not a word; "one" differs in its last letter
    assert ctc_greedy_decode(heard) == [[3, 2, 5]]
    assert ctc_prefix_beam_search(heard, beam_size=8, lexicon=lexicon()) == [list(ONE)]


def test_a_lexicon_puts_delimiters_only_between_whole_words():
    heard = spelled(4, 5, 3, 6, 3, 2, 1)  # "two one", heard cleanly
    assert ctc_prefix_beam_search(heard, beam_size=8, lexicon=lexicon()) == [[*TWO, SPACE, *ONE]]
    leading = spelled(6, 3, 2, 1)  # a delimiter before any word is dropped, not kept
    assert ctc_prefix_beam_search(leading, beam_size=8, lexicon=lexicon()) == [list(ONE)]


@pytest.mark.parametrize("seed", range(5))
def test_every_word_a_lexicon_search_returns_is_a_lexicon_word(seed):
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(3, 12, 7, generator=g).log_softmax(-1)
    for path in ctc_prefix_beam_search(log_probs, beam_size=6, lexicon=lexicon()):
        assert path == [] or all(w in (ONE, TWO) for w in words(path)), path


def test_a_lexicon_from_words_spells_them_with_the_vocabulary():
    from tokenizers_mm import CharacterVocabulary

    vocab = CharacterVocabulary(list("enotw "))
    lex = Lexicon.from_words(["one", "two"], vocab)
    assert lex.words == {ONE, TWO} and lex.delimiter == SPACE
    with pytest.raises(ValueError, match=r"not in the vocabulary"):
        Lexicon.from_words(["three"], vocab)
    with pytest.raises(ValueError, match="must not contain the delimiter"):
        Lexicon.from_words(["one two"], vocab)
    with pytest.raises(ValueError, match="at least one word"):
        Lexicon.from_words([], vocab)
    with pytest.raises(TypeError, match="list of words"):
        Lexicon.from_words("one", vocab)


def test_decoding_by_name_refuses_a_lexicon_without_beam_search():
    heard = spelled(3, 0, 2, 0, 1)
    assert ctc_decode(heard, decoder="greedy") == ctc_greedy_decode(heard)
    assert ctc_decode(heard, decoder="beam", lexicon=lexicon()) == [list(ONE)]
    with pytest.raises(ValueError, match="a lexicon needs decoder='beam'"):
        ctc_decode(heard, decoder="greedy", lexicon=lexicon())
    with pytest.raises(ValueError, match="decoder must be 'greedy' or 'beam'"):
        ctc_decode(heard, decoder="viterbi")  # type: ignore[arg-type]


def test_nan_log_probs_fractional_lengths_bad_pruning_and_lexicon_ids_are_refused():
    log_probs = torch.randn(1, 6, 4).log_softmax(-1)
    broken = log_probs.clone()
    broken[0, 2, 1] = float("nan")
    for decode in (ctc_greedy_decode, ctc_prefix_beam_search):
        with pytest.raises(ValueError, match="log_probs contain 1 NaN / \\+inf values"):
            decode(broken)
        with pytest.raises(ValueError, match="lengths must be whole frame counts, got \\[5.5\\]"):
            decode(log_probs, torch.tensor([5.5]))  # it read 5 frames
    ruled_out = log_probs.clone()
    ruled_out[0, :, 3] = float("-inf")  # a label no frame allows is fine
    assert ctc_greedy_decode(ruled_out) == ctc_greedy_decode(log_probs[..., :3])
    for prune in (0.5, float("nan")):
        with pytest.raises(ValueError, match="prune must be a finite log-probability ≤ 0"):
            ctc_prefix_beam_search(log_probs, prune=prune)
    # a threshold no label reaches keeps each frame's best label (it emptied the beam before)
    assert ctc_prefix_beam_search(log_probs, prune=-1e-9, beam_size=1) == ctc_greedy_decode(log_probs)
    for words, delimiter in (([[7]], 3), ([[1]], 0)):
        with pytest.raises(ValueError, match="the blank \\(0\\) or outside the model's 4 labels"):
            ctc_prefix_beam_search(log_probs, lexicon=Lexicon(words, delimiter))


def test_a_lexicon_delimiter_is_one_character():
    from tokenizers_mm import CharacterVocabulary

    vocabulary = CharacterVocabulary.build(["ab ba"])
    for delimiter in ("ab", ""):
        with pytest.raises(ValueError, match=f"delimiter must be one character of the vocabulary, got {delimiter!r}"):
            Lexicon.from_words(["ab"], vocabulary, delimiter=delimiter)
