"""Callbacks every run uses: the last checkpoint, clean stops on SIGTERM / SIGINT, a step
progress bar, the exported model folder, frozen parts kept quietly in eval mode; and printing
predictions."""

from __future__ import annotations

import re
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from tasks.run_folder import log_dir


def checkpoint_dir(trainer: L.Trainer) -> Path:
    """``<run>/checkpoints``: beside the run's logs (the folder Lightning's ModelCheckpoint picks)."""
    return log_dir(trainer) / "checkpoints"


class LastCheckpoint(L.Callback):
    """``checkpoints/last.ckpt`` is the last step: written after every validation and when
    training ends or stops (a monitored ``ModelCheckpoint`` writes ``best.ckpt``), so a run can
    always be resumed from where it was (``--ckpt_path last``)."""

    def __init__(self) -> None:
        self.saved_step = -1

    def save(self, trainer: L.Trainer) -> None:
        if trainer.sanity_checking or trainer.global_step == self.saved_step:
            return
        trainer.save_checkpoint(checkpoint_dir(trainer) / "last.ckpt", weights_only=False)  # rank 0 writes
        self.saved_step = trainer.global_step

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self.save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer)


class StoppedBySignal(SystemExit):
    """Raised by `StopOnSignal` where a run stops after SIGTERM / SIGINT; ``code`` is the exit
    status, 128 + the signal (143, 130)."""


class StopOnSignal(L.Callback):
    """SIGTERM (a scheduler's stop) or SIGINT (Ctrl-C) stops a run between two optimizer steps,
    with ``last.ckpt`` written, and exits with status 128 + the signal (143, 130), not 0: a
    stopped run is resumable (``--ckpt_path last``), continues the same curve, and does not look
    finished.

    The signal is noted, and the run stops where the next step would start: the step in
    progress finishes (every batch of a gradient accumulation) and so does a validation under
    way; nothing of Lightning's can hold the stop off (``min_steps``) or add work to it (its
    validation when ``should_stop`` is set). A run whose last step is already done finishes
    (``last.ckpt``, the exported model) and then exits with that status. `unitok validate`,
    ``test`` and ``predict`` stop before their next batch and write no checkpoint (``predict``
    writes the predictions of the batches it finished). A second
    Ctrl-C interrupts at once. Under DDP every rank stops at the same step."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}  # the handlers ours replaced, by signal
        self._mid_step = False  # the last batch trained left its step's gradients to accumulate

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = signum

    def _install(self, signum: int) -> None:
        if signum not in self._previous and threading.current_thread() is threading.main_thread():
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:  # (Lightning puts its own SIGTERM's back itself)
                signal.signal(signum, previous)
        self._previous = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.received, self._mid_step = None, False
        self._install(signal.SIGINT)

    def _take_over_sigterm(self, trainer: L.Trainer) -> None:
        # Lightning's SIGTERM handler (set up after `setup`) makes it raise SIGTERMException at
        # its next check: mid-accumulation, mid-validation, or never (predict). Ours replaces it
        # as the run starts, taking on a SIGTERM it has noted already.
        if signal.SIGTERM in self._previous:
            return
        signals = trainer._signal_connector
        if signals.received_sigterm:
            signals.received_sigterm = False
            self._on_signal(signal.SIGTERM, None)
        self._install(signal.SIGTERM)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_over_sigterm(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_over_sigterm(trainer)  # (in fit: at the sanity check)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_over_sigterm(trainer)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_over_sigterm(trainer)

    def _signalled(self, trainer: L.Trainer) -> bool:
        """Whether this rank or another received a stop signal (every rank asks at the same batch)."""
        stop = trainer.strategy.reduce_boolean_decision(self.received is not None, all=False)
        if stop and self.received is None:
            self.received = signal.SIGTERM  # another rank's (a scheduler's stop, most likely)
        return stop

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self._mid_step or not self._signalled(trainer):  # (asked at the batches that start a step)
            return
        # The loop counted this batch as fetched ("ready"), and noted whether it is the epoch's
        # last, before this hook: left so, the checkpoint would move a resumed run's batch count
        # (its validation schedule) one on, or end its epoch a batch early.
        progress = trainer.fit_loop.epoch_loop.batch_progress
        progress.total.ready -= 1
        progress.current.ready -= 1
        progress.is_last_batch = False  # (the batch trained last was not: this one came after it)
        raise StoppedBySignal(self.exit_code)  # on_exception writes last.ckpt

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._mid_step = trainer.fit_loop.epoch_loop._should_accumulate()

    def _stop_evaluating(self, trainer: L.Trainer) -> None:
        if self._signalled(trainer):
            raise StoppedBySignal(self.exit_code)

    def on_validation_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:  # `unitok validate`, not a validation within fit
            self._stop_evaluating(trainer)

    def on_test_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._stop_evaluating(trainer)

    def on_predict_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        # Each rank on its own: predict shares the items out unevenly (no padding), so a per-batch
        # vote would wait for a rank that has no batch left. The prediction writer's one gather
        # (at the end, or at the stop) pairs up whichever way each rank leaves.
        if self.received is not None:
            raise StoppedBySignal(self.exit_code)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.received is not None:
            rank_zero_warn(f"received {signal.Signals(self.received).name} after the last step: training is "
                           f"complete (step {trainer.global_step}); the run finishes and exits with status "
                           f"{self.exit_code}")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()
        if isinstance(exception, SIGTERMException):  # Lightning's own stop (where ours was not installed)
            self.received = signal.SIGTERM
        elif not isinstance(exception, StoppedBySignal):
            return
        name = signal.Signals(self.received).name
        if trainer.state.fn != TrainerFn.FITTING:  # test / validate / predict read a checkpoint, write none
            rank_zero_warn(f"received {name}: {trainer.state.fn.value} stopped")
            return
        rank_zero_warn(f"received {name}: stopped after step {trainer.global_step}, saving last.ckpt "
                       "(resume with --ckpt_path last)")
        trainer.save_checkpoint(checkpoint_dir(trainer) / "last.ckpt", weights_only=False)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()

    @property
    def exit_code(self) -> int:
        return 0 if self.received is None else 128 + int(self.received)


def frozen_in_eval(model: nn.Module) -> tuple[list[str], list[str]]:
    """A model's eval-mode modules at the start of training -> (frozen, other) names. Frozen: the
    module or one around it has parameters, none trainable (a locked tower, a frozen body:
    their models keep them in eval mode on purpose, so dropout stays off)."""
    names = {name: module for name, module in model.named_modules() if not module.training}

    def frozen(module: nn.Module) -> bool:
        params = list(module.parameters())
        return bool(params) and not any(p.requires_grad for p in params)

    roots = [name for name, module in names.items() if frozen(module)]
    inside = {name for name in names if any(r == "" or name == r or name.startswith(r + ".") for r in roots)}
    return [n for n in names if n in inside], [n for n in names if n not in inside]


class FrozenInEval(L.Callback):
    """Lightning warns when modules are in eval mode as training starts ("This may lead to
    unexpected behavior"). A recipe that freezes part of its model keeps that part in eval mode
    on purpose, so the warning is silenced when every eval-mode module is frozen, and kept (it
    then names a count the frozen parts alone do not make) when any other module is."""

    def __init__(self) -> None:
        self._filter: tuple | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        frozen, other = frozen_in_eval(pl_module)
        if frozen and not other:  # the warning would count exactly the frozen modules
            message = re.escape(f"Found {len(frozen)} module(s) in eval mode at the start of training")
            warnings.filterwarnings("ignore", message=message)
            self._filter = warnings.filters[0]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._remove()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._remove()

    def _remove(self) -> None:
        if self._filter is not None:
            if self._filter in warnings.filters:
                warnings.filters.remove(self._filter)
                getattr(warnings, "_filters_mutated", lambda: None)()  # as filterwarnings does: drop cached decisions
            self._filter = None


class StepProgressBar(TQDMProgressBar):
    """For runs measured in steps (``max_steps``, no epoch limit): one bar counting optimizer
    steps to ``max_steps``, not batches of an epoch that never ends."""

    def _by_steps(self, trainer: L.Trainer) -> bool:
        return trainer.max_steps > 0 and trainer.max_epochs in (None, -1)

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if not self._by_steps(trainer):
            return super().on_train_epoch_start(trainer, *args)
        bar = self.train_progress_bar
        if bar.total != trainer.max_steps:
            bar.reset(total=trainer.max_steps)
        bar.n = trainer.global_step  # a resumed run continues the count
        bar.set_description("Training (steps)")
        bar.refresh()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._by_steps(trainer):
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        n = trainer.global_step
        if self._should_update(n, self.train_progress_bar.total):
            self.train_progress_bar.n = n
            self.train_progress_bar.refresh()
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._by_steps(trainer):
            super().on_train_epoch_end(trainer, pl_module)


class ExportPretrained(L.Callback):
    """At the end of ``fit``, write the task's model (``save_pretrained``) with its processor —
    the data module's tokenizer and class names on top of what the model's config holds — into
    ``dirpath`` (default: ``<log dir>/pretrained``): the self-contained folder `unitok.load`,
    `unitok.pipeline` and `unitok sample` read."""

    def __init__(self, dirpath: str | None = None) -> None:
        self.dirpath = dirpath
        self.first_step: int | None = None  # the step training started from (a resumed run's is > 0)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.first_step = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.first_step = trainer.global_step  # after a checkpoint's restore; never called when done already

    def steps_made(self, trainer: L.Trainer) -> int:
        """Training steps this fit made (not counting the steps of the run it resumed)."""
        return 0 if self.first_step is None else trainer.global_step - self.first_step

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # (a run stopped by a signal never gets here: `StopOnSignal` raises; one that got a signal
        # after its last step did finish, and is exported)
        if self.steps_made(trainer) == 0:  # the weights of no new step would pass for this run's (and move `latest`)
            print("no training step was made in this run: no model exported")
            return
        folder = Path(self.dirpath or log_dir(trainer) / "pretrained")
        model = pl_module.model
        data_processor = getattr(trainer.datamodule, "processor", None)
        processor = data_processor() if callable(data_processor) else None
        if processor is not None:
            model.processor = processor  # the data's tokenizer and class names travel with the weights
        model.save_pretrained(folder)  # type: ignore[operator]
        parts = model.processor.modalities if model.processor is not None else []
        print(f"exported the model{' and its processor (' + ', '.join(parts) + ')' if parts else ''} to {folder}")


class PrintPredictions(L.Callback):
    """Print what ``unitok predict`` returns, one prediction per block: each record (see
    `tasks.predictions`) in the task's ``prediction_format`` (default ``"{input}\\n→ {prediction}"``,
    or ``"{prediction}"`` for records without an input); plain strings as they are."""

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        for output in outputs:
            if isinstance(output, dict):
                default = "{input}\n→ {prediction}" if "input" in output else "{prediction}"
                output = getattr(pl_module, "prediction_format", default).format_map(output)
            print(f"{output}\n{'-' * 40}")


class Compile(L.Callback):
    """Compile the task's transformer stacks with torch.compile before training
    (`unitok.compile.compile_backbones`: the blocks as one graph each, and each chunk of the LM
    head's fused loss; input checks eager; evaluation stays eager). The first steps pay the
    compilation (tens of seconds on a CPU); worth it for long runs. ``backend`` / ``mode`` / ``dynamic``: as `torch.compile` takes them.

    In a recipe: ``trainer.callbacks: [{class_path: tasks.Compile}]``; on the command line:
    ``--trainer.callbacks+=tasks.Compile``. A backend, mode or ``dynamic`` that `torch.compile` would
    refuse is refused when the callback is made, before the data's setup."""

    def __init__(self, backend: str = "inductor", mode: str | None = None, dynamic: bool | None = None) -> None:
        from unitok.compile import check_backend

        check_backend("tasks.Compile backend", backend or "inductor")  # (None: torch.compile's default)
        if mode is not None and (backend or "inductor") == "inductor":  # (other backends ignore the mode)
            from torch._inductor import list_mode_options

            if mode not in list_mode_options():
                raise ValueError(f"tasks.Compile mode must be None or one of inductor's modes "
                                 f"({', '.join(list_mode_options())}), got {mode!r}")
        if dynamic is not None and not isinstance(dynamic, bool):
            raise TypeError(f"tasks.Compile dynamic must be True, False or None, got {dynamic!r}")
        self.options = {"backend": backend, "mode": mode, "dynamic": dynamic}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # at fit start, after setup: tasks may build their model there
        from unitok.compile import compile_backbones

        if compile_backbones(pl_module, **self.options) == 0:
            rank_zero_warn(f"tasks.Compile: {type(pl_module).__name__} holds no unitok Backbone; nothing compiled")
