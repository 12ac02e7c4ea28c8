"""Trajectories -> Decision Transformer windows: (return-to-go, state, action) for K steps.

A Decision Transformer reads a trajectory as interleaved tokens R̂_1, s_1, a_1, R̂_2, s_2, a_2, …
where R̂_t = r_t + r_{t+1} + … + r_T is the return still to come (undiscounted). This module
turns episodes into fixed windows of K steps (left-padded at an episode's start, with a
padding mask), normalises states with statistics computed from the data, maps continuous
actions to [-1, 1] (the range of a tanh action head), divides returns by a scale, and back.

Axis legend: W windows (batch), K steps per window, T steps of one episode, S state width,
A action width (continuous) or number of actions (discrete).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tokenizers_mm.checks import check_int

TOKENIZER_FILE = "trajectory_tokenizer.json"
D4RL_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts")
# What a tokenizer is made of; a `DecisionTransformerConfig` has fields of the same names.
TOKENIZER_FIELDS = ("state_dim", "act_dim", "discrete", "context_length", "state_mean", "state_std",
                    "return_scale", "action_low", "action_high")


# --------------------------------------------------------------------------- input checks
def _numeric_array(value: Any, name: str, dtype: Any | None = None) -> np.ndarray:
    """``value`` as a numeric numpy array, or a clear error for ragged or non-numeric input."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, (str, bytes, Mapping)) or value is None:
        raise TypeError(f"{name} must be an array of numbers, got {type(value).__name__}")
    try:
        array = np.asarray(value)
    except ValueError as error:  # numpy ≥ 1.24 refuses ragged nested lists
        raise ValueError(f"{name} is ragged (rows of different lengths): {error}") from None
    if array.dtype == object:
        raise ValueError(f"{name} is ragged or mixes types (numpy made an object array of shape {array.shape})")
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold numbers, got dtype {array.dtype}")
    return array.astype(dtype) if dtype is not None else array


def _first_bad(array: np.ndarray) -> int:
    """Index of the first row holding NaN or ±inf."""
    bad = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
    return int(np.argmax(bad))


@dataclass(frozen=True)
class Episode:
    """One recorded episode: what the agent saw, did and received, step by step.

    Args:
        observations: (T, S) states s_t, numbers.
        actions: (T, A) continuous actions, or (T,) integer ids for discrete action spaces
            (a float 1-D array is one continuous action dimension).
        rewards: (T,) reward r_t received after action a_t; finite numbers.
        terminated: the episode ended in a terminal state (False: cut by a time limit, or the
            data ran out).
    """

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: bool = True

    def __post_init__(self) -> None:
        obs = _numeric_array(self.observations, "observations", np.float32)
        if obs.ndim == 1:
            obs = obs[:, None]
        if obs.ndim != 2:
            raise ValueError(f"observations must be (steps, state_dim), got shape {obs.shape}")
        actions = _numeric_array(self.actions, "actions")
        if actions.dtype.kind in "biu":
            if actions.ndim != 1:
                raise ValueError(f"integer (discrete) actions must be (steps,), got shape {actions.shape}")
            if actions.size and actions.min() < 0:
                raise ValueError(f"discrete actions must be ≥ 0, got {int(actions.min())}")
            actions = actions.astype(np.int64)
        else:
            actions = actions.astype(np.float32)
            if actions.ndim == 1:
                actions = actions[:, None]
            if actions.ndim != 2:
                raise ValueError(f"continuous actions must be (steps, action_dim), got shape {actions.shape}")
        rewards = _numeric_array(self.rewards, "rewards", np.float64)
        if rewards.ndim == 2 and rewards.shape[1] == 1:
            rewards = rewards[:, 0]
        if rewards.ndim != 1:
            raise ValueError(f"rewards must be (steps,), got shape {rewards.shape}")
        lengths = {"observations": len(obs), "actions": len(actions), "rewards": len(rewards)}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"an episode's arrays must have one length (steps), got {lengths}")
        if len(obs) == 0:
            raise ValueError("an episode needs at least one step, got 0")
        for name, array in (("rewards", rewards), ("observations", obs), ("actions", actions)):
            if not np.isfinite(array).all():
                t = _first_bad(array)
                raise ValueError(f"{name} must be finite, got {array[t]} at step {t}")
        if not isinstance(self.terminated, (bool, np.bool_)):
            raise TypeError(f"terminated must be a bool, got {type(self.terminated).__name__}")
        object.__setattr__(self, "observations", obs)
        object.__setattr__(self, "actions", actions)
        object.__setattr__(self, "rewards", rewards)
        object.__setattr__(self, "terminated", bool(self.terminated))

    @property
    def length(self) -> int:
        return len(self.rewards)

    @property
    def total_return(self) -> float:
        return float(self.rewards.sum())

    @property
    def discrete(self) -> bool:
        return self.actions.ndim == 1

    def __len__(self) -> int:
        return self.length


def returns_to_go(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """(T,) suffix sums R̂_t = r_t + … + r_{T-1} (undiscounted, as in the Decision Transformer)."""
    r = np.asarray(rewards, dtype=np.float64)
    return np.cumsum(r[::-1])[::-1].copy()


def episodes_from_arrays(
    observations: Any, actions: Any, rewards: Any, terminals: Any, timeouts: Any | None = None
) -> list[Episode]:
    """Split flat D4RL/Minari-style arrays (one row per step) into episodes.

    An episode ends after a step whose ``terminals`` (reached a terminal state) or ``timeouts``
    (cut by a time limit) flag is set; steps after the last flag form a final, unterminated
    episode.
    """
    arrays = {"observations": observations, "actions": actions, "rewards": rewards, "terminals": terminals}
    if timeouts is not None:
        arrays["timeouts"] = timeouts
    arrays = {k: _numeric_array(v, k) for k, v in arrays.items()}
    lengths = {k: len(v) if v.ndim else 0 for k, v in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"the trajectory arrays must have one length (steps), got {lengths}")
    if lengths["rewards"] == 0:
        raise ValueError("the trajectory arrays are empty")
    terminal = arrays["terminals"].reshape(-1).astype(bool)
    timeout = arrays["timeouts"].reshape(-1).astype(bool) if "timeouts" in arrays else np.zeros_like(terminal)
    ends = np.flatnonzero(terminal | timeout)
    bounds = list(zip(np.r_[0, ends[:-1] + 1], ends + 1))
    if not len(ends) or ends[-1] != len(terminal) - 1:
        bounds.append((ends[-1] + 1 if len(ends) else 0, len(terminal)))
    return [
        Episode(arrays["observations"][a:b], arrays["actions"][a:b], arrays["rewards"][a:b],
                terminated=bool(terminal[b - 1]))
        for a, b in bounds
    ]


def episodes_to_arrays(episodes: Sequence[Episode]) -> dict[str, np.ndarray]:
    """Concatenate episodes into flat D4RL/Minari-style arrays (the inverse of `episodes_from_arrays`)."""
    if not episodes:
        raise ValueError("need at least one episode")
    terminals, timeouts = [], []
    for ep in episodes:
        end = np.zeros(ep.length, dtype=bool)
        end[-1] = True
        terminals.append(end & ep.terminated)
        timeouts.append(end & (not ep.terminated))
    return {
        "observations": np.concatenate([ep.observations for ep in episodes]),
        "actions": np.concatenate([ep.actions for ep in episodes]),
        "rewards": np.concatenate([ep.rewards for ep in episodes]).astype(np.float32),
        "terminals": np.concatenate(terminals),
        "timeouts": np.concatenate(timeouts),
    }


# --------------------------------------------------------------------------- windows
@dataclass(frozen=True)
class TrajectoryWindows:
    """A batch of W windows of K steps, in the model's units (what `DecisionTransformer` reads).

    ``states`` (W, K, S) normalised; ``actions`` (W, K, A) in [-1, 1] (continuous) or (W, K)
    ids (discrete); ``returns_to_go`` (W, K, 1) divided by the return scale; ``timesteps``
    (W, K) step index within the episode; ``attention_mask`` (W, K) 1 for real steps, 0 for
    padding (on the left, before an episode's first step); ``rewards`` (W, K) raw rewards and
    ``terminals`` (W, K) 1 on the last step of an episode that ended in a terminal state — kept
    so `TrajectoryTokenizer.decode` can rebuild the episode.
    """

    states: Tensor
    actions: Tensor
    returns_to_go: Tensor | None
    timesteps: Tensor
    attention_mask: Tensor
    rewards: Tensor
    terminals: Tensor
    modality: str = "trajectory"

    def __post_init__(self) -> None:
        W, K = self.states.shape[:2]
        for name in ("actions", "returns_to_go", "timesteps", "attention_mask", "rewards", "terminals"):
            if name == "returns_to_go" and self.returns_to_go is None:  # a segment not conditioned on returns
                continue
            if tuple(getattr(self, name).shape[:2]) != (W, K):
                raise ValueError(f"TrajectoryWindows.{name} must start with (windows, steps) = {(W, K)}, "
                                 f"got {tuple(getattr(self, name).shape)}")

    @property
    def batch_size(self) -> int:
        return self.states.shape[0]

    @property
    def context_length(self) -> int:
        return self.states.shape[1]

    def __len__(self) -> int:
        return self.batch_size

    def model_inputs(self) -> dict[str, Tensor]:
        """The keyword tensors of ``DecisionTransformer.forward`` (Hugging Face's names)."""
        return {"states": self.states, "actions": self.actions, "returns_to_go": self.returns_to_go,
                "timesteps": self.timesteps, "attention_mask": self.attention_mask}

    def as_dict(self) -> dict[str, Tensor]:
        """Every tensor by name (for data loaders, which batch dicts of tensors)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "modality"}

    def to(self, device: torch.device | str) -> TrajectoryWindows:
        return replace(self, **{k: v.to(device) for k, v in self.as_dict().items() if v is not None})


# --------------------------------------------------------------------------- tokenizer
class TrajectoryTokenizer:
    """Episodes <-> K-step windows of normalised (return-to-go, state, action) triples.

    Parameter-free: its statistics are plain numbers computed by `fit` from the data and saved
    as JSON (``save`` / ``to_dict``); a `DecisionTransformer` stores the same numbers in its
    config so a loaded checkpoint acts with the normalisation it was trained with.

    Args:
        state_dim: S. act_dim: A, the action width (continuous) or number of actions (discrete).
        discrete: actions are integer ids in [0, act_dim).
        context_length: K, steps per window.
        state_mean / state_std: per-dimension state normalisation, (s - mean) / std
            (default 0 / 1).
        return_scale: returns-to-go are divided by it (fit: the largest |episode return|).
        action_low / action_high: continuous actions are mapped from [low, high] to [-1, 1]
            per dimension (default: already in [-1, 1]).
    """

    def __init__(
        self,
        state_dim: int,
        act_dim: int,
        discrete: bool = False,
        context_length: int = 20,
        state_mean: Sequence[float] | None = None,
        state_std: Sequence[float] | None = None,
        return_scale: float = 1.0,
        action_low: Sequence[float] | None = None,
        action_high: Sequence[float] | None = None,
    ) -> None:
        for name, value in (("state_dim", state_dim), ("act_dim", act_dim), ("context_length", context_length)):
            check_int(name, value)
        if discrete and act_dim < 2:
            raise ValueError(f"a discrete action space needs act_dim ≥ 2 actions, got {act_dim}")
        if (isinstance(return_scale, bool) or not isinstance(return_scale, (int, float, np.integer, np.floating))
                or not math.isfinite(return_scale) or return_scale <= 0):  # numpy scalars welcome (fit's own)
            raise ValueError(f"return_scale must be a positive finite number, got {return_scale!r}")
        self.state_dim, self.act_dim, self.discrete = int(state_dim), int(act_dim), bool(discrete)
        self.context_length = int(context_length)
        self.return_scale = float(return_scale)
        self.state_mean = self._vector(state_mean, 0.0, state_dim, "state_mean")
        self.state_std = self._vector(state_std, 1.0, state_dim, "state_std")
        if (self.state_std <= 0).any():
            raise ValueError(f"state_std must be positive, got {self.state_std.tolist()}")
        if discrete and (action_low is not None or action_high is not None):
            raise ValueError("action_low / action_high are for continuous actions; this tokenizer is discrete")
        self.action_low = None if action_low is None else self._vector(action_low, -1.0, act_dim, "action_low")
        self.action_high = None if action_high is None else self._vector(action_high, 1.0, act_dim, "action_high")
        if (self.action_low is None) != (self.action_high is None):
            raise ValueError("give both action_low and action_high, or neither")
        if self.action_low is not None and (self.action_high < self.action_low).any():
            raise ValueError(f"action_high {self.action_high.tolist()} is below action_low {self.action_low.tolist()}")

    @staticmethod
    def _vector(value: Sequence[float] | None, default: float, dim: int, name: str) -> np.ndarray:
        if value is None:
            return np.full(dim, default, dtype=np.float64)
        array = _numeric_array(value, name, np.float64).reshape(-1)
        if array.shape != (dim,):
            raise ValueError(f"{name} needs {dim} values, got {array.shape[0]}")
        if not np.isfinite(array).all():
            raise ValueError(f"{name} must be finite, got {array.tolist()}")
        return array

    # ------------------------------------------------------------------ fitting and saving
    @classmethod
    def fit(
        cls,
        episodes: Iterable[Episode],
        context_length: int = 20,
        act_dim: int | None = None,
        return_scale: float | None = None,
        action_bounds: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> TrajectoryTokenizer:
        """Compute the statistics from ``episodes``: state mean / std over every step, the
        return scale (largest |episode return|), continuous action bounds (per-dimension min /
        max) unless ``action_bounds`` gives them, and — for discrete actions — the number of
        actions (largest id + 1) unless ``act_dim`` says."""
        episodes = list(episodes)
        if not episodes:
            raise ValueError("fit needs at least one episode")
        if not all(isinstance(ep, Episode) for ep in episodes):
            bad = next(type(ep).__name__ for ep in episodes if not isinstance(ep, Episode))
            raise TypeError(f"fit takes Episode objects, got {bad}")
        kinds = {ep.discrete for ep in episodes}
        if len(kinds) != 1:
            raise ValueError("some episodes have discrete (integer) actions and others continuous ones")
        discrete = kinds.pop()
        state_dims = {ep.observations.shape[1] for ep in episodes}
        if len(state_dims) != 1:
            raise ValueError(f"episodes have different state sizes {sorted(state_dims)}")
        states = np.concatenate([ep.observations for ep in episodes]).astype(np.float64)
        mean, std = states.mean(0), states.std(0)
        std = np.where(std < 1e-6, 1.0, std)  # a constant dimension stays as it is, shifted to 0
        if return_scale is None:
            return_scale = max(abs(ep.total_return) for ep in episodes) or 1.0
        if discrete:
            n = int(max(ep.actions.max() for ep in episodes)) + 1
            if act_dim is not None and act_dim < n:
                raise ValueError(f"act_dim={act_dim} but the data holds action id {n - 1}")
            return cls(len(mean), act_dim or max(n, 2), True, context_length, mean, std, return_scale)
        act_dims = {ep.actions.shape[1] for ep in episodes}
        if len(act_dims) != 1:
            raise ValueError(f"episodes have different action sizes {sorted(act_dims)}")
        A = act_dims.pop()
        if act_dim is not None and act_dim != A:
            raise ValueError(f"act_dim={act_dim} but the data's actions have {A} dimensions")
        if action_bounds is None:
            actions = np.concatenate([ep.actions for ep in episodes]).astype(np.float64)
            low, high = actions.min(0), actions.max(0)
        else:
            low, high = action_bounds
        return cls(len(mean), A, False, context_length, mean, std, return_scale, low, high)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able numbers; ``TrajectoryTokenizer.from_dict`` rebuilds the same tokenizer."""
        def listed(v: np.ndarray | None) -> list[float] | None:
            return None if v is None else [float(x) for x in v]

        return {
            "state_dim": self.state_dim, "act_dim": self.act_dim, "discrete": self.discrete,
            "context_length": self.context_length, "state_mean": listed(self.state_mean),
            "state_std": listed(self.state_std), "return_scale": self.return_scale,
            "action_low": listed(self.action_low), "action_high": listed(self.action_high),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrajectoryTokenizer:
        known = set(TOKENIZER_FIELDS)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrajectoryTokenizer key(s) {unknown}; known: {sorted(known)}")
        return cls(**data)

    def save(self, directory: str | Path) -> Path:
        """Write ``trajectory_tokenizer.json`` into ``directory`` (created if needed)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / TOKENIZER_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> TrajectoryTokenizer:
        """Read a folder written by ``save`` (or the JSON file itself)."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no trajectory tokenizer at {path}")
        return cls.from_dict(json.loads(path.read_text()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrajectoryTokenizer) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        kind = "discrete" if self.discrete else "continuous"
        return (f"TrajectoryTokenizer(state_dim={self.state_dim}, act_dim={self.act_dim} {kind}, "
                f"context_length={self.context_length}, return_scale={self.return_scale:g})")

    # ------------------------------------------------------------------ unit conversions
    def normalize_states(self, states: np.ndarray) -> np.ndarray:
        """(…, S) raw states -> (s - mean) / std, float32."""
        return ((np.asarray(states, dtype=np.float64) - self.state_mean) / self.state_std).astype(np.float32)

    def denormalize_states(self, states: np.ndarray) -> np.ndarray:
        return (np.asarray(states, dtype=np.float64) * self.state_std + self.state_mean).astype(np.float32)

    def _action_span(self) -> tuple[np.ndarray, np.ndarray]:
        low, high = self.action_low, self.action_high
        centre = (high + low) / 2  # type: ignore[operator]
        half = np.where(high - low > 0, (high - low) / 2, 1.0)  # type: ignore[operator]
        return centre, half

    def scale_actions(self, actions: np.ndarray) -> np.ndarray:
        """Continuous (…, A) actions in [low, high] -> [-1, 1]; discrete ids unchanged."""
        if self.discrete or self.action_low is None:
            return np.asarray(actions)
        centre, half = self._action_span()
        return ((np.asarray(actions, dtype=np.float64) - centre) / half).astype(np.float32)

    def unscale_actions(self, actions: np.ndarray) -> np.ndarray:
        """[-1, 1] -> [low, high]: what the environment receives from a tanh action head."""
        if self.discrete or self.action_low is None:
            return np.asarray(actions)
        centre, half = self._action_span()
        return (np.asarray(actions, dtype=np.float64) * half + centre).astype(np.float32)

    # ------------------------------------------------------------------ encode / decode
    def _check_episode(self, episode: Episode) -> None:
        if not isinstance(episode, Episode):
            raise TypeError(f"encode takes an Episode, got {type(episode).__name__}")
        if episode.observations.shape[1] != self.state_dim:
            raise ValueError(f"the episode's states have {episode.observations.shape[1]} dimensions, "
                             f"the tokenizer expects state_dim={self.state_dim}")
        if episode.discrete != self.discrete:
            kind = "discrete" if self.discrete else "continuous"
            raise ValueError(f"the episode's actions are {'discrete' if episode.discrete else 'continuous'}, "
                             f"the tokenizer expects {kind} actions")
        if self.discrete and int(episode.actions.max()) >= self.act_dim:
            raise ValueError(f"action id {int(episode.actions.max())} is outside [0, {self.act_dim})")
        if not self.discrete and episode.actions.shape[1] != self.act_dim:
            raise ValueError(f"the episode's actions have {episode.actions.shape[1]} dimensions, "
                             f"the tokenizer expects act_dim={self.act_dim}")

    def encode(self, episode: Episode, ends: Sequence[int] | np.ndarray | None = None) -> TrajectoryWindows:
        """Windows of K steps ending at each step in ``ends`` (default: every step, so one window
        per step). A window ending at step t holds steps t-K+1 … t; before the episode's
        start it is padded on the left, with ``attention_mask`` 0."""
        encoded = EncodedEpisodes(self, [episode])
        T = episode.length
        if ends is not None:
            given = np.asarray(ends).reshape(-1)
            if given.dtype == bool or not (np.issubdtype(given.dtype, np.integer) or (given == np.round(given)).all()):
                raise ValueError(f"window ends must be whole step numbers, got {given.tolist()[:8]}")  # not cut to one
        ends = np.arange(T) if ends is None else np.asarray(ends).astype(np.int64).reshape(-1)
        if ends.size == 0 or ends.min() < 0 or ends.max() >= T:
            raise ValueError(f"window ends must be steps in [0, {T}), got {ends.tolist()[:8]}")
        return encoded.windows(ends)

    def decode(self, windows: TrajectoryWindows) -> Episode:
        """Rebuild the episode from windows that together cover its every step (e.g. the output
        of ``encode``): states un-normalised, actions back in their own range. Windows of more
        than one episode (a loader's batch) are refused: they disagree on some step."""
        if not isinstance(windows, TrajectoryWindows):
            raise TypeError(f"decode takes TrajectoryWindows, got {type(windows).__name__}")
        real = windows.attention_mask.bool().numpy()
        steps = windows.timesteps.numpy()[real]
        T = int(steps.max()) + 1 if steps.size else 0
        missing = sorted(set(range(T)) - set(steps.tolist()))
        if T == 0 or missing:
            raise ValueError(f"the windows do not cover the episode: steps {missing[:8]} are missing")
        order = np.zeros(T, dtype=np.int64)
        flat = np.flatnonzero(real.reshape(-1))
        order[steps] = flat  # any window holding step t will do, once they are known to agree
        for name in ("states", "actions", "returns_to_go", "rewards", "terminals"):
            values = getattr(windows, name)
            if values is None:
                continue
            values = values.reshape(-1, *values.shape[2:]).numpy()
            held, picked = values[flat], values[order[steps]]  # every real slot, and its step's pick
            differ = ~(held == picked).reshape(len(held), -1).all(axis=1)
            if differ.any():
                t = int(steps[np.argmax(differ)])
                raise ValueError(f"the windows come from more than one episode: their {name} at step {t} differ; "
                                 "decode the windows of one episode (as encode gives them)")
        pick = lambda t: t.reshape(-1, *t.shape[2:]).numpy()[order]  # noqa: E731
        actions = pick(windows.actions)
        return Episode(
            observations=self.denormalize_states(pick(windows.states)),
            actions=actions if self.discrete else self.unscale_actions(actions),
            rewards=pick(windows.rewards),
            terminated=bool(pick(windows.terminals)[-1]),
        )

    @staticmethod
    def collate(windows: Sequence[TrajectoryWindows]) -> TrajectoryWindows:
        """Concatenate batches of windows (all of the same K) along the batch axis."""
        if not windows:
            raise ValueError("collate needs at least one batch of windows")
        Ks = {w.context_length for w in windows}
        if len(Ks) != 1:
            raise ValueError(f"windows of different lengths {sorted(Ks)} cannot be batched")
        return TrajectoryWindows(**{k: torch.cat([w.as_dict()[k] for w in windows]) for k in windows[0].as_dict()})


class EncodedEpisodes:
    """Episodes converted to model units once (normalised states, scaled actions and
    returns-to-go) and laid end to end, so a batch of windows is one gather. Global step i
    is step ``i - offsets[e]`` of episode e; a window ending there never reaches into the
    previous episode (those slots are padding)."""

    def __init__(self, tokenizer: TrajectoryTokenizer, episodes: Sequence[Episode]) -> None:
        if not episodes:
            raise ValueError("need at least one episode")
        for ep in episodes:
            tokenizer._check_episode(ep)
        self.tokenizer = tokenizer
        lengths = np.array([ep.length for ep in episodes], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])  # (E + 1,)
        self.states = np.concatenate([tokenizer.normalize_states(ep.observations) for ep in episodes])
        actions = np.concatenate([tokenizer.scale_actions(ep.actions) for ep in episodes])
        self.actions = actions.astype(np.int64 if tokenizer.discrete else np.float32)
        rtg = np.concatenate([returns_to_go(ep.rewards) for ep in episodes]) / tokenizer.return_scale
        self.returns_to_go = rtg.astype(np.float32)[:, None]
        self.rewards = np.concatenate([ep.rewards for ep in episodes]).astype(np.float32)
        self.terminals = np.zeros(len(self.rewards), dtype=np.int64)
        self.terminals[self.offsets[1:] - 1] = [int(ep.terminated) for ep in episodes]
        self.starts = np.repeat(self.offsets[:-1], lengths)  # first global step of each step's episode
        self.timesteps = np.arange(len(self.rewards), dtype=np.int64) - self.starts

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def windows(self, ends: Sequence[int] | np.ndarray) -> TrajectoryWindows:
        """The K-step windows ending at global steps ``ends`` (W,), left-padded and masked."""
        ends = np.asarray(ends, dtype=np.int64).reshape(-1)
        if ends.size == 0 or ends.min() < 0 or ends.max() >= len(self):
            raise ValueError(f"window ends must be steps in [0, {len(self)}), got {ends.tolist()[:8]}")
        K = self.tokenizer.context_length
        index = ends[:, None] - (K - 1) + np.arange(K)  # (W, K) global step of each slot
        real = index >= self.starts[ends][:, None]
        index = np.where(real, index, 0)

        def gather(values: np.ndarray) -> Tensor:  # (N, …) -> (W, K, …), zeros at padding
            out = values[index]
            return torch.from_numpy(np.where(real.reshape(real.shape + (1,) * (out.ndim - 2)), out, 0))

        return TrajectoryWindows(
            states=gather(self.states), actions=gather(self.actions), returns_to_go=gather(self.returns_to_go),
            timesteps=gather(self.timesteps), attention_mask=torch.from_numpy(real.astype(np.int64)),
            rewards=gather(self.rewards), terminals=gather(self.terminals),
        )
