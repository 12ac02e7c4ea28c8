"""``labels=`` gives ``.loss`` as Hugging Face users expect: GPT, BERT and T5 equal the reference
models' own ``.loss`` after conversion; ViT / DeiT / Mixer equal ``cross_entropy`` of their logits;
ConformerCTC equals torch's ``ctc_loss`` (reduction "mean"). Without labels ``.loss`` is None.
BERT also takes Hugging Face's ``token_type_ids`` for its segment ids."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import small_gpt2
from tests.unitok.convert.test_bert_equivalence import bert_config
from unitok.convert import from_transformers
from unitok.losses import (
    causal_lm_loss,
    check_class_labels,
    cross_entropy,
    ctc_loss,
    linear_cross_entropy,
    sequence_classification_loss,
)
from unitok.models import (
    GPT,
    ConformerConfig,
    ConformerCTC,
    DeiT,
    GPTConfig,
    MixerConfig,
    MLPMixer,
    ViT,
    ViTConfig,
)
from unitok.models.bert import BERT, BERTConfig

transformers = pytest.importorskip("transformers")
ATOL = 1e-5


def close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=1e-5)


def with_ignored(labels: torch.Tensor, fraction: float = 0.3, seed: int = 3) -> torch.Tensor:
    """A copy of ``labels`` with about ``fraction`` of the positions set to -100."""
    g = torch.Generator().manual_seed(seed)
    return labels.masked_fill(torch.rand(labels.shape, generator=g) < fraction, -100)


# ---------------------------------------------------------------------------------------- GPT
def test_gpt_loss_equals_gpt2_lm_head_model():
    hf = small_gpt2()
    ours = from_transformers(hf).eval()
    ids = torch.randint(3, hf.config.vocab_size, (3, 12))
    mask = torch.ones_like(ids)
    mask[2, 8:] = 0  # right padding, not scored
    labels = with_ignored(ids).masked_fill(mask == 0, -100)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, labels=labels)
        out = ours(ids, attention_mask=mask, labels=labels)
    close(out.loss, ref.loss)
    close(out.logits[mask.bool()], ref.logits[mask.bool()])  # padded positions compute nothing used
    # the shift is inside: position t is scored on labels[t + 1]
    close(out.loss, F.cross_entropy(out.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()))


def test_gpt_without_labels_has_no_loss_and_bad_labels_are_refused():
    model = GPT(GPTConfig.from_name("gpt-nano", vocab_size=50, context_length=16)).eval()
    ids = torch.randint(0, 50, (2, 7))
    assert model(ids).loss is None
    with pytest.raises(ValueError, match="shape"):
        model(ids, labels=ids[:, :-1])
    with pytest.raises(ValueError, match=r"outside \[0, 50\)"):
        model(ids, labels=ids + 50)
    with pytest.raises(TypeError, match="integer"):
        model(ids, labels=ids.float())


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8, torch.uint8])
def test_labels_of_any_integer_dtype_score_as_int64_on_every_path(dtype):
    # int32 used to crash the unfused cross-entropy and uint8 the fused one's gather: the same call
    # scored or failed by path, in torch errors that did not name the labels
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("gpt-nano", vocab_size=97, context_length=16)).eval()
    ids = torch.randint(0, 97, (2, 8))
    labels = ids % 50
    with torch.no_grad():
        expected = model(ids, labels=labels).loss
        for return_logits in (True, False):
            close(model(ids, labels=labels.to(dtype), return_logits=return_logits).loss, expected)
    logits, hidden, weight = torch.randn(3, 4), torch.randn(3, 8), torch.randn(4, 8)
    classes = torch.tensor([0, 3, 1])
    close(cross_entropy(logits, classes.to(dtype)), cross_entropy(logits, classes))
    close(sequence_classification_loss(logits, classes.to(dtype)), sequence_classification_loss(logits, classes))
    close(causal_lm_loss(logits[None], classes[None].to(dtype)), causal_lm_loss(logits[None], classes[None]))
    close(linear_cross_entropy(hidden, weight, classes.to(dtype)), linear_cross_entropy(hidden, weight, classes))
    assert check_class_labels(classes.to(dtype), (3,), 4).dtype == torch.int64
    assert check_class_labels(classes, (3,), 4) is classes  # int64 labels are not copied


def test_bool_or_floating_labels_are_refused_on_every_path():
    model = GPT(GPTConfig.from_name("gpt-nano", vocab_size=50, context_length=16)).eval()
    ids = torch.randint(0, 50, (2, 7))
    for labels in (ids.float(), ids.to(torch.float64), ids > 0):
        for return_logits in (True, False):
            with pytest.raises(TypeError, match=f"labels must hold integer class ids, got {labels.dtype}"):
                model(ids, labels=labels, return_logits=return_logits)
    with pytest.raises(TypeError, match="labels must hold integer class ids, got torch.bool"):
        sequence_classification_loss(torch.randn(2, 3), torch.tensor([True, False]))


def test_gpt_loss_backpropagates():
    model = GPT(GPTConfig.from_name("gpt-nano", vocab_size=50, context_length=16))
    ids = torch.randint(0, 50, (2, 7))
    model(ids, labels=ids).loss.backward()
    assert model.tok_embed.weight.grad is not None


# ---------------------------------------------------------------------------------------- BERT
def bert_inputs(batch: int = 3, length: int = 13):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 101, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:], mask[2, 4:] = 0, 0
    ids[mask == 0] = 0
    seg = torch.zeros_like(ids)
    seg[:, 6:] = 1
    seg[mask == 0] = 0
    return ids, mask, seg


def test_bert_mlm_loss_equals_bert_for_masked_lm():
    hf = transformers.BertForMaskedLM(bert_config()).eval()
    ours = from_transformers(hf).eval()
    ids, mask, seg = bert_inputs()
    labels = with_ignored(ids, 0.7).masked_fill(mask == 0, -100)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=seg, labels=labels)
        out = ours(ids, attention_mask=mask, token_type_ids=seg, labels=labels)
    close(out.loss, ref.loss)


def test_bert_pretraining_loss_is_mlm_plus_nsp_as_in_bert_for_pretraining():
    hf = transformers.BertForPreTraining(bert_config()).eval()
    ours = from_transformers(hf).eval()
    ids, mask, seg = bert_inputs()
    labels = with_ignored(ids, 0.7).masked_fill(mask == 0, -100)
    nsp = torch.tensor([0, 1, 1])
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=seg, labels=labels, next_sentence_label=nsp)
        out = ours(ids, attention_mask=mask, token_type_ids=seg, labels=labels, next_sentence_label=nsp)
        mlm_only = ours(ids, attention_mask=mask, token_type_ids=seg, labels=labels)
        nsp_only = ours(ids, attention_mask=mask, token_type_ids=seg, next_sentence_label=nsp)
    close(out.loss, ref.loss)
    close(mlm_only.loss + nsp_only.loss, ref.loss)
    close(nsp_only.loss, F.cross_entropy(ref.seq_relationship_logits, nsp))


@pytest.mark.parametrize("num_labels,kind", [(3, "single"), (1, "regression"), (4, "multi")])
def test_bert_sequence_classification_loss_equals_reference(num_labels, kind):
    hf = transformers.BertForSequenceClassification(bert_config(num_labels=num_labels)).eval()
    ours = from_transformers(hf).eval()
    ids, mask, seg = bert_inputs()
    g = torch.Generator().manual_seed(4)
    labels = {"single": torch.tensor([2, 0, 1]),
              "regression": torch.randn(3, generator=g),
              "multi": (torch.rand(3, num_labels, generator=g) < 0.5).float()}[kind]
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=seg, labels=labels)
        out = ours(ids, attention_mask=mask, token_type_ids=seg, labels=labels)
    close(out.loss, ref.loss)


def test_bert_token_classification_loss_equals_reference():
    hf = transformers.BertForTokenClassification(bert_config(num_labels=5)).eval()
    ours = from_transformers(hf).eval()
    ids, mask, seg = bert_inputs()
    labels = with_ignored(torch.randint(0, 5, ids.shape)).masked_fill(mask == 0, -100)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=seg, labels=labels)
        out = ours(ids, attention_mask=mask, segment_ids=seg, labels=labels)
    close(out.loss, ref.loss)


def tiny_bert(**overrides) -> BERT:
    config = BERTConfig(vocab_size=60, context_length=16, d_model=32, n_layers=1, n_heads=2, dropout=0.0,
                        attn_dropout=0.0, **overrides)
    return BERT(config).eval()


def test_bert_token_type_ids_are_segment_ids():
    model = tiny_bert()
    ids, mask, seg = bert_inputs(length=10)
    ids = ids % 60
    a = model(ids, attention_mask=mask, segment_ids=seg)
    b = model(ids, attention_mask=mask, token_type_ids=seg)
    torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, atol=0, rtol=0)
    assert a.loss is None and b.loss is None
    with pytest.raises(ValueError, match="segment_ids or token_type_ids"):
        model(ids, segment_ids=seg, token_type_ids=seg)


def test_bert_labels_errors():
    ids = torch.randint(1, 60, (2, 8))
    with pytest.raises(ValueError, match="ambiguous"):
        tiny_bert(heads=("pooler", "mlm", "classifier"), num_labels=2)(ids, labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="include none"):
        tiny_bert(heads=("pooler",))(ids, labels=ids)
    with pytest.raises(ValueError, match="no 'nsp' head"):
        tiny_bert(heads=("mlm",))(ids, next_sentence_label=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="compute_heads"):
        tiny_bert(heads=("mlm",))(ids, labels=ids, compute_heads=False)
    with pytest.raises(ValueError, match="shape"):
        tiny_bert(heads=("token_classifier",), num_labels=3)(ids, labels=torch.zeros(2, dtype=torch.long))


# ---------------------------------------------------------------------------------------- T5
@pytest.mark.parametrize("variant", ["v1.0", "v1.1"])
def test_t5_loss_and_shifted_decoder_inputs_equal_t5_for_conditional_generation(variant):
    tied = variant == "v1.0"
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=20, dropout_rate=0.0, decoder_start_token_id=0,
        feed_forward_proj="relu" if tied else "gated-gelu", tie_word_embeddings=tied)).eval()
    if not tied:  # give the v1.1 head its own weights, as released v1.1 checkpoints have
        hf.lm_head.weight = torch.nn.Parameter(torch.randn_like(hf.lm_head.weight) * 0.05)
    ours = from_transformers(hf).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 99, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:], mask[2, 4:] = 0, 0
    labels = torch.randint(2, 99, (3, 6), generator=g)
    labels[1, 4:], labels[2, 2:] = -100, -100  # padded targets
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, labels=labels)
        out = ours(ids, attention_mask=mask, labels=labels)
        given = ours(ids, attention_mask=mask, decoder_input_ids=hf._shift_right(labels), labels=labels)
    close(out.logits, ref.logits)
    close(out.loss, ref.loss)
    close(given.loss, ref.loss)  # explicit decoder inputs: the same loss
    with torch.no_grad():
        assert ours(ids, attention_mask=mask, decoder_input_ids=hf._shift_right(labels)).loss is None


# ---------------------------------------------------------------------------------------- images
def image_model(family, preset: str, **overrides):
    config_class = MixerConfig if family is MLPMixer else ViTConfig
    options = dict(n_layers=1, num_classes=5, dropout=0.0) | overrides
    return family(config_class.from_name(preset, **options)).eval()


@pytest.mark.parametrize("family,preset", [(ViT, "vit-digits"), (MLPMixer, "mixer-digits"), (DeiT, "deit-digits")])
def test_image_loss_is_cross_entropy_of_the_logits(family, preset):
    model = image_model(family, preset)
    pixels, labels = torch.randn(4, 1, 32, 32), torch.tensor([0, 4, 2, 2])
    with torch.no_grad():
        out = model(pixels, labels=labels)
        assert model(pixels).loss is None
    close(out.loss, F.cross_entropy(out.logits, labels))  # DeiT in eval mode: the averaged heads


def test_deit_in_train_mode_averages_both_heads_losses():
    model = image_model(DeiT, "deit-digits").train()  # dropout is 0: train mode changes only the loss
    pixels, labels = torch.randn(4, 1, 32, 32), torch.tensor([1, 3, 0, 4])
    out = model(pixels, labels=labels)
    expected = (F.cross_entropy(out.logits_cls, labels) + F.cross_entropy(out.logits_dist, labels)) / 2
    close(out.loss, expected)
    out.loss.backward()
    assert model.head_dist.weight.grad is not None and model.head.weight.grad is not None


def test_image_labels_errors():
    pixels = torch.randn(2, 1, 32, 32)
    with pytest.raises(ValueError, match="no classification head"):
        image_model(ViT, "vit-digits", num_classes=0)(pixels, labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"outside \[0, 5\)"):
        image_model(MLPMixer, "mixer-digits")(pixels, labels=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="shape"):
        image_model(ViT, "vit-digits")(pixels, labels=torch.tensor([[0, 1]]))


# ---------------------------------------------------------------------------------------- Conformer
def tiny_conformer() -> ConformerCTC:
    config = ConformerConfig.from_name("conformer-digits", n_mels=16, d_model=32, n_layers=2, dropout=0.0,
                                       vocabulary=tuple("abcd"))
    return ConformerCTC(config).eval()


def test_conformer_loss_equals_torch_ctc_loss_mean():
    model = tiny_conformer()
    frames, lengths = torch.randn(3, 80, 16), torch.tensor([80, 61, 45])
    labels = torch.tensor([[1, 2, 3, 4, 1], [2, 2, 3, 0, 0], [4, 1, 0, 0, 0]])  # 0-padded (the blank)
    label_lengths = torch.tensor([5, 3, 2])
    with torch.no_grad():
        out = model(frames, lengths, labels=labels, label_lengths=label_lengths)
        assert model(frames, lengths).loss is None
    log_probs = out.logits.log_softmax(-1).transpose(0, 1)
    expected = F.ctc_loss(log_probs, labels, out.lengths, label_lengths, blank=model.blank_id)  # reduction="mean"
    close(out.loss, expected)
    per_utterance = F.ctc_loss(log_probs, labels, out.lengths, label_lengths, reduction="none")
    close(out.loss, (per_utterance / label_lengths).mean())  # what "mean" means
    # lengths default to the entries that are neither -100 nor the blank
    with torch.no_grad():
        inferred = model(frames, lengths, labels=labels.masked_fill(labels == 0, -100)).loss
    close(inferred, expected)


def test_ctc_loss_refuses_fractional_lengths_rather_than_truncating_them():
    logits = torch.randn(2, 10, 5)
    labels = torch.tensor([[1, 2, 3, -100], [4, 4, -100, -100]])
    with pytest.raises(ValueError, match=r"lengths must hold integer counts, got torch.float32 \[9\.8"):
        ctc_loss(logits, torch.tensor([9.8, 10.0]), labels)  # was scored as 9 frames
    with pytest.raises(ValueError, match=r"label_lengths must hold integer counts, got torch.float32 \[2\.5"):
        ctc_loss(logits, torch.tensor([10, 10]), labels, label_lengths=torch.tensor([2.5, 2.0]))
    with pytest.raises(ValueError, match=r"lengths must hold integer counts, got torch.bool"):
        ctc_loss(logits, torch.tensor([True, True]), labels)
    for lengths in (torch.tensor([10, 9]), torch.tensor([10, 9], dtype=torch.int32)):  # any integer dtype
        assert torch.isfinite(ctc_loss(logits, lengths, labels, label_lengths=torch.tensor([3, 2], dtype=torch.int32)))


def test_ctc_loss_refuses_labels_that_are_not_integer_ids():
    logits, lengths = torch.randn(2, 10, 5), torch.tensor([10, 10])
    labels = torch.tensor([[1, 2, 3], [4, 4, 0]])
    for dtype in (torch.float32, torch.float64, torch.bool):  # 2.7 or True would be scored as some id
        with pytest.raises(TypeError, match=f"labels must hold integer label ids .*, got {dtype}"):
            ctc_loss(logits, lengths, labels.to(dtype))
    expected = ctc_loss(logits, lengths, labels)
    for dtype in (torch.int32, torch.int16, torch.uint8):  # any integer dtype: the same loss
        close(ctc_loss(logits, lengths, labels.to(dtype)), expected)


def test_conformer_labels_errors():
    model = tiny_conformer()
    frames = torch.randn(2, 40, 16)
    with pytest.raises(ValueError, match="other than the blank"):
        model(frames, labels=torch.tensor([[1, 9], [2, 3]]))
    with pytest.raises(ValueError, match="label_lengths"):
        model(frames, labels=torch.tensor([[1, 2], [2, 3]]), label_lengths=torch.tensor([3, 1]))
    with pytest.raises(ValueError, match="without labels"):
        model(frames, label_lengths=torch.tensor([1, 1]))
