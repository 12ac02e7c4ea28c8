"""Decision Transformer training: the loss is the paper's (MSE / cross-entropy over real steps),
the model takes its shape and statistics from the data and checkpoints rebuild it, a
checkpoint for other actions is refused, evaluation logs returns per target and plots them
(sampled discrete actions unless told to take the argmax) — and on CartPole, from built-in
mixed-quality data, return conditioning works: the achieved return follows targets 100–400
within 25 %, rises with the target and reaches ≥ 90 % of the maximum at the top."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor

from tasks import DecisionTransformerTask, TrajectoryDataModule, action_loss
from unitok.models import DecisionTransformer, DecisionTransformerConfig, DecisionTransformerOutput

SMALL = dict(expert_episodes=2, noisy_episodes=4, random_episodes=2)


def trainer(max_steps: int = 2, **options) -> L.Trainer:
    """A quiet CPU trainer that validates only when asked."""
    defaults = dict(max_steps=max_steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    limit_val_batches=0, log_every_n_steps=10)
    return L.Trainer(**{**defaults, **options})


def small_data(tmp_path: Path, **options) -> TrajectoryDataModule:
    return TrajectoryDataModule(**{**dict(env_id="CartPole-v1", context_length=5, batch_size=16,
                                          cache_dir=str(tmp_path / "cache"), val_fraction=0.25), **SMALL, **options})


# --------------------------------------------------------------------------- loss


def test_action_loss_is_mse_or_cross_entropy_over_real_steps():
    mask = torch.tensor([[0, 1, 1]])
    preds = torch.tensor([[[9.0, 9.0], [0.5, -0.5], [0.0, 1.0]]])
    out = DecisionTransformerOutput(action_preds=preds, state_preds=None, return_preds=None,
                                    last_hidden_state=torch.zeros(1, 9, 4))
    target = torch.tensor([[[-9.0, -9.0], [0.0, 0.0], [0.0, 0.0]]])
    # Continuous: mean of the squared errors at the two real steps (the padded one is ignored).
    assert float(action_loss(out, target, mask, discrete=False)) == pytest.approx((0.25 + 0.25 + 0 + 1) / 4)
    ids = torch.tensor([[1, 0, 1]])
    by_hand = (-np.log(np.exp(0.5) / (np.exp(0.5) + np.exp(-0.5))) - np.log(np.exp(1.0) / (1 + np.exp(1.0)))) / 2
    assert float(action_loss(out, ids, mask, discrete=True)) == pytest.approx(by_hand, rel=1e-6)


# --------------------------------------------------------------------------- mechanics


def test_the_model_comes_from_the_data_and_a_checkpoint_rebuilds_it(tmp_path):
    dm = small_data(tmp_path)
    task = DecisionTransformerTask(preset="dt-tiny", eval_targets=[20, 500], eval_episodes=2, eval_max_steps=30)
    t = trainer(3, logger=CSVLogger(str(tmp_path), name="dt"), limit_val_batches=1, val_check_interval=3)
    t.fit(task, datamodule=dm)
    c = task.model.config
    assert (c.state_dim, c.act_dim, c.discrete, c.context_length) == (4, 2, True, 5)
    assert c.tokenizer() == dm.tokenizer  # the statistics travel with the model
    # Validation rolled the policy out: per-target returns logged, plot and returns saved.
    metrics = t.callback_metrics
    assert {"eval_return_20", "eval_return_500", "eval_return_top", "val_loss", "val_acc"} <= set(metrics)
    assert float(metrics["eval_return_top"]) == pytest.approx(float(metrics["eval_return_500"]))
    folder = Path(t.log_dir)
    assert (folder / "returns_vs_target.png").read_bytes().startswith(b"\x89PNG")
    saved = json.loads((folder / "eval_returns.json").read_text())
    assert set(saved["returns"]) == {"20", "500"} and all(len(v) == 2 for v in saved["returns"].values())
    assert task.evaluation is not None and task.evaluation.lengths.max() <= 30

    t.save_checkpoint(tmp_path / "dt.ckpt")
    loaded = DecisionTransformerTask.load_from_checkpoint(tmp_path / "dt.ckpt")  # no data needed
    batch = next(iter(dm.val_dataloader()))
    keys = ("states", "actions", "returns_to_go", "timesteps", "attention_mask")
    with torch.no_grad():
        a = loaded.model.eval()(*(batch[k] for k in keys)).action_preds
        b = task.model.eval()(*(batch[k] for k in keys)).action_preds
    assert torch.equal(a, b) and loaded.model.config == task.model.config


class RolloutSpy(L.Callback):
    """Records the rollouts' forwards (four arguments: no attention mask, unlike the training and
    validation batches') on a one-episode evaluation. Step t's input carries the action chosen at
    step t - 1, so each chosen action pairs with the logits it was chosen from."""

    def __init__(self) -> None:
        self.calls: list[tuple[Tensor, Tensor]] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.model.register_forward_hook(self.record)

    def record(self, module: torch.nn.Module, args: tuple, output: DecisionTransformerOutput) -> None:
        if len(args) == 4:
            assert args[0].shape[0] == 1, "one target, one episode: a batch of one"
            self.calls.append((args[1][0].clone(), output.action_preds[0, -1].clone()))

    def choices(self) -> list[tuple[int, Tensor]]:
        """(chosen action, the logits it was chosen from) at every step but the last; then forgets."""
        calls, self.calls = self.calls, []
        return [(int(calls[t][0][-2]), calls[t - 1][1]) for t in range(1, len(calls))]


def test_rollouts_sample_discrete_actions_unless_told_to_take_the_argmax(tmp_path):
    """Validation's rollouts draw each discrete action from the softmax of the logits (the
    default): from a barely trained model's near-even logits some draws are not the argmax,
    and the draws are seeded (a rollout again gives the same ones, another seed others). With
    eval_sample=False every action is the argmax. The choice is recorded with the returns."""
    dm = small_data(tmp_path)
    actions = {}
    for eval_sample, sampled in ((None, True), (False, False)):
        L.seed_everything(0)  # the same model both times
        task = DecisionTransformerTask(preset="dt-tiny", eval_targets=[50], eval_episodes=1, eval_max_steps=20,
                                       eval_sample=eval_sample)
        spy = RolloutSpy()
        t = trainer(1, logger=CSVLogger(str(tmp_path), name=f"dt-{eval_sample}"), limit_val_batches=1,
                    val_check_interval=1, callbacks=[spy])
        t.fit(task, datamodule=dm)
        choices = spy.choices()
        assert len(choices) >= 5 and len(choices) == task.evaluation.lengths[0, 0] - 1
        took_argmax = [action == int(logits.argmax()) for action, logits in choices]
        assert not all(took_argmax) if sampled else all(took_argmax), took_argmax
        actions[sampled] = [action for action, _ in choices]
        assert task.evaluation.extra["sample"] is sampled
        assert json.loads((Path(t.log_dir) / "eval_returns.json").read_text())["sample"] is sampled
        # the same rollout again (same seed: the same start and, sampled, the same draws)
        h = task.hparams
        task.model.evaluate("CartPole-v1", [50], episodes=1, seed=h.eval_seed, max_steps=20, sample=eval_sample)
        assert [action for action, _ in spy.choices()] == actions[sampled]
        if sampled:  # another seed draws other actions
            task.model.evaluate("CartPole-v1", [50], episodes=1, seed=h.eval_seed + 1, max_steps=20, sample=True)
            assert [action for action, _ in spy.choices()] != actions[sampled]
    assert actions[True] != actions[False]  # the same model from the same start


def test_behaviour_cloning_baseline_is_the_same_model_without_return_tokens(tmp_path):
    dm = small_data(tmp_path)
    task = DecisionTransformerTask(preset="dt-tiny", condition_on_returns=False, eval_episodes=0)
    trainer(2).fit(task, datamodule=dm)
    assert task.model.embed_return is None and task.model.config.tokens_per_step == 2
    full = DecisionTransformerTask(preset="dt-tiny", eval_episodes=0)
    trainer(1).fit(full, datamodule=dm)
    assert full.model.num_parameters() - task.model.num_parameters() == 2 * 32 + 32 + 1  # return embed + head


def test_a_checkpoint_for_other_actions_is_refused(tmp_path):
    pendulum = DecisionTransformer(DecisionTransformerConfig.from_name("dt-pendulum", context_length=5))
    folder = pendulum.save_pretrained(tmp_path / "pendulum")
    task = DecisionTransformerTask(pretrained=str(folder))
    with pytest.raises(ValueError, match=r"action dimension mismatch: the model \(checkpoint\) has act_dim=1 "
                                         r"continuous actions, the data act_dim=2 discrete"):
        trainer(1).fit(task, datamodule=small_data(tmp_path))


def test_a_pretrained_model_fine_tunes_on_matching_data(tmp_path):
    dm = small_data(tmp_path)
    source = DecisionTransformer(DecisionTransformerConfig.from_name("dt-cartpole", context_length=5))
    folder = source.save_pretrained(tmp_path / "cartpole")
    task = DecisionTransformerTask(pretrained=str(folder), learning_rate=0.0, warmup_steps=0)
    trainer(1).fit(task, datamodule=dm)
    for key, value in source.state_dict().items():
        assert torch.equal(task.model.state_dict()[key], value), key
    assert task.model.config.return_scale == dm.tokenizer.return_scale


def test_a_model_fine_tuned_on_new_data_reads_and_exports_the_new_statistics(tmp_path):
    # the loaded folder's statistics stayed in its processor (the pipeline's) while the config
    # (rollouts') took the new data's, and the export then did not load
    from tokenizers_mm.trajectory import Episode, TrajectoryTokenizer

    rng = np.random.default_rng(0)

    def episodes(shift: float) -> list[Episode]:
        return [Episode(rng.normal(shift, 1, (20, 4)), rng.integers(0, 2, 20), np.ones(20) * (1 + shift))
                for _ in range(3)]

    old, new = TrajectoryTokenizer.fit(episodes(0.0), context_length=5), TrajectoryTokenizer.fit(episodes(5.0),
                                                                                                   context_length=5)
    DecisionTransformer(DecisionTransformerConfig.from_name("dt-cartpole", context_length=5).with_tokenizer(old)
                        ).save_pretrained(tmp_path / "first")
    task = DecisionTransformerTask(preset="dt-cartpole", pretrained=str(tmp_path / "first"))
    task.adopt_data(new)  # what setup does on the new data
    read = task.model.processor.part("trajectory")
    np.testing.assert_allclose(read.state_mean, new.state_mean)
    assert read.return_scale == new.return_scale
    task.model.save_pretrained(tmp_path / "second")
    again = DecisionTransformer.from_pretrained(tmp_path / "second")
    np.testing.assert_allclose(again.processor.part("trajectory").state_mean, new.state_mean)


def test_bad_task_arguments_fail_at_once():
    with pytest.raises(ValueError, match="unknown DecisionTransformerConfig preset 'dt-giant'"):
        DecisionTransformerTask(preset="dt-giant")
    with pytest.raises(TypeError, match="each target return must be a real number"):
        DecisionTransformerTask(eval_targets=[100, "500"])  # type: ignore[list-item]


# --------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_return_conditioning_works_on_cartpole(tmp_path):
    # Built-in data: 40 expert episodes (return 500), 150 noisy ones (random action with a
    # probability drawn from [0.4, 1]: returns ≈ 10…500) and 50 random ones (≈ 10…60).
    # configs/dt/cartpole.yaml's settings: dt-small (2 layers, width 64), K = 10, returns-to-go
    # divided by 50, 1,000 AdamW steps of 64 windows (about a minute and a half on one CPU
    # core), argmax actions. The achieved return follows the target: within 20 % of targets
    # 100–400 over training seeds 0–2 (benchmarks/claims_control.py); here one seed, 20 episodes.
    L.seed_everything(0)
    dm = TrajectoryDataModule(env_id="CartPole-v1", context_length=10, batch_size=64, return_scale=50,
                              cache_dir=str(tmp_path))
    task = DecisionTransformerTask(preset="dt-small", learning_rate=1e-3, warmup_steps=50, eval_episodes=0)
    trainer(1000, gradient_clip_val=1.0).fit(task, datamodule=dm)
    targets = [100, 200, 300, 400, 500]
    result = task.model.evaluate("CartPole-v1", targets, episodes=20, seed=10_000, sample=False)
    means = result.mean_returns()
    assert all(abs(means[t] - t) <= 0.25 * t for t in targets[:-1]), f"achieved return off target: {result}"
    assert means[500.0] >= 0.9 * 500, f"mean return at the highest target: {result}"
    assert all(means[a] < means[b] for a, b in zip(targets, targets[1:])), f"does not rise with the target: {result}"
