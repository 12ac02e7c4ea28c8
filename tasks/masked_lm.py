"""Masked-language-model pretraining: BERT (MLM + next-sentence prediction) and ELECTRA
(generator MLM + discriminator replaced-token detection), trained with AdamW.

Batches come from `tasks.data.bert.BERTDataModule`: ``input_ids`` (masked), ``attention_mask``,
``segment_ids``, ``labels`` (-100 where not masked) and, with NSP, ``nsp_labels``.

Axis legend: B batch, N tokens, M masked positions in the batch, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from tasks.optim import adamw_warmup_cosine
from tasks.predictions import Record, mean_log_likelihood, records
from tasks.recorded import check_trained_tokenizer, take_trained_tokenizer
from unitok.models import BERT, ELECTRA, BERTConfig, ELECTRAConfig


def masked_lm_loss(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """(M, V) logits at the masked positions, (M,) targets -> (cross-entropy, accuracy).
    A batch with nothing masked gives a zero loss that still reaches every logit."""
    if targets.numel() == 0:
        zero = logits.sum() * 0.0
        return zero, zero.detach()
    loss = F.cross_entropy(logits.float(), targets)
    return loss, (logits.argmax(-1) == targets).float().mean()


class _PretrainingTask(L.LightningModule):
    """AdamW with warm-up + cosine decay, shared by the pretraining tasks."""

    model: torch.nn.Module

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.model, self.trainer, self.hparams)

    def setup(self, stage: str) -> None:
        # The model keeps its padding id's embedding row at zero: with another tokenizer's id
        # that row is a real token's (a [PAD] at 1 leaves [UNK] at 0), which then never learns.
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        given, have = getattr(datamodule, "pad_token_id", None), self.model.config.pad_token_id
        if given is not None and have is not None and given != have:
            raise ValueError(f"the data module's pad_token_id={given} differs from the model's pad_token_id={have}; "
                             f"set model.init_args.pad_token_id: {given} (the tokenizer's [PAD])")
        check_trained_tokenizer(self, datamodule, stage)  # a checkpoint tested with another tokenizer is refused

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        take_trained_tokenizer(self, checkpoint)

    def _log_all(self, stage: str, metrics: dict[str, Tensor], batch_size: int) -> None:
        for name, value in metrics.items():
            self.log(f"{stage}_{name}", value, prog_bar=name in ("loss", "mlm_acc", "nsp_acc", "rtd_acc"),
                     batch_size=batch_size)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        metrics = self._metrics(batch)
        self._log_all("train", metrics, batch["input_ids"].shape[0])
        return metrics["loss"]

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        metrics = self._metrics(batch)
        self._log_all("val", metrics, batch["input_ids"].shape[0])
        return metrics["loss"]

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        metrics = self._metrics(batch)
        self._log_all("test", metrics, batch["input_ids"].shape[0])
        return metrics["loss"]

    def _metrics(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        raise NotImplementedError


class MaskedLMTask(_PretrainingTask):
    """Pretrains a BERT with the masked-LM loss (+ next-sentence prediction).

    Logs ``loss``, ``mlm_loss``, ``mlm_acc`` (accuracy on the masked positions only) and,
    with NSP, ``nsp_loss`` and ``nsp_acc``, for train / val / test. ``predict`` fills the
    [MASK] tokens of the data module's ``predict_texts``.

    Args:
        vocab_size / context_length: linked from the data module by the CLI.
        preset: a `BERTConfig` preset; ``d_model``, ``n_layers``, ``n_heads``, ``dropout``
            override it when given.
        nsp: train the next-sentence head (the data module must give sentence pairs).
        pad_token_id: the tokenizer's padding id (its embedding stays zero); training refuses a
            data module whose ``pad_token_id`` differs.
        learning_rate / weight_decay / betas / warmup_steps / min_lr_ratio: AdamW, linear
            warm-up then cosine decay (no decay on biases and norm gains).
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        preset: str = "bert-micro",
        d_model: int | None = None,
        n_layers: int | None = None,
        n_heads: int | None = None,
        dropout: float | None = None,
        nsp: bool = True,
        pad_token_id: int | None = 0,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        overrides: dict[str, Any] = {k: v for k, v in dict(d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                                           dropout=dropout).items() if v is not None}
        if dropout is not None:
            overrides["attn_dropout"] = dropout
        heads = ("pooler", "mlm", "nsp") if nsp else ("mlm",)
        config = BERTConfig.from_name(preset, vocab_size=vocab_size, context_length=context_length,
                                      pad_token_id=pad_token_id, heads=heads, **overrides)
        self.model = BERT(config)

    def forward(self, input_ids: Tensor, **kwargs: Any):
        return self.model(input_ids, **kwargs)

    def _metrics(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        out = self.model(batch["input_ids"], batch.get("attention_mask"), batch.get("segment_ids"),
                         compute_heads=False)
        masked = batch["labels"] != -100
        # The vocabulary projection only where there is something to predict (≈15 % of tokens).
        logits = self.model.mlm_head(out.last_hidden_state[masked])
        mlm_loss, mlm_acc = masked_lm_loss(logits, batch["labels"][masked])
        metrics = {"mlm_loss": mlm_loss, "mlm_acc": mlm_acc}
        loss = mlm_loss
        if self.model.nsp_head is not None:
            if "nsp_labels" not in batch:
                raise ValueError("the model trains next-sentence prediction but the batch has no nsp_labels; "
                                 "use sentence pairs (BERTDataModule(nsp=True)) or MaskedLMTask(nsp=False)")
            nsp_logits = self.model.nsp_head(out.pooled)
            nsp_loss = F.cross_entropy(nsp_logits.float(), batch["nsp_labels"])
            metrics.update(nsp_loss=nsp_loss, nsp_acc=(nsp_logits.argmax(-1) == batch["nsp_labels"]).float().mean())
            loss = loss + nsp_loss
        metrics["loss"] = loss
        return metrics

    prediction_format = "{input}  ->  {prediction}"  # how `tasks.PrintPredictions` shows a record

    @torch.no_grad()
    def predict_step(self, batch: list[str], batch_idx: int) -> list[Record]:
        """Fill every [MASK] in each text with the model's most likely token. Records
        (`tasks.predictions`): the text as ``input``, the filled text as ``prediction``, the mean
        log-probability of the filled-in tokens as ``score`` (0 without a [MASK])."""
        tok = self.trainer.datamodule.tokenizer  # type: ignore[union-attr]
        # a text longer than the context is an error, as in the fill-mask pipeline: cut, it could
        # lose its [MASK] and answer with nothing filled in
        tokens = tok.batch_encode(batch, max_length=self.model.config.context_length, truncation=False)
        tokens = tokens.to(self.device)
        logits = self.model(tokens).mlm_logits  # (B, N, V)
        ids = tokens.ids.clone()
        at_mask = ids == tok.mask_id
        ids[at_mask] = logits[at_mask].argmax(-1)
        score = mean_log_likelihood(logits, ids, at_mask)
        return records(tok.batch_decode(ids), score, input=list(batch))


class ElectraTask(_PretrainingTask):
    """Trains ELECTRA's generator (MLM) and discriminator (replaced-token detection) jointly:
    loss = MLM + ``rtd_weight`` · binary cross-entropy over every real token.

    Logs ``loss``, ``mlm_loss``, ``mlm_acc`` (the generator), ``rtd_loss``, ``rtd_acc`` (all
    real tokens), ``rtd_recall`` (replaced tokens found) and ``replaced_frac`` (the share of
    real tokens replaced: predicting "nothing replaced" scores 1 − that). The data module gives
    single segments (``nsp: false``); every selected position is refilled by a generator
    sample. Export ``model.discriminator`` (a `BERT`) to fine-tune.

    Args:
        vocab_size / context_length: linked from the data module by the CLI.
        preset: an `ELECTRAConfig` preset; ``dropout`` overrides it when given.
        rtd_weight: λ of the discriminator loss (50 in the paper).
        temperature: of the generator's sampling.
        pad_token_id / learning_rate / weight_decay / betas / warmup_steps / min_lr_ratio: as in
            `MaskedLMTask`.
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        preset: str = "electra-nano",
        dropout: float | None = None,
        pad_token_id: int | None = 0,
        rtd_weight: float = 50.0,
        temperature: float = 1.0,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if rtd_weight <= 0:
            raise ValueError(f"rtd_weight must be > 0, got {rtd_weight}")
        overrides: dict[str, Any] = {} if dropout is None else {"dropout": dropout, "attn_dropout": dropout}
        config = ELECTRAConfig.from_name(preset, vocab_size=vocab_size, context_length=context_length,
                                         pad_token_id=pad_token_id, **overrides)
        self.model = ELECTRA(config)

    def _metrics(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        out = self.model(batch["input_ids"], batch["labels"], batch.get("attention_mask"), batch.get("segment_ids"),
                         temperature=self.hparams.temperature)
        mlm_loss, mlm_acc = masked_lm_loss(out.generator_logits, batch["labels"][out.masked])
        real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(out.replaced)
        logits, target = out.discriminator_logits[real].float(), out.replaced[real].float()
        rtd_loss = F.binary_cross_entropy_with_logits(logits, target)
        predicted = logits > 0
        replaced = target.bool()
        recall = (predicted & replaced).sum() / replaced.sum().clamp(min=1)
        return {
            "loss": mlm_loss + self.hparams.rtd_weight * rtd_loss, "mlm_loss": mlm_loss, "mlm_acc": mlm_acc,
            "rtd_loss": rtd_loss, "rtd_acc": (predicted == replaced).float().mean(), "rtd_recall": recall,
            "replaced_frac": target.mean(),
        }

    @torch.no_grad()
    def predict_step(self, batch: list[str], batch_idx: int) -> list[Record]:
        """Replaced-token detection on each text: the generator first fills every [MASK] with its
        most likely token, then the discriminator flags each token. Records (`tasks.predictions`):
        ``prediction`` [token, replaced?] for every real token, ``score`` the mean probability
        of the flags given, ``filled`` the text the discriminator read, ``input`` the text."""
        tok = self.trainer.datamodule.tokenizer  # type: ignore[union-attr]
        tokens = tok.batch_encode(batch, max_length=self.model.config.context_length, truncation=False)  # no silent cut
        tokens = tokens.to(self.device)
        ids, mask, segments = tokens.ids.clone(), tokens.attention_mask, tokens.segments
        at_mask = ids == tok.mask_id
        if at_mask.any():
            hidden = self.model.generator(ids, mask, segments, compute_heads=False).last_hidden_state
            ids[at_mask] = self.model.generator.mlm_head(hidden[at_mask]).argmax(-1)
        p_replaced = self.model.discriminator(ids, mask, segments).rtd_logits.float().sigmoid()  # (B, N)
        special = torch.tensor(tok.special_ids, device=ids.device)
        real = ~torch.isin(ids, special)
        if mask is not None:
            real &= mask.bool()
        flags = p_replaced > 0.5
        confidence = torch.where(flags, p_replaced, 1 - p_replaced)
        score = (confidence * real).sum(-1) / real.sum(-1).clamp(min=1)
        tagged = [[[tok.id_to_token(int(i)), bool(f)] for i, f, r in zip(row_ids, row_flags, row_real) if r]
                  for row_ids, row_flags, row_real in zip(ids.tolist(), flags.tolist(), real.tolist())]
        return records(tagged, score, input=list(batch), filled=tok.batch_decode(ids))
