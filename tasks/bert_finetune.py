"""Fine-tuning a BERT-family body, in the lectures' styles:

- ``mode="full"``: a new head, every weight trained (BERT's fine-tuning approach);
- ``mode="frozen"``: "decapitate, add a new head, freeze the rest" — only the head learns;
- ``mode="features"``: the feature-based approach — the frozen body's hidden states of
  chosen layers, combined by a learnable weighted sum (`unitok.heads.ScalarMix`), feed a
  new head.

`SequenceClassificationTask` ([CLS] classification or regression, single texts or sentence
pairs through segment ids — or, with ``family="gpt"``, GPT-1's fine-tuning: a classifier on a
GPT's last real token, optionally with its auxiliary language-modelling loss),
`TokenClassificationTask` (labels on first sub-tokens) and `QuestionAnsweringTask`
(start/end spans). The body comes from a ``save_pretrained`` folder (BERT, ELECTRA whose
discriminator is used, or GPT) or is built from a preset (from scratch).

Axis legend: B batch, N tokens, D width, K labels, L layers mixed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from tasks.optim import adamw_warmup_cosine
from tasks.predictions import Record, class_records, records
from tasks.recorded import (
    check_pretrained_tokenizer,
    check_trained_tokenizer,
    record_model_config,
    take_trained_tokenizer,
)
from tokenizers_mm.checks import check_int
from unitok.models import BERT, ELECTRA, GPT, BERTConfig, GPTConfig
from unitok.models.bert import span_from_logits

Mode = Literal["full", "frozen", "features"]
Family = Literal["bert", "gpt"]


def _saved_family(pretrained: str | Path, recipe: str) -> tuple[Path, str | None]:
    """A ``save_pretrained`` folder and the model family its config.json names."""
    folder = Path(pretrained)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; expected a folder written by save_pretrained "
                                f"(e.g. the pretrained/ folder of `unitok fit --config configs/{recipe}.yaml`)")
    return folder, json.loads(config_file.read_text()).get("family")


def load_body(pretrained: str | Path) -> BERT:
    """A `BERT` body from a ``save_pretrained`` folder: a BERT, or an ELECTRA's discriminator
    (in training mode: loading gives eval mode, and Lightning keeps a module's mode)."""
    folder, family = _saved_family(pretrained, "bert/mlm_tiny")
    if family == "ELECTRA":
        return ELECTRA.from_pretrained(folder).discriminator_as_bert().train()
    if family != "BERT":
        raise ValueError(f"{folder} holds a {family} checkpoint; fine-tuning needs a BERT or ELECTRA one "
                         "(family='gpt' fine-tunes a GPT)")
    return BERT.from_pretrained(folder).train()


def load_gpt(pretrained: str | Path) -> GPT:
    """A `GPT` from a ``save_pretrained`` folder, in training mode."""
    folder, family = _saved_family(pretrained, "gpt/tiny")
    if family != "GPT":
        raise ValueError(f"{folder} holds a {family} checkpoint; family='gpt' fine-tunes a GPT one")
    return GPT.from_pretrained(folder).train()


def build_body(vocab_size: int | None, context_length: int, pretrained: str | None, preset: str,
               family: Family = "bert", model_config: dict[str, Any] | None = None) -> BERT | GPT:
    """The body to fine-tune: rebuilt from ``model_config`` (a checkpoint's body config: its
    weights follow, the starting folder is not read) or loaded from ``pretrained`` (either one's
    vocabulary and length checked against the data's), or a fresh `BERT` (``family="gpt"``:
    `GPT`) from ``preset`` when training from scratch."""
    if family not in ("bert", "gpt"):
        raise ValueError(f"family must be 'bert' or 'gpt', got {family!r}")
    if model_config is not None or pretrained is not None:
        if model_config is not None:
            body = GPT(GPTConfig.from_dict(dict(model_config))) if family == "gpt" else \
                BERT(BERTConfig.from_dict(dict(model_config)))
            source, owner = "the checkpoint's model (model_config)", "the checkpoint's model"
        else:
            body = load_body(pretrained) if family == "bert" else load_gpt(pretrained)  # type: ignore[arg-type]
            source, owner = f"the pretrained model {pretrained}", "the pretrained model"
        if vocab_size is not None and vocab_size != body.config.vocab_size:
            raise ValueError(
                f"the data's tokenizer has {vocab_size} tokens but {source} has "
                f"{body.config.vocab_size}; give the data module the checkpoint's tokenizer (its folder)")
        if context_length > body.config.context_length:
            raise ValueError(f"context_length={context_length} exceeds {owner}'s "
                             f"{body.config.context_length} positions")
        return body
    if vocab_size is None:
        raise ValueError("training from scratch (no `pretrained`) needs vocab_size (from the data module)")
    if family == "gpt":
        return GPT(GPTConfig.from_name(preset, vocab_size=vocab_size, context_length=context_length))
    return BERT(BERTConfig.from_name(preset, vocab_size=vocab_size, context_length=context_length, heads=()))


class _FineTuneTask(L.LightningModule):
    """Modes, the AdamW schedule and label checks shared by the fine-tuning tasks; the tokenizer a
    model was fitted with is recorded (``trained_tokenizer``), and a checkpoint tested or resumed
    with another one (of the same size) is refused."""

    num_labels: int

    def __init__(self, mode: Mode) -> None:
        super().__init__()
        if mode not in ("full", "frozen", "features"):
            raise ValueError(f"mode must be 'full', 'frozen' or 'features', got {mode!r}")
        self.mode = mode

    def _check_labels(self, labels: Tensor, num_labels: int) -> None:
        real = labels[labels != -100]
        if real.numel() and (int(real.min()) < 0 or int(real.max()) >= num_labels):
            bad = real[(real < 0) | (real >= num_labels)].unique()[:5].tolist()
            raise ValueError(f"labels {bad} are outside [0, {num_labels}): the data has more classes than the "
                             f"model's num_labels={num_labels}")

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        expected = getattr(datamodule, "num_labels", None)
        if expected is not None and expected != self.num_labels and self.num_labels != 1:
            raise ValueError(f"label count mismatch: the data module has {expected} labels "
                             f"{tuple(getattr(datamodule, 'label_names', ()))} but the task was built with "
                             f"num_labels={self.num_labels}")
        check_pretrained_tokenizer(self.model, self.hparams.get("pretrained"), datamodule)
        check_trained_tokenizer(self, datamodule, stage)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        take_trained_tokenizer(self, checkpoint)  # a checkpoint's body has no tokenizer: its record is checked

    def configure_optimizers(self):
        return adamw_warmup_cosine(self, self.trainer, self.hparams)

    def _log_all(self, stage: str, metrics: dict[str, Tensor], batch_size: int) -> None:
        for name, value in metrics.items():
            self.log(f"{stage}_{name}", value, prog_bar=True, batch_size=batch_size)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        metrics = self._metrics(batch)
        self._log_all("train", metrics, batch["input_ids"].shape[0])
        return metrics["loss"]

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._log_all("val", self._metrics(batch), batch["input_ids"].shape[0])

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._log_all("test", self._metrics(batch), batch["input_ids"].shape[0])

    def _metrics(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        raise NotImplementedError

    def _label_names(self) -> list[str] | None:
        """The data module's label names (None: records carry label indices)."""
        names = getattr(getattr(self.trainer, "datamodule", None), "label_names", None)
        return list(names) if names and len(names) == self.num_labels else None


def _examples(batch: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The raw examples a predict batch carries (`_LabelledTextModule.predict_collate`)."""
    return batch.get("examples")


class _LabelTask(_FineTuneTask):
    """What sequence and token classification share: the body, the head for the mode, forward."""

    per_token = False

    def _build(self, num_labels: int, vocab_size: int | None, context_length: int, pretrained: str | None,
               preset: str, mode: Mode, feature_layers: str | list[int], dropout: float | None,
               classifier_dropout: float | None, family: Family = "bert",
               model_config: dict[str, Any] | None = None) -> None:
        self.num_labels = num_labels
        self.family = family
        if family == "gpt" and (mode != "full" or self.per_token or num_labels < 2):
            raise ValueError("family='gpt' classifies whole texts (num_labels ≥ 2) with every weight trained "
                             f"(mode='full'); got mode={mode!r}, num_labels={num_labels}")
        body = build_body(vocab_size, context_length, pretrained, preset, family, model_config)
        record_model_config(self, body.config)  # the body's: a checkpoint rebuilds it, then the head
        if isinstance(body, GPT):
            self.model = GPT.for_sequence_classification(body, num_labels, dropout)
        else:
            make = BERT.for_token_classification if self.per_token else BERT.for_sequence_classification
            # "features": a learned mix of the frozen body's layers feeds the classifier (in the
            # model's config, so the exported folder holds it)
            self.model = make(body, num_labels, freeze_backbone=mode != "full", classifier_dropout=classifier_dropout,
                              dropout=dropout, classifier_layers=feature_layers if mode == "features" else None)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, K) scores per text, or (B, N, K) per token."""
        if self.family == "gpt":
            # the classifier reads the last real token's state: no (B, N, V) next-token logits
            return self.model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                              return_logits=False).class_logits
        return self.model(batch["input_ids"], batch.get("attention_mask"), batch.get("segment_ids")).logits


class SequenceClassificationTask(_LabelTask):
    """Fine-tunes a BERT body to classify (K ≥ 2) or regress (K = 1) whole texts or sentence
    pairs from the [CLS] state — or a GPT (``family="gpt"``) to classify them from the last
    real token's state, as GPT-1 did. Logs ``loss`` and ``acc`` (classification) or ``mse``
    (and ``lm_loss`` with ``lm_loss_weight``).

    Args:
        num_labels: K (must equal the data module's; 1 = regression with float labels).
        vocab_size / context_length: linked from the data module by the CLI.
        pretrained: a ``save_pretrained`` folder (BERT or ELECTRA; GPT for ``family="gpt"``);
            None trains from scratch.
        preset: the `BERTConfig` (`GPTConfig`) preset used from scratch.
        model_config: the body's config as a dict, as ``pretrained`` or ``preset`` gave it (set
            automatically, so a checkpoint rebuilds its model without ``pretrained``'s folder;
            wins over ``pretrained`` and ``preset``).
        mode: "full", "frozen" (new head on a frozen body) or "features" (ScalarMix of
            ``feature_layers`` of the frozen body, mean-pooled, then a linear head).
        feature_layers: for "features": "all", "last4", or a list of hidden-state indices.
        dropout: the body's dropout while fine-tuning (BERT's 0.1; None keeps the checkpoint's).
        classifier_dropout: before the head (None: the body's dropout).
        learning_rate / weight_decay / betas / warmup_steps / min_lr_ratio: AdamW schedule.
        family: "bert" ([CLS], segment ids) or "gpt" (the last real token; mode "full" only, the
            head's dropout is the body's; the data module must give the GPT's tokenizer, e.g.
            its export folder).
        lm_loss_weight: GPT-1's auxiliary objective: this weight times the language-modelling
            loss on the fine-tuning texts is added to the classification loss (GPT-1: 0.5).
    """

    def __init__(
        self,
        num_labels: int,
        vocab_size: int | None = None,
        context_length: int = 128,
        pretrained: str | None = None,
        preset: str = "bert-micro",
        mode: Mode = "full",
        feature_layers: str | list[int] = "all",
        dropout: float | None = 0.1,
        classifier_dropout: float | None = None,
        learning_rate: float = 5e-4,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 20,
        min_lr_ratio: float = 0.1,
        family: Family = "bert",
        lm_loss_weight: float = 0.0,
        model_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(mode)
        self.save_hyperparameters()
        check_int("num_labels", num_labels, note="(1 = regression)")
        if lm_loss_weight < 0 or (lm_loss_weight > 0 and family != "gpt"):
            raise ValueError(f"lm_loss_weight must be ≥ 0, and > 0 only with family='gpt'; got {lm_loss_weight} "
                             f"with family={family!r}")
        self._build(num_labels, vocab_size, context_length, pretrained, preset, mode, feature_layers, dropout,
                    classifier_dropout, family, model_config)

    def _metrics(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        labels = batch["labels"]
        lm_loss = None
        if self.hparams.lm_loss_weight > 0:  # GPT-1: the classifier's and the LM's loss on the same pass
            mask = batch["attention_mask"]
            # labels= without logits: the LM head fused with the loss (the shift inside, as causal_lm_loss)
            out = self.model(batch["input_ids"], attention_mask=mask, return_logits=False,
                             labels=batch["input_ids"].masked_fill(mask == 0, -100))
            logits, lm_loss = out.class_logits, out.loss
        else:
            logits = self(batch)
        if self.num_labels == 1:
            mse = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            return {"loss": mse, "mse": mse}
        self._check_labels(labels, self.num_labels)
        loss = F.cross_entropy(logits.float(), labels)
        metrics = {"loss": loss, "acc": (logits.argmax(-1) == labels).float().mean()}
        if lm_loss is not None:
            metrics |= {"loss": loss + self.hparams.lm_loss_weight * lm_loss, "lm_loss": lm_loss}
        return metrics

    @torch.no_grad()
    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[Record]:
        """Records (`tasks.predictions`): the label name (or index) and its probability —
        regression: the value as both — with the example's text as ``input`` and its label as
        ``target`` when the batch has them."""
        logits = self(batch)
        examples = _examples(batch)
        inputs = None if examples is None else [
            [ex["text"], ex["pair"]] if "pair" in ex else ex["text"] for ex in examples]
        if self.num_labels == 1:
            values = logits.squeeze(-1).float()
            return records(values.tolist(), values, input=inputs,
                           target=batch["labels"].tolist() if "labels" in batch else None)
        return class_records(logits, self._label_names(), batch.get("labels"), input=inputs)


class TokenClassificationTask(_LabelTask):
    """Fine-tunes a BERT body to label every (first sub-)token; -100 labels are ignored.
    Logs ``loss`` and ``acc`` over labelled tokens. Arguments as `SequenceClassificationTask`."""

    per_token = True

    def __init__(
        self,
        num_labels: int,
        vocab_size: int | None = None,
        context_length: int = 64,
        pretrained: str | None = None,
        preset: str = "bert-micro",
        mode: Mode = "full",
        feature_layers: str | list[int] = "all",
        dropout: float | None = 0.1,
        classifier_dropout: float | None = None,
        learning_rate: float = 5e-4,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 20,
        min_lr_ratio: float = 0.1,
        model_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(mode)
        self.save_hyperparameters()
        if not isinstance(num_labels, int) or num_labels < 2:
            raise ValueError(f"token classification needs num_labels ≥ 2, got {num_labels!r}")
        self._build(num_labels, vocab_size, context_length, pretrained, preset, mode, feature_layers, dropout,
                    classifier_dropout, model_config=model_config)

    def _metrics(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        logits, labels = self(batch), batch["labels"]
        self._check_labels(labels, self.num_labels)
        labelled = labels != -100
        loss = F.cross_entropy(logits[labelled].float(), labels[labelled]) if labelled.any() else logits.sum() * 0
        acc = (logits[labelled].argmax(-1) == labels[labelled]).float().mean()
        return {"loss": loss, "acc": acc}

    @torch.no_grad()
    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[Record]:
        """Records (`tasks.predictions`): ``[word, tag]`` for every word — read at its first
        sub-token, the positions the data labels — with the mean probability of the tags as
        ``score`` and the true tags as ``target``. Without word labels every real token is tagged."""
        probs = self(batch).float().softmax(-1)  # (B, N, K)
        confidence, tags = probs.max(-1)
        if "labels" in batch:
            first = batch["labels"] != -100
        elif "attention_mask" in batch:
            first = batch["attention_mask"].bool()
        else:
            first = torch.ones_like(tags, dtype=torch.bool)
        names = self._label_names()
        name = (lambda k: names[k]) if names else (lambda k: k)  # noqa: E731
        examples = _examples(batch)
        tok = getattr(getattr(self.trainer, "datamodule", None), "tokenizer", None)
        predictions, scores, targets = [], [], []
        for row in range(tags.shape[0]):
            where = first[row].nonzero().squeeze(-1).tolist()
            if examples is not None and "words" in examples[row]:
                words = examples[row]["words"][: len(where)]
            elif tok is not None:
                words = [tok.id_to_token(int(batch["input_ids"][row, i])) for i in where]
            else:
                words = [int(batch["input_ids"][row, i]) for i in where]
            predictions.append([[w, name(int(tags[row, i]))] for w, i in zip(words, where)])
            scores.append(float(confidence[row, where].mean()) if where else 1.0)
            if "labels" in batch:
                targets.append([name(int(batch["labels"][row, i])) for i in where])
        return records(predictions, scores, target=targets or None)


def context_positions(segment_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """(B, N) True where an answer may lie: ``[CLS] question [SEP] context [SEP]``'s context, the
    closing [SEP] (segment 1 too, the last real token) left out."""
    allowed = segment_ids.bool() & attention_mask.bool()
    last = attention_mask.long().sum(dim=1, keepdim=True) - 1  # (B, 1): each row's closing [SEP]
    return allowed & (torch.arange(segment_ids.shape[1], device=segment_ids.device)[None, :] != last)


class QuestionAnsweringTask(_FineTuneTask):
    """Fine-tunes a BERT body for extractive QA: a start and an end score per token,
    cross-entropy on ``start_positions`` / ``end_positions``. Logs ``loss`` and
    ``exact_match`` (the best valid span inside the context segment equals the answer).
    Arguments as `SequenceClassificationTask` (modes "full" and "frozen")."""

    def __init__(
        self,
        vocab_size: int | None = None,
        context_length: int = 128,
        pretrained: str | None = None,
        preset: str = "bert-micro",
        mode: Literal["full", "frozen"] = "full",
        max_answer_length: int = 16,
        dropout: float | None = 0.1,
        learning_rate: float = 5e-4,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 20,
        min_lr_ratio: float = 0.1,
        model_config: dict[str, Any] | None = None,
    ) -> None:
        if mode == "features":
            raise ValueError("QuestionAnsweringTask supports mode 'full' or 'frozen'")
        check_int("max_answer_length", max_answer_length)
        super().__init__(mode)
        self.save_hyperparameters()
        self.num_labels = 1  # no class count to check against the data
        body = build_body(vocab_size, context_length, pretrained, preset, model_config=model_config)
        record_model_config(self, body.config)
        self.model = BERT.for_question_answering(body, freeze_backbone=mode == "frozen", dropout=dropout)

    def _metrics(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        out = self.model(batch["input_ids"], batch.get("attention_mask"), batch.get("segment_ids"))
        start, end = batch["start_positions"], batch["end_positions"]
        loss = (F.cross_entropy(out.start_logits.float(), start) + F.cross_entropy(out.end_logits.float(), end)) / 2
        allowed = context_positions(batch["segment_ids"], batch["attention_mask"])
        s, e = span_from_logits(out.start_logits, out.end_logits, allowed, self.hparams.max_answer_length)
        return {"loss": loss, "exact_match": ((s == start) & (e == end)).float().mean()}

    @torch.no_grad()
    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[Record]:
        """Records (`tasks.predictions`): the best span inside the context segment as text,
        ``score`` p(start) · p(end); ``target`` the answer (the documented name) when known."""
        out = self.model(batch["input_ids"], batch.get("attention_mask"), batch.get("segment_ids"))
        allowed = context_positions(batch["segment_ids"], batch["attention_mask"])
        s, e = span_from_logits(out.start_logits, out.end_logits, allowed, self.hparams.max_answer_length)
        rows = torch.arange(len(s), device=s.device)
        # probabilities over the context alone (Hugging Face's QA pipeline masks the question,
        # the special tokens and the padding first): the score does not move with the batch's padding
        start_p = out.start_logits.float().masked_fill(~allowed, float("-inf")).softmax(-1)
        end_p = out.end_logits.float().masked_fill(~allowed, float("-inf")).softmax(-1)
        score = start_p[rows, s] * end_p[rows, e]
        tok = self.trainer.datamodule.tokenizer  # type: ignore[union-attr]
        answers = [tok.decode(batch["input_ids"][i, int(s[i]): int(e[i]) + 1]) for i in range(len(s))]
        examples = _examples(batch)
        return records(answers, score, input=None if examples is None else [ex["question"] for ex in examples],
                       target=None if examples is None else [ex["name"] for ex in examples])
