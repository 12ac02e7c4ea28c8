"""The tasks' and `unitok sample`'s arguments are checked when they are given: a value that would
make a NaN loss, an error mid-run naming another option, or a silently ignored or cut option is
refused at once, naming itself."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from tasks import BindTask, CausalLMTask, ElectraTask, ImageClassificationTask, MaskedLMTask
from tasks.sample import main as sample
from tasks.seq2seq import Seq2SeqTask
from tokenizers_mm import BPETokenizer
from unitok.generate import GenerationConfig
from unitok.models import GPT, GPTConfig


@pytest.mark.parametrize(("options", "message"), [
    (dict(family="deit", distillation="soft", teacher="cnn:train", distill_tau=float("nan")), "distill_tau must be a finite number > 0, got nan"),
    (dict(label_smoothing=1.5), r"label_smoothing must be a finite number in \[0, 1\], got 1.5"),
    (dict(family="deit", distillation="soft", teacher="cnn:train", teacher_steps=0),
     "teacher_steps must be an integer ≥ 1, got 0"),  # it was refused at setup as "total_steps"
])
def test_image_classification_refuses_at_construction(options, message):
    with pytest.raises(ValueError, match=message):
        ImageClassificationTask(**options)


def test_bind_refuses_a_nan_audio_weight():
    with pytest.raises(ValueError, match="audio_weight must be a finite number ≥ 0, got nan"):
        BindTask(preset="clip-digits-audio", audio_weight=float("nan"))


@pytest.mark.parametrize(("options", "message"), [
    (dict(eval_num_beams=2.5), r"eval_num_beams must be an integer ≥ 2 or None \(None: greedy only\), got 2.5"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer ≥ 1, got 0"),
    (dict(max_new_tokens=10_000), "max_new_tokens=10000 is more than the decoder's max_decoder_length - 1 = 511"),
    (dict(length_penalty=float("nan")), "length_penalty must be a finite number, got nan"),
])
def test_seq2seq_refuses_decoding_settings_at_construction(options, message):
    with pytest.raises(ValueError, match=message):
        Seq2SeqTask(vocab_size=64, eos_token_id=1, **options)


@pytest.mark.parametrize("task_class", [MaskedLMTask, ElectraTask])
def test_pretraining_refuses_a_padding_id_other_than_the_tokenizers(task_class):
    # The model zeroes its pad_token_id's embedding row: under a vocabulary whose [PAD] is 1 the
    # default 0 would be [UNK]'s row, which would then never learn.
    task = task_class(vocab_size=64, context_length=16)
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(pad_token_id=1))
    with pytest.raises(ValueError, match=r"the data module's pad_token_id=1 differs from the model's "
                                         r"pad_token_id=0; set model.init_args.pad_token_id: 1"):
        task.setup("fit")
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(pad_token_id=0))
    task.setup("fit")  # the same id (the default tokenizers' [PAD]) trains
    matched = task_class(vocab_size=64, context_length=16, pad_token_id=1)
    matched._trainer = SimpleNamespace(datamodule=SimpleNamespace(pad_token_id=1))
    matched.setup("fit")


@pytest.mark.parametrize("value", [0, 2.5])
def test_causal_lm_refuses_a_continuation_length_at_construction_not_at_predict(value):
    with pytest.raises(ValueError, match=f"generate_max_new_tokens must be an integer ≥ 1, got {value}"):
        CausalLMTask(vocab_size=64, context_length=16, preset="gpt-nano", generate_max_new_tokens=value)


def test_generation_refuses_a_nan_temperature_or_length_penalty():
    with pytest.raises(ValueError, match="temperature must be float with no NaN or infinite value, got nan"):
        GenerationConfig(strategy="sample", temperature=float("nan"))
    with pytest.raises(ValueError, match="length_penalty must be float with no NaN or infinite value, got nan"):
        GenerationConfig(strategy="beam", num_beams=2, length_penalty=float("nan"))


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt")
    tok = BPETokenizer.train(iterator=["def add(a, b):\n    return a + b\n"] * 20, vocab_size=300)
    torch.manual_seed(0)
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=tok.vocab_size, context_length=16)).save_pretrained(folder)
    tok.save(folder)
    return str(folder)


@pytest.mark.parametrize(("argv", "message"), [
    (["--max_new_tokens", "0"], "argument --max_new_tokens: must be a whole number ≥ 1, got '0'"),
    (["--max_new_tokens", "2.5"], "argument --max_new_tokens: must be a whole number ≥ 1, got '2.5'"),
    (["--top_p", "5", "--strategy", "sample"], r"argument --top_p: must be a finite number in \(0, 1\], got '5'"),
    (["--strategy", "sample", "--temperature", "nan"], "argument --temperature: must be a finite number > 0, got 'nan'"),
    (["--strategy", "beam", "--length_penalty", "nan"], "argument --length_penalty: must be a finite number, got 'nan'"),
    (["--top_k", "-1", "--strategy", "sample"], "argument --top_k: must be a whole number ≥ 0, got '-1'"),
    (["--top_p", "0.9"], "--top_p is read by --strategy sample, not greedy"),  # it was ignored: greedy ran
    (["--num_beams", "2", "--strategy", "sample"], "--num_beams is read by --strategy beam, not sample"),
    (["--max_new_tokens", "100"], r"'def add\(' \(3 tokens\) and --max_new_tokens 100 exceed the model's context "
                                  "of 16 tokens: ask for at most 13"),  # it was cut to 13 without a word
])
def test_sample_refuses_what_it_would_ignore_misread_or_cut(model_folder, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sample(["--model", model_folder, "--prompt", "def add(", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and re.search(message, err), err


def test_sample_answers_within_the_context(model_folder):
    texts = sample(["--model", model_folder, "--prompt", "def add(", "--max_new_tokens", "13", "--strategy", "beam",
                    "--num_beams", "2"])
    assert len(texts) == 1 and texts[0].startswith("def add(")


def test_sample_takes_hugging_faces_top_k_unless_told_and_0_switches_it_off(model_folder, monkeypatch):
    import tasks.sample as sample_module

    seen = []
    real = GPT.generate
    monkeypatch.setattr(GPT, "generate", lambda self, *a, **kw: seen.append(kw.get("top_k")) or real(self, *a, **kw))
    base = ["--model", model_folder, "--prompt", "def add(", "--max_new_tokens", "3", "--strategy", "sample"]
    sample_module.main(base)
    sample_module.main([*base, "--top_k", "0"])
    assert seen == [50, 0]


def test_clip_training_arguments_that_would_be_misread_are_refused(tmp_path):
    from types import SimpleNamespace

    from tasks import CaptionedDigitsDataModule, ContrastiveTask
    from unitok.models import ViT, ViTConfig

    with pytest.raises(TypeError, match="zero_shot_templates must be a list of templates, got the string"):
        ContrastiveTask(zero_shot_templates="a photo of {}.")  # its characters would be the templates
    ViT(ViTConfig.from_name("vit-digits", n_layers=1, num_classes=10)).save_pretrained(tmp_path / "vit")
    with pytest.raises(ValueError, match="an image_tower brings its own"):
        ContrastiveTask(image_tower=str(tmp_path / "vit"), dropout=0.3)  # only the text tower's would change
    # LiT: a frozen tower cannot learn to read pixels normalised otherwise than it was trained on
    task = ContrastiveTask(image_tower=str(tmp_path / "vit"), lock_image_tower=True)
    task._trainer = SimpleNamespace(datamodule=CaptionedDigitsDataModule(mean=0.1, std=0.3))
    with pytest.raises(ValueError, match=r"the locked image tower reads pixels normalised with mean \(0.5,\)"):
        task.setup("fit")

