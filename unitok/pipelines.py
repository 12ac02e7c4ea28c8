"""`unitok.pipeline(task, model=…)`: raw input in, answers out, with Hugging Face's task names
and calling conventions.

``pipeline("image-classification", model="runs/vit_digits/latest/pretrained")(image)`` loads the folder
(`unitok.load`), reads raw input with the model's own processor, runs the model in eval mode
under ``torch.inference_mode`` in batches of ``batch_size`` (a progress bar when the input spans
many batches), and answers in Hugging Face's shapes: one input gives one answer, a list gives a
list. Tasks and the families they take:

==================================  =====================  ==========================================
task                                family                 answer per input
==================================  =====================  ==========================================
text-generation                     GPT                    ``[{"generated_text"}]``
fill-mask                           BERT (MLM head)        ``[{"score", "token", "token_str", "sequence"}]``
text-classification                 BERT, GPT (classifier) ``{"label", "score"}`` (``top_k``: a list)
token-classification                BERT (token head)      ``[{"entity", "score", "index", "word", "start", "end"}]``
text2text-generation                T5                     ``[{"generated_text"}]``
image-classification                ViT, DeiT, MLPMixer    ``[{"label", "score"}]`` (top 5)
zero-shot-image-classification      CLIP                   ``[{"label", "score"}]`` over ``candidate_labels``
automatic-speech-recognition        ConformerCTC           ``{"text"}``
zero-shot-audio-classification      CLIP with audio        ``[{"label", "score"}]`` over ``candidate_labels``
decision                            DecisionTransformer    ``{"action", "score"}``
==================================  =====================  ==========================================
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from tokenizers_mm import BPETokenizer, Processor, Tokens, collate, pad_pairs
from tokenizers_mm.audio import SpectrogramTokenizer
from tokenizers_mm.checks import check_int, check_number
from unitok.auto import load
from unitok.models.base import PretrainedModel

PROGRESS_AFTER_BATCHES = 4  # a progress bar when the input needs more batches than this


class Pipeline:
    """Raw input -> answers for one task; subclasses say which families they take (``families``)
    and answer one batch (``run_batch``)."""

    task: ClassVar[str]
    families: ClassVar[tuple[str, ...]]
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, model: PretrainedModel, batch_size: int = 8, device: str | torch.device | None = None,
                 progress: bool | None = None, **options: Any) -> None:
        if type(model).__name__ not in self.families:
            raise ValueError(f"the {self.task!r} pipeline takes a {' or '.join(self.families)} model, "
                             f"got a {type(model).__name__}")
        check_int("batch_size", batch_size)
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise TypeError(f"unknown option(s) {unknown} for {self.task!r}; it takes {sorted(self.defaults)}")
        self.model = model.to(device) if device is not None else model
        self.model.eval()
        self.batch_size, self.progress = batch_size, progress
        self.options = {**self.defaults, **options}
        self.check_model()

    @property
    def processor(self) -> Processor:
        processor = self.model.processor
        if processor is None:
            raise ValueError(f"this {type(self.model).__name__} has no processor (no tokenizer saved with it); "
                             "set model.processor = tokenizers_mm.Processor(text=tokenizer) and save it again")
        return processor

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The model's floating-point dtype: what the features a pipeline computes are cast to."""
        return next(p.dtype for p in self.model.parameters() if p.is_floating_point())

    def check_model(self) -> None:
        """Fail at construction when the model lacks what the task needs (a head, a tokenizer)."""

    def __call__(self, inputs: Any, **options: Any) -> Any:
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise TypeError(f"unknown option(s) {unknown} for {self.task!r}; it takes {sorted(self.defaults)}")
        options = {**self.options, **options}
        items, single = self.split(inputs)
        if not items:
            raise ValueError(f"{self.task!r} got an empty list of inputs")
        answers: list[Any] = []
        with torch.inference_mode():
            for batch in self._batches(items):
                out = self.run_batch(batch, **options)
                if len(out) != len(batch):  # one answer pinned on the wrong input, or answers dropped
                    raise ValueError(f"{len(batch)} inputs gave {len(out)} answers: an input holds several (a batch "
                                     "tensor inside a list?); give one input per list item, or the batch alone")
                answers.extend(out)
        return answers[0] if single else answers

    def split(self, inputs: Any) -> tuple[list[Any], bool]:
        """The inputs as a list, and whether one bare input was given (a list or tuple: several)."""
        if isinstance(inputs, list | tuple):
            return list(inputs), False
        return [inputs], True

    def _batches(self, items: list[Any]) -> Iterator[list[Any]]:
        starts = range(0, len(items), self.batch_size)
        show = self.progress if self.progress is not None else len(starts) > PROGRESS_AFTER_BATCHES
        if show:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc=self.task, unit="batch")
        for start in starts:
            yield items[start : start + self.batch_size]

    def run_batch(self, items: list[Any], **options: Any) -> list[Any]:
        raise NotImplementedError

    def label(self, index: int) -> str:
        labels = self.model.processor.labels if self.model.processor is not None else None
        return labels[index] if labels is not None and index < len(labels) else f"LABEL_{index}"


def _texts(items: list[Any], task: str) -> list[str]:
    bad = [i for i, t in enumerate(items) if not isinstance(t, str) or not t]
    if bad:
        raise ValueError(f"{task!r} reads non-empty strings; input {bad[0]} is {items[bad[0]]!r}")
    return items


def _check_flags(**flags: Any) -> None:
    """Yes/no options must be bools: ``resize="no"`` is a true string, and would resize."""
    for name, value in flags.items():
        if not isinstance(value, bool | np.bool_):
            raise ValueError(f"{name} must be True or False, got {value!r}")


def _text_and_pair(item: Any) -> tuple[Any, Any]:
    """A text, or Hugging Face's ``{"text", "text_pair"}`` -> (text, pair or None)."""
    if not isinstance(item, dict):
        return item, None
    if set(item) - {"text", "text_pair"} or "text" not in item:
        raise ValueError(f"a dict input holds 'text' (and 'text_pair'), got keys {sorted(item)}")
    return item["text"], item.get("text_pair")


def _top(probs: Tensor, k: int, label: Any) -> list[dict[str, Any]]:
    check_int("top_k", k)
    scores, ids = probs.topk(min(k, probs.shape[-1]))
    return [{"label": label(int(i)), "score": float(s)} for s, i in zip(scores, ids, strict=True)]


# --------------------------------------------------------------------------- text


class TextGenerationPipeline(Pipeline):
    """Prompts -> continued text with a GPT (greedy, sampling or beam search)."""

    task = "text-generation"
    families = ("GPT",)
    defaults = {"max_new_tokens": 32, "strategy": None, "do_sample": False, "num_beams": 1, "temperature": 1.0,
                "top_k": 50, "top_p": None, "return_full_text": True, "seed": None}

    def check_model(self) -> None:
        self.processor.part("text")

    def run_batch(self, items: list[Any], max_new_tokens: int, strategy: str | None, do_sample: bool,
                  num_beams: int, temperature: float, top_k: int | None, top_p: float | None,
                  return_full_text: bool, seed: int | None) -> list[Any]:
        tok = self.processor.text
        prompts = tok.batch_encode(_texts(items, self.task), padding_side="left").to(self.device)
        check_int("num_beams", num_beams, note="(1: no beam search)")
        if num_beams > 1 and (do_sample or strategy not in (None, "beam")):
            what = "do_sample=True" if do_sample else f"strategy={strategy!r}"
            raise ValueError(f"num_beams={num_beams} asks for beam search, which {what} contradicts "
                             "(beam search does not sample): drop one of them")
        _check_flags(do_sample=do_sample, return_full_text=return_full_text)
        check_int("seed", seed, at_least=0, or_none=True)
        strategy = strategy or ("beam" if num_beams > 1 else "sample" if do_sample else "greedy")
        if strategy != "sample":  # as `unitok sample`: a sampling setting with no sampling is a mistake, not a no-op
            given = {name: value for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p))
                     if value != self.defaults[name]}
            if given:
                raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in given.items())} only apply to sampling, but "
                                 f"this call decodes by {strategy}: pass do_sample=True, or leave them out")
        options: dict[str, Any] = {}
        if strategy == "beam":
            options["num_beams"] = num_beams
        if strategy == "sample":
            options.update(temperature=temperature, top_k=top_k, top_p=top_p)
        generator = torch.Generator(self.device).manual_seed(seed) if seed is not None else None
        out = self.model.generate(prompts, max_new_tokens=max_new_tokens, strategy=strategy, generator=generator,
                                  **options)
        eos, width = self.model.config.eos_token_id, prompts.ids.shape[1]
        answers = []
        for prompt, row in zip(items, out[:, width:].tolist(), strict=True):
            if eos is not None and eos in row:
                row = row[: row.index(eos)]
            text = tok.decode(row, skip_special_tokens=True)
            answers.append([{"generated_text": prompt + text if return_full_text else text}])
        return answers


class Text2TextGenerationPipeline(Pipeline):
    """Inputs -> generated texts with a T5 (the task prefix is part of the input, as trained)."""

    task = "text2text-generation"
    families = ("T5",)
    defaults = {"max_new_tokens": 32, "num_beams": 1}

    def check_model(self) -> None:
        self.processor.part("text")

    def run_batch(self, items: list[Any], max_new_tokens: int, num_beams: int) -> list[Any]:
        tok = self.processor.text
        sources = collate(list(tok.iter_ids(_texts(items, self.task))), pad_id=tok.pad_id).to(self.device)
        check_int("num_beams", num_beams, note="(1: no beam search)")
        strategy = "beam" if num_beams > 1 else "greedy"
        out = self.model.generate(sources.ids, attention_mask=sources.attention_mask, max_new_tokens=max_new_tokens,
                                  strategy=strategy, **({"num_beams": num_beams} if num_beams > 1 else {}))
        eos, pad = self.model.config.eos_token_id, self.model.config.pad_token_id
        answers = []
        for row in out[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            answers.append([{"generated_text": tok.decode([t for t in row if t != pad])}])
        return answers


class _BERTPipeline(Pipeline):
    families = ("BERT",)
    head: ClassVar[str]

    def check_model(self) -> None:
        self.processor.part("text")
        if getattr(self.model, self.head, None) is None:
            raise ValueError(f"{self.task!r} needs a BERT with a {self.head!r}; this one has heads "
                             f"{list(self.model.config.heads)}")

    def encode(self, items: list[Any]) -> Tokens:
        texts, pairs = map(list, zip(*map(_text_and_pair, items), strict=True))
        _texts(texts, self.task)
        if any(p is not None for p in pairs) and not all(p is not None for p in pairs):
            raise ValueError("give text_pair for every input of a batch or for none")
        return self.processor.text.batch_encode(texts, pairs if pairs[0] is not None else None,
                                                max_length=self.model.config.context_length).to(self.device)


class TextClassificationPipeline(_BERTPipeline):
    """Texts (or ``{"text", "text_pair"}``) -> the class and its probability (a regressor,
    ``num_labels=1``: the value itself); a BERT reads ``[CLS] text [SEP]``, a GPT with a
    classifier ``text <eos>`` (GPT-1)."""

    task = "text-classification"
    families = ("BERT", "GPT")
    head = "classifier"
    defaults = {"top_k": None}

    def check_model(self) -> None:
        if type(self.model).__name__ != "GPT":
            return super().check_model()
        if self.model.classifier is None:
            raise ValueError("'text-classification' needs a GPT with a classifier (GPT.for_sequence_classification)")
        if not isinstance(self.processor.part("text"), BPETokenizer):
            raise ValueError("'text-classification' with a GPT needs its byte-level BPE tokenizer")
        return None

    def encode(self, items: list[Any]) -> Tokens:
        if type(self.model).__name__ != "GPT":
            return super().encode(items)
        rows = []
        for item in items:
            text, pair = _text_and_pair(item)
            _texts([text] + ([pair] if pair is not None else []), self.task)
            ids, segments = self.processor.text.encode_for_classifier(text, pair, self.model.config.context_length,
                                                                          truncation=False)  # as BERT's: no silent cut
            rows.append((ids.tolist(), segments.tolist()))
        return pad_pairs(rows, self.processor.text.pad_id).to(self.device)

    def run_batch(self, items: list[Any], top_k: int | None) -> list[Any]:
        tokens = self.encode(items)
        if type(self.model).__name__ == "GPT":
            logits = self.model(tokens.ids, attention_mask=tokens.attention_mask,
                                return_logits=False).class_logits.float()  # no next-token logits
        else:
            logits = self.model(tokens).logits.float()
        # One output is a regression (the loss unitok trains it with is MSE): its score is the
        # value itself, as Hugging Face answers for problem_type "regression".
        scores = logits if logits.shape[-1] == 1 else logits.softmax(-1)
        if top_k is None:
            return [_top(p, 1, self.label)[0] for p in scores]
        return [_top(p, top_k, self.label) for p in scores]


class TokenClassificationPipeline(_BERTPipeline):
    """Texts -> one entry per sub-word token whose class is not ignored (Hugging Face's
    ``aggregation_strategy="none"``), with its characters in the text."""

    task = "token-classification"
    head = "token_classifier"
    defaults = {"ignore_labels": ("O",)}

    def run_batch(self, items: list[Any], ignore_labels: Sequence[str]) -> list[Any]:
        tok = self.processor.text
        answers = []
        for text in _texts(items, self.task):
            enc = tok.encode(text, max_length=self.model.config.context_length)
            logits = self.model(enc.ids[None].to(self.device)).logits[0].float()
            probs = logits.softmax(-1)
            entities = []
            for index, (token, offset, seq) in enumerate(zip(enc.tokens, enc.offsets, enc.sequence_ids,
                                                             strict=True)):
                if seq is None:  # [CLS], [SEP]
                    continue
                score, cls = probs[index].max(-1)
                entity = self.label(int(cls))
                if entity in ignore_labels:
                    continue
                word = text[offset[0]:offset[1]] if token == tok.unk_token else token  # as Hugging Face names [UNK]
                entities.append({"entity": entity, "score": float(score), "index": index, "word": word,
                                 "start": offset[0], "end": offset[1]})
            answers.append(entities)
        return answers


class FillMaskPipeline(_BERTPipeline):
    """Texts with one mask token -> the ``top_k`` fillers, each with the completed sequence."""

    task = "fill-mask"
    head = "mlm_head"
    defaults = {"top_k": 5}

    def run_batch(self, items: list[Any], top_k: int) -> list[Any]:
        check_int("top_k", top_k)
        tok = self.processor.text
        rows = []
        for text in _texts(items, self.task):
            parts = text.split(tok.mask_token)
            if len(parts) != 2:
                raise ValueError(f"fill-mask needs exactly one {tok.mask_token} in the text, found "
                                 f"{len(parts) - 1} in {text!r}")
            before = tok.encode_ids(parts[0]) if parts[0].strip() else []
            after = tok.encode_ids(parts[1]) if parts[1].strip() else []
            rows.append([tok.cls_id, *before, tok.mask_id, *after, tok.sep_id])
        batch = collate(rows, pad_id=tok.pad_id, modality="text").to(self.device)
        if batch.ids.shape[1] > self.model.config.context_length:
            raise ValueError(f"a text has {batch.ids.shape[1]} tokens, more than the context "
                             f"{self.model.config.context_length}")
        # The masked-LM head only where the mask is: one row of logits a text, not one a token.
        where = [row.index(tok.mask_id) for row in rows]
        hidden = self.model(batch, compute_heads=False).last_hidden_state  # (B, N, D)
        logits = self.model.mlm_head(hidden[torch.arange(len(rows)), where]).float()  # (B, V)
        answers = []
        for i, (row, at) in enumerate(zip(rows, where, strict=True)):
            probs = logits[i].softmax(-1)
            scores, ids = probs.topk(min(top_k, probs.shape[-1]))
            answers.append([{"score": float(s), "token": int(t), "token_str": tok.decode([int(t)]),
                             "sequence": tok.decode(row[1:at] + [int(t)] + row[at + 1 : -1])}
                            for s, t in zip(scores, ids, strict=True)])
        return answers


# --------------------------------------------------------------------------- images


class ImageClassificationPipeline(Pipeline):
    """Images (paths, PIL, arrays, tensors) -> the ``top_k`` classes with probabilities. Images
    of another size are an error unless ``resize=True`` (to the model's size)."""

    task = "image-classification"
    families = ("ViT", "DeiT", "MLPMixer")
    defaults = {"top_k": 5, "resize": False}

    def split(self, inputs: Any) -> tuple[list[Any], bool]:
        return _split_images(inputs) or super().split(inputs)

    def check_model(self) -> None:
        if self.model.config.num_classes == 0:
            raise ValueError(f"{self.task!r} needs a classification head; this {type(self.model).__name__} has "
                             "num_classes=0")

    def run_batch(self, items: list[Any], top_k: int, resize: bool) -> list[Any]:
        _check_flags(resize=resize)
        config = self.model.config.preprocess_config(resize)
        tokens = Processor(image=config).encode_image(items).to(self.device)
        if tuple(tokens.grid) != self.model.config.grid:  # the model could resample its positions: not asked for
            P, (H, W) = self.model.config.patch_size, self.model.config.image_size
            raise ValueError(f"images are {tokens.grid[0] * P}×{tokens.grid[1] * P}, the model reads {H}×{W}: "
                             "pass resize=True to resize them")
        fast = {"class_tokens_only": True} if getattr(self.model, "reads_class_tokens", False) else {}
        probs = self.model(tokens, **fast).logits.float().softmax(-1)  # a ViT's last block: class tokens only
        return [_top(p, top_k, self.label) for p in probs]


def _split_images(inputs: Any) -> tuple[list[Any], bool] | None:
    """A (B, C, H, W) tensor or array -> its B images, answered as a list (None: not a batch)."""
    if isinstance(inputs, Tensor | np.ndarray) and inputs.ndim == 4:
        return list(inputs), False
    return None


def _candidate_labels(candidate_labels: Any) -> list[str]:
    """Refuse what would answer something else than was asked: a string (its characters would
    be the classes), no labels, labels that are not non-empty strings, or one label twice (the
    answer would split its probability between two rows of the same name)."""
    if isinstance(candidate_labels, str):
        raise TypeError(f"candidate_labels must be a list of labels, got the string {candidate_labels!r} "
                        f"(for one label: [{candidate_labels!r}])")
    labels = list(candidate_labels)
    if not labels:
        raise ValueError("candidate_labels is empty: give at least one label")
    bad = [label for label in labels if not isinstance(label, str) or not label.strip()]
    if bad:
        raise ValueError(f"candidate_labels must be non-empty strings, got {bad[:3]!r}")
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"candidate_labels repeat {repeated}: give each label once")
    return labels


class ZeroShotImageClassificationPipeline(Pipeline):
    """Images -> probabilities over ``candidate_labels``, each written into
    ``hypothesis_template`` (default: the labels saved with the model)."""

    task = "zero-shot-image-classification"
    families = ("CLIP",)
    defaults = {"candidate_labels": None, "hypothesis_template": "This is a photo of {}.", "resize": False}
    modality = "image"

    def split(self, inputs: Any) -> tuple[list[Any], bool]:
        return (_split_images(inputs) if self.modality == "image" else None) or super().split(inputs)

    def run_batch(self, items: list[Any], candidate_labels: Sequence[str] | None, hypothesis_template: str,
                  resize: bool) -> list[Any]:
        from unitok.zero_shot import ZeroShotClassifier

        _check_flags(resize=resize)

        if candidate_labels is not None:
            labels = _candidate_labels(candidate_labels)
        else:
            labels = list(self.processor.labels or [])
            if not labels:
                raise ValueError(f"{self.task!r} needs candidate_labels=[...] (this model saved no class names)")
        key = (tuple(labels), hypothesis_template, resize)
        if getattr(self, "_classifier_key", None) != key:  # the class embeddings, built once per label set
            self._classifier = ZeroShotClassifier(self.model, labels, templates=[hypothesis_template], resize=resize,
                                                  batch_size=max(self.batch_size, len(labels)),
                                                  modality=self.modality)  # type: ignore[arg-type]
            self._classifier_key = key
        probs = self._classifier.predict_proba(self.inputs(items)).float()
        return [_top(p, len(labels), labels.__getitem__) for p in probs]

    def inputs(self, items: list[Any]) -> Any:
        return items


# --------------------------------------------------------------------------- audio


def _audio_items(items: list[Any], sample_rate: int | None) -> list[tuple[Any, int | None]]:
    """Audio inputs -> (file or waveform, its rate): paths, waveforms with ``sample_rate=``, or
    Hugging Face's ``{"raw" | "array": waveform, "sampling_rate": rate}``."""
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            wave = item.get("raw", item.get("array"))
            rate = item.get("sampling_rate")
            if wave is None or rate is None:
                raise ValueError(f"audio input {i}: a dict needs 'raw' (or 'array') and 'sampling_rate', "
                                 f"got keys {sorted(item)}")
            out.append((wave, rate))  # checked where it is read, as sample_rate= is
        elif isinstance(item, (str, Path)):
            out.append((item, None))
        else:
            if sample_rate is None:
                raise ValueError(f"audio input {i} is a bare waveform: give sample_rate= (or "
                                 "{'raw': waveform, 'sampling_rate': rate}); nothing is assumed")
            out.append((item, sample_rate))
    return out


def _audio_tokens(processor: Processor, items: list[Any], sample_rate: int | None) -> Tokens:
    tokenizer = SpectrogramTokenizer(processor.part("audio"))
    return collate([tokenizer.features(wave, rate) for wave, rate in _audio_items(items, sample_rate)],
                   modality="audio")


class SpeechRecognitionPipeline(Pipeline):
    """Audio -> ``{"text"}`` with a Conformer-CTC (greedy or prefix beam search, optionally
    held to a ``lexicon`` of words)."""

    task = "automatic-speech-recognition"
    families = ("ConformerCTC",)
    defaults = {"sample_rate": None, "decoder": "greedy", "beam_size": 8, "lexicon": None}

    def check_model(self) -> None:
        self.processor.part("characters")

    def run_batch(self, items: list[Any], sample_rate: int | None, decoder: str, beam_size: int,
                  lexicon: list[str] | None) -> list[Any]:
        from unitok.ctc import Lexicon, check_decoder, ctc_decode

        check_decoder(decoder, lexicon)
        words = Lexicon.from_words(lexicon, self.processor.characters) if lexicon is not None else None
        tokens = _audio_tokens(self.processor, items, sample_rate).to(self.device)
        # the frames are float32; a bf16 or half model reads them in its own dtype, as transcribe does
        out = self.model(tokens.features.to(self.dtype), tokens.attention_mask.sum(dim=1))
        paths = ctc_decode(out.logits.float().log_softmax(-1), out.lengths, decoder, beam_size, words)  # type: ignore[arg-type]
        return [{"text": self.processor.characters.decode(p)} for p in paths]


class ZeroShotAudioClassificationPipeline(ZeroShotImageClassificationPipeline):
    """Audio -> probabilities over ``candidate_labels`` with a CLIP that has an audio tower."""

    task = "zero-shot-audio-classification"
    defaults = {"candidate_labels": None, "hypothesis_template": "This is a sound of {}.", "sample_rate": None}
    modality = "audio"

    def check_model(self) -> None:
        if self.model.config.audio is None:
            raise ValueError(f"{self.task!r} needs a CLIP with an audio tower; this one is an image–text model")

    def run_batch(self, items: list[Any], candidate_labels: Sequence[str] | None, hypothesis_template: str,
                  sample_rate: int | None) -> list[Any]:
        self._sample_rate = sample_rate
        return super().run_batch(items, candidate_labels, hypothesis_template, resize=False)

    def inputs(self, items: list[Any]) -> Any:
        from unitok.models.clip import refuse_silent_frames, refuse_silent_waves

        # As ZeroShotClassifier refuses it: silence holds no sound to embed, so any label would be made up.
        refuse_silent_waves([wave for wave, _ in _audio_items(items, self._sample_rate)])
        tokens = _audio_tokens(self.processor, items, self._sample_rate)
        refuse_silent_frames(tokens)
        return tokens


# --------------------------------------------------------------------------- control


class DecisionPipeline(Pipeline):
    """An episode so far -> the Decision Transformer's next action for a target return.

    Input: ``{"observations": (T, S) states seen so far (the last is the current one),
    "actions": the T-1 actions taken, "rewards": the T-1 rewards received, "target_return": R}``
    (actions and rewards may be left out at T = 1). The answer: ``{"action": id or list of
    floats in the environment's units, "score": its probability (discrete) or None}``.
    """

    task = "decision"
    families = ("DecisionTransformer",)
    defaults = {"target_return": None}

    def run_batch(self, items: list[Any], target_return: float | None) -> list[Any]:
        c, tok = self.model.config, self.processor.part("trajectory")
        answers = []
        for i, item in enumerate(items):
            states, actions, rtg, timesteps = self._window(item, i, target_return, c, tok)
            out = self.model(states, actions, rtg, timesteps)
            pred = out.action_preds[0, -1].float()
            if c.discrete:
                probs = pred.softmax(-1)
                action = int(probs.argmax())
                answers.append({"action": action, "score": float(probs[action])})
            else:
                # [-1, 1] is the model's range only with a tanh head or a stored range (as rollouts read it);
                # otherwise it predicts raw actions in the environment's units
                bounded = c.action_tanh or tok.action_low is not None
                action = tok.unscale_actions((pred.clamp(-1, 1) if bounded else pred).cpu().numpy())
                answers.append({"action": [float(a) for a in action], "score": None})
        return answers

    def _window(self, item: Any, i: int, target_return: float | None, c: Any, tok: Any) -> tuple[Tensor, ...]:
        if not isinstance(item, dict) or "observations" not in item:
            raise ValueError(f"decision input {i} must be a dict with 'observations' (and 'actions', 'rewards', "
                             f"'target_return'), got {type(item).__name__}")
        unknown = sorted(set(item) - {"observations", "actions", "rewards", "target_return"})
        if unknown:
            raise ValueError(f"decision input {i}: unknown keys {unknown}")
        target = item.get("target_return", target_return)
        if target is None:
            raise ValueError(f"decision input {i} needs a target_return (in the input or as an option)")
        if isinstance(target, Tensor | np.ndarray) and target.ndim == 0:
            target = target.item()
        target = check_number(f"decision input {i}: target_return", target)
        obs = np.asarray(item["observations"], dtype=np.float64)
        if obs.shape == (c.state_dim,):  # one observation
            obs = obs[None]
        if obs.ndim != 2 or obs.shape[1] != c.state_dim or obs.shape[0] < 1:  # never reshaped into other steps
            raise ValueError(f"decision input {i}: observations must be (T, {c.state_dim}), got shape {obs.shape}")
        T = obs.shape[0]
        if T > c.max_ep_len:
            raise ValueError(f"decision input {i}: {T} steps exceed the model's max_ep_len={c.max_ep_len}")
        past = np.asarray(item.get("actions", []), dtype=np.float64)
        rewards = np.asarray(item.get("rewards", []), dtype=np.float64)
        n_past = past.shape[0] if past.ndim else 0
        if rewards.ndim > 1:
            raise ValueError(f"decision input {i}: rewards must be one number a step, shape ({T - 1},), got shape "
                             f"{rewards.shape}")
        if n_past != T - 1 or rewards.ndim != 1 or rewards.shape[0] != T - 1:
            raise ValueError(f"decision input {i}: {T} observations need {T - 1} past actions and rewards, got "
                             f"{n_past} and {rewards.shape[0] if rewards.ndim else 0}")
        action_shape = (T - 1,) if c.discrete else (T - 1, c.act_dim)
        if T > 1 and past.shape != action_shape:
            raise ValueError(f"decision input {i}: actions must be {action_shape}, got shape {past.shape}")
        if c.discrete and (past != np.round(past)).any():
            raise ValueError(f"decision input {i}: discrete actions must be whole ids, got {past[past != np.round(past)][:3]}")
        for what, values in (("observations", obs), ("actions", past), ("rewards", rewards)):
            if not np.isfinite(values).all():
                raise ValueError(f"decision input {i}: {what} contain NaN/inf values")
        K = min(T, c.context_length)
        dtype = self.dtype  # a float64 or bf16 model reads its window in its own dtype
        states = torch.as_tensor(tok.normalize_states(obs[-K:]), dtype=dtype)
        remaining = float(target) - np.concatenate([[0.0], np.cumsum(rewards)])  # R̂ at each step
        rtg = torch.as_tensor(remaining[-K:] / tok.return_scale, dtype=dtype)[:, None]
        if c.discrete:
            acts = torch.zeros(T, dtype=torch.long)
            acts[: T - 1] = torch.as_tensor(past.reshape(-1), dtype=torch.long)
        else:
            acts = torch.zeros(T, c.act_dim, dtype=dtype)
            if T > 1:
                acts[: T - 1] = torch.as_tensor(tok.scale_actions(past.reshape(T - 1, c.act_dim)), dtype=dtype)
        steps = torch.arange(T - K, T)
        d = self.device
        return states[None].to(d), acts[-K:][None].to(d), rtg[None].to(d), steps[None].to(d)


PIPELINES: dict[str, type[Pipeline]] = {p.task: p for p in (
    TextGenerationPipeline, FillMaskPipeline, TextClassificationPipeline, TokenClassificationPipeline,
    Text2TextGenerationPipeline, ImageClassificationPipeline, ZeroShotImageClassificationPipeline,
    SpeechRecognitionPipeline, ZeroShotAudioClassificationPipeline, DecisionPipeline)}


def pipeline(task: str, model: str | Path | PretrainedModel, batch_size: int = 8,
             device: str | torch.device | None = None, progress: bool | None = None, **options: Any) -> Pipeline:
    """A ready pipeline for ``task`` (Hugging Face's task names) over ``model`` — a saved folder
    or a model object; ``options`` are the task's defaults for every call (``top_k=3``…)."""
    if task not in PIPELINES:
        import difflib

        close = difflib.get_close_matches(task, list(PIPELINES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown pipeline task {task!r}{hint}; tasks: {', '.join(PIPELINES)}")
    if isinstance(model, (str, Path)):
        model = load(model)
    if not isinstance(model, PretrainedModel):
        raise TypeError(f"model must be a saved folder or a unitok model, got {type(model).__name__}")
    return PIPELINES[task](model, batch_size=batch_size, device=device, progress=progress, **options)
