"""Multi-task training of one `MultimodalTransformer`: several tasks, each from its own data
module, one set of backbone weights, one optimiser, one checkpoint.

The data comes from `tasks.data.MultiTaskDataModule` (a ``{task: batch}`` dict per training
step, every task's held-out loader in turn for validation and test). `MultiTaskTask` builds the
model from its objectives (`tasks.objectives`) once the data is set up, and each step trains
every task (``tasks_per_step="all"``: the sum of the weighted losses) or one task drawn by its
sampling weight (``"one"``). Each task's loss and held-out metric are logged under its own name
(``digits/val_acc``, ``speech/val_cer``, …).
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from tasks.objectives import Objective, as_objective
from tasks.optim import adamw_warmup_cosine
from tasks.predictions import Record
from tasks.recorded import check_trained_tokenizer, record_model_config, take_trained_tokenizer
from tokenizers_mm.checks import check_int
from unitok.models import MultimodalConfig, MultimodalTransformer


class MultiTaskTask(L.LightningModule):
    """Trains one `MultimodalTransformer` on every objective at once.

    Args:
        objectives: task name -> `Objective` (`ImageClassification`, `SpeechRecognition`,
            `LanguageModelling`, `ReturnConditionedControl`, `ImageAudioMatch`); names match
            the data module's tasks. Objectives that name the same segment share its embedder.
            Kept in the hyperparameters as plain specs (`Objective.spec`), which are accepted
            here too: a checkpoint loads with ``weights_only=True``.
        preset: a `MultimodalConfig` backbone preset; d_model / n_layers / n_heads / dropout
            override it. modality_embedding: add a learned vector per modality.
        tasks_per_step: "all" (every step trains every task on its batch) or "one" (each step
            trains one task, drawn with probability ∝ its sampling_weight, the same draw on
            every device; under DDP use ``strategy: ddp_find_unused_parameters_true``). The
            combined loader serves every task's batch each step either way: with "one" the
            undrawn tasks' batches are set aside, so each task trains on about its weight's
            share of its batches.
        sampling_seed: seed of the "one" draws.
        model_config: the full model config (recorded once built, so checkpoints rebuild it).
        learning_rate / weight_decay / betas / warmup_steps / min_lr_ratio: AdamW, warm-up + cosine.
    """

    def __init__(
        self,
        objectives: dict[str, Objective],
        preset: str = "mm-small",
        d_model: int | None = None,
        n_layers: int | None = None,
        n_heads: int | None = None,
        dropout: float | None = None,
        modality_embedding: bool = True,
        tasks_per_step: Literal["all", "one"] = "all",
        sampling_seed: int = 0,
        model_config: dict[str, Any] | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
    ) -> None:
        super().__init__()
        # the objectives as plain specs, not objects: a checkpoint then loads with weights_only=True
        self.save_hyperparameters(ignore=["objectives"])
        objectives = {name: as_objective(name, o) for name, o in (objectives or {}).items()}
        self.hparams["objectives"] = {name: o.spec() for name, o in objectives.items()}
        if not objectives:
            raise ValueError("MultiTaskTask needs at least one objective: objectives: {name: objective}")
        if tasks_per_step not in ("all", "one"):
            raise ValueError(f"tasks_per_step must be 'all' or 'one', got {tasks_per_step!r}")
        if tasks_per_step == "one" and not any(o.sampling_weight > 0 for o in objectives.values()):
            raise ValueError("every sampling_weight is 0: no task could be drawn")
        if not any(o.loss_weight > 0 for o in objectives.values()):
            raise ValueError("every loss_weight is 0: no task's loss would train the model")
        if tasks_per_step == "one" and not any(o.loss_weight > 0 and o.sampling_weight > 0
                                               for o in objectives.values()):
            raise ValueError("no task has both a sampling_weight and a loss_weight above 0: every step would draw a "
                             "task whose loss counts for nothing")
        if tasks_per_step == "all":
            drawn = sorted(name for name, o in objectives.items() if o.sampling_weight != 1.0)
            if drawn:  # read only when one task is drawn a step: a weight here would be ignored
                raise ValueError(f"sampling_weight of {drawn} is read with tasks_per_step='one' only; every task "
                                 "trains every step with 'all' (use loss_weight to weigh them)")
        check_int("sampling_seed", sampling_seed, 0)
        if tasks_per_step == "all" and sampling_seed != 0:  # as sampling_weight: it would be ignored
            raise ValueError(f"sampling_seed={sampling_seed} is read with tasks_per_step='one' only; 'all' draws nothing")
        if preset not in MultimodalConfig.presets:  # fail here, not at setup
            MultimodalConfig.from_name(preset)
        self.objectives = dict(objectives)
        self.model: MultimodalTransformer | None = None
        if model_config is not None:
            self.model = MultimodalTransformer(MultimodalConfig.from_dict(dict(model_config)))
        self.metrics = nn.ModuleDict()

    # ------------------------------------------------------------------ model from the data
    def setup(self, stage: str) -> None:
        data = getattr(self.trainer, "datamodule", None)
        tasks = getattr(data, "tasks", None)
        if tasks is None:
            raise ValueError("MultiTaskTask trains with a MultiTaskDataModule (data: tasks: {name: data module})")
        if set(tasks) != set(self.objectives):
            raise ValueError(f"the objectives {sorted(self.objectives)} and the data's tasks {sorted(tasks)} must "
                             "have the same names")
        if self.hparams.tasks_per_step == "one" and getattr(data, "mode", None) == "max_size":
            # an ended loader gives None in "max_size" mode: a step that draws its task has nothing to train
            raise ValueError("tasks_per_step='one' draws a task each step, which a 'max_size' data mode leaves "
                             "without a batch once its loader ends; use mode 'max_size_cycle' or 'min_size'")
        processor = getattr(data, "processor", None)
        if callable(processor):  # one model reads one text vocabulary: refuse two tokenizers now, not at export
            processor()
        check_trained_tokenizer(self, data, stage)  # and a checkpoint tested with another one is refused
        for name, objective in self.objectives.items():
            try:
                objective.bind(name, tasks[name])
            except AttributeError as error:  # an objective given another kind of data (text's to images)
                raise ValueError(f"task {name!r}: {type(objective).__name__} cannot read "
                                 f"{type(tasks[name]).__name__} ({error})") from None
        config = self.build_config()
        if self.model is None:
            self.model = MultimodalTransformer(config)
        elif (self.model.config.modalities, self.model.config.heads) != (config.modalities, config.heads):
            raise ValueError("the model (checkpoint) does not read what the data gives: its modalities/heads "
                             f"{sorted(self.model.config.modalities)}/{sorted(self.model.config.heads)} differ "
                             "from the objectives' (same names, other settings)")
        record_model_config(self, self.model.config)
        self.task_names = list(tasks)  # the data's order: validation's dataloader_idx follows it
        for name, objective in self.objectives.items():
            if name not in self.metrics:
                self.metrics[name] = nn.ModuleDict(objective.make_metrics()).to(self.device)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        take_trained_tokenizer(self, checkpoint)

    def build_config(self) -> MultimodalConfig:
        """Every objective's segments (shared names must agree) and heads, on the preset backbone."""
        modalities: dict[str, Any] = {}
        heads: dict[str, Any] = {}
        for name, objective in self.objectives.items():
            for segment, modality in objective.modalities().items():
                if segment in modalities and modalities[segment] != modality:
                    differ = {k: (v, getattr(modality, k)) for k, v in modalities[segment].to_dict().items()
                              if getattr(modality, k) != v}
                    raise ValueError(f"task {name!r} shapes segment {segment!r} differently from an earlier task "
                                     f"(earlier, {name}): {differ}; give the data modules the same settings or "
                                     "use another segment name")
                modalities[segment] = modality
            for head, config in objective.heads().items():
                if head in heads:
                    raise ValueError(f"two tasks use the head name {head!r}")
                heads[head] = config
        h = self.hparams
        overrides = {k: v for k, v in dict(d_model=h.d_model, n_layers=h.n_layers, n_heads=h.n_heads,
                                           dropout=h.dropout).items() if v is not None}
        return MultimodalConfig.from_name(h.preset, modalities=modalities, heads=heads,
                                          modality_embedding=h.modality_embedding, **overrides)

    def _require_model(self) -> MultimodalTransformer:
        if self.model is None:
            raise RuntimeError("the model is built in setup() from the data; fit with a MultiTaskDataModule")
        return self.model

    # ------------------------------------------------------------------ steps
    def step_tasks(self, step: int | None = None) -> list[str]:
        """The tasks step ``step`` (default: the current one) trains: all, or one drawn by
        sampling weight from a generator seeded by the step, so every device draws the same."""
        names = list(self.objectives)
        if self.hparams.tasks_per_step == "all":
            return names
        step = self.global_step if step is None else step
        weights = torch.tensor([self.objectives[n].sampling_weight for n in names], dtype=torch.float64)
        generator = torch.Generator().manual_seed(self.hparams.sampling_seed * 1_000_003 + step)
        return [names[int(torch.multinomial(weights, 1, generator=generator))]]

    def _task_loss(self, name: str, batch: Any) -> tuple[Tensor, Any]:
        objective = self.objectives[name]
        out = self._require_model()(objective.inputs(batch), heads=[objective.head])
        return objective.loss(out, batch), out

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        total: Tensor | None = None
        for name in self.step_tasks():
            if batch.get(name) is None:  # "max_size" mode: this task's loader has ended
                continue
            loss, _ = self._task_loss(name, batch[name])
            objective = self.objectives[name]
            self.log(f"{name}/train_loss", loss, batch_size=objective.batch_size(batch[name]))
            weighted = objective.loss_weight * loss
            total = weighted if total is None else total + weighted
        if total is None:
            raise RuntimeError("no task had a batch at this step")
        self.log("train_loss", total, prog_bar=True)
        self.log("lr", self.optimizers().param_groups[0]["lr"])  # type: ignore[union-attr]
        return total

    def _eval_step(self, batch: Any, dataloader_idx: int, stage: str) -> None:
        name = self.task_names[dataloader_idx]
        loss, out = self._task_loss(name, batch)
        objective = self.objectives[name]
        objective.update(self.metrics[name], out, batch, loss)
        self.log(f"{name}/{stage}_loss", loss, batch_size=objective.batch_size(batch), add_dataloader_idx=False,
                 sync_dist=True)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, dataloader_idx, "val")

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, dataloader_idx, "test")

    @torch.no_grad()
    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> list[Record]:
        """Records (`tasks.predictions`) of a held-out batch of the task ``dataloader_idx`` names
        (`MultiTaskDataModule.predict_dataloader`), each with its ``task``; what each holds is
        the task's `Objective.predict`."""
        name = self.task_names[dataloader_idx]
        objective = self.objectives[name]
        model = self._require_model()
        out = model(objective.inputs(batch), heads=[objective.head])
        data = self.trainer.datamodule.tasks[name]  # type: ignore[union-attr]
        return [{"task": name, **record} for record in objective.predict(out, batch, model, data)]

    def _epoch_end(self, stage: str) -> None:
        summary = []
        for name, objective in self.objectives.items():
            # a task that had no batch (an empty held-out split) reports nothing, not a 0 torchmetrics made up
            updated = any(getattr(m, "update_count", 1) > 0 for m in self.metrics[name].values())
            values = objective.compute(self.metrics[name]) if self.metrics[name] and updated else {}
            if not self.trainer.sanity_checking:
                values.update(objective.evaluate(self._require_model()))
            for key, value in values.items():
                self.log(f"{name}/{stage}_{key}", value, prog_bar=key == objective.metric, sync_dist=True)
            for metric in self.metrics[name].values():
                metric.reset()
            if objective.metric in values:
                summary.append(f"{name} {objective.metric} {values[objective.metric]:.4g}")
        if summary and not self.trainer.sanity_checking:
            where = "test" if stage == "test" else f"{stage} at step {self.global_step}"
            message = f"{where}: " + ", ".join(summary)
            if stage == "test" and self.trainer.is_global_zero:
                print(message)  # what `unitok test` reports, whatever the logging setup
            else:
                rank_zero_info(message)

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test")

    def configure_optimizers(self):
        return adamw_warmup_cosine(self._require_model(), self.trainer, self.hparams)
