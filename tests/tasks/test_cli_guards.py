"""What the `unitok` command refuses before a run starts, and why: everything a run writes stays in
its own folder (no export, prediction file or log elsewhere), a checkpoint is read from this
machine only, a prompt is continued in full or refused by name, and `unitok sample` names the bad
``--model`` or ``--seed`` — each as one line and exit status 2, never a traceback after the work."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from tasks import CausalLMTask, PredictionWriter
from tasks.cli import main
from tasks.predictions import PromptSet
from tokenizers_mm import BPETokenizer

ROOT = Path(__file__).resolve().parents[2]
GPT = ["--config", str(ROOT / "configs" / "gpt" / "tiny.yaml"), "--model.preset", "gpt-nano",
       "--data.builtin_max_bytes", "60000", "--data.vocab_size", "300", "--data.context_length", "32",
       "--data.batch_size", "4", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
       "--trainer.enable_model_summary", "false"]
RUNS = Path("runs") / "gpt_tiny"
LONG = "import os, sys, re, json, math, time"  # over 4 tokens, whatever the tokenizer learnt


def refused(args: list[str], capsys: pytest.CaptureFixture, printed: list[str] | None = None) -> str:
    """Run the CLI expecting a refusal: exit status 2 and one ``error: …`` line; the message
    (what the run printed is appended to ``printed``)."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and "Traceback" not in err, err[-3000:]
    if printed is not None:
        printed.append(out)
    return err.splitlines()[-1]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one fitted gpt-nano run (two steps) of the GPT recipe."""
    folder = tmp_path_factory.mktemp("fitted")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        main(["fit", *GPT, "--trainer.max_steps", "2"])
    assert (folder / RUNS / "latest" / "pretrained" / "config.json").is_file()
    return folder


# ------------------------------------------------------------------ everything in the run's folder
def test_an_export_folder_of_ones_own_is_refused_as_a_checkpoint_folder_is(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    message = refused(["fit", *GPT, "--trainer.max_steps", "2", "--trainer.callbacks",
                       "[{class_path: tasks.ExportPretrained, init_args: {dirpath: exported}}]"], capsys)
    assert "ExportPretrained(dirpath='exported') would write outside the run's folder" in message
    assert "leave dirpath unset (the model goes to runs/gpt_tiny/version_0/pretrained)" in message
    assert not (tmp_path / "exported").exists() and not list(tmp_path.rglob("*.ckpt"))


def test_a_logger_writing_outside_the_run_folder_is_refused_by_option(tmp_path, monkeypatch, capsys):
    """The run would follow its logger's folder, away from where `latest` and ``--ckpt_path last`` look."""
    monkeypatch.chdir(tmp_path)
    message = refused(["fit", *GPT, "--trainer.max_steps", "2", "--trainer.logger",
                       "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", "logs"], capsys)
    assert message.startswith("error: --trainer.logger: CSVLogger would write into logs/lightning_logs/version_0, "
                              "not the run's folder runs/gpt_tiny/version_0")
    assert not (tmp_path / "logs").exists() and not list(tmp_path.rglob("*.ckpt"))


def test_a_run_without_a_logger_still_writes_its_config_into_its_own_folder(tmp_path, monkeypatch):
    """Lightning would save ``config.yaml`` at the recipe's root, where the next run overwrites it."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        main(["fit", *GPT, "--trainer.max_steps", "1", "--trainer.logger", "false"])
    for version in (0, 1):
        assert "max_steps: 1" in (tmp_path / RUNS / f"version_{version}" / "config.yaml").read_text()
    assert not (tmp_path / RUNS / "config.yaml").exists()


def test_a_root_dir_that_is_a_file_is_refused_by_option(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notadir").write_text("x")
    message = refused(["fit", *GPT, "--trainer.max_steps", "2", "--trainer.default_root_dir", "notadir"], capsys)
    assert message == ("error: --trainer.default_root_dir notadir: notadir is a file; expected a folder (made if "
                       "missing) to hold the runs")


def writer(output_path: str) -> list[str]:
    """A second `PredictionWriter`, beside the recipe's, writing to ``output_path``."""
    return ["--trainer.callbacks+=tasks.PredictionWriter", f"--trainer.callbacks.output_path={output_path}"]


def test_a_prediction_path_is_inside_the_run_folder_and_one_outside_is_refused(fitted, monkeypatch, capsys):
    monkeypatch.chdir(fitted)
    predict = ["predict", *GPT, "--ckpt_path", "last", "--model.generate_max_new_tokens", "2"]
    main([*predict, *writer("preds/out.jsonl")])
    run = max((fitted / RUNS).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    assert len((run / "preds" / "out.jsonl").read_text().splitlines()) == 3  # the recipe's three prompts
    assert not (fitted / "preds").exists()

    elsewhere = fitted / "elsewhere.jsonl"
    message = refused([*predict, *writer(str(elsewhere))], capsys)
    assert f"PredictionWriter(output_path='{elsewhere}') would write outside the run's folder" in message
    assert "PredictionWriter(output_path='../out.jsonl') would write outside" in refused(
        [*predict, *writer("../out.jsonl")], capsys)
    assert not elsewhere.exists() and not (fitted / RUNS / "out.jsonl").exists()


def test_an_existing_file_taken_for_an_output_folder_is_refused_before_anything_is_predicted(tmp_path):
    class Echo(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.predicted = 0

        def predict_step(self, batch, batch_idx):
            self.predicted += len(batch)
            return [{"prediction": int(x), "score": 1.0} for x in batch]

    (tmp_path / "preds").write_text("not a folder")
    for output_path, message in [("preds", "is an existing file .* without a suffix, where a folder is meant"),
                                 ("preds/out.jsonl", "is a file, not a folder")]:
        module = Echo()
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[PredictionWriter(str(tmp_path / output_path))])
        with pytest.raises(ValueError, match=f"PredictionWriter output_path '.*{output_path}'.*{message}"):
            trainer.predict(module, DataLoader(torch.arange(4), batch_size=2))
        assert module.predicted == 0
    assert (tmp_path / "preds").read_text() == "not a folder"


# ------------------------------------------------------------------ checkpoints from this machine only
@pytest.mark.parametrize("ckpt", ["http://127.0.0.1:9/model.ckpt", "s3://bucket/model.ckpt", "hpc", "registry",
                                  "registry:my-model:v2"])
def test_a_checkpoint_is_never_fetched_over_the_network_or_from_a_registry(ckpt, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    message = refused(["predict", *GPT, "--ckpt_path", ckpt], capsys)
    assert message == (f"error: --ckpt_path {ckpt}: a run reads no checkpoint over the network or from a registry; "
                       "give a checkpoint file, or last / best (the newest run's)")
    assert not (tmp_path / "runs").exists()  # refused before any folder or cache is made


# ------------------------------------------------------------------ prompts
def test_a_blank_prompt_is_refused_by_index_before_any_is_predicted():
    assert PromptSet(["def", " import"]).texts == ["def", " import"]
    for prompts, message in [(["def", ""], "prompt 1 is ''"), (["a", "b", "   "], "prompt 2 is '   '")]:
        with pytest.raises(ValueError, match=f"{message}: a prompt needs text"):
            PromptSet(prompts)
    with pytest.raises(TypeError, match=r"prompt 1 is a int \(7\), expected text"):
        PromptSet(["def", 7])  # type: ignore[list-item]


def test_a_prompt_too_long_for_its_continuation_is_refused_before_any_batch_runs(fitted, monkeypatch, capsys):
    """The sixth of six prompts, in the second batch of four: named by its index, nothing predicted."""
    monkeypatch.chdir(fitted)
    printed: list[str] = []
    message = refused(["predict", *GPT, "--ckpt_path", "last", "--model.generate_max_new_tokens", "28",
                       f"--data.predict_prompts=[a, b, c, d, e, '{LONG}']"], capsys, printed)
    assert message.startswith(f"error: prompt 5 ('{LONG}', ")
    assert "and generate_max_new_tokens 28 exceed the model's context of 32 tokens: shorten it or ask for at most" \
        in message
    assert "-" * 40 not in printed[0]  # the recipe's PrintPredictions printed no prediction


def test_each_prompt_gets_its_whole_continuation_whatever_its_batch():
    """A short prompt batched with a longer one is continued as far as alone; a prompt that leaves
    less room than ``generate_max_new_tokens`` is refused by name, never cut short."""
    tok = BPETokenizer.train(iterator=iter(["def add(a, b): return a + b", "import os, sys, re, json"] * 5),
                             vocab_size=300)
    torch.manual_seed(0)
    task = CausalLMTask(vocab_size=tok.vocab_size, context_length=32, preset="gpt-nano",
                        generate_max_new_tokens=8).eval()
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=tok))  # what predict_step reads
    alone = task.predict_step(["def"], 0)[0]
    batched = task.predict_step(["def", "import os, sys, re"], 0)[0]
    assert batched["prediction"] == alone["prediction"]
    assert batched["score"] == pytest.approx(alone["score"], abs=1e-4)

    long = "import os, sys, re, json " * 3  # more tokens than 32 - 8
    with pytest.raises(ValueError, match=r"prompt 'import os, sys, re, json .*' \(\d+ tokens\) and "
                                         r"generate_max_new_tokens 8 exceed the model's context of 32 tokens"):
        task.predict_step(["def", long], 0)


# ------------------------------------------------------------------ unitok sample
def test_sample_names_a_missing_model_folder(tmp_path, capsys):
    message = refused(["sample", "--model", str(tmp_path / "nowhere"), "--prompt", "def"], capsys)
    assert message == (f"unitok sample: error: --model {tmp_path / 'nowhere'}: no model folder at "
                       f"{tmp_path / 'nowhere'} (expected config.json and model.safetensors written by save_pretrained)")


def test_sample_names_a_folder_of_another_family(tmp_path, capsys):
    from unitok.models import ViT, ViTConfig

    ViT(ViTConfig.from_name("vit-digits", num_classes=3)).save_pretrained(tmp_path / "vit")
    message = refused(["sample", "--model", str(tmp_path / "vit"), "--prompt", "def"], capsys)
    assert message == (f"unitok sample: error: --model {tmp_path / 'vit'} holds a ViT, not a GPT: unitok sample "
                       "continues text with a GPT's folder (e.g. runs/gpt_tiny/latest/pretrained)")


@pytest.mark.parametrize("seed", [str(2**64), str(-(2**63) - 1), "seven"])
def test_sample_seed_outside_torchs_range_names_the_flag_and_the_range(seed, tmp_path, capsys):
    message = refused(["sample", "--model", str(tmp_path), "--prompt", "def", "--seed", seed], capsys)
    assert message == (f"unitok sample: error: argument --seed: must be a whole number from -9223372036854775808 "
                       f"to 18446744073709551615, got '{seed}'")


def test_sample_takes_every_seed_torch_takes():
    from tasks.sample import build_parser

    for seed in (-(2**63), -1, 0, 2**64 - 1):
        args = build_parser().parse_args(["--model", "m", "--prompt", "p", "--seed", str(seed)])
        torch.Generator().manual_seed(args.seed)
        assert args.seed == seed



def test_a_run_refused_before_its_first_step_leaves_no_version_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:  # refused as the data is read, after the logger's first file
        main(["fit", "--config", str(ROOT / "configs" / "vit" / "digits.yaml"), "--data.train_per_class", "500"])
    assert refused.value.code == 2 and "train_per_class=500" in capsys.readouterr().err
    assert not list((tmp_path / "runs" / "vit_digits").glob("version_*"))


def test_only_a_folder_holding_nothing_but_a_runs_first_files_is_removed(tmp_path):
    from tasks.run_folder import remove_if_empty

    header = bytes(88)  # a TensorBoard file's header alone: nothing logged
    for name, files, removed in (("refused", {"config.yaml": b"x", "events.out.tfevents.1.vm.1.0": header}, True),
                                 ("logged", {"events.out.tfevents.1.vm.1.0": header * 4}, False),
                                 ("metrics", {"config.yaml": b"x", "metrics.csv": b"step"}, False),
                                 ("checkpoint", {"checkpoints/last.ckpt": b"x"}, False)):
        folder = tmp_path / name
        for path, data in files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_bytes(data)
        remove_if_empty(folder)
        assert folder.exists() is not removed, name
