"""Encoder–decoder training for `T5`: span-corruption pretraining and text-to-text fine-tuning.

One objective serves both: cross-entropy of the decoder's next-token logits on ``labels``
(teacher forcing, -100 ignored). Text-to-text validation also decodes the held-out inputs
and logs exact match (greedy, and beam search when asked), overall and per task prefix.

Axis legend: B batch, S source tokens, N target tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import Tensor

from tasks.optim import adamw_warmup_cosine
from tasks.predictions import Record, mean_log_likelihood, records, until_eos
from tasks.recorded import (
    check_pretrained_tokenizer,
    check_trained_tokenizer,
    record_model_config,
    take_trained_tokenizer,
)
from tokenizers_mm.checks import check_int, check_number
from unitok.models import T5, T5Config

IGNORE = -100


def exact_match(generated: Tensor, labels: Tensor, eos_token_id: int,
                decode: Callable[[list[int]], str] | None = None, pad_token_id: int | None = None) -> Tensor:
    """(B,) bool: does each generated answer equal its target?

    ``generated`` (B, 1 + new) starts with the decoder's start token (as ``T5.generate``
    returns it); ``labels`` (B, N) end in EOS and are padded with -100. A prediction counts up
    to its first EOS; one that never ends does not match. With ``decode`` (a tokenizer's) the
    texts are compared, as a text-to-text task is scored: an answer spelt with other pieces
    ("hel" "lo" for "hello") or with a stray pad is right; without it, the ids.
    """
    out = torch.zeros(labels.shape[0], dtype=torch.bool)
    for row, (pred, target) in enumerate(zip(generated[:, 1:].tolist(), labels.tolist())):
        target = [t for t in target if t != IGNORE]
        if eos_token_id not in pred:
            continue
        pred = pred[: pred.index(eos_token_id) + 1]
        if decode is None:
            out[row] = pred == target
        else:
            def text(ids: list[int]) -> str:
                return decode([t for t in ids if t not in (eos_token_id, pad_token_id)])

            out[row] = text(pred) == text(target)
    return out


class Seq2SeqTask(L.LightningModule):
    """Trains a `T5` on ``{"input_ids", "attention_mask", "labels"}`` batches.

    Logs ``train_loss``, ``val_loss`` / ``test_loss``; on text-to-text batches (they carry a
    ``prefix`` list) also ``val_exact_match`` (greedy), ``val_exact_match_<prefix>`` per task
    and, with ``eval_num_beams``, ``val_exact_match_beam``. The model's config is stored in the
    checkpoint's hyperparameters (``model_config``), so a checkpoint rebuilds its own model, and
    so is the tokenizer it was trained with (``trained_tokenizer``): testing or resuming a
    checkpoint with another one (of the same size) is refused.

    Args:
        vocab_size / eos_token_id: linked from the data module by the CLI.
        pad_token_id: padding and decoder start id (T5's ``<pad>`` = 0, as the T5 data modules
            build their tokenizers; checked against the data module when training starts).
        preset: a `T5Config` preset; ``d_model``, ``n_layers``, ``n_decoder_layers``,
            ``n_heads``, ``d_ff``, ``dropout`` override it when given.
        pretrained: a ``save_pretrained`` folder (e.g. a span-corruption run's) to fine-tune;
            then the preset and overrides are not used.
        model_config: a full `T5Config` as a dict (set automatically, so a checkpoint rebuilds
            its model without ``pretrained``'s folder; wins over the other model options).
        learning_rate / weight_decay / betas: AdamW (no decay on norm gains).
        warmup_steps / min_lr_ratio: linear warm-up, then cosine decay to
            ``min_lr_ratio × learning_rate``.
        exact_match: decode held-out text-to-text inputs and log exact match.
        eval_num_beams / length_penalty: also log beam-search exact match with this many beams.
        max_new_tokens: decoding budget in ``predict`` (evaluation uses the target's length + 1).
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int = 0,
        preset: str = "t5-tiny",
        d_model: int | None = None,
        n_layers: int | None = None,
        n_decoder_layers: int | None = None,
        n_heads: int | None = None,
        d_ff: int | None = None,
        dropout: float | None = None,
        pretrained: str | None = None,
        model_config: dict[str, Any] | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
        exact_match: bool = True,
        eval_num_beams: int | None = None,
        length_penalty: float = 1.0,
        max_new_tokens: int = 32,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_int("eval_num_beams", eval_num_beams, at_least=2, or_none=True, note="(None: greedy only)")
        check_int("max_new_tokens", max_new_tokens)
        check_number("length_penalty", length_penalty)
        if model_config is not None:  # a checkpoint: its weights follow, the starting folder is not read
            self.model = T5(T5Config.from_dict(dict(model_config)))
        elif pretrained is not None:
            self.model = T5.from_pretrained(pretrained).train()  # loading gives eval mode; Lightning keeps it
            c = self.model.config
            for name, given, have in (("vocab_size", vocab_size, c.vocab_size),
                                      ("eos_token_id", eos_token_id, c.eos_token_id),
                                      ("pad_token_id", pad_token_id, c.pad_token_id)):
                if given is not None and given != have:
                    raise ValueError(f"the data's {name}={given} differs from the pretrained model's {have} "
                                     f"({pretrained}); use the tokenizer the model was trained with "
                                     "(data.tokenizer: <the same pretrained folder>)")
        else:
            if vocab_size is None:
                raise ValueError("vocab_size is required to build a model from scratch (the CLI links it from the "
                                 "data module); or give `pretrained`")
            overrides = {k: v for k, v in dict(d_model=d_model, n_layers=n_layers, n_decoder_layers=n_decoder_layers,
                                               n_heads=n_heads, d_ff=d_ff, dropout=dropout).items() if v is not None}
            eos = {"eos_token_id": eos_token_id} if eos_token_id is not None else {}
            config = T5Config.from_name(preset, vocab_size=vocab_size, pad_token_id=pad_token_id,
                                        decoder_start_token_id=pad_token_id, **eos, **overrides)
            self.model = T5(config)
        record_model_config(self, self.model.config)
        limit = self.model.config.max_decoder_length - 1  # the decoder start token takes one position
        if max_new_tokens > limit:
            raise ValueError(f"max_new_tokens={max_new_tokens} is more than the decoder's max_decoder_length - 1 = "
                             f"{limit} new tokens")

    def forward(self, input_ids: Tensor, **kwargs: Any):
        return self.model(input_ids, **kwargs)

    # ------------------------------------------------------------------ loss
    def loss(self, batch: dict[str, Any]) -> Tensor:
        """Mean cross-entropy of the targets (teacher forcing; -100 ignored), the LM head fused with
        the loss: the (B, N, V) logits are never held whole."""
        return self.model(batch["input_ids"], attention_mask=batch.get("attention_mask"), labels=batch["labels"],
                          return_logits=False).loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        self.log("lr", self.optimizers().param_groups[0]["lr"])  # type: ignore[union-attr]
        return loss

    def _eval_step(self, batch: dict[str, Any], stage: str) -> Tensor:
        size = batch["labels"].shape[0]
        loss = self.loss(batch)
        self.log(f"{stage}_loss", loss, prog_bar=True, batch_size=size)
        if self.hparams.exact_match and "prefix" in batch:
            self._log_exact_match(batch, stage)
        return loss

    @torch.no_grad()
    def predict_ids(self, batch: dict[str, Any], strategy: str = "greedy", max_new_tokens: int | None = None,
                    **options: Any) -> Tensor:
        """Decode a batch's inputs -> (B, 1 + new) ids; the budget defaults to the labels' width + 1."""
        budget = max_new_tokens or batch["labels"].shape[1] + 1
        budget = min(budget, self.model.config.max_decoder_length - 1)
        return self.model.generate(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                                   max_new_tokens=budget, strategy=strategy, **options)

    def _log_exact_match(self, batch: dict[str, Any], stage: str) -> None:
        labels, prefixes = batch["labels"], batch["prefix"]
        runs = [("", self.predict_ids(batch))]
        if self.hparams.eval_num_beams:
            runs.append(("_beam", self.predict_ids(batch, "beam", num_beams=self.hparams.eval_num_beams,
                                                   length_penalty=self.hparams.length_penalty)))
        eos, pad = self.model.config.eos_token_id, self.model.config.pad_token_id
        tokenizer = getattr(getattr(self.trainer, "datamodule", None), "tokenizer", None)
        decode = tokenizer.decode if tokenizer is not None else None  # texts compared, not their pieces
        for suffix, generated in runs:
            hits = exact_match(generated.cpu(), labels.cpu(), eos, decode, pad).float()
            self.log(f"{stage}_exact_match{suffix}", hits.mean(), prog_bar=True, batch_size=len(hits))
            for prefix in sorted({p for p in prefixes if p}):
                rows = torch.tensor([p == prefix for p in prefixes])
                self.log(f"{stage}_exact_match{suffix}_{prefix}", hits[rows].mean(), batch_size=int(rows.sum()))

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self._eval_step(batch, "test")

    prediction_format = "{input}\n→ {prediction}"  # how `tasks.PrintPredictions` shows a record

    @torch.no_grad()
    def predict_step(self, batch: list[str], batch_idx: int) -> list[Record]:
        """Answer each input string greedily; needs the data module's tokenizer. Sentinels stay
        visible (a span-corruption model's answers are sentinel-marked spans). Records
        (`tasks.predictions`): the text as ``input``, the answer as ``prediction``, the mean
        log-probability of its tokens (EOS included) as ``score``."""
        from tasks.data.t5 import encode_inputs

        datamodule = self.trainer.datamodule  # type: ignore[union-attr]
        tok = datamodule.tokenizer
        for text in batch:
            if hasattr(datamodule, "check_prefix"):
                datamodule.check_prefix(text, "predict input")
        enc = {k: v.to(self.device) for k, v in encode_inputs(tok, batch).items()}
        out = self.model.generate(enc["input_ids"], attention_mask=enc["attention_mask"],
                                  max_new_tokens=self.hparams.max_new_tokens)  # (B, 1 + T)
        logits = self.model(enc["input_ids"], attention_mask=enc["attention_mask"],
                            decoder_input_ids=out[:, :-1]).logits  # (B, T, V)
        score = mean_log_likelihood(logits, out[:, 1:], until_eos(out[:, 1:], self.model.config.eos_token_id))
        return records(self.decode_answers(out, tok), score, input=list(batch))

    def decode_answers(self, generated: Tensor, tokenizer: Any) -> list[str]:
        """(B, 1 + new) generated ids -> texts: start token dropped, cut at EOS, pad removed."""
        eos, pad = self.model.config.eos_token_id, self.model.config.pad_token_id
        texts = []
        for row in generated[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            texts.append(tokenizer.decode([t for t in row if t != pad]) if row else "")
        return texts

    # ------------------------------------------------------------------ setup and optimiser
    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        c = self.model.config
        for name, have in (("pad_token_id", c.pad_token_id), ("eos_token_id", c.eos_token_id),
                           ("vocab_size", c.vocab_size)):
            given = getattr(datamodule, name, None)
            if given is not None and given != have:
                raise ValueError(f"the data module's {name}={given} differs from the model's {name}={have}; "
                                 f"set model.init_args.{name}: {given} (or use the model's tokenizer)")
        check_pretrained_tokenizer(self.model, self.hparams.pretrained, datamodule)
        check_trained_tokenizer(self, datamodule, stage)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        take_trained_tokenizer(self, checkpoint)  # a checkpoint's model has no processor: its record is checked

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.model, self.trainer, self.hparams)
