"""unitok's BERT *is* Hugging Face BERT (and ELECTRA): random reference models of several shapes
(noise on every weight, so each norm and bias matters), converted, give the same hidden states,
attentions, pooled output and head logits (float32, atol 1e-5), with and without padding masks
and segment ids. Padded positions are compared only where they are real tokens: what a padding
position computes is never used."""

from __future__ import annotations

import pytest
import torch

from tests.unitok.convert.perturb import perturbed
from unitok.convert import from_transformers
from unitok.models import BERT

transformers = pytest.importorskip("transformers")

SHAPES = {
    "base": {},
    "deeper-custom-ff": dict(num_hidden_layers=3, num_attention_heads=2, intermediate_size=48),
    "relu-eps-wide-heads": dict(num_hidden_layers=1, hidden_size=48, num_attention_heads=6, hidden_act="relu",
                                layer_norm_eps=1e-6, type_vocab_size=3),
    "gelu-tanh": dict(hidden_act="gelu_new", max_position_embeddings=40),
}
ATOL = 1e-5


def bert_config(**overrides):
    options = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                   max_position_embeddings=64, type_vocab_size=2, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0, pad_token_id=0)
    options.update(overrides)
    return transformers.BertConfig(**options)


def electra_config(**overrides):
    options = dict(vocab_size=101, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0)
    options.update(overrides)
    return transformers.ElectraConfig(**options)


def inputs(config, padded: bool, segments: bool, batch: int = 3, length: int = 13):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, config.vocab_size, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 9:] = 0
        mask[2, 4:] = 0
        ids[mask == 0] = 0
    seg = None
    if segments:
        seg = torch.zeros_like(ids)
        seg[:, 6:] = 1
        seg[mask == 0] = 0
    return ids, mask, seg


def assert_same(ours, theirs, mask=None):
    if mask is not None and ours.dim() >= 2 and ours.shape[:2] == mask.shape:
        ours, theirs = ours[mask.bool()], theirs[mask.bool()]
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def run_both(hf, ours, ids, mask, seg, **kwargs):
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=seg, **kwargs)
        out = ours(ids, attention_mask=mask, segment_ids=seg, **kwargs)
    return ref, out


@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "padding"])
@pytest.mark.parametrize("segments", [False, True], ids=["no-segments", "segments"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_pretraining_model_hidden_states_mlm_and_nsp(shape, padded, segments):
    torch.manual_seed(0)
    config = bert_config(**SHAPES[shape])
    hf = perturbed(transformers.BertForPreTraining(config))
    ours = from_transformers(hf).eval()
    assert isinstance(ours, BERT) and ours.config.heads == ("pooler", "mlm", "nsp")
    ids, mask, seg = inputs(config, padded, segments)
    ref, out = run_both(hf, ours, ids, mask, seg, output_hidden_states=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == config.num_hidden_layers + 1
    for mine, theirs in zip(out.hidden_states, ref.hidden_states):
        assert_same(mine, theirs, mask)
    assert_same(out.mlm_logits, ref.prediction_logits, mask)
    assert_same(out.nsp_logits, ref.seq_relationship_logits)


@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "padding"])
def test_bert_model_pooled_output_and_attentions(padded):
    torch.manual_seed(0)
    config = bert_config()
    hf = perturbed(transformers.BertModel(config))
    hf.set_attn_implementation("eager")  # materialises the attention weights
    ours = from_transformers(hf).eval()
    assert ours.config.heads == ("pooler",)
    ids, mask, seg = inputs(config, padded, segments=True)
    ref, out = run_both(hf, ours, ids, mask, seg, output_attentions=True)
    assert_same(out.last_hidden_state, ref.last_hidden_state, mask)
    assert_same(out.pooled, ref.pooler_output)
    assert len(out.attentions) == config.num_hidden_layers
    for mine, theirs in zip(out.attentions, ref.attentions):
        rows = mask.bool()  # compare the weights of real queries over every key
        torch.testing.assert_close(mine.transpose(1, 2)[rows], theirs.transpose(1, 2)[rows], atol=ATOL, rtol=0)


def test_bert_model_without_pooler_and_custom_positions():
    config = bert_config()
    hf = perturbed(transformers.BertModel(config, add_pooling_layer=False))
    ours = from_transformers(hf).eval()
    assert ours.config.heads == () and ours.pooler is None
    ids, mask, seg = inputs(config, padded=False, segments=True)
    positions = torch.arange(ids.shape[1]).flip(0).expand_as(ids) + 3
    with torch.no_grad():
        ref = hf(ids, token_type_ids=seg, position_ids=positions).last_hidden_state
        out = ours(ids, segment_ids=seg, position_ids=positions)
    assert out.pooled is None
    assert_same(out.last_hidden_state, ref)


@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "padding"])
def test_masked_lm(padded):
    config = bert_config(num_hidden_layers=3)
    hf = perturbed(transformers.BertForMaskedLM(config))
    ours = from_transformers(hf).eval()
    assert ours.config.heads == ("mlm",)
    assert ours.mlm_head.decoder.weight is ours.embeddings.tok_embed.weight
    ids, mask, seg = inputs(config, padded, segments=False)
    ref, out = run_both(hf, ours, ids, mask, seg)
    assert_same(out.mlm_logits, ref.logits, mask)


@pytest.mark.parametrize("num_labels", [3, 1], ids=["3-classes", "regression"])
def test_sequence_classification(num_labels):
    config = bert_config(num_labels=num_labels)
    hf = perturbed(transformers.BertForSequenceClassification(config))
    ours = from_transformers(hf).eval()
    assert ours.config.heads == ("pooler", "classifier") and ours.config.num_labels == num_labels
    ids, mask, seg = inputs(config, padded=True, segments=True)
    ref, out = run_both(hf, ours, ids, mask, seg)
    assert out.logits.shape == (3, num_labels)
    assert_same(out.logits, ref.logits)


def test_token_classification_and_question_answering():
    config = bert_config(num_labels=5)
    ids, mask, seg = inputs(config, padded=True, segments=True)
    hf = perturbed(transformers.BertForTokenClassification(config))
    ours = from_transformers(hf).eval()
    ref, out = run_both(hf, ours, ids, mask, seg)
    assert_same(out.logits, ref.logits, mask)
    hf = perturbed(transformers.BertForQuestionAnswering(bert_config(num_labels=2)))
    ours = from_transformers(hf).eval()
    ref, out = run_both(hf, ours, ids, mask, seg)
    assert_same(out.start_logits, ref.start_logits, mask)
    assert_same(out.end_logits, ref.end_logits, mask)


@pytest.mark.parametrize("embedding_size", [16, 32], ids=["factorised-E16", "E-equals-D"])
@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "padding"])
def test_electra_discriminator(embedding_size, padded):
    torch.manual_seed(0)
    config = electra_config(embedding_size=embedding_size)
    hf = perturbed(transformers.ElectraForPreTraining(config))
    ours = from_transformers(hf).eval()
    assert ours.config.heads == ("rtd",)
    assert (ours.embeddings.proj is not None) == (embedding_size != 32)
    ids, mask, seg = inputs(config, padded, segments=True)
    ref, out = run_both(hf, ours, ids, mask, seg, output_hidden_states=True)
    for mine, theirs in zip(out.hidden_states, ref.hidden_states):
        assert_same(mine, theirs, mask)
    assert_same(out.rtd_logits, ref.logits, mask)


def test_electra_generator_and_model():
    config = electra_config(hidden_size=16, num_attention_heads=2, intermediate_size=32)
    ids, mask, seg = inputs(config, padded=True, segments=True)
    hf = perturbed(transformers.ElectraForMaskedLM(config))
    ours = from_transformers(hf).eval()
    ref, out = run_both(hf, ours, ids, mask, seg)
    assert_same(out.mlm_logits, ref.logits, mask)
    hf = perturbed(transformers.ElectraModel(config))
    ours = from_transformers(hf).eval()
    ref, out = run_both(hf, ours, ids, mask, seg)
    assert_same(out.last_hidden_state, ref.last_hidden_state, mask)


def test_converted_model_trains_like_the_reference():
    """One SGD step on the same loss leaves both models' MLM logits equal (gradients agree)."""
    config = bert_config()
    hf = perturbed(transformers.BertForMaskedLM(config))
    ours = from_transformers(hf)
    hf.train(), ours.train()  # dropout is 0: train mode changes nothing but must not break
    ids, mask, seg = inputs(config, padded=True, segments=True)
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) < 0.3, ids, -100)
    labels[mask == 0] = -100
    for model, logits_of in ((hf, lambda m: m(ids, attention_mask=mask, token_type_ids=seg).logits),
                             (ours, lambda m: m(ids, attention_mask=mask, segment_ids=seg).mlm_logits)):
        loss = torch.nn.functional.cross_entropy(logits_of(model).flatten(0, 1), labels.flatten())
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 0.5 * p.grad
    hf.eval(), ours.eval()
    ref, out = run_both(hf, ours, ids, mask, seg)
    assert_same(out.mlm_logits, ref.logits, mask)


def test_untied_decoder_and_unsupported_options_are_refused():
    hf = transformers.BertForMaskedLM(bert_config(tie_word_embeddings=False))
    with torch.no_grad():
        hf.cls.predictions.decoder.weight.add_(1.0)
    with pytest.raises(ValueError, match="not tied"):
        from_transformers(hf)
    hf = transformers.BertModel(bert_config(is_decoder=True))
    with pytest.raises(ValueError, match="decoder"):
        from_transformers(hf)


@pytest.mark.parametrize("cls_name", ["BertForPreTraining", "BertForMaskedLM", "ElectraForPreTraining"])
def test_checkpoint_folder_loads_without_transformers(cls_name, tmp_path):
    """``load_bert_folder`` reads a saved config.json + model.safetensors directly."""
    from unitok.convert.bert import load_bert_folder

    config = electra_config() if cls_name.startswith("Electra") else bert_config()
    hf = perturbed(getattr(transformers, cls_name)(config))
    hf.save_pretrained(tmp_path)
    ours = load_bert_folder(tmp_path).eval()
    reference = from_transformers(hf).eval()
    assert ours.config == reference.config
    ids, mask, seg = inputs(config, padded=True, segments=True)
    with torch.no_grad():
        a, b = ours(ids, mask, seg), reference(ids, mask, seg)
    for name in ("last_hidden_state", "mlm_logits", "nsp_logits", "rtd_logits"):
        if getattr(b, name) is not None:
            torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=0, rtol=0)
