"""Causal language modelling: next-token cross-entropy for `GPT`, trained with AdamW."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from torch import Tensor

from tasks.optim import adamw_warmup_cosine
from tasks.predictions import PromptSet, Record, mean_log_likelihood, records, until_eos
from tasks.recorded import check_trained_tokenizer, take_trained_tokenizer
from tokenizers_mm.checks import check_int
from unitok.compile import loss_backend
from unitok.losses import linear_cross_entropy
from unitok.models import GPT, GPTConfig


class CausalLMTask(L.LightningModule):
    """Trains a GPT on (input_ids, labels) windows; logs loss and perplexity.

    Args:
        vocab_size / context_length / eos_token_id: linked from the data module by the CLI.
        preset: a `GPTConfig` preset name; ``d_model``, ``n_layers``, ``n_heads``, ``dropout``
            override it when given.
        learning_rate / weight_decay / betas: AdamW (no decay on biases and norm gains).
        warmup_steps / min_lr_ratio: linear warm-up, then cosine decay to
            ``min_lr_ratio × learning_rate`` at the end of training.
        generate_max_new_tokens: length of continuations in ``predict`` (EOS ends one sooner); a
            prompt must leave that much room in the context.
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        preset: str = "gpt-micro",
        d_model: int | None = None,
        n_layers: int | None = None,
        n_heads: int | None = None,
        dropout: float | None = None,
        eos_token_id: int | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
        generate_max_new_tokens: int = 48,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_int("generate_max_new_tokens", generate_max_new_tokens)  # now, not when predict runs
        overrides = {k: v for k, v in dict(d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                           dropout=dropout).items() if v is not None}
        config = GPTConfig.from_name(preset, vocab_size=vocab_size, context_length=context_length,
                                     eos_token_id=eos_token_id, **overrides)
        self.model = GPT(config)

    def setup(self, stage: str) -> None:
        # the tokenizer the model learns its ids with: a checkpoint tested or resumed with another
        # of the same size would read every id as another piece (`tasks.recorded`)
        check_trained_tokenizer(self, getattr(self.trainer, "datamodule", None) if self._trainer else None, stage)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        take_trained_tokenizer(self, checkpoint)

    def forward(self, input_ids: Tensor, **kwargs: Any):
        return self.model(input_ids, **kwargs)

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        # labels are already the next tokens (labels[:, t] follows input t): no shift here. The LM
        # head runs fused with the loss, so the (B, N, V) logits are never held whole.
        out = self.model(batch["input_ids"], attention_mask=batch.get("attention_mask"), return_logits=False)
        return linear_cross_entropy(out.last_hidden_state, self.model.lm_head.weight, batch["labels"],
                                    self.model.lm_head.bias, compile=loss_backend(self.model))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        self.log("lr", self.optimizers().param_groups[0]["lr"], prog_bar=False)  # type: ignore[union-attr]
        return loss

    def _eval_step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        loss = self._loss(batch)
        self.log(f"{stage}_loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._eval_step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        loss = self.trainer.callback_metrics.get("val_loss")
        if loss is not None:
            self.log("val_ppl", math.exp(min(float(loss), 50.0)), prog_bar=True)

    def on_test_epoch_end(self) -> None:
        loss = self.trainer.callback_metrics.get("test_loss")
        if loss is not None:
            self.log("test_ppl", math.exp(min(float(loss), 50.0)))

    prediction_format = "{input}{prediction}"  # how `tasks.PrintPredictions` shows a record

    def on_predict_start(self) -> None:
        """Every prompt of the predict set is checked before any is continued: one too long for
        its continuation is refused now, not when its batch comes after the others were computed."""
        tok = getattr(self.trainer.datamodule, "tokenizer", None)
        loaders = self.trainer.predict_dataloaders
        for loader in loaders if isinstance(loaders, list | tuple) else [loaders]:
            dataset = getattr(loader, "dataset", None)
            if tok is not None and isinstance(dataset, PromptSet):
                self._check_room(dataset.texts, _token_counts(tok, dataset.texts),
                                 [dataset.item_id(i) for i in range(len(dataset))])

    def _check_room(self, texts: list[str], counts: list[int], names: list[Any] | None = None) -> None:
        """A ValueError naming the first prompt (by ``names``, its ids in the predict set, where
        known) that leaves less room in the context than ``generate_max_new_tokens``: no
        continuation is cut short."""
        context, asked = self.model.config.context_length, self.hparams.generate_max_new_tokens
        too_long = [i for i, n in enumerate(counts) if n + asked > context]
        if not too_long:
            return
        i = too_long[0]
        prompt = f"prompt {names[i]} ({texts[i]!r}, " if names is not None else f"prompt {texts[i]!r} ("
        more = f" (and {len(too_long) - 1} more)" if len(too_long) > 1 else ""
        room = (f"shorten it or ask for at most {context - counts[i]} new tokens (--model.generate_max_new_tokens)"
                if counts[i] < context else "shorten it")
        raise ValueError(f"{prompt}{counts[i]} tokens){more} and generate_max_new_tokens {asked} exceed the model's "
                         f"context of {context} tokens: {room}")

    @torch.no_grad()
    def predict_step(self, batch: list[str], batch_idx: int) -> list[Record]:
        """Continue each prompt string greedily by ``generate_max_new_tokens`` (or to its EOS),
        whatever its batch; needs the data module's tokenizer. Records (`tasks.predictions`): the
        prompt as ``input``, the continuation as ``prediction``, its mean log-probability per
        token as ``score``."""
        tok = self.trainer.datamodule.tokenizer  # type: ignore[union-attr]
        prompts = tok.batch_encode(batch, padding_side="left").to(self.device)
        S = prompts.seq_len
        counts = prompts.attention_mask.sum(1).tolist() if prompts.attention_mask is not None else [S] * len(batch)
        self._check_room(list(batch), counts)  # (checked ahead for a PromptSet: this is for any other loader)
        out = self.model.generate(prompts, max_new_tokens=self.hparams.generate_max_new_tokens)
        new = out[:, S:]  # (B, T)
        kept = until_eos(new, self.model.config.eos_token_id)
        prompt_mask = prompts.attention_mask if prompts.attention_mask is not None else torch.ones_like(prompts.ids)
        mask = torch.cat([prompt_mask.long(), torch.ones_like(new)], dim=1)[:, :-1]
        hidden = self.model(out[:, :-1], attention_mask=mask, return_logits=False).last_hidden_state
        # Only the last T positions predict generated tokens: the head runs there alone, (B, T, V).
        score = mean_log_likelihood(self.model.lm_head(hidden[:, S - 1:]), new, kept)
        eos = self.model.config.eos_token_id
        texts = [tok.decode([t for t in row if t >= 0 and t != eos], skip_special_tokens=True)
                 for row in new.masked_fill(~kept, -1).tolist()]
        return records(texts, score, input=list(batch))

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.model, self.trainer, self.hparams)


def _token_counts(tok: Any, texts: list[str], chunk: int = 1024) -> list[int]:
    """The number of tokens each text encodes to, as `CausalLMTask.predict_step` encodes it."""
    counts: list[int] = []
    for start in range(0, len(texts), chunk):
        tokens = tok.batch_encode(texts[start:start + chunk], padding_side="left")
        mask = tokens.attention_mask
        counts += mask.sum(1).tolist() if mask is not None else [tokens.seq_len] * len(texts[start:start + chunk])
    return counts
