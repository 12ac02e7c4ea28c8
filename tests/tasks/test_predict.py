"""`unitok predict` works for every recipe in configs/: after a couple of training steps (tiny
overrides), predicting from the checkpoint writes ``predictions.jsonl`` into the run's folder —
one record per predict input, each with an id, a prediction of the right kind and a finite
score — and fitting writes none. `tasks.PredictionWriter` gathers every rank's records under DDP.

Recipes that start from another's export (fine-tuning) fit it first, in the same folder; users'
data (an image tree, caption and speech manifests, a trajectory file) is made up here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import soundfile
import torch
from PIL import Image
from torch.utils.data import DataLoader

import tasks.cli as cli_module
from tasks import MultiTaskDataModule, PredictionWriter, record_episodes, save_trajectories
from tasks.cli import main
from tasks.data.captions import DIGIT_NAMES
from tasks.data.labelled_text import TOKEN_CLASSES
from tasks.data.speech import DIGIT_WORDS

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))
NAMES = [str(c.relative_to(ROOT / "configs").with_suffix("")) for c in CONFIGS]
STEPS = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
         "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
         "--trainer.log_every_n_steps", "1"]
DIGITS = [str(d) for d in range(10)]
SPOKEN = set("".join(DIGIT_WORDS) + " ")
SHAPES = ("circle", "square", "star")
MM = ["--model.preset", "mm-tiny"]


def task(name: str, **options: Any) -> list[str]:
    """Overrides of one task of a MultiTaskDataModule."""
    return [arg for key, value in options.items() for arg in (f"--data.init_args.tasks.{name}.init_args.{key}",
                                                               str(value))]


def overrides(recipe: str, ws: Path) -> list[str]:
    """Each recipe at a test's size (the data, and where caches go)."""
    speech, rl = ws / "cache" / "speech", ws / "cache" / "rl"
    pretrain_text = ["--data.builtin_max_bytes", "100000", "--data.vocab_size", "300", "--data.batch_size", "4"]
    bert = [*pretrain_text, "--data.context_length", "24", "--data.val_samples", "8"]
    finetune = ["--data.context_length", "24", "--data.batch_size", "4", "--data.val_per_class", "4",
                "--data.train_per_class", "8", "--data.test_per_class", "4"]
    pairs = dict(train_utterances=80, held_out_utterances=60, held_out_pairs=16, batch_size=8, cache_dir=speech)
    spoken = dict(train_utterances=12, held_out_utterances=4, max_digits=2, cache_dir=speech, batch_size=4)
    cartpole = ["--data.expert_episodes", "2", "--data.noisy_episodes", "3", "--data.random_episodes", "2",
                "--data.cache_dir", str(rl), "--data.batch_size", "32", "--model.eval_episodes", "1",
                "--model.eval_max_steps", "20"]
    return {
        "bert/electra_tiny": bert,
        "bert/finetune_cls": finetune,
        "bert/finetune_tokens": finetune,
        "bert/mlm_tiny": bert,
        "clip/bind_audio": [*task("image_text", batch_size=32), *task("audio_image", **pairs)],
        "clip/digits": ["--data.batch_size", "32"],
        "clip/pairs": ["--data.train_file", str(ws / "pairs" / "captions.jsonl"), "--model.preset", "clip-digits",
                       "--data.image_size", "32", "--data.channels", "1", "--data.batch_size", "2",
                       "--data.num_workers", "0", "--data.val_fraction", "0.25"],
        "conformer/manifest": ["--data.train_manifest", str(ws / "speech" / "train.jsonl"), "--model.preset",
                               "conformer-digits", "--data.batch_size", "2", "--data.num_workers", "0",
                               "--data.val_fraction", "0.34", "--trainer.devices", "1"],
        "conformer/spoken_digits": ["--data.train_utterances", "12", "--data.held_out_utterances", "4",
                                    "--data.max_digits", "2", "--data.batch_size", "4",
                                    "--data.cache_dir", str(speech)],
        "deit/digits_distill": ["--model.teacher_steps", "5"],
        "deit/digits_few": ["--model.teacher_steps", "5"],
        "dt/cartpole": cartpole,
        "dt/offline": ["--data.path", str(ws / "pendulum.npz"), "--data.batch_size", "32"],
        "gpt/finetune_cls": finetune,
        "gpt/tiny": [*pretrain_text, "--data.context_length", "32", "--model.generate_max_new_tokens", "5"],
        "mixer/digits": [],
        "multimodal/four_tasks": [*MM, *task("speech", **spoken),
                                  *task("text", builtin_max_bytes=60000, vocab_size=300, context_length=16,
                                        cache_dir=ws / "cache" / "text"),
                                  *task("cartpole", expert_episodes=2, noisy_episodes=2, random_episodes=2,
                                        cache_dir=rl),
                                  "--model.init_args.objectives.cartpole.init_args.eval_episodes", "1",
                                  "--model.init_args.objectives.text.init_args.predict_tokens", "4"],
        "multimodal/image_audio_match": [*MM, *task("match", **pairs), *task("speech", **spoken)],
        "t5/span_corruption_tiny": [*pretrain_text, "--data.vocab_size", "400", "--data.context_length", "32"],
        "t5/text_to_text": ["--data.builtin_max_bytes", "100000", "--data.batch_size", "4", "--data.val_per_task", "2",
                            "--model.max_new_tokens", "4"],
        "vit/digits": [],
        "vit/imagefolder": ["--data.root", str(ws / "images"), "--model.num_classes", "3", "--data.batch_size", "4",
                            "--data.num_workers", "0"],
    }[recipe]


NEEDS = {"bert/finetune_cls": "bert/mlm_tiny", "bert/finetune_tokens": "bert/mlm_tiny", "gpt/finetune_cls": "gpt/tiny",
         "t5/text_to_text": "t5/span_corruption_tiny"}


def users_files(ws: Path) -> None:
    """The users' data of the recipes that read it: an image tree, image–caption pairs, a
    speech manifest and a trajectory file."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("val", 2)):
        for c, name in enumerate(SHAPES):
            (ws / "images" / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 255, size=(40, 50, 3), dtype=np.uint8)
                pixels[..., c] = 255
                Image.fromarray(pixels).save(ws / "images" / split / name / f"{i}.png")
    (ws / "pairs").mkdir()
    rows = []
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, size=(24, 24), dtype=np.uint8)).save(ws / "pairs" / f"{i}.png")
        rows.append(json.dumps({"image": f"{i}.png", "caption": f"a grey square number {i}"}))
    (ws / "pairs" / "captions.jsonl").write_text("\n".join(rows))
    (ws / "speech").mkdir()
    rows = []
    for i, text in enumerate(["yes", "no", "yes no", "no yes", "yes yes", "no no"]):
        seconds = 0.4 + 0.1 * i
        noise = (0.1 * rng.standard_normal(int(seconds * 16000))).astype("float32")
        soundfile.write(ws / "speech" / f"{i}.flac", noise, 16000)
        rows.append(json.dumps({"audio_filepath": f"{i}.flac", "text": text, "duration": seconds}))
    (ws / "speech" / "train.jsonl").write_text("\n".join(rows))
    save_trajectories(record_episodes("Pendulum-v1", 3, "noisy", seed=0), ws / "pendulum.npz")


class Workspace:
    """One folder for every recipe's run (fine-tuning recipes read their pretraining's export)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fitted: set[str] = set()
        users_files(root)

    def cli(self, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
        """Run `unitok` in the workspace; return the `LightningCLI` it built."""
        built: list[Any] = []

        class Recorded(cli_module.UnitokCLI):
            def __init__(self, *a: Any, **k: Any) -> None:
                built.append(self)
                super().__init__(*a, **k)

        monkeypatch.chdir(self.root)
        with monkeypatch.context() as patch:
            patch.setattr(cli_module, "UnitokCLI", Recorded)
            main(list(args))
        return built[0]

    def fit(self, monkeypatch: pytest.MonkeyPatch, recipe: str) -> Path:
        """Fit ``recipe`` once (after what it needs); its run folder."""
        if recipe in NEEDS:
            self.fit(monkeypatch, NEEDS[recipe])
        cli = None
        if recipe not in self.fitted:
            cli = self.cli(monkeypatch, "fit", "--config", str(ROOT / "configs" / f"{recipe}.yaml"), *STEPS,
                           *overrides(recipe, self.root))
            self.fitted.add(recipe)
        run = self.root / recipe_root(recipe)
        if cli is not None:
            assert not list(run.rglob("predictions.jsonl")), "fit wrote predictions"
        return run


def recipe_root(recipe: str) -> str:
    """The recipe's run root (``trainer.default_root_dir``, e.g. ``runs/vit_digits``)."""
    import yaml

    return yaml.safe_load((ROOT / "configs" / f"{recipe}.yaml").read_text())["trainer"]["default_root_dir"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("predict"))


# --------------------------------------------------------------------------- what each recipe predicts
Check = Callable[[dict[str, Any]], bool]
PROBABILITY, LOG_LIKELIHOOD, NEG_ERROR = "probability", "log-likelihood", "negative error"


def one_of(values: Any) -> Check:
    return lambda r: r["prediction"] in values


def text(r: dict[str, Any]) -> bool:
    return isinstance(r["prediction"], str)


def filled_text(r: dict[str, Any]) -> bool:
    return isinstance(r["prediction"], str) and r["prediction"].strip() != ""


def spoken(r: dict[str, Any]) -> bool:
    return isinstance(r["prediction"], str) and set(r["prediction"]) <= SPOKEN


def existing_file(r: dict[str, Any]) -> bool:
    return isinstance(r["id"], str) and Path(r["id"]).is_file()


def tags(names: Any) -> Check:
    return lambda r: (isinstance(r["prediction"], list) and len(r["prediction"]) > 0
                      and all(isinstance(w, str) and t in names for w, t in r["prediction"]))


def action(discrete: bool) -> Check:
    if discrete:
        return lambda r: r["prediction"] in (0, 1) and isinstance(r["step"], int)
    return lambda r: (isinstance(r["prediction"], list) and len(r["prediction"]) == 1
                      and -2.0 - 1e-4 <= r["prediction"][0] <= 2.0 + 1e-4)  # Pendulum's torque range


def by_task(checks: dict[str, tuple[Check, str]]) -> tuple[Check, Callable[[dict[str, Any]], str]]:
    return (lambda r: checks[r["task"]][0](r)), (lambda r: checks[r["task"]][1])


GPT_PROMPTS = {"def ", "class ", "import "}
EXPECT: dict[str, tuple[Check, str | Callable[[dict[str, Any]], str]]] = {
    "bert/electra_tiny": (lambda r: tags({True, False})(r) and "[MASK]" not in r["filled"], PROBABILITY),
    "bert/finetune_cls": (lambda r: r["prediction"] in ("asyncio", "email", "logging", "tkinter")
                          and r["target"] in ("asyncio", "email", "logging", "tkinter"), PROBABILITY),
    "bert/finetune_tokens": (tags(TOKEN_CLASSES), PROBABILITY),
    "bert/mlm_tiny": (lambda r: filled_text(r) and "[MASK]" in r["input"], LOG_LIKELIHOOD),
    "clip/bind_audio": by_task({"image_text": (one_of(DIGIT_NAMES), PROBABILITY),
                                "audio_image": (one_of(DIGIT_NAMES), PROBABILITY)}),
    "clip/digits": (lambda r: r["prediction"] in DIGIT_NAMES and r["target"] in DIGIT_NAMES, PROBABILITY),
    "clip/pairs": (lambda r: existing_file(r) and r["prediction"].startswith("a grey square number"), PROBABILITY),
    "conformer/manifest": (lambda r: existing_file(r) and set(r["prediction"]) <= set(" enosy"), LOG_LIKELIHOOD),
    "conformer/spoken_digits": (lambda r: existing_file(r) and spoken(r), LOG_LIKELIHOOD),
    "deit/digits_distill": (lambda r: r["prediction"] in DIGITS and r["target"] in DIGITS, PROBABILITY),
    "deit/digits_few": (lambda r: r["prediction"] in DIGITS and r["target"] in DIGITS, PROBABILITY),
    "dt/cartpole": (action(discrete=True), PROBABILITY),
    "dt/offline": (action(discrete=False), NEG_ERROR),
    "gpt/finetune_cls": (lambda r: r["prediction"] in ("asyncio", "email", "logging", "tkinter")
                         and r["target"] in ("asyncio", "email", "logging", "tkinter"), PROBABILITY),
    "gpt/tiny": (lambda r: text(r) and r["input"] in GPT_PROMPTS, LOG_LIKELIHOOD),
    "mixer/digits": (one_of(DIGITS), PROBABILITY),
    "multimodal/four_tasks": by_task({"digits": (one_of(DIGITS), PROBABILITY),
                                      "speech": (spoken, LOG_LIKELIHOOD),
                                      "text": (lambda r: text(r) and isinstance(r["input"], str), LOG_LIKELIHOOD),
                                      "cartpole": (action(discrete=True), PROBABILITY)}),
    "multimodal/image_audio_match": by_task({"match": (one_of(("same", "different")), PROBABILITY),
                                             "digits": (one_of(DIGITS), PROBABILITY),
                                             "speech": (spoken, LOG_LIKELIHOOD)}),
    "t5/span_corruption_tiny": (lambda r: text(r) and "<extra_id_0>" in r["input"], LOG_LIKELIHOOD),
    "t5/text_to_text": (lambda r: text(r) and r["input"].split(":")[0] in ("name", "identifiers", "params"),
                        LOG_LIKELIHOOD),
    "vit/digits": (one_of(DIGITS), PROBABILITY),
    "vit/imagefolder": (lambda r: existing_file(r) and r["prediction"] in SHAPES and r["target"] in SHAPES,
                        PROBABILITY),
}


def test_every_recipe_has_an_expectation():
    assert sorted(EXPECT) == NAMES


def score_ok(score: Any, kind: str) -> bool:
    if not isinstance(score, float | int) or not math.isfinite(score):
        return False
    if kind == PROBABILITY:
        return 0.0 <= score <= 1.0 + 1e-6
    return score <= 1e-4  # log-likelihoods and negative errors


@pytest.mark.slow
@pytest.mark.parametrize("recipe", NAMES)
def test_predict_writes_one_record_per_input(recipe, workspace, monkeypatch, capsys):
    run = workspace.fit(monkeypatch, recipe)
    before = set(run.rglob("predictions.jsonl"))
    cli = workspace.cli(monkeypatch, "predict", "--config", str(ROOT / "configs" / f"{recipe}.yaml"), "--ckpt_path",
                        str(run / "latest" / "checkpoints" / "last.ckpt"), *STEPS, *overrides(recipe, workspace.root))
    written = set(run.rglob("predictions.jsonl")) - before
    assert len(written) == 1, f"expected one new predictions.jsonl under {run}, found {sorted(written)}"
    (path,) = written
    assert path.parent.parent == run and path.parent.name.startswith("version_")  # the predict run's own folder
    rows = [json.loads(line) for line in path.read_text().splitlines()]

    loaders = cli.datamodule.predict_dataloader()
    loaders = loaders if isinstance(loaders, list) else [loaders]
    sizes = [len(loader.dataset) for loader in loaders]
    assert len(rows) == sum(sizes) > 0
    task_names = cli.datamodule.names if isinstance(cli.datamodule, MultiTaskDataModule) else []
    for i, size in enumerate(sizes):  # every input once, task by task, in predict-set order
        mine = [r for r in rows if r.get("task") == (task_names[i] if task_names else None)]
        assert len(mine) == size and len({json.dumps(r["id"]) for r in mine}) == size
        if all(isinstance(r["id"], int) for r in mine):
            assert [r["id"] for r in mine] == list(range(size))

    check, kind = EXPECT[recipe]
    for r in rows:
        assert list(r)[:2] in (["id", "prediction"], ["id", "task"]), r
        assert check(r), r
        assert score_ok(r["score"], kind if isinstance(kind, str) else kind(r)), r
    if "PrintPredictions" in (ROOT / "configs" / f"{recipe}.yaml").read_text():  # text recipes still print
        printed = capsys.readouterr().out
        assert all(r["input"] in printed for r in rows)


# --------------------------------------------------------------------------- the writer itself
@pytest.mark.parametrize("n", [11, 5])  # 5 in batches of 2: rank 0 two batches, rank 1 one
def test_records_follow_the_predict_set_under_ddp(tmp_path, n):
    from tasks.callbacks import StopOnSignal
    from tests.tasks.ddp_workers import EchoPredictions

    data = DataLoader(torch.arange(100, 100 + n), batch_size=2 if n == 5 else 3)
    # (the CLI's stop callback rides along: a rank with no batch left must not wait on the others)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False, enable_progress_bar=False,
                        callbacks=[PredictionWriter(str(tmp_path / "out")), StopOnSignal()], enable_model_summary=False)
    trainer.predict(EchoPredictions(), data, return_predictions=False)
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(n))  # one file, each input once, in order
    assert all(r["prediction"] == 100 + r["id"] for r in rows)  # each record under its input's index
    assert {r["rank"] for r in rows} == {0, 1}
    assert not list(tmp_path.rglob("*.tmp"))



def test_a_gloo_group_is_destroyed_when_its_process_exits(tmp_path, monkeypatch):
    import torch.distributed as dist

    from tasks import predictions

    hooks = []
    monkeypatch.setattr(predictions.atexit, "register", hooks.append)
    monkeypatch.setattr(predictions, "_gloo_exit_hook_registered", False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        predictions._destroy_gloo_group_at_exit()
        predictions._destroy_gloo_group_at_exit()  # once a process
        assert len(hooks) == 1
        hooks[0]()  # what the interpreter runs at exit
        assert not dist.is_initialized()
        hooks[0]()  # nothing left to destroy: no error
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

def test_a_predict_step_that_returns_no_records_is_a_clear_error(tmp_path):
    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def predict_step(self, batch, batch_idx):
            return batch

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[PredictionWriter(str(tmp_path / "p.jsonl"))])
    with pytest.raises(TypeError, match="must return a list of records"):
        trainer.predict(Plain(), DataLoader(torch.arange(4), batch_size=2))


def test_a_predict_step_that_returns_fewer_records_than_its_batch_is_refused(tmp_path):
    # numbering its records by count would write input 14 as item 3 and lose three items
    class Drop(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def predict_step(self, batch, batch_idx):
            return [{"prediction": int(x), "score": 1.0} for x in batch[:-1]]

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[PredictionWriter(str(tmp_path / "p.jsonl"))])
    with pytest.raises(ValueError, match=r"Drop.predict_step returned 3 records for a batch of 4 items "
                                         r"\(dataloader 0, batch 0\)"):
        trainer.predict(Drop(), DataLoader(torch.arange(10, 20), batch_size=4))


def test_records_of_several_unnamed_loaders_say_which_loader_they_come_from(tmp_path):
    # ids restart in each loader: without the loader's index two records would read as one item
    class Echo(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return [{"prediction": int(x), "score": 1.0} for x in batch]

    path = tmp_path / "p.jsonl"
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[PredictionWriter(str(path))])
    trainer.predict(Echo(), [DataLoader(torch.arange(10, 13), batch_size=2), DataLoader(torch.arange(20, 22))])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["dataloader"], r["id"], r["prediction"]) for r in rows] == [
        (0, 0, 10), (0, 1, 11), (0, 2, 12), (1, 0, 20), (1, 1, 21)]
    assert list(rows[0]) == ["id", "dataloader", "prediction", "score"]
    # one loader: no field to tell apart
    trainer.predict(Echo(), DataLoader(torch.arange(10, 13)))
    assert [json.loads(line) for line in path.read_text().splitlines()][0] == {"id": 0, "prediction": 10, "score": 1.0}


def test_prompt_files_name_their_lines(tmp_path):
    from tasks.predictions import PromptSet

    (tmp_path / "prompts.txt").write_text("def main(\n\nimport os\n")
    prompts = PromptSet(file=tmp_path / "prompts.txt")
    assert list(prompts) == ["def main(", "import os"]
    assert [prompts.item_id(i) for i in range(2)] == [f"{tmp_path / 'prompts.txt'}:1", f"{tmp_path / 'prompts.txt'}:3"]
    with pytest.raises(FileNotFoundError, match="predict file"):
        PromptSet(file=tmp_path / "missing.txt")


# --------------------------------------------------------------------------- the exported folders
def raw_input(recipe: str, model: Any) -> tuple[str, Any, dict[str, Any]] | None:
    """The pipeline task a recipe's export serves, a raw input for it and the call's options."""
    family = recipe.split("/")[0]
    wave = (0.1 * np.random.default_rng(0).standard_normal(8000)).astype(np.float32)
    if recipe in ("clip/digits", "clip/pairs"):
        return "zero-shot-image-classification", torch.rand(1, 32, 32), {"candidate_labels": ["seven", "two"]}
    if recipe == "clip/bind_audio":
        return "zero-shot-audio-classification", wave, {"candidate_labels": ["seven", "two"], "sample_rate": 16000}
    if family in ("vit", "deit", "mixer"):
        c = model.config
        image = (np.random.default_rng(0).random((c.channels, *c.image_size)) * 255).astype(np.uint8)
        return "image-classification", torch.from_numpy(image), {"top_k": 2}
    return {
        "gpt/tiny": ("text-generation", "def ", {"max_new_tokens": 4}),
        "bert/mlm_tiny": ("fill-mask", "import [MASK]", {"top_k": 2}),
        "bert/finetune_cls": ("text-classification", "Return the path of the file.", {}),
        "gpt/finetune_cls": ("text-classification", "Return the path of the file.", {}),
        "bert/finetune_tokens": ("token-classification", "x = len(items)", {"ignore_labels": ()}),
        "t5/text_to_text": ("text2text-generation", "name: def f(x): return x", {"max_new_tokens": 4}),
        "t5/span_corruption_tiny": ("text2text-generation", "def f(x): return x", {"max_new_tokens": 4}),
        "conformer/spoken_digits": ("automatic-speech-recognition", wave, {"sample_rate": 16000}),
        "conformer/manifest": ("automatic-speech-recognition", wave, {"sample_rate": 16000}),
        "dt/cartpole": ("decision", {"observations": np.zeros((1, 4))}, {"target_return": 500}),
        "dt/offline": ("decision", {"observations": np.zeros((1, 3))}, {"target_return": -200}),
    }.get(recipe)  # ELECTRA and the multimodal models have no Hugging Face pipeline task: see `raw_answers`


def raw_answers(recipe: str, model: Any) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """For an export without a pipeline task (ELECTRA, the multimodal models): the loaded model
    run on raw inputs of each kind it reads, encoded by its own processor — per head, the output
    and the shape it must have."""
    processor = model.processor
    if recipe == "bert/electra_tiny":  # the discriminator, what fine-tuning starts from: a flag per token
        tokens = processor.encode_text("import os")
        return {"rtd": (model.discriminator_as_bert()(tokens).rtd_logits, tuple(tokens.ids.shape))}
    wave = (0.1 * np.random.default_rng(0).standard_normal(8000)).astype(np.float32)
    image = (np.random.default_rng(0).random((1, 32, 32)) * 255).astype(np.uint8)
    raw = {"image": processor.encode_image(torch.from_numpy(image)),
           "audio": processor.encode_audio(wave, sample_rate=16000)}
    if "text" in processor.modalities:
        raw["text"] = processor.encode_text("def f(x):")
    answers: dict[str, tuple[Any, tuple[int, ...]]] = {}
    for name, head in model.config.heads.items():
        if head.kind == "action":  # a trajectory is read from an environment: three steps of CartPole
            from unitok.rollouts import evaluate_returns

            result = evaluate_returns(model.policy(head.segment, name), "CartPole-v1", [50.0], episodes=1,
                                      max_steps=3)
            answers[name] = (torch.as_tensor(result.lengths), (1, 1))
            continue
        # the match head reads a scan and an utterance together, as `ImageAudioMatch` gives them
        segments = ("image", "audio") if name == "match" else (head.segment,)
        with torch.no_grad():
            out = model({s: raw[s] for s in segments}, heads=[name]).heads[name]
        if head.kind == "classifier":
            shape: tuple[int, ...] = (1, head.num_classes)
        elif head.kind == "ctc":  # subsampled frames (1 to the utterance's), a blank beside the characters
            frames = out.shape[1] if 1 <= out.shape[1] <= raw["audio"].features.shape[1] else 0
            shape = (1, frames, len(head.vocabulary) + 1)
        else:  # lm: next-token logits at every text position
            shape = (1, raw["text"].ids.shape[1], model.config.modalities["text"].vocab_size)
        answers[name] = (out, shape)
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("recipe", NAMES)
def test_the_export_opens_with_unitok_load_and_answers_raw_input(recipe, workspace, monkeypatch):
    import unitok
    from unitok.pipelines import pipeline

    folder = workspace.fit(monkeypatch, recipe) / "latest" / "pretrained"
    model = unitok.load(folder)
    assert not model.training
    assert (folder / "processor_config.json").is_file() or model.processor is None
    call = raw_input(recipe, model)
    if call is None:  # no pipeline task: the loaded model answers raw inputs of every kind it reads
        answers = raw_answers(recipe, model)
        heads = set(model.config.heads) if recipe.startswith("multimodal/") else {"rtd"}
        assert set(answers) == heads
        for head, (out, shape) in answers.items():
            assert tuple(out.shape) == shape and torch.isfinite(out.float()).all(), (head, tuple(out.shape), shape)
            if head == "cartpole":
                assert 1 <= int(out) <= 3  # steps taken
        return
    name, raw, options = call
    answer = pipeline(name, model=folder)(raw, **options)
    labels = model.processor.labels if model.processor is not None else None
    if name in ("image-classification", "text-classification"):
        top = answer[0] if isinstance(answer, list) else answer
        assert labels is not None and top["label"] in labels and 0.0 <= top["score"] <= 1.0
    elif name.startswith("zero-shot"):
        assert {a["label"] for a in answer} == {"seven", "two"}
    elif name == "token-classification":
        assert answer and all(a["entity"] in labels for a in answer)
    elif name in ("text-generation", "text2text-generation"):
        assert isinstance(answer[0]["generated_text"], str)
    elif name == "fill-mask":  # the top 2 fillers, best first, tokens of the vocabulary spelled as it spells them
        text_tokenizer = model.processor.part("text")
        assert len(answer) == 2 and answer[0]["score"] >= answer[1]["score"]
        for a in answer:
            assert 0 <= a["token"] < text_tokenizer.vocab_size and 0.0 <= a["score"] <= 1.0
            assert a["token_str"] == text_tokenizer.decode([a["token"]]) and a["sequence"].startswith("import")
    elif name == "automatic-speech-recognition":
        assert set(answer["text"]) <= set(model.processor.characters.chars)
    else:
        assert "action" in answer
