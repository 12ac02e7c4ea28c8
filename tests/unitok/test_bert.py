"""BERT and ELECTRA on the shared backbone: presets, typed outputs, tied MLM decoder, padding,
save/load (and refusing a GPT checkpoint), feature extraction and the scalar mix, new heads on
a frozen or trainable body, span decoding, and bad input."""

from __future__ import annotations

import pytest
import torch

import unitok
from tokenizers_mm import BPETokenizer, Processor, Tokens, WordPieceTokenizer
from unitok.heads import ScalarMix
from unitok.models import BERT, ELECTRA, GPT, BERTConfig, ELECTRAConfig, GPTConfig
from unitok.models.bert import mean_pool, span_from_logits

TINY = dict(vocab_size=97, context_length=32, d_model=32, n_layers=3, n_heads=4, dropout=0.0, attn_dropout=0.0)


def tiny(**overrides) -> BERT:
    return BERT(BERTConfig(**{**TINY, **overrides})).eval()


def batch(B=3, N=10, vocab=97, pad_row=True) -> Tokens:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (B, N), generator=g)
    mask = torch.ones_like(ids)
    if pad_row:
        mask[1, 6:] = 0
        ids[1, 6:] = 0
    seg = torch.zeros_like(ids)
    seg[:, 5:] = 1
    seg[mask == 0] = 0
    return Tokens(ids=ids, attention_mask=mask, segments=seg)


def test_presets_have_the_published_sizes():
    with torch.device("meta"):
        base = BERT(BERTConfig.from_name("bert-base-uncased", heads=("pooler",)))
        large = BERT(BERTConfig.from_name("bert-large-uncased", heads=("pooler",)))
    assert base.num_parameters() == 109_482_240  # Hugging Face BertModel, bert-base-uncased
    assert large.num_parameters() == 335_141_888
    for name in BERTConfig.presets:
        assert BERTConfig.from_name(name).backbone_config().norm_position == "post"


def test_output_shapes_and_tied_decoder():
    model = tiny()
    t = batch()
    out = model(t, output_hidden_states=True, output_attentions=True)
    assert out.last_hidden_state.shape == (3, 10, 32) and out.pooled.shape == (3, 32)
    assert out.mlm_logits.shape == (3, 10, 97) and out.nsp_logits.shape == (3, 2)
    assert len(out.hidden_states) == 4 and len(out.attentions) == 3
    assert out.attentions[0].shape == (3, 4, 10, 10)
    assert model.mlm_head.decoder.weight is model.embeddings.tok_embed.weight
    assert out.rtd_logits is None and out.logits is None and out.start_logits is None
    skipped = model(t, compute_heads=False)
    assert skipped.mlm_logits is None and skipped.pooled is not None


def test_padding_does_not_change_real_tokens():
    model = tiny()
    t = batch(B=1, N=7, pad_row=False)
    longer = Tokens(ids=torch.cat([t.ids, torch.zeros(1, 4, dtype=torch.long)], 1),
                    attention_mask=torch.cat([t.attention_mask, torch.zeros(1, 4, dtype=torch.long)], 1),
                    segments=torch.cat([t.segments, torch.zeros(1, 4, dtype=torch.long)], 1))
    with torch.no_grad():
        a, b = model(t), model(longer)
    torch.testing.assert_close(b.last_hidden_state[:, :7], a.last_hidden_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(b.nsp_logits, a.nsp_logits, atol=1e-5, rtol=0)


def test_segments_change_the_encoding():
    model = tiny()
    t = batch()
    with torch.no_grad():
        with_segments = model(t).last_hidden_state
        without = model(t.ids, t.attention_mask).last_hidden_state
    assert not torch.allclose(with_segments, without)


def test_every_parameter_gets_a_gradient():
    for heads, num_labels in [(("pooler", "mlm", "nsp"), 0), (("rtd", "span"), 0), (("pooler", "classifier"), 3),
                              (("token_classifier",), 4)]:
        model = tiny(heads=heads, num_labels=num_labels).train()
        out = model(batch())
        total = sum(v.float().sum() for v in (out.mlm_logits, out.nsp_logits, out.rtd_logits, out.logits,
                                              out.start_logits, out.end_logits) if v is not None)
        total.backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing, (heads, missing)
        assert not any(torch.isnan(p.grad).any() for p in model.parameters())


def test_save_and_load_round_trip(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path / "bert")
    again = BERT.from_pretrained(tmp_path / "bert").eval()
    assert again.config == model.config
    assert again.mlm_head.decoder.weight is again.embeddings.tok_embed.weight
    with torch.no_grad():
        torch.testing.assert_close(again(batch()).mlm_logits, model(batch()).mlm_logits)


def test_loading_a_gpt_checkpoint_as_bert_is_a_clear_error(tmp_path):
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=97, context_length=32)).save_pretrained(tmp_path / "gpt")
    with pytest.raises(ValueError, match="holds a GPT checkpoint, not a BERT"):
        BERT.from_pretrained(tmp_path / "gpt")


def test_features_by_layer_and_combination():
    model = tiny()
    t = batch()
    with torch.no_grad():
        hs = model(t, output_hidden_states=True).hidden_states
        assert model.layer_indices("last4") == [1, 2, 3]  # only three layers: all of them
        torch.testing.assert_close(model.features(t, "last4", "sum"), hs[1] + hs[2] + hs[3])
        torch.testing.assert_close(model.features(t, [-1, -2], "mean"), (hs[3] + hs[2]) / 2)
        assert model.features(t, "last4", "concat").shape == (3, 10, 3 * 32)
        torch.testing.assert_close(model.features(t, 0), hs[0])
        torch.testing.assert_close(model.features(t, "last"), model(t).last_hidden_state)
    with pytest.raises(ValueError, match="layer 7 is out of range"):
        model.features(t, [7])
    with pytest.raises(ValueError, match="combine must be"):
        model.features(t, "last", "max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layers='first'"):
        model.features(t, "first")  # type: ignore[arg-type]


def test_scalar_mix_learns_weights_over_layers():
    mix = ScalarMix(3)
    layers = [torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    torch.testing.assert_close(mix(layers), sum(layers) / 3)  # starts as the plain average
    opt = torch.optim.Adam(mix.parameters(), lr=0.1)
    for _ in range(200):  # learn to pick the last layer
        opt.zero_grad()
        ((mix(layers) - layers[2]) ** 2).mean().backward()
        opt.step()
    assert mix.layer_weights.argmax() == 2 and mix.layer_weights[2] > 0.9
    with pytest.raises(ValueError, match="built for 3 layers"):
        mix(layers[:2])


def test_sequence_classification_on_a_frozen_body():
    body = tiny()
    clf = BERT.for_sequence_classification(body, num_labels=2, freeze_backbone=True).train()
    assert clf.config.heads == ("pooler", "classifier")
    trainable = {n for n, p in clf.named_parameters() if p.requires_grad}
    assert trainable == {"classifier.out.weight", "classifier.out.bias"}
    torch.testing.assert_close(clf.backbone.blocks[0].sublayers.attn.qkv.weight,
                               body.backbone.blocks[0].sublayers.attn.qkv.weight)
    assert not clf.backbone.training  # the frozen body stays in eval mode (no dropout)
    out = clf(batch())
    assert out.logits.shape == (3, 2) and out.mlm_logits is None
    out.logits.sum().backward()
    assert body.mlm_head is not None and clf.mlm_head is None  # the original keeps its heads
    reg = BERT.for_sequence_classification(body, num_labels=1)
    assert reg(batch()).logits.shape == (3, 1)
    assert all(p.requires_grad for p in reg.parameters())


def test_a_classifier_on_a_layer_mix_is_the_feature_based_approach_in_the_models_config(tmp_path):
    """``classifier_layers``: the classifier reads a learned mix of chosen layers (mean-pooled over
    real tokens, no pooler), so a saved folder holds the whole feature-based classifier."""
    body = tiny()
    clf = BERT.for_sequence_classification(body, num_labels=3, freeze_backbone=True, classifier_layers=[0, -1])
    assert clf.config.heads == ("classifier",) and clf.config.classifier_layers == (0, 3) and clf.pooler is None
    assert {n for n, p in clf.named_parameters() if p.requires_grad} == {
        "layer_mix.weights", "layer_mix.gamma", "classifier.out.weight", "classifier.out.bias"}
    with torch.no_grad():
        clf.layer_mix.weights.copy_(torch.tensor([0.3, -0.2]))
        t = batch()
        out = clf.eval()(t)
        hs = body(t, output_hidden_states=True).hidden_states
        w = torch.tensor([0.3, -0.2]).softmax(0)
        mixed = mean_pool(w[0] * hs[0] + w[1] * hs[3], t.attention_mask)
        torch.testing.assert_close(out.logits, clf.classifier(mixed))
        assert out.hidden_states is None, "the mix's hidden states are not returned unless asked"
        clf.save_pretrained(tmp_path / "clf")
        loaded = unitok.load(tmp_path / "clf")
        assert loaded.config == clf.config
        torch.testing.assert_close(loaded(t).logits, out.logits, rtol=0, atol=0)
    both = body.with_heads(("mlm", "classifier"), 3, classifier_layers=[0])  # the mix feeds the classifier alone
    with torch.no_grad():
        torch.testing.assert_close(both.eval()(t).mlm_logits, both.mlm_head(both(t, compute_heads=False).last_hidden_state))
    tagger = BERT.for_token_classification(body, num_labels=4, classifier_layers="all")
    with torch.no_grad():
        hs = tagger.eval()(t, output_hidden_states=True).hidden_states
        torch.testing.assert_close(tagger(t).logits, tagger.token_classifier(sum(hs[1:]) / 3))
    with pytest.raises(ValueError, match=r"classifier_layers=\(0, 4\): expected distinct hidden-state indices "
                                         r"0 \(embeddings\) … 3"):
        BERTConfig(**TINY, heads=("classifier",), num_labels=2, classifier_layers=(0, 4))
    with pytest.raises(ValueError, match=r"classifier_layers=\(1,\) given but no 'classifier'"):
        BERTConfig(**TINY, heads=("pooler",), classifier_layers=(1,))
    with pytest.raises(ValueError, match="the 'classifier' head reads the pooled"):
        BERTConfig(**TINY, heads=("classifier",), num_labels=2)  # without a mix it reads the pooler


def test_token_classification_and_question_answering_heads():
    body = tiny()
    tagger = BERT.for_token_classification(body, num_labels=5)
    assert tagger(batch()).logits.shape == (3, 10, 5)
    qa = BERT.for_question_answering(body, freeze_backbone=True)
    out = qa(batch())
    assert out.start_logits.shape == out.end_logits.shape == (3, 10)


CORPUS = ["the parser reads the text and returns the words", "def parse(text): return text.split()"] * 20


@pytest.fixture(scope="module")
def wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(iterator=CORPUS, vocab_size=120)


def test_a_new_head_keeps_the_bodys_tokenizer_and_its_class_names_while_they_still_fit(wordpiece, tmp_path):
    # As with Hugging Face's from_pretrained on a new head: the text is read as the body read it.
    body = tiny(vocab_size=wordpiece.vocab_size, heads=("pooler", "classifier"), num_labels=2)
    body.processor = Processor(text=wordpiece, labels=("neg", "pos"))
    same = BERT.for_sequence_classification(body, num_labels=2)
    assert same.processor.text is wordpiece and same.processor.labels == ("neg", "pos")
    for new in (BERT.for_sequence_classification(body, num_labels=3), BERT.for_question_answering(body),
                body.with_heads(("pooler", "mlm"))):
        assert new.processor.text is wordpiece and new.processor.labels is None  # the old task's names: dropped
    assert body.processor.labels == ("neg", "pos")  # the body is left as it is
    tagger = BERT.for_token_classification(body, num_labels=3, freeze_backbone=True)
    tagger.save_pretrained(tmp_path / "tagger")  # a folder that reads raw text
    entities = unitok.pipeline("token-classification", model=tmp_path / "tagger")("the parser reads the text")
    assert entities and {e["entity"] for e in entities} <= {"LABEL_0", "LABEL_1", "LABEL_2"}


def test_a_gpt_classifier_keeps_the_language_models_tokenizer(tmp_path):
    bpe = BPETokenizer.train(iterator=CORPUS, vocab_size=300)
    lm = GPT(GPTConfig(vocab_size=bpe.vocab_size, context_length=64, d_model=32, n_layers=2, n_heads=4))
    lm.processor = Processor(text=bpe)
    clf = GPT.for_sequence_classification(lm, num_labels=2)
    assert clf.processor.text is bpe and clf.processor.labels is None
    clf.processor = Processor(text=bpe, labels=("other", "parser"))
    assert GPT.for_sequence_classification(clf, num_labels=2).processor.labels == ("other", "parser")
    assert GPT.for_sequence_classification(clf, num_labels=4).processor.labels is None
    clf.save_pretrained(tmp_path / "gpt")
    answer = unitok.pipeline("text-classification", model=tmp_path / "gpt")("the parser reads the text")
    assert answer["label"] in ("other", "parser")


def test_a_token_classifier_needs_two_classes():
    # One score a token has a cross-entropy of 0 whatever its label: it could never learn.
    with pytest.raises(ValueError, match=r"num_labels must be an integer ≥ 2 \(classes; .*\), got 1"):
        BERT.for_token_classification(tiny(), num_labels=1)
    with pytest.raises(ValueError, match=r"'token_classifier' head needs num_labels ≥ 2 classes .*got 1"):
        BERTConfig(**TINY, heads=("token_classifier",), num_labels=1)
    assert BERTConfig(**TINY, heads=("pooler", "classifier"), num_labels=1).num_labels == 1  # regression


def test_span_decoding_picks_the_best_valid_span():
    start = torch.tensor([[0.0, 5.0, 0.0, 0.0, 9.0]])
    end = torch.tensor([[0.0, 0.0, 0.0, 4.0, 1.0]])
    s, e = span_from_logits(start, end)
    assert (s.item(), e.item()) == (4, 4)  # 9 + 1 beats 5 + 4; an end before its start is invalid
    s, e = span_from_logits(start, end, allowed=torch.tensor([[0, 1, 1, 1, 0]]))
    assert (s.item(), e.item()) == (1, 3)


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0], [3.0], [100.0]]])
    assert mean_pool(hidden, torch.tensor([[1, 1, 0]])).item() == 2.0


def test_bad_input_is_refused():
    model = tiny()
    with pytest.raises(ValueError, match="longer than the context length 32"):
        model(torch.ones(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"segment ids \[2\] are outside \[0, 2\)"):
        model(torch.ones(1, 4, dtype=torch.long), segment_ids=torch.full((1, 4), 2))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.full((1, 4), 97))
    with pytest.raises(ValueError, match="attention_mask must have the shape"):
        model(torch.ones(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="features"):
        model(Tokens(features=torch.zeros(1, 4, 8)))
    with pytest.raises(ValueError, match=r"num_labels must be an integer ≥ 1 \(1 = regression\), got 0"):
        BERT.for_sequence_classification(model, num_labels=0)
    with pytest.raises(ValueError, match="reads the pooled"):
        BERTConfig(**TINY, heads=("nsp",))
    with pytest.raises(ValueError, match="unknown or repeated head"):
        BERTConfig(**TINY, heads=("pooler", "ctc"))
    with pytest.raises(ValueError, match="num_labels=3 given but no"):
        BERTConfig(**TINY, heads=("pooler",), num_labels=3)


# --------------------------------------------------------------------------- ELECTRA
def tiny_electra() -> ELECTRA:
    return ELECTRA(ELECTRAConfig.from_name("electra-nano", vocab_size=97, context_length=32, dropout=0.0,
                                           attn_dropout=0.0))


def test_electra_shares_embeddings_and_labels_replacements():
    model = tiny_electra()
    assert model.generator.embeddings.tok_embed is model.discriminator.embeddings.tok_embed
    assert model.generator.mlm_head.decoder.weight is model.discriminator.embeddings.tok_embed.weight
    t = batch()
    labels = torch.full_like(t.ids, -100)
    labels[:, 2] = t.ids[:, 2]
    masked_ids = t.ids.clone()
    masked_ids[:, 2] = 4  # [MASK]
    out = model(Tokens(ids=masked_ids, attention_mask=t.attention_mask, segments=t.segments), labels,
                generator=torch.Generator().manual_seed(0))
    assert out.generator_logits.shape == (3, 97)
    assert out.discriminator_logits.shape == (3, 10)
    assert torch.equal(out.replaced, out.corrupted_ids != torch.where(out.masked, labels, masked_ids))
    assert not out.replaced[:, [0, 1, 3]].any()  # only sampled positions can be replaced
    (out.generator_logits.sum() + out.discriminator_logits.sum()).backward()
    assert model.discriminator.embeddings.tok_embed.weight.grad is not None


def test_electra_round_trip_and_discriminator_as_bert(tmp_path):
    model = tiny_electra()
    model.save_pretrained(tmp_path / "electra")
    again = ELECTRA.from_pretrained(tmp_path / "electra")
    assert again.generator.embeddings.tok_embed is again.discriminator.embeddings.tok_embed
    torch.testing.assert_close(again.discriminator.embeddings.tok_embed.weight,
                               model.discriminator.embeddings.tok_embed.weight)
    model.discriminator_as_bert().save_pretrained(tmp_path / "disc")
    body = BERT.from_pretrained(tmp_path / "disc")
    clf = BERT.for_sequence_classification(body, num_labels=2)
    assert clf(batch()).logits.shape == (3, 2)
    with pytest.raises(ValueError, match="holds a ELECTRA checkpoint, not a BERT"):
        BERT.from_pretrained(tmp_path / "electra")


def test_the_electra_discriminator_carries_the_electras_tokenizer(wordpiece, tmp_path):
    model = ELECTRA(ELECTRAConfig.from_name("electra-nano", vocab_size=wordpiece.vocab_size, context_length=32))
    model.processor = Processor(text=wordpiece)
    model.save_pretrained(tmp_path / "electra")
    body = ELECTRA.from_pretrained(tmp_path / "electra").discriminator_as_bert()
    assert body.processor.text == wordpiece
    clf = BERT.for_sequence_classification(body, num_labels=2)
    clf.save_pretrained(tmp_path / "clf")
    assert unitok.pipeline("text-classification", model=tmp_path / "clf")("the parser")["label"] in ("LABEL_0", "LABEL_1")
