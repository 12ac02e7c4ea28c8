"""Where a run writes: one folder per run, versioned under the recipe's root.

``--trainer.default_root_dir`` (default ``runs/<recipe file name>``) is the recipe's root; each
``unitok fit / validate / test / predict`` gets the next ``version_N`` inside it and writes
everything there — CSV and TensorBoard logs, ``checkpoints/`` (``last.ckpt``: the last step;
``best.ckpt``: the best monitored one), the exported model (``pretrained/``), predictions. No run
overwrites another's. ``<root>/latest`` points at the newest run that exported a model, and
``--ckpt_path last`` / ``best`` mean that checkpoint of the newest run that has one, so a
resumed, tested or fine-tuned run finds the one before it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import lightning as L
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

VERSION_ENV = "UNITOK_RUN_VERSION"  # the parent's version, inherited by DDP worker processes
LATEST = "latest"


def log_dir(trainer: L.Trainer) -> Path:
    """The run's folder, as ``trainer.log_dir`` but without its broadcast, so that code running on
    rank 0 alone (a checkpoint, an export, a plot) may ask: under DDP a broadcast that only rank 0
    joins hangs or fails."""
    logger = trainer.loggers[0] if trainer.loggers else None
    folder = logger.log_dir if isinstance(logger, (TensorBoardLogger, CSVLogger)) else getattr(logger, "save_dir", None)
    if folder:
        return Path(folder)
    # no logger with a folder (fast_dev_run swaps in a dummy): the CLI's version folder still
    version = os.environ.get(VERSION_ENV)
    return run_dir(Path(trainer.default_root_dir), int(version)) if version is not None else Path(trainer.default_root_dir)


class ConfigInRunFolder(SaveConfigCallback):
    """Saves the CLI's ``config.yaml`` into the run's folder. Lightning's callback writes it to
    ``trainer.log_dir``, which is the recipe's root when a run has no logger
    (``--trainer.logger false``): every run would overwrite the one file there."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        if trainer.is_global_zero:
            folder = log_dir(trainer)
            folder.mkdir(parents=True, exist_ok=True)
            self.parser.save(self.config, str(folder / self.config_filename), skip_none=False, overwrite=True,
                             multifile=self.multifile)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


def versions(root: Path) -> list[int]:
    """The run versions under ``root``, ascending."""
    if not root.is_dir():
        return []
    found = (re.fullmatch(r"version_(\d+)", p.name) for p in root.iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def next_version(root: Path) -> int:
    """This run's version: the next free one, or the launching process's (DDP workers re-run the
    command after rank 0 has chosen, and must write to the same folder)."""
    inherited = os.environ.get(VERSION_ENV)
    if inherited is not None:
        return int(inherited)
    existing = versions(root)
    version = existing[-1] + 1 if existing else 0
    while True:  # claimed by creating it: runs started together take one folder each
        try:
            run_dir(root, version).mkdir(parents=True)
            break
        except FileExistsError:
            version += 1
    os.environ[VERSION_ENV] = str(version)
    return version


def run_dir(root: Path, version: int) -> Path:
    return root / f"version_{version}"


# A TensorBoard file holding its header alone (88 bytes: the file-version event), no logged value.
EVENTS_HEADER_BYTES = 128


def _bookkeeping(path: Path) -> bool:
    """A file a run writes before anything happens: the CLI's saved ``config.yaml``, or a
    TensorBoard events file with no event beyond its header."""
    if path.is_symlink() or not path.is_file():
        return False
    if path.name.startswith("events.out.tfevents."):
        return path.stat().st_size <= EVENTS_HEADER_BYTES
    return path.name == "config.yaml"


def remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` if nothing was written in it (empty folders, the saved config and an
    empty TensorBoard file at most): a run refused before its first step leaves no version behind."""
    if not folder.is_dir():
        return
    inner = sorted((p for p in folder.rglob("*")), key=lambda p: len(p.parts), reverse=True)
    if any(not (p.is_dir() and not p.is_symlink()) and not _bookkeeping(p) for p in inner):
        return
    for p in inner:
        p.rmdir() if p.is_dir() else p.unlink()
    folder.rmdir()


def find_checkpoint(root: Path, which: str) -> Path:
    """``last`` / ``best`` -> that checkpoint of the newest run under ``root`` that has one."""
    for version in reversed(versions(root)):
        path = run_dir(root, version) / "checkpoints" / f"{which}.ckpt"
        if path.is_file():
            return path
    raise FileNotFoundError(f"no run under {root} has a {which}.ckpt yet; fit the recipe first "
                            f"(unitok fit --config …) or give --ckpt_path a file")


def mark_latest(root: Path, run: Path) -> None:
    """Point ``<root>/latest`` at ``run`` (a relative symlink, replaced atomically)."""
    link = root / LATEST
    tmp = root / f".{LATEST}.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run.name, target_is_directory=True)
    os.replace(tmp, link)



RECIPES = Path(__file__).resolve().parents[1] / "configs"  # the repository's recipes (a source checkout)


def recipe_writing(root: Path, configs: Path = RECIPES) -> Path | None:
    """The recipe under ``configs`` whose ``default_root_dir`` is ``root`` (None: none found)."""
    if not configs.is_dir():
        return None
    for recipe in sorted(configs.rglob("*.yaml")):
        found = re.search(r"^\s*default_root_dir:\s*(\S+)\s*$", recipe.read_text(), re.MULTILINE)
        if found and Path(found.group(1)) == root:
            return recipe
    return None


def check_exports(options: dict[str, object]) -> None:
    """Raise for any option naming another run's export (``<root>/latest/…``) that is not there
    yet, saying which recipe writes it: ``{"--model.pretrained": "runs/bert_mlm_tiny/latest/pretrained"}``."""
    for option, value in options.items():
        if not isinstance(value, str) or LATEST not in Path(value).parts or Path(value).exists():
            continue
        parts = Path(value).parts
        root = Path(*parts[: parts.index(LATEST)])
        recipe = recipe_writing(root)
        run = (f"unitok fit --config {recipe.relative_to(recipe.parents[2])}" if recipe is not None
               else f"the recipe whose default_root_dir is {root}")
        raise FileNotFoundError(
            f"{option}={value} does not exist (from {Path.cwd()}): it is another run's export. Run {run} "
            f"first, from this directory, or point {option} at an exported folder")
