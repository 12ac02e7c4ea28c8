"""Offline RL with the Decision Transformer: action prediction on logged trajectories, and
rollouts in gymnasium at several target returns.

The loss is the paper's: mean squared error of the (tanh) actions for continuous action
spaces, cross-entropy of the action logits for discrete ones, over real (unpadded) steps.
``condition_on_returns=False`` trains the same network without return tokens: the
behaviour-cloning baseline that return conditioning is measured against.

Axis legend: B batch, K steps per window, A action width or number of actions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from tasks.optim import adamw_warmup_cosine
from tasks.predictions import Record, class_records, records
from tasks.recorded import record_model_config
from tasks.run_folder import log_dir
from tokenizers_mm.checks import check_int
from unitok.models import DecisionTransformer, DecisionTransformerConfig, DecisionTransformerOutput
from unitok.rollouts import EvaluationResult, check_env_id, check_target_returns

PLOT_FILE = "returns_vs_target.png"
RESULTS_FILE = "eval_returns.json"


def action_records(preds: Tensor, batch: dict[str, Tensor], tokenizer: Any) -> list[Record]:
    """Records (`tasks.predictions`) of the action at each window's last step: (B, K, A)
    predictions (logits, or tanh actions in model units) and the window batch -> per window the
    action (an id; or floats in the environment's units) with its probability (discrete) or
    −(mean squared error) against the logged action in model units (continuous), the logged
    action as ``target``, and the window's ``step`` and ``return_to_go`` (environment units)."""
    last = preds[:, -1].float()  # (B, A)
    logged = batch["actions"][:, -1]
    extra = {"step": batch["timesteps"][:, -1].tolist(),
             "return_to_go": (batch["returns_to_go"][:, -1, 0].float() * tokenizer.return_scale).tolist()}
    if tokenizer.discrete:
        return class_records(last, None, logged.long(), **extra)
    score = -(last - logged.float()).pow(2).mean(-1)
    unscale = lambda a: tokenizer.unscale_actions(a.detach().cpu().numpy()).tolist()  # noqa: E731
    return records(unscale(last), score, target=unscale(logged.float()), **extra)


def action_loss(out: DecisionTransformerOutput | Tensor, actions: Tensor, attention_mask: Tensor,
                discrete: bool) -> Tensor:
    """MSE (continuous) or cross-entropy (discrete) of the predicted actions at real steps.

    (B, K, A) predictions (or a model output holding them as ``action_preds``); (B, K, A)
    target actions or (B, K) ids; (B, K) mask -> scalar.
    """
    preds = out if isinstance(out, Tensor) else out.action_preds
    real = attention_mask.bool()
    preds = preds[real].float()  # (M, A) over the M real steps
    if discrete:
        return F.cross_entropy(preds, actions[real].long())
    return F.mse_loss(preds, actions[real].float())


class DecisionTransformerTask(L.LightningModule):
    """Trains a `DecisionTransformer` on `TrajectoryDataModule` windows and evaluates it by
    rolling it out at target returns.

    Logs ``train_loss``, ``val_loss`` (and ``val_acc`` for discrete actions) and, after each
    validation (and in ``test``) when an environment is known, ``eval_return_<target>`` (mean
    achieved return per target) and ``eval_return_top`` (at the highest target); the
    achieved-vs-target plot (``returns_vs_target.png``) and the returns of every episode
    (``eval_returns.json``) go into the log dir, and ``evaluation`` keeps the last result.

    The model's dimensions, its context length and the tokenizer statistics (state mean/std,
    return scale, action range) come from the data module when fitting; they are recorded in
    ``model_config`` so checkpoints rebuild the same model.

    Args:
        preset: a `DecisionTransformerConfig` preset, the shape of a model trained from scratch
            (not read with ``pretrained`` or ``model_config``, as for the other fine-tuning
            tasks); ``d_model``, ``n_layers``, ``n_heads``, ``dropout`` override it when given.
            context_length: K (the CLI links the data's).
        dropout: with ``pretrained``, the dropout while fine-tuning (a training choice, as for
            BERT and GPT fine-tuning); None keeps the folder's.
        condition_on_returns: False gives the behaviour-cloning baseline (no return tokens);
            None (default): True for a fresh model.
        pretrained: a ``save_pretrained`` folder to start from; its state and action spaces
            must match the data's. It keeps its own architecture: an architecture option
            (``d_model``, ``n_layers``, ``n_heads``, ``context_length``) or
            ``condition_on_returns`` given with a different value than the folder's is an
            error, not ignored.
        model_config: a full config as a dict (set automatically; wins over the other options).
        learning_rate / weight_decay / betas / warmup_steps / min_lr_ratio: AdamW (no decay
            on biases and norm gains), linear warm-up then cosine decay.
        eval_env: gymnasium id for rollouts (default: the data module's ``env_id``).
        eval_targets: target returns (default: quartiles and maximum of the data's returns).
        eval_episodes: episodes per target (0: no rollouts). eval_max_steps: cap per episode
            (≥ 1, None: the environment's time limit).
        eval_seed: episode e starts from seed eval_seed + e for every target (≥ 0).
        eval_sample: how rollouts choose discrete actions: True draws them from the softmax
            (seeded per episode), False takes the argmax; None (default) samples, as
            `unitok.rollouts.evaluate_returns` does. Which tracks the target closer depends on
            how sharply the model reads the return: configs/dt/cartpole.yaml takes the argmax
            and gives both. Continuous actions are used as predicted (True is refused for them).

    Rollout options and the environment's spaces are checked before training starts, not at
    the first validation.
    """

    def __init__(
        self,
        preset: str = "dt-small",
        context_length: int | None = None,
        d_model: int | None = None,
        n_layers: int | None = None,
        n_heads: int | None = None,
        dropout: float | None = None,
        condition_on_returns: bool | None = None,
        pretrained: str | None = None,
        model_config: dict[str, Any] | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
        eval_env: str | None = None,
        eval_targets: list[float] | None = None,
        eval_episodes: int = 5,
        eval_max_steps: int | None = None,
        eval_seed: int = 10_000,
        eval_sample: bool | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        DecisionTransformerConfig.from_name(preset)  # an unknown preset fails here, not mid-fit
        if eval_targets is not None:
            check_target_returns(eval_targets)
        check_int("eval_episodes", eval_episodes, 0, note="(0: no rollouts)")
        check_int("eval_max_steps", eval_max_steps, or_none=True)
        check_int("eval_seed", eval_seed, 0)
        if eval_sample is not None and not isinstance(eval_sample, bool):
            raise TypeError(f"eval_sample must be True, False or None, got {eval_sample!r}")
        self.model: DecisionTransformer | None = None
        if model_config is not None:
            self.model = DecisionTransformer(DecisionTransformerConfig.from_dict(dict(model_config)))
        elif pretrained is not None:
            self.model = DecisionTransformer.from_pretrained(pretrained).train()  # loading gives eval mode
            self._check_pretrained_options(pretrained)
            if dropout is not None and dropout != self.model.config.dropout:
                # on its embeddings, residual branches and attention weights
                self.model = self.model.rebuilt(self.model.config.replace(dropout=dropout))
        self.evaluation: EvaluationResult | None = None

    # ------------------------------------------------------------------ model
    def _check_pretrained_options(self, folder: str) -> None:
        """A pretrained model keeps its architecture: an option given with another value would
        otherwise be silently ignored (a behaviour-cloning baseline that reads returns)."""
        c = self.model.config  # type: ignore[union-attr]
        architecture = {k: v for k, v in self._overrides().items() if k != "dropout"}  # dropout: fine-tuning's
        given = {**architecture, "condition_on_returns": self.hparams.condition_on_returns}
        differ = {k: (v, getattr(c, k)) for k, v in given.items() if v is not None and v != getattr(c, k)}
        if differ:
            listed = ", ".join(f"{k}={v!r} (the model's: {had!r})" for k, (v, had) in differ.items())
            hint = (f"; set data.context_length: {c.context_length}" if "context_length" in differ else "")
            raise ValueError(f"the pretrained model in {folder} keeps its own architecture; given {listed}: "
                             f"leave these options out, or train a fresh model{hint}")

    def _overrides(self) -> dict[str, Any]:
        h = self.hparams
        return {k: v for k, v in dict(d_model=h.d_model, n_layers=h.n_layers, n_heads=h.n_heads, dropout=h.dropout,
                                      context_length=h.context_length).items() if v is not None}

    def setup(self, stage: str) -> None:
        """Build the model from the data (or check a given one against it) and record its config."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        tokenizer = getattr(datamodule, "tokenizer", None)
        if self.model is None:
            if tokenizer is None:
                raise ValueError("the model's state and action spaces come from the data: fit with a "
                                 "TrajectoryDataModule (or pass model_config / pretrained)")
            self.model = self.build_model(tokenizer)
        elif tokenizer is not None:
            self.adopt_data(tokenizer)
        if self.hparams.eval_sample and not self.model.config.discrete:
            raise ValueError("eval_sample=True draws discrete actions from the softmax, but this model has "
                             "continuous actions (used as predicted): leave eval_sample unset")
        if stage in ("fit", "validate", "test") and self.hparams.eval_env and self.hparams.eval_episodes:
            # (the data module checks its own env_id against the data)
            check_env_id(self.hparams.eval_env, self.model.config)
        longest = getattr(datamodule, "max_episode_length", None)
        if longest is not None and longest > self.model.config.max_ep_len:
            raise ValueError(f"the data has episodes of {longest} steps but the model's timestep embedding "
                             f"covers max_ep_len={self.model.config.max_ep_len}; use a preset with a larger one")
        record_model_config(self, self.model.config)

    def build_model(self, tokenizer: Any) -> DecisionTransformer:
        """A fresh model of ``preset`` (plus overrides) for the data ``tokenizer`` describes."""
        overrides = self._overrides()
        if "context_length" in overrides and overrides["context_length"] != tokenizer.context_length:
            raise ValueError(f"the model's context_length={overrides['context_length']} differs from the data's "
                             f"{tokenizer.context_length}; set one value for both")
        overrides.pop("context_length", None)
        config = DecisionTransformerConfig.from_name(self.hparams.preset, **overrides)
        conditioned = self.hparams.condition_on_returns is not False  # None: a fresh model reads returns
        config = config.replace(condition_on_returns=conditioned).with_tokenizer(tokenizer)
        return DecisionTransformer(config)

    def adopt_data(self, tokenizer: Any) -> None:
        """Check a given (pretrained / checkpointed) model against the data and take the data's
        statistics, which are what its windows are normalised with."""
        c = self.model.config  # type: ignore[union-attr]
        kind = lambda discrete: "discrete" if discrete else "continuous"  # noqa: E731
        if (c.act_dim, c.discrete) != (tokenizer.act_dim, tokenizer.discrete):
            raise ValueError(f"action dimension mismatch: the model (checkpoint) has act_dim={c.act_dim} "
                             f"{kind(c.discrete)} actions, the data act_dim={tokenizer.act_dim} "
                             f"{kind(tokenizer.discrete)}")
        if c.state_dim != tokenizer.state_dim:
            raise ValueError(f"state dimension mismatch: the model (checkpoint) has state_dim={c.state_dim}, "
                             f"the data state_dim={tokenizer.state_dim}")
        if c.context_length != tokenizer.context_length:
            raise ValueError(f"the model's context_length={c.context_length} differs from the data's "
                             f"{tokenizer.context_length}; set data.context_length: {c.context_length}")
        self.model.config = c.with_tokenizer(tokenizer)  # type: ignore[union-attr]

    def _require_model(self) -> DecisionTransformer:
        if self.model is None:
            raise RuntimeError("the model is built in setup() from the data; fit with a TrajectoryDataModule")
        return self.model

    def forward(self, **batch: Tensor) -> DecisionTransformerOutput:
        return self._require_model()(**{k: v for k, v in batch.items() if k not in ("terminals",)})

    # ------------------------------------------------------------------ steps
    def _loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, DecisionTransformerOutput]:
        model = self._require_model()
        out = model(batch["states"], batch["actions"], batch["returns_to_go"], batch["timesteps"],
                    batch["attention_mask"], actions_only=True)  # the loss reads actions alone
        return action_loss(out, batch["actions"], batch["attention_mask"], model.config.discrete), out

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=batch["states"].shape[0])
        self.log("lr", self.optimizers().param_groups[0]["lr"], prog_bar=False)  # type: ignore[union-attr]
        return loss

    def _eval_step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        loss, out = self._loss(batch)
        B = batch["states"].shape[0]
        self.log(f"{stage}_loss", loss, prog_bar=True, batch_size=B)
        if self._require_model().config.discrete:
            real = batch["attention_mask"].bool()
            accuracy = (out.action_preds[real].argmax(-1) == batch["actions"][real]).float().mean()
            self.log(f"{stage}_acc", accuracy, batch_size=B)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._eval_step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.run_evaluation()

    def on_test_epoch_end(self) -> None:
        self.run_evaluation()

    @torch.no_grad()
    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> list[Record]:
        """Records (`tasks.predictions`): the action the model takes at the last step of each
        window, conditioned on the logged returns-to-go (see `action_records`)."""
        model = self._require_model()
        out = model(batch["states"], batch["actions"], batch["returns_to_go"], batch["timesteps"],
                    batch["attention_mask"], actions_only=True)
        return action_records(out.action_preds, batch, model.tokenizer())

    # ------------------------------------------------------------------ rollouts
    def _eval_env(self) -> str | None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        return self.hparams.eval_env or getattr(datamodule, "env_id", None)

    def eval_targets(self) -> list[float]:
        """The configured targets, or the quartiles and the maximum of the data's returns."""
        if self.hparams.eval_targets is not None:
            return check_target_returns(self.hparams.eval_targets)
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is None or not hasattr(datamodule, "episode_returns"):
            raise ValueError("no eval_targets given and no data to derive them from")
        returns = datamodule.episode_returns()
        return [float(np.round(v, 1)) for v in np.quantile(returns, [0.25, 0.5, 0.75, 1.0])]

    def run_evaluation(self) -> EvaluationResult | None:
        """Roll out at every target, log the mean returns, save the plot and the returns."""
        env_id, h = self._eval_env(), self.hparams
        if env_id is None or h.eval_episodes == 0:
            return None
        model = self._require_model()
        result = model.evaluate(env_id, self.eval_targets(), episodes=h.eval_episodes, seed=h.eval_seed,
                                max_steps=h.eval_max_steps, device=self.device, sample=h.eval_sample)
        self.evaluation = result
        means = result.mean_returns()
        for target, mean in means.items():
            self.log(f"eval_return_{target:g}", mean, rank_zero_only=True)
        self.log("eval_return_top", means[max(means)], prog_bar=True, rank_zero_only=True)
        rank_zero_info("returns by target: " + ", ".join(f"{t:g} -> {m:.1f}" for t, m in means.items()))
        if self.trainer.is_global_zero:
            folder = log_dir(self.trainer)
            kind = "return-conditioned" if model.config.condition_on_returns else "behaviour cloning"
            save_return_plot(result, folder / PLOT_FILE, label=f"{kind}, step {self.global_step}")
            payload = {"env_id": env_id, "step": self.global_step, "sample": result.extra["sample"],
                       "returns": {f"{t:g}": r for t, r in result.as_dict().items()}}
            (folder / RESULTS_FILE).write_text(json.dumps(payload, indent=2) + "\n")
        return result

    def configure_optimizers(self):
        return adamw_warmup_cosine(self._require_model(), self.trainer, self.hparams)


def save_return_plot(
    result: EvaluationResult,
    path: str | Path,
    label: str = "achieved",
    others: Sequence[tuple[str, EvaluationResult]] = (),
) -> Path:
    """Achieved mean return (± one standard deviation over episodes) against the target return,
    with the diagonal achieved = target; ``others`` adds more (label, result) curves (e.g. the
    behaviour-cloning baseline). Written as a PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

    fig = Figure(figsize=(5.0, 4.0))
    ax = fig.add_subplot()
    lows, highs = [], []
    for name, res in ((label, result), *others):
        targets = np.asarray(res.targets)
        order = np.argsort(targets)
        mean, std = res.returns.mean(1)[order], res.returns.std(1)[order]
        ax.errorbar(targets[order], mean, yerr=std, marker="o", capsize=3, label=name)
        lows += [targets.min(), (mean - std).min()]
        highs += [targets.max(), (mean + std).max()]
    lo, hi = min(lows), max(highs)
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="achieved = target")
    ax.set(xlabel="target return", ylabel="achieved return",
           title=f"{result.env_id}: {result.returns.shape[1]} episodes per target")
    ax.legend(fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
