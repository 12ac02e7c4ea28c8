"""The `unitok` command: a LightningCLI (fit / validate / test / predict) plus `unitok sample`.

Every run is a YAML recipe in ``configs/<family>/<recipe>.yaml``; model and data are chosen
by ``class_path`` (subclass mode), and the data module's vocabulary size, EOS id, context
length and class count flow into the model through ``link_arguments``. Each run writes into
its own folder (`tasks.run_folder`): CSV and TensorBoard logs, ``checkpoints/last.ckpt`` (the
last step) and ``best.ckpt``, the exported model; SIGTERM / SIGINT stop it with a resumable
checkpoint and a non-zero exit. Options are matched exactly, with a did-you-mean for typos.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import linecache
import logging
import os
import re
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from tasks.callbacks import (
    ExportPretrained,
    FrozenInEval,
    LastCheckpoint,
    StepProgressBar,
    StopOnSignal,
)
from tasks.data.base import CACHE_ENV
from tasks.optim import check_optimizer_settings
from tasks.predictions import PredictionWriter
from tasks.resume import (
    SETTINGS_KEY,
    RecordSettings,
    ResumableRNG,
    changed_settings,
    plain_settings,
    recorded_settings,
    resume_callbacks,
)
from tasks.run_folder import (
    RECIPES,
    VERSION_ENV,
    ConfigInRunFolder,
    check_exports,
    find_checkpoint,
    mark_latest,
    next_version,
    remove_if_empty,
    run_dir,
)
from unitok.cpu_memory import keep_freed_memory_unless_opted_out
from unitok.layers import onednn_gemm

SAMPLE_HELP = "Continue prompts with a trained GPT folder (see `unitok sample --help`)."
CLAIMED: list[Path] = []  # version folders this process created, removed at exit if nothing was written there


def did_you_mean(message: str, known: Sequence[str]) -> str:
    """Suggestions for the unknown options a parser error names (``--trainer.max_stepz``, or a
    class's ``Option 'lerning_rate' is not accepted``)."""
    hints = []
    for option in re.findall(r"(--[\w.\-]+)", message.split("unrecognized arguments:", 1)[-1]) \
            if "unrecognized arguments:" in message else []:
        close = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
        if close:
            hints.append(f"{option}: did you mean {close[0]}?")
    for class_path, name in re.findall(r"class_path '([\w.]+)'[^']*Option '(\w+)' is not accepted", message,
                                       flags=re.S):
        try:
            module, _, attr = class_path.rpartition(".")
            params = list(inspect.signature(getattr(importlib.import_module(module), attr)).parameters)
        except (ImportError, AttributeError, ValueError):
            continue
        close = difflib.get_close_matches(name, params, n=1, cutoff=0.6)
        if close:
            hints.append(f"{name!r}: did you mean {close[0]!r} (of {class_path})?")
    return ("\n" + "\n".join(hints)) if hints else ""


def fill_cache_dirs(node: Any, cache_dir: str) -> None:
    """Set every unset ``cache_dir`` in a data config (a data module's ``init_args``, and those
    of the tasks a `MultiTaskDataModule` nests) to ``cache_dir``."""
    if isinstance(node, Namespace):
        node = vars(node)  # its own keys (a Namespace's items() are the nested leaves)
    if isinstance(node, dict):
        if "cache_dir" in node and node["cache_dir"] is None:
            node["cache_dir"] = cache_dir
        for value in node.values():
            fill_cache_dirs(value, cache_dir)
    elif isinstance(node, list | tuple):
        for value in node:
            fill_cache_dirs(value, cache_dir)


class UnitokArgumentParser(LightningArgumentParser):
    """Options match exactly (``--trainer.max_step`` is an error, not ``max_steps``), and an
    unknown one gets a did-you-mean."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        known = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        for action in self._actions:  # the subcommands' options (fit / test / …)
            for sub in (getattr(action, "choices", None) or {}).values():
                if isinstance(sub, LightningArgumentParser):
                    known += [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
        super().error(message + did_you_mean(message, known), ex)


class UnitokCLI(LightningCLI):
    """LightningCLI with unitok's argument links and run folders; its help also lists `sample`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parser_class", UnitokArgumentParser)
        self.stop: StopOnSignal | None = None
        self.model_config_from: str | None = None  # the checkpoint whose model_config builds the model
        super().__init__(*args, **kwargs)

    def subcommand_config(self) -> Namespace:
        """The parsed settings of the subcommand being run (all of them without one)."""
        return self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config

    # ------------------------------------------------------------------ the run's folder
    def recipe_root(self) -> Path:
        """``--trainer.default_root_dir``, else ``runs/<recipe file name>`` (``runs/unitok`` without one)."""
        config = self.subcommand_config()
        root = config.get("trainer", {}).get("default_root_dir")
        if root:
            return Path(root)
        recipes = config.get("config") or []
        name = Path(str(recipes[-1])).stem if recipes else "unitok"
        return Path("runs") / name

    def before_instantiate_classes(self) -> None:
        """A path to another run's export that is missing is an error naming the recipe to run.
        Data caches (tokenizers, token files, synthesised speech, recorded episodes) of a data
        module given no ``cache_dir`` go to ``<root>/cache``, shared by the recipe's runs, unless
        ``$UNITOK_CACHE_DIR`` names a cache shared by every recipe."""
        config = self.subcommand_config()
        self._check_root()
        self._check_ckpt_source(config.get("ckpt_path"))
        self._take_checkpoint_model_config(config)
        unread = {"model.init_args.pretrained", "model.init_args.image_tower"} if self.model_config_from else set()
        if self.subcommand != "fit":  # a teacher is read for fitting alone (`ImageClassificationTask.setup`)
            unread.add("model.init_args.teacher")
        try:
            check_exports({f"--{key.replace('.init_args.', '.')}": value for key, value in config.items()
                           if key.startswith(("model.", "data.")) and key not in unread})
        except FileNotFoundError as error:
            self.parser.error(str(error))
        if not os.environ.get(CACHE_ENV):
            fill_cache_dirs(config.get("data"), str(self.recipe_root() / "cache"))

    def _check_root(self) -> None:
        """The recipe's root must be a folder (made if missing): a file there, or on the way to it,
        is refused now rather than as a traceback when the run's folder is made."""
        root = self.recipe_root()
        existing = next((p for p in (root, *root.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            given = self.subcommand_config().get("trainer", {}).get("default_root_dir")
            name = f"--trainer.default_root_dir {root}" if given else f"the recipe's runs folder {root}"
            self.parser.error(f"{name}: {existing} is a file; expected a folder (made if missing) to hold the runs")

    def _check_ckpt_source(self, ckpt: Any) -> None:
        """``--ckpt_path`` names a checkpoint on this machine: a URL (which Lightning would fetch
        over the network) and Lightning's ``hpc`` / ``registry`` look-ups are refused."""
        if isinstance(ckpt, str) and ("://" in ckpt or ckpt == "hpc"
                                      or re.fullmatch(r"registry(:.*)?", ckpt, flags=re.IGNORECASE | re.S)):
            self.parser.error(f"--ckpt_path {ckpt}: a run reads no checkpoint over the network or from a registry; "
                              "give a checkpoint file, or last / best (the newest run's)")

    def instantiate_classes(self) -> None:
        """A value the model or data module refuses while being built (a misspelt preset, a file
        that is not there) is reported as a misspelt option is: its own message on one line, exit
        status 2, instead of a traceback through jsonargparse ending in "Does not validate against
        any of the Union subtypes"."""
        try:
            super().instantiate_classes()
            if hasattr(getattr(self.model, "hparams", None), "learning_rate"):  # before the data is built
                check_optimizer_settings(self.model.hparams)
        except Exception as error:
            refusal = _own_refusal(error)
            if refusal is None:
                raise
            self.parser.error(str(refusal))
        if self.model_config_from is not None:  # built: the run's config.yaml keeps the recipe's value
            config = self.subcommand_config()
            config.model.init_args.model_config = None

    def _parse_ckpt_path(self) -> None:
        """Lightning replaces the model's settings with a checkpoint file's hyperparameters (the
        recipe's and the command line's ``--model.*`` with them), but not for ``last`` / ``best``,
        which are resolved later: here the recipe and the command line decide in every case, and
        `_check_checkpoint` compares them with the checkpoint's run — all but the model's
        architecture, which the checkpoint's ``model_config`` gives (`_take_checkpoint_model_config`)."""

    def _take_checkpoint_model_config(self, config: Namespace) -> None:
        """With ``--ckpt_path``, a task that records its model's config (``model_config``) builds the
        checkpoint's model from it — the config its weights were trained in — and reads no starting
        folder (``pretrained``, a CLIP's ``image_tower``): the checkpoint is tested, validated,
        predicted with or resumed on its own, whether that folder was moved, deleted or written
        again since. A ``model_config`` the recipe or the command line gives is kept."""
        model, ckpt = config.get("model"), config.get("ckpt_path")
        init_args = model.get("init_args") if isinstance(model, Namespace) else None
        if not isinstance(init_args, Namespace) or "model_config" not in init_args \
                or init_args.get("model_config") is not None:
            return
        if ckpt in ("last", "best"):
            try:
                ckpt = str(find_checkpoint(self.recipe_root(), ckpt))
            except FileNotFoundError:  # `_run_subcommand` says so
                return
        if not isinstance(ckpt, str) or not Path(ckpt).is_file():
            return
        try:
            checkpoint = torch.load(ckpt, weights_only=True, map_location="cpu", mmap=True)
        except Exception:  # not ours to judge here: Lightning's own load names the problem
            return
        if not isinstance(checkpoint, dict):
            return
        recorded = checkpoint.get(SETTINGS_KEY)
        if isinstance(recorded, dict) and recorded.get("model.class_path") != model.get("class_path"):
            return  # another kind of model's: `_check_checkpoint` refuses it by name
        hyper_parameters = checkpoint.get("hyper_parameters") or {}
        if "family" in hyper_parameters and hyper_parameters["family"] != init_args.get("family"):
            return  # another family's model (a ViT's for a Mixer recipe): `_run_subcommand` says it does not fit
        model_config = hyper_parameters.get("model_config")
        if isinstance(model_config, dict):
            init_args["model_config"] = model_config
            self.model_config_from = ckpt

    def _set_seed(self) -> None:
        """``--seed_everything`` outside numpy's range (a negative seed) is refused as a misspelt option is."""
        config = self.subcommand_config()
        self.seed_asked = config.get("seed_everything")  # True: drawn at random, compared with nothing
        try:
            super()._set_seed()
        except ValueError as error:
            self.parser.error(f"--seed_everything: {error}")

    def run_settings(self) -> dict[str, Any]:
        """The settings that make a run's curve: its model, its data and (when one was asked for) its seed."""
        config = self.subcommand_config()
        model = config.get("model")
        if self.model_config_from is not None:  # the checkpoint's (while the model is built), not a setting
            model = model.clone()
            model.init_args.model_config = None
        settings = plain_settings({"model": model, "data": config.get("data")})
        if getattr(self, "seed_asked", None) is not True:
            settings["seed_everything"] = config.get("seed_everything")
        return settings

    def _check_checkpoint(self, subcommand: str, ckpt: str) -> None:
        """A checkpoint of another kind of model is refused; resuming training with other settings
        than the checkpoint's run had (another learning rate, batch size, seed) is refused too, since
        the run would go on along another curve than the one its checkpoint and logs are of; for
        validate / test / predict the differences are only listed."""
        recorded = recorded_settings(ckpt)
        if recorded is None:
            return
        current = self.run_settings()
        kind = "model.class_path"
        if recorded.get(kind) != current.get(kind):
            self.parser.error(f"--ckpt_path {ckpt} was written by a {recorded.get(kind)} run; this recipe's model is "
                              f"{current.get(kind)}: give a checkpoint of this recipe")
        changed = changed_settings(recorded, current)
        if not changed:
            return
        listed = "; ".join(changed[:6]) + (f"; … ({len(changed)} in all)" if len(changed) > 6 else "")
        if subcommand == "fit":
            self.parser.error(f"resuming from {ckpt} with other settings than its run's: {listed}. A resumed run goes on "
                              "along the checkpoint's curve; resume with its settings, or start a new run")
        rank_zero_only(print)(f"settings that differ from the checkpoint's run: {listed}")

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """The trainer, writing into ``<root>/version_N``: CSV and TensorBoard logs, checkpoints
        (``last.ckpt`` always, ``best.ckpt`` where the recipe monitors a metric), the export."""
        root = self.recipe_root()
        version = next_version(root)
        self.run_dir = run_dir(root, version)
        CLAIMED.append(self.run_dir)
        trainer = dict(self._get(self.config_init, "trainer", default={}))
        trainer["default_root_dir"] = str(root)
        if trainer.get("logger") in (None, True):
            trainer["logger"] = [CSVLogger(save_dir=root, name="", version=version),
                                 TensorBoardLogger(save_dir=root, name="", version=version, default_hp_metric=False)]
        else:
            self._check_loggers(trainer["logger"])
        callbacks = list(trainer.get("callbacks") or [])
        for callback in callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath is not None:
                raise ValueError(f"ModelCheckpoint(dirpath={callback.dirpath!r}) would write outside the run's "
                                 f"folder; leave dirpath unset (checkpoints go to {self.run_dir}/checkpoints)")
            if isinstance(callback, ExportPretrained) and callback.dirpath is not None:
                raise ValueError(f"ExportPretrained(dirpath={callback.dirpath!r}) would write outside the run's "
                                 f"folder, where `latest` does not point and the next run writes again; leave "
                                 f"dirpath unset (the model goes to {self.run_dir}/pretrained)")
            if isinstance(callback, PredictionWriter) and callback.output_path is not None \
                    and not _inside(self.run_dir, callback.output_path):
                raise ValueError(f"PredictionWriter(output_path={callback.output_path!r}) would write outside the "
                                 f"run's folder; give a path relative to it (predictions.jsonl goes to "
                                 f"{self.run_dir}) or leave output_path unset")
        self.stop = StopOnSignal()
        callbacks += [LastCheckpoint(), self.stop, FrozenInEval(), RecordSettings(self.run_settings())]
        if not any(isinstance(c, ResumableRNG) for c in callbacks):
            callbacks += resume_callbacks()
        if not any(isinstance(c, ExportPretrained) for c in callbacks):
            callbacks.append(ExportPretrained())
        if trainer.get("enable_progress_bar", True) is not False and not any(isinstance(c, ProgressBar)
                                                                             for c in callbacks):
            callbacks.append(StepProgressBar())
        trainer["callbacks"] = callbacks
        # Decided now, before Lightning starts any worker process: they inherit the decision (the
        # environment) and multiply as this one does, not timing again and perhaps deciding otherwise.
        onednn_gemm.preferred()
        steps, every = trainer.get("max_steps") or -1, trainer.get("log_every_n_steps") or 50
        if 0 < steps < 10 * every:  # a short run still logs from its first steps (ten points at least)
            trainer["log_every_n_steps"] = max(1, steps // 10)
        if steps > 0 and trainer.get("check_val_every_n_epoch", 1) is None:
            # A run measured in steps logs every log_every_n_steps across epochs, however short an
            # epoch is (100 scans are one batch): Lightning's warning that an epoch holds fewer
            # batches than the interval is about per-epoch logs, which such a run does not keep.
            warnings.filterwarnings("ignore", message=r"The number of training batches \(\d+\) is smaller than "
                                                      r"the logging interval")
        extra = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        return self._instantiate_trainer({**trainer, **kwargs}, extra)

    def _check_loggers(self, logger: Any) -> None:
        """A logger of the recipe's or the command line's must write into the run's folder: one
        writing elsewhere would take the run (its checkpoints, its export) there, away from the
        folder ``latest`` and ``--ckpt_path last`` / ``best`` look in."""
        for each in logger if isinstance(logger, list | tuple) else [logger]:
            if not isinstance(each, Logger):
                continue  # False: no logger
            folder = getattr(each, "log_dir", None) or each.save_dir
            if folder and Path(folder).resolve() != self.run_dir.resolve():
                raise ValueError(f"--trainer.logger: {type(each).__name__} would write into {folder}, not the run's "
                                 f"folder {self.run_dir} (where `latest` and --ckpt_path last / best look); leave "
                                 "--trainer.logger unset (the run's CSV and TensorBoard logs go to its folder)")

    def _run_subcommand(self, subcommand: str) -> None:
        config = self.config_init[subcommand]
        ckpt = config.get("ckpt_path")
        if ckpt in ("last", "best"):  # the newest run's, not this new version's (empty) folder
            try:
                config["ckpt_path"] = str(find_checkpoint(self.recipe_root(), ckpt))
            except FileNotFoundError as error:
                self.parser.error(str(error))
        elif isinstance(ckpt, str) and not Path(ckpt).is_file():  # (URLs, hpc, registry: `_check_ckpt_source`)
            self.parser.error(f"--ckpt_path {ckpt}: no such checkpoint file ('last' or 'best' find the newest run's)")
        if isinstance(config.get("ckpt_path"), str) and Path(config["ckpt_path"]).is_file():
            self._check_checkpoint(subcommand, config["ckpt_path"])
        export = next((c for c in self.trainer.callbacks if isinstance(c, ExportPretrained)), None)
        try:
            super()._run_subcommand(subcommand)
        except Exception as error:
            # A value refused as the data is read or the first batch runs (a missing file, a split
            # larger than the data): one line and exit 2, as a refusal while building is, when no
            # step was made — a failure mid-run keeps its traceback.
            made = export.steps_made(self.trainer) if export is not None else self.trainer.global_step
            if made == 0 and "Error(s) in loading state_dict" in str(error):  # another recipe's weights
                first = str(error).splitlines()[0]
                self.parser.error(f"--ckpt_path {config.get('ckpt_path')} does not fit this recipe's model ({first} "
                                  "…): give a checkpoint of this recipe")
            refusal = _own_refusal(error)
            if refusal is None or made > 0:
                raise
            self.parser.error(str(refusal))
        stopped = self.stop is not None and self.stop.received is not None
        made = export.steps_made(self.trainer) if export is not None else self.trainer.global_step
        if subcommand == "fit" and made == 0 and not stopped:
            if self.trainer.global_step:  # a resumed run already at max_steps
                self.parser.error(f"fit made no training step, so nothing was exported: the checkpoint is at step "
                                  f"{self.trainer.global_step} and max_steps is {self.trainer.max_steps}; raise "
                                  "--trainer.max_steps to train on")
            self.parser.error("fit made no training step, so nothing was exported: the training data gives no "
                              "batch (fewer items than one batch?) or max_steps is 0")
        if subcommand == "fit" and (self.run_dir / "pretrained" / "config.json").is_file():
            rank_zero_only(mark_latest)(self.recipe_root(), self.run_dir)

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        super()._add_subcommands(parser, **kwargs)
        # `main` runs `unitok sample` with its own argparse parser before LightningCLI sees the
        # arguments; this empty entry only makes `unitok --help` list it beside fit / validate / ...
        sample = self.parser_class(description=SAMPLE_HELP, add_help=False)
        parser._subcommands_action.add_subcommand("sample", sample, help=SAMPLE_HELP)

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.init_args.context_length", "model.init_args.context_length")
        parser.link_arguments("data.vocab_size", "model.init_args.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.eos_token_id", "model.init_args.eos_token_id", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")


_OWN_PACKAGES = tuple(str(Path(__file__).resolve().parents[1] / name) + os.sep
                      for name in ("unitok", "tasks", "tokenizers_mm"))


def _inside(folder: Path, path: str) -> bool:
    """Whether ``path`` (relative to ``folder``, or absolute) lies inside ``folder``."""
    return (folder / path).resolve().is_relative_to(folder.resolve())


def _own_refusal(error: BaseException) -> BaseException | None:
    """The ValueError / TypeError / OSError behind ``error`` (its causes followed) that unitok's own
    code raised — a refusal of a value, worded for the user — or None (anything else: a traceback).
    A TypeError counts only from a ``raise`` statement: Python's own (a call with a wrong argument
    inside unitok) is a bug, and keeps its traceback."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        raised_in = tb.tb_frame.f_code.co_filename if tb is not None else ""
        if isinstance(current, ValueError | TypeError | OSError) and raised_in.startswith(_OWN_PACKAGES):
            if not isinstance(current, TypeError) or _raise_statement(raised_in, tb.tb_lineno):
                return current
        current = current.__cause__ or current.__context__
    return None


def _raise_statement(filename: str, lineno: int | None) -> bool:
    """Whether line ``lineno`` of ``filename`` is (the start of) a ``raise`` statement."""
    return lineno is not None and linecache.getline(filename, lineno).lstrip().startswith("raise ")


def resolve_recipes(args: list[str]) -> list[str]:
    """``--config configs/<family>/<recipe>.yaml`` names the shipped recipe from any working
    directory: a recipe path that does not exist here is read from the project's recipes."""
    resolved = list(args)
    for i, arg in enumerate(args[:-1]):
        if arg in ("--config", "-c") and not Path(args[i + 1]).exists():
            shipped = RECIPES.parent / args[i + 1]
            if Path(args[i + 1]).parts[:1] == ("configs",) and shipped.is_file():
                resolved[i + 1] = str(shipped)
    return resolved


class _NoCloudLoggerTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def _drop_cloud_logger_tip() -> None:
    """Lightning prints a tip to install its cloud logger on every run that does not use it: an
    advert in each run's output (and no network here), dropped once."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoCloudLoggerTip) for f in logger.filters):
        logger.addFilter(_NoCloudLoggerTip())


def main(argv: Sequence[str] | None = None) -> None:
    args = resolve_recipes(list(sys.argv[1:] if argv is None else argv))
    if argv is None:
        sys.argv[1:] = args  # LightningCLI reads the command line itself
    keep_freed_memory_unless_opted_out()  # no page faults for each step's big CPU buffers
    # Lightning's own call of a pytree API torch deprecated: nothing a user of the CLI can act on.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    _drop_cloud_logger_tip()
    if args and args[0] == "sample":
        from tasks.sample import main as sample_main

        sample_main(args[1:])
        return
    chooses_version = VERSION_ENV not in os.environ  # not a DDP worker the launching process started
    try:
        cli = UnitokCLI(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args if argv is not None else None,
            save_config_callback=ConfigInRunFolder,
            save_config_kwargs={"overwrite": True},
        )
    except SIGTERMException:  # Lightning's stop between steps: last.ckpt is written (StopOnSignal)
        sys.exit(128 + signal.SIGTERM)
    finally:
        if chooses_version:
            os.environ.pop(VERSION_ENV, None)  # the next command in this process picks its own
            while CLAIMED:
                remove_if_empty(CLAIMED.pop())
    if cli.stop is not None and cli.stop.exit_code:
        sys.exit(cli.stop.exit_code)  # stopped by SIGTERM / SIGINT: resumable, not finished


if __name__ == "__main__":
    main()
