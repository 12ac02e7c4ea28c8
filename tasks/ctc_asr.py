"""CTC speech recognition: a Conformer-CTC trained on spectrogram frames, scored by CER and WER.

Axis legend: B batch, N frames in, N' frames after subsampling, V = 1 + characters, L target length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.text import CharErrorRate, WordErrorRate

from tasks.optim import adamw_warmup_cosine
from tasks.predictions import Record, records
from tasks.recorded import record_model_config
from tokenizers_mm import CharacterVocabulary, SpectrogramConfig
from tokenizers_mm.checks import check_int
from unitok.ctc import Decoder, Lexicon, check_decoder, ctc_decode
from unitok.losses import check_ctc_targets
from unitok.models import ConformerConfig, ConformerCTC
from unitok.outputs import CTCOutput


def ctc_loss(logits: Tensor, output_lengths: Tensor, targets: Tensor, target_lengths: Tensor) -> Tensor:
    """CTC loss (blank = 0) from (B, N', V) logits, averaged over the batch after dividing each
    utterance's loss by its target length — an empty target's (a clip with no speech: every
    frame blank) by its frame count, so one such clip does not outweigh a batch of speech;
    impossible alignments (too few frames) count as 0. Targets: (B, U) padded ids, each row's
    first ``target_lengths`` in [1, V)."""
    within = torch.arange(targets.shape[-1], device=targets.device)[None, :] < target_lengths[:, None]  # (B, U)
    check_ctc_targets(targets[within], logits.shape[-1], blank=0)
    log_probs = logits.float().log_softmax(dim=-1).transpose(0, 1)  # (N', B, V)
    losses = F.ctc_loss(log_probs, targets, output_lengths, target_lengths, blank=0, reduction="none",
                        zero_infinity=True)  # (B,)
    per = torch.where(target_lengths > 0, target_lengths, output_lengths).clamp_min(1).to(losses)
    return (losses / per).mean()


def ctc_log_likelihood(log_probs: Tensor, lengths: Tensor, paths: Sequence[Sequence[int]]) -> Tensor:
    """log P(labels | audio) of each row's label sequence, summed over every CTC alignment
    (blank = 0): (B, N', V) log-probabilities, (B,) frame counts, B label sequences -> (B,)."""
    device = log_probs.device
    targets = torch.tensor([label for path in paths for label in path], dtype=torch.long, device=device)
    target_lengths = torch.tensor([len(path) for path in paths], dtype=torch.long, device=device)
    nll = F.ctc_loss(log_probs.float().transpose(0, 1), targets, lengths, target_lengths, blank=0, reduction="none")
    return -nll


class CTCSpeechTask(L.LightningModule):
    """Trains a `ConformerCTC` on ``{"features", "feature_lengths", "targets", "target_lengths",
    "texts"}`` batches.

    The model's vocabulary and spectrogram settings come from the data module (``vocabulary``,
    ``spectrogram_config``) when fitting starts, or from ``vocabulary`` / ``spectrogram`` here;
    they are stored in the model's config, and that config in the checkpoint's hyperparameters
    (``model_config``), so a checkpoint or an exported folder transcribes audio on its own.

    Logs ``train_loss``, ``val_loss``, ``val_cer``, ``val_wer`` (greedy decoding), ``test_loss``,
    ``test_cer``, ``test_wer`` (with ``decoder``); ``predict`` returns transcript records.

    Args:
        preset: a `ConformerConfig` preset. d_model / n_layers / n_heads / conv_kernel_size /
            dropout: override it.
        pretrained: a ``save_pretrained`` folder to start from (its vocabulary and spectrogram
            settings must match the data's, and ``vocabulary`` / ``spectrogram`` when given). It
            keeps its architecture (``d_model``, ``n_layers``, ``n_heads``, ``conv_kernel_size``
            given with it are errors); ``dropout`` is the fine-tuning's (a training choice, as
            for BERT and GPT fine-tuning).
        vocabulary / spectrogram: the characters (ids 1..) and `SpectrogramConfig` fields, to
            build the model now instead of from the data module.
        model_config: a full `ConformerConfig` as a dict (set automatically once the model
            exists, so a checkpoint rebuilds it without ``pretrained``'s folder; wins over the
            other model options).
        learning_rate / weight_decay / betas / warmup_steps / min_lr_ratio: AdamW (no decay on
            biases and norm gains), linear warm-up then cosine decay.
        decoder / beam_size: decoding for test and predict: "greedy" or CTC prefix beam search.
        lexicon: words the transcripts consist of (e.g. the ten digit names): beam search then
            spells only those (`unitok.ctc.Lexicon`); needs ``decoder="beam"``.
    """

    def __init__(
        self,
        preset: str = "conformer-digits",
        d_model: int | None = None,
        n_layers: int | None = None,
        n_heads: int | None = None,
        conv_kernel_size: int | None = None,
        dropout: float | None = None,
        pretrained: str | None = None,
        vocabulary: list[str] | None = None,
        spectrogram: dict[str, Any] | None = None,
        model_config: dict[str, Any] | None = None,
        learning_rate: float = 2e-3,
        weight_decay: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.01,
        decoder: Decoder = "greedy",
        beam_size: int = 8,
        lexicon: list[str] | None = None,
    ) -> None:
        super().__init__()
        # Decoding is an evaluation choice, not part of the trained model: left out of the
        # checkpoint's hyperparameters so `unitok test --ckpt_path … --model.decoder beam` applies.
        self.save_hyperparameters(ignore=["decoder", "beam_size", "lexicon"])
        check_decoder(decoder, lexicon)
        check_int("beam_size", beam_size)
        self.decoder, self.beam_size, self.lexicon = decoder, beam_size, lexicon
        self._words: Lexicon | None = None  # ``lexicon`` spelled in the model's characters, once it exists
        architecture = [k for k in self._overrides() if k != "dropout"]  # dropout: fine-tuning's
        if pretrained is not None and architecture:
            raise ValueError(f"a pretrained model's {', '.join(architecture)} cannot be overridden")
        self.model: ConformerCTC | None = None
        if model_config is not None:  # a checkpoint: its weights follow, the starting folder is not read
            self.model = ConformerCTC(ConformerConfig.from_dict(dict(model_config)))
        elif pretrained is not None:
            self.model = ConformerCTC.from_pretrained(pretrained).train()  # loading gives eval mode
            self._check_given(self.model.config, vocabulary, spectrogram)
            if dropout is not None and dropout != self.model.config.dropout:
                # in its blocks: the config's dropout, as a fresh model's override sets it
                self.model = self.model.rebuilt(self.model.config.replace(dropout=dropout))
        elif vocabulary is not None:
            self.model = self._build(CharacterVocabulary(vocabulary), SpectrogramConfig.from_dict(spectrogram or {}))
        if self.model is not None:
            record_model_config(self, self.model.config)
        self.val_cer, self.val_wer = CharErrorRate(), WordErrorRate()
        self.test_cer, self.test_wer = CharErrorRate(), WordErrorRate()

    # ------------------------------------------------------------------ model
    def _overrides(self) -> dict[str, Any]:
        h = self.hparams
        return {k: h[k] for k in ("d_model", "n_layers", "n_heads", "conv_kernel_size", "dropout") if h[k] is not None}

    def _build(self, vocabulary: CharacterVocabulary, spectrogram: SpectrogramConfig) -> ConformerCTC:
        config = ConformerConfig.from_name(self.hparams.preset, n_mels=spectrogram.n_mels,
                                           vocabulary=tuple(vocabulary.chars), spectrogram=spectrogram.to_dict(),
                                           **self._overrides())
        return ConformerCTC(config)

    @staticmethod
    def _check_given(config: ConformerConfig, vocabulary: list[str] | None,
                     spectrogram: dict[str, Any] | None) -> None:
        """``vocabulary`` / ``spectrogram`` given with ``pretrained`` must be the loaded model's:
        they would otherwise be ignored."""
        if vocabulary is not None and tuple(vocabulary) != config.vocabulary:
            raise ValueError(f"vocabulary={list(vocabulary)} differs from the pretrained model's "
                             f"{list(config.vocabulary)}; leave vocabulary out to use the model's")
        if spectrogram is not None:  # the fields given (as SpectrogramConfig reads them) against the model's
            given = SpectrogramConfig.from_dict(spectrogram).to_dict()
            model = SpectrogramConfig.for_model(config.spectrogram, config.n_mels).to_dict()
            differ = [f"{k}={given[k]!r} (the model's {model[k]!r})" for k in spectrogram if given[k] != model[k]]
            if differ:
                raise ValueError(f"spectrogram {', '.join(differ)} differs from the pretrained model's; "
                                 "leave spectrogram out to use the model's")

    def configure_model(self) -> None:
        """Build the model from the data module's vocabulary and spectrogram settings, unless it
        exists; check a pretrained or given model against the data."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        vocabulary = getattr(datamodule, "vocabulary", None)
        spectrogram = getattr(datamodule, "spectrogram_config", None)
        if self.model is None:
            if vocabulary is None or spectrogram is None:
                raise ValueError("CTCSpeechTask needs a vocabulary and spectrogram settings: fit with a speech data "
                                 "module (vocabulary, spectrogram_config) or pass vocabulary=[...] / pretrained=")
            self.model = self._build(vocabulary, spectrogram)
            # Recorded so `load_from_checkpoint` rebuilds the same model without the data module.
            self.hparams["vocabulary"] = list(vocabulary.chars)
            self.hparams["spectrogram"] = spectrogram.to_dict()
            record_model_config(self, self.model.config)
            self._lexicon()  # a lexicon word the characters cannot spell fails now, not after a run
            return
        c = self.model.config
        if vocabulary is not None and tuple(vocabulary.chars) != c.vocabulary:
            raise ValueError(f"the data's vocabulary {''.join(vocabulary.chars)!r} differs from the model's "
                             f"{''.join(c.vocabulary)!r}; give the data module vocabulary={list(c.vocabulary)}")
        if spectrogram is not None and c.spectrogram and spectrogram != SpectrogramConfig.from_dict(c.spectrogram):
            differ = {k: (v, c.spectrogram.get(k)) for k, v in spectrogram.to_dict().items()
                      if c.spectrogram.get(k) != v and k not in ("global_mean", "global_std")}
            raise ValueError(f"the data's spectrogram settings differ from the model's (data, model): {differ or 'stats'}; "
                             f"give the data module spectrogram={c.spectrogram}")
        self._lexicon()

    def forward(self, features: Tensor, lengths: Tensor | None = None) -> CTCOutput:
        return self._model(features, lengths)

    @property
    def _model(self) -> ConformerCTC:
        if self.model is None:
            raise RuntimeError("the model is built when fitting starts (from the data module); "
                               "pass vocabulary=[...] or pretrained= to build it now")
        return self.model

    # ------------------------------------------------------------------ steps
    def _loss(self, batch: dict[str, Any]) -> tuple[Tensor, CTCOutput]:
        out = self._model(batch["features"], batch["feature_lengths"])
        loss = ctc_loss(out.logits, out.lengths, batch["targets"], batch["target_lengths"])
        return loss, out

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=len(batch["texts"]))
        self.log("lr", self.optimizers().param_groups[0]["lr"], prog_bar=False)  # type: ignore[union-attr]
        return loss

    def decode(self, out: CTCOutput, decoder: Decoder = "greedy", beam_size: int = 8,
               lexicon: list[str] | None = None) -> list[str]:
        """Model output -> transcripts with greedy decoding or CTC prefix beam search (held to
        ``lexicon``'s words when given)."""
        paths = self._paths(out.logits.float().log_softmax(dim=-1), out.lengths, decoder, beam_size, lexicon)
        vocabulary = CharacterVocabulary(self._model.config.vocabulary)
        return [vocabulary.decode(p) for p in paths]

    def _paths(self, log_probs: Tensor, lengths: Tensor, decoder: Decoder, beam_size: int,
               lexicon: list[str] | None) -> list[list[int]]:
        if lexicon is self.lexicon and lexicon is not None:
            words = self._lexicon()
        else:
            words = Lexicon.from_words(lexicon, CharacterVocabulary(self._model.config.vocabulary)) if lexicon else None
        return ctc_decode(log_probs, lengths, decoder, beam_size, words)

    def _lexicon(self) -> Lexicon | None:
        """``lexicon`` in the model's characters, built once (a word it cannot spell is an error)."""
        if self.lexicon is not None and self._words is None:
            self._words = Lexicon.from_words(self.lexicon, CharacterVocabulary(self._model.config.vocabulary))
        return self._words

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss, out = self._loss(batch)
        hypotheses = self.decode(out)
        self.val_cer.update(hypotheses, batch["texts"])
        self.val_wer.update(hypotheses, batch["texts"])
        size = len(batch["texts"])
        self.log("val_loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        self.log("val_cer", self.val_cer, prog_bar=True, batch_size=size)
        self.log("val_wer", self.val_wer, batch_size=size)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss, out = self._loss(batch)
        hypotheses = self.decode(out, self.decoder, self.beam_size, self.lexicon)
        self.test_cer.update(hypotheses, batch["texts"])
        self.test_wer.update(hypotheses, batch["texts"])
        size = len(batch["texts"])
        self.log("test_loss", loss, batch_size=size, sync_dist=True)
        self.log("test_cer", self.test_cer, batch_size=size)
        self.log("test_wer", self.test_wer, batch_size=size)

    @torch.no_grad()
    def predict_step(self, batch: dict[str, Any] | Tensor, batch_idx: int) -> list[Record]:
        """Records (`tasks.predictions`) for a data batch (or (B, N, F) frames, all valid): the
        transcript (``decoder``) as ``prediction``, its CTC log-likelihood log P(text | audio) as
        ``score``, the batch's transcripts as ``target`` when it has them."""
        if isinstance(batch, dict):
            out = self._model(batch["features"], batch["feature_lengths"])
        else:
            out = self._model(batch)
        log_probs = out.logits.float().log_softmax(dim=-1)
        paths = self._paths(log_probs, out.lengths, self.decoder, self.beam_size, self.lexicon)
        vocabulary = CharacterVocabulary(self._model.config.vocabulary)
        return records([vocabulary.decode(p) for p in paths], ctc_log_likelihood(log_probs, out.lengths, paths),
                       target=batch.get("texts") if isinstance(batch, dict) else None)

    def configure_optimizers(self):
        return adamw_warmup_cosine(self._model, self.trainer, self.hparams)
