"""Gymnasium rollouts of a return-conditioned policy (a `DecisionTransformer`) at target returns.

The return-to-go starts at the target and, after each step, drops by the reward received:
R̂_{t+1} = R̂_t − r_t, in the environment's own reward units (so with negative rewards, as in
Pendulum, the target is negative and R̂ rises towards 0). The model reads R̂_t / return_scale,
the scale its tokenizer was fitted with. Episodes stop when the environment terminates or
truncates them, and at the latest after ``max_steps`` (default: the environment's time limit,
never more than the model's ``max_ep_len``).

Axis legend: E environments run together (targets × episodes), T steps so far, K window,
S state width, A action width.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tokenizers_mm.checks import check_int

if TYPE_CHECKING:
    from unitok.models.decision_transformer import DecisionTransformer


@dataclass
class EvaluationResult:
    """Achieved returns per target: ``returns[i, e]`` and ``lengths[i, e]`` for target
    ``targets[i]`` and episode ``e`` (episode e starts from the same seed for every target)."""

    env_id: str
    targets: list[float]
    returns: np.ndarray
    lengths: np.ndarray
    max_steps: int
    extra: dict[str, Any] = field(default_factory=dict)

    def mean_returns(self) -> dict[float, float]:
        """{target: mean achieved return}."""
        return {t: float(r.mean()) for t, r in zip(self.targets, self.returns)}

    def as_dict(self) -> dict[float, list[float]]:
        """{target: [achieved return of each episode]}."""
        return {t: [float(x) for x in r] for t, r in zip(self.targets, self.returns)}

    def __getitem__(self, target: float) -> list[float]:
        return self.as_dict()[float(target)]

    def __repr__(self) -> str:
        means = ", ".join(f"{t:g}: {m:.1f}" for t, m in self.mean_returns().items())
        return f"EvaluationResult({self.env_id}, {self.returns.shape[1]} episodes, target -> mean return {{{means}}})"


def check_target_returns(target_returns: Any) -> list[float]:
    """A number or a non-empty list of finite numbers, as floats; anything else is a clear error."""
    if isinstance(target_returns, np.ndarray) and target_returns.ndim == 0:  # a number held in an array
        target_returns = target_returns.item()
    values = [target_returns] if isinstance(target_returns, numbers.Number) else target_returns
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(f"target_returns must be a number or a list of numbers, got {type(target_returns).__name__} "
                        f"{target_returns!r}")
    if len(values) == 0:
        raise ValueError("target_returns is empty: give at least one target return")
    out = []
    for value in values:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"each target return must be a real number, got {type(value).__name__} {value!r}")
        if not math.isfinite(float(value)):
            raise ValueError(f"target returns must be finite, got {value}")
        out.append(float(value))
    return out


def check_env_spaces(env: Any, spec: Any, env_id: str, source: str = "the model (checkpoint) was trained with") -> None:
    """Refuse an environment whose observations or actions differ from ``spec``'s (anything with
    ``state_dim``, ``act_dim`` and ``discrete``: a model config, a `TrajectoryTokenizer`), in a
    ValueError naming both; ``source`` says whose dimensions they are ("the data has")."""
    from gymnasium import spaces

    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, spaces.Box) or int(np.prod(obs_space.shape)) != spec.state_dim:
        raise ValueError(f"{env_id} observations are {obs_space}, but {source} state_dim={spec.state_dim}")
    if spec.discrete:
        if not isinstance(act_space, spaces.Discrete) or int(act_space.n) != spec.act_dim:
            raise ValueError(f"{env_id} actions are {act_space}, but {source} {spec.act_dim} discrete actions")
    elif not isinstance(act_space, spaces.Box) or int(np.prod(act_space.shape)) != spec.act_dim:
        raise ValueError(f"{env_id} actions are {act_space}, but {source} act_dim={spec.act_dim} continuous actions")


def check_env_id(env_id: str, spec: Any, source: str = "the model (checkpoint) was trained with",
                 env_kwargs: dict[str, Any] | None = None) -> None:
    """`check_env_spaces` for the gymnasium environment ``env_id``, made and closed here: before a
    training run whose rollouts would otherwise fail (or mean nothing) only once it is over."""
    import gymnasium as gym

    env = gym.make(env_id, **(env_kwargs or {}))
    try:
        check_env_spaces(env, spec, env_id, source)
    finally:
        env.close()


@torch.no_grad()
def evaluate_returns(
    model: DecisionTransformer,
    env_id: str,
    target_returns: float | Sequence[float],
    episodes: int = 10,
    seed: int = 0,
    max_steps: int | None = None,
    device: torch.device | str | None = None,
    env_kwargs: dict[str, Any] | None = None,
    sample: bool | None = None,
) -> EvaluationResult:
    """Run ``episodes`` episodes of ``env_id`` for every target return, all at once (one batched
    forward per step). Episode ``e`` is reset with seed ``seed + e`` for every target, so
    targets are compared on the same starts.

    ``sample``: draw discrete actions from the softmax of the logits (seeded per episode) rather than take
    the argmax. The default (None) samples for discrete actions, as the paper's Atari code does
    — a discrete Decision Transformer models the data's action distribution, and where it reads
    the return weakly its argmax turns a noisy low-return behaviour back into the expert's
    (CartPole with returns-to-go scaled into [0, 1]: 230 at target 100, against 63 sampled) —
    and uses the predicted action as is for continuous ones (a regression, deterministic). A
    model that reads the return sharply can track the target closer with the argmax
    (configs/dt/cartpole.yaml gives both)."""
    import gymnasium as gym

    targets = check_target_returns(target_returns)
    # gymnasium takes Python ints only (a numpy count would make the reset seeds numpy ints)
    episodes = check_int("episodes", episodes)
    seed = check_int("seed", seed, 0)
    max_steps = check_int("max_steps", max_steps, or_none=True)
    c, tok = model.config, model.tokenizer()
    sample = c.discrete if sample is None else bool(sample)
    if sample and not c.discrete:
        raise ValueError("sample=True draws discrete actions; this model has continuous actions")
    weight = next(p for p in model.parameters() if p.is_floating_point())
    device = torch.device(device) if device is not None else weight.device
    dtype = weight.dtype  # a bfloat16 or float64 model reads states, actions and returns in its own precision
    E = len(targets) * episodes
    envs = [gym.make(env_id, **(env_kwargs or {})) for _ in range(E)]
    try:
        check_env_spaces(envs[0], c, env_id)
        limit = getattr(envs[0].spec, "max_episode_steps", None) or c.max_ep_len
        horizon = min(limit, c.max_ep_len, max_steps if max_steps is not None else limit)
        obs = np.stack([env.reset(seed=seed + i % episodes)[0].reshape(-1) for i, env in enumerate(envs)])
        S, A, K = c.state_dim, c.act_dim, c.context_length
        states = torch.zeros(E, horizon, S, dtype=dtype, device=device)
        actions = (torch.zeros(E, horizon, dtype=torch.long, device=device) if c.discrete
                   else torch.zeros(E, horizon, A, dtype=dtype, device=device))
        rtg = torch.zeros(E, horizon, 1, dtype=dtype, device=device)
        timesteps = torch.arange(horizon, device=device).expand(E, horizon)
        remaining = np.repeat(np.asarray(targets, dtype=np.float64), episodes)  # R̂ in reward units
        returns, lengths = np.zeros(E), np.zeros(E, dtype=np.int64)
        alive = np.ones(E, dtype=bool)
        # One random stream per episode index, shared by every target (common random numbers):
        # a target's results do not depend on which other targets are evaluated with it.
        streams = [np.random.default_rng([seed, i % episodes]) for i in range(E)]
        was_training = model.training
        model.eval()
        if not c.discrete:
            low = np.asarray(envs[0].action_space.low, dtype=np.float64).reshape(-1)
            high = np.asarray(envs[0].action_space.high, dtype=np.float64).reshape(-1)
        try:
            for t in range(horizon):
                idx = np.flatnonzero(alive)
                rows = torch.as_tensor(idx, device=device)
                states[rows, t] = torch.as_tensor(tok.normalize_states(obs[idx]), dtype=dtype, device=device)
                rtg[rows, t, 0] = torch.as_tensor(remaining[idx] / tok.return_scale, dtype=dtype, device=device)
                window = slice(max(0, t + 1 - K), t + 1)  # every episode started at 0: no padding
                out = model(states[rows, window], actions[rows, window], rtg[rows, window], timesteps[rows, window])
                pred = out.action_preds[:, -1]  # (E', A)
                if c.discrete:
                    if sample:  # inverse-CDF draw with each episode's own uniform number
                        u = torch.tensor([streams[i].random() for i in idx], device=device)[:, None]
                        cdf = pred.float().softmax(-1).cumsum(-1)
                        chosen = (cdf < u).sum(-1).clamp(max=c.act_dim - 1)
                    else:
                        chosen = pred.argmax(-1)
                    actions[rows, t] = chosen
                    env_actions = chosen.cpu().numpy()
                else:
                    # [-1, 1] is the model's action range only with a tanh head or a stored range;
                    # otherwise it predicts raw actions, which only the environment's bounds limit
                    chosen = pred.clamp(-1.0, 1.0) if c.action_tanh or tok.action_low is not None else pred
                    actions[rows, t] = chosen
                    env_actions = np.clip(tok.unscale_actions(chosen.float().cpu().numpy()), low, high)
                for j, i in enumerate(idx):
                    a = env_actions[j] if c.discrete else env_actions[j].reshape(envs[i].action_space.shape)
                    obs_i, reward, terminated, truncated, _ = envs[i].step(int(a) if c.discrete else a)
                    obs[i] = np.asarray(obs_i).reshape(-1)
                    returns[i] += float(reward)
                    remaining[i] -= float(reward)
                    lengths[i] += 1
                    if terminated or truncated:
                        alive[i] = False
                if not alive.any():
                    break
        finally:
            model.train(was_training)
    finally:
        for env in envs:
            env.close()
    shape = (len(targets), episodes)
    return EvaluationResult(env_id, targets, returns.reshape(shape), lengths.reshape(shape), horizon,
                            extra={"sample": sample, "seed": seed})
