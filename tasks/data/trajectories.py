"""Offline reinforcement-learning data: users' trajectory files, or built-in gymnasium episodes.

Users' data: ``.npz`` (or ``.hdf5`` / ``.h5`` with h5py installed) holding D4RL/Minari-style
flat arrays, one row per step — ``observations``, ``actions``, ``rewards``, ``terminals``,
``timeouts`` (Minari's names ``terminations`` / ``truncations`` are read too; an HDF5 file of
Minari ``episode_*`` groups as well). Discrete actions are integer ids, continuous ones floats.

Built-in data: episodes recorded from scripted policies of mixed quality in CartPole-v1
(discrete) and Pendulum-v1 (continuous): an *expert* controller, a *noisy* expert that takes a
random action with a probability drawn per episode from ``noise_range``, and a *random*
policy. Recording is seeded and cached as ``.npz`` under ``cache_dir`` (default
``$UNITOK_CACHE_DIR``, else ``~/.cache/unitok``), so later runs load it at once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tasks.data.base import Split, SplitDataModule, default_cache_dir
from tasks.data.sampling import (
    ResumableBatchSampler,
    SeededRandomSampler,
    held_out_generator,
    resumable_loader,
)
from tokenizers_mm.checks import check_int
from tokenizers_mm.trajectory import (
    EncodedEpisodes,
    Episode,
    TrajectoryTokenizer,
    episodes_from_arrays,
    episodes_to_arrays,
)
from unitok.rollouts import check_env_id

DEFAULT_ENV = "default"  # env_id's default: the built-in data's BUILTIN_ENV, or none for a user's file
BUILTIN_ENV = "CartPole-v1"
GENERATOR_VERSION = 1  # bump when recording changes, so old caches are not reused
QUALITIES = ("expert", "noisy", "random")


# --------------------------------------------------------------------------- scripted policies
def cartpole_expert(obs: np.ndarray) -> int:
    """Push towards where the pole is falling, with a little cart-position feedback: a linear
    controller that balances CartPole-v1 for all 500 steps from every start."""
    x, x_dot, theta, theta_dot = (float(v) for v in obs)
    return int(0.05 * x + 0.1 * x_dot + theta + 0.5 * theta_dot > 0)


def pendulum_expert(obs: np.ndarray) -> np.ndarray:
    """Swing up by pumping energy, then balance with a PD controller near the top
    (Pendulum-v1: θ̈ = 15 sin θ + 3u, |u| ≤ 2; a mean return of about −140)."""
    cos, sin, theta_dot = (float(v) for v in obs)
    theta = np.arctan2(sin, cos)
    if cos > 0.85:
        u = -(10.0 * theta + 2.0 * theta_dot)
    else:
        energy = 0.5 * theta_dot**2 + 15.0 * cos  # 15 = the energy at rest upright
        u = (15.0 - energy) * (np.sign(theta_dot) if abs(theta_dot) > 1e-3 else 1.0)
    return np.clip(np.array([u], dtype=np.float32), -2.0, 2.0)


EXPERTS: dict[str, Callable[[np.ndarray], Any]] = {"CartPole-v1": cartpole_expert, "Pendulum-v1": pendulum_expert}


def record_episodes(
    env_id: str,
    n_episodes: int,
    quality: str,
    seed: int = 0,
    noise_range: tuple[float, float] = (0.4, 1.0),
) -> list[Episode]:
    """Record ``n_episodes`` episodes of ``env_id`` with the scripted policy of ``quality``
    ("expert", "noisy" or "random"). Seeded: the same arguments give the same episodes."""
    import gymnasium as gym

    if env_id not in EXPERTS:
        raise ValueError(f"no scripted policy for {env_id!r}; built-in environments: {', '.join(EXPERTS)}")
    if quality not in QUALITIES:
        raise ValueError(f"quality must be one of {QUALITIES}, got {quality!r}")
    lo, hi = noise_range
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"noise_range must satisfy 0 ≤ low ≤ high ≤ 1, got {noise_range}")
    expert = EXPERTS[env_id]
    rng = np.random.default_rng([seed, QUALITIES.index(quality)])
    env = gym.make(env_id)
    env.action_space.seed(int(rng.integers(2**31)))
    episodes = []
    try:
        for _ in range(n_episodes):
            eps = {"expert": 0.0, "random": 1.0}.get(quality) if quality != "noisy" else rng.uniform(lo, hi)
            obs, _ = env.reset(seed=int(rng.integers(2**31)))
            observations, actions, rewards = [], [], []
            while True:
                action = env.action_space.sample() if rng.random() < eps else expert(obs)
                observations.append(np.asarray(obs, dtype=np.float32))
                actions.append(action)
                obs, reward, terminated, truncated, _ = env.step(action)
                rewards.append(float(reward))
                if terminated or truncated:
                    break
            acts = np.asarray(actions, dtype=np.int64 if np.ndim(actions[0]) == 0 else np.float32)
            episodes.append(Episode(np.stack(observations), acts, np.asarray(rewards), terminated=bool(terminated)))
    finally:
        env.close()
    return episodes


def builtin_trajectories(
    env_id: str = "CartPole-v1",
    expert_episodes: int = 40,
    noisy_episodes: int = 150,
    random_episodes: int = 50,
    noise_range: tuple[float, float] = (0.4, 1.0),
    seed: int = 0,
    cache_dir: str | Path | None = None,
) -> list[Episode]:
    """Mixed-quality episodes of a built-in environment, recorded once and cached as ``.npz``."""
    spec = dict(env_id=env_id, expert=expert_episodes, noisy=noisy_episodes, random=random_episodes,
                noise_range=[float(v) for v in noise_range], seed=seed, version=GENERATOR_VERSION)
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    path = Path(cache_dir or default_cache_dir()) / "trajectories" / f"{env_id}-{key}.npz"
    if path.is_file():
        return load_trajectories(path)
    episodes = []
    for quality, n in (("expert", expert_episodes), ("noisy", noisy_episodes), ("random", random_episodes)):
        if n < 0:
            raise ValueError(f"{quality}_episodes must be ≥ 0, got {n}")
        episodes += record_episodes(env_id, n, quality, seed=seed, noise_range=noise_range)
    if not episodes:
        raise ValueError("no episodes asked for: set expert_episodes, noisy_episodes or random_episodes")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")  # several processes may build the same cache
    save_trajectories(episodes, tmp)
    os.replace(tmp, path)
    return episodes


# --------------------------------------------------------------------------- files
_ALIASES = {"terminations": "terminals", "truncations": "timeouts"}


def save_trajectories(episodes: Sequence[Episode], path: str | Path) -> Path:
    """Write episodes as flat D4RL-style arrays: ``.npz``, or ``.hdf5`` / ``.h5`` (needs h5py)."""
    path = Path(path)
    arrays = episodes_to_arrays(episodes)
    if path.suffix in (".hdf5", ".h5"):
        h5py = _h5py()
        with h5py.File(path, "w") as f:
            for key, value in arrays.items():
                f.create_dataset(key, data=value)
    elif path.suffix == ".npz":
        np.savez_compressed(path, **arrays)
    else:
        raise ValueError(f"trajectory files are .npz, .hdf5 or .h5, got {path.name}")
    return path


def load_trajectories(path: str | Path) -> list[Episode]:
    """Read episodes from a ``.npz`` / ``.hdf5`` / ``.h5`` file with D4RL/Minari-style keys."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trajectory file at {path}")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            arrays = {_ALIASES.get(k, k): data[k] for k in data.files}
    elif path.suffix in (".hdf5", ".h5"):
        h5py = _h5py()
        with h5py.File(path, "r") as f:
            episode_groups = sorted((k for k in f if k.startswith("episode_")), key=lambda k: int(k.split("_")[-1]))
            if episode_groups and "observations" not in f:
                return [_minari_episode(f[k], f"{path}:{k}") for k in episode_groups]
            arrays = {_ALIASES.get(k, k): f[k][()] for k in f if isinstance(f[k], h5py.Dataset)}
    else:
        raise ValueError(f"trajectory files are .npz, .hdf5 or .h5, got {path.name}")
    required = ("observations", "actions", "rewards")
    missing = [k for k in required if k not in arrays]
    if missing or ("terminals" not in arrays and "timeouts" not in arrays):
        raise ValueError(f"{path} needs the keys observations, actions, rewards and terminals and/or timeouts "
                         f"(D4RL/Minari style); it has {sorted(arrays)}")
    n = len(arrays["rewards"])
    terminals = arrays.get("terminals", np.zeros(n, dtype=bool))
    try:
        return episodes_from_arrays(arrays["observations"], arrays["actions"], arrays["rewards"], terminals,
                                    arrays.get("timeouts"))
    except (ValueError, TypeError) as error:
        raise type(error)(f"{path}: {error}") from None


def _minari_episode(group: Any, name: str) -> Episode:
    """One Minari episode group: observations hold T + 1 entries (the last is after the end)."""
    obs, actions, rewards = group["observations"][()], group["actions"][()], group["rewards"][()]
    if len(obs) == len(rewards) + 1:
        obs = obs[:-1]
    terminated = bool(group["terminations"][()][-1]) if "terminations" in group else True
    try:
        return Episode(obs, actions, rewards, terminated=terminated)
    except (ValueError, TypeError) as error:
        raise type(error)(f"{name}: {error}") from None


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as error:
        raise ImportError("reading or writing .hdf5 trajectory files needs h5py (pip install h5py); "
                          ".npz files need nothing extra") from error
    return h5py


# --------------------------------------------------------------------------- datasets
class TrajectoryWindowDataset(Dataset):
    """One window per (episode, step): the K steps ending at that step. Uniform over steps, so
    episodes are drawn in proportion to their length, as in the Decision Transformer paper.

    Items are dicts of tensors (``TrajectoryWindows`` fields without the batch axis); a data
    loader with ``collate_fn=collate_windows`` fetches a whole batch in one gather
    (``__getitems__``).
    """

    def __init__(self, episodes: Sequence[Episode], tokenizer: TrajectoryTokenizer) -> None:
        if not episodes:
            raise ValueError("a trajectory dataset needs at least one episode")
        self.encoded = EncodedEpisodes(tokenizer, episodes)

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.encoded.windows([index]).as_dict().items()}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        return self.encoded.windows(indices).as_dict()


def collate_windows(batch: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A batch from ``__getitems__`` is ready; single items are stacked."""
    if isinstance(batch, dict):
        return batch
    return {k: torch.stack([item[k] for item in batch]) for k in batch[0]}


class TrajectoryDataModule(SplitDataModule):
    """Decision Transformer windows from a trajectory file (``path``) or built-in episodes.

    After ``setup`` (or on first use) it exposes ``tokenizer`` (statistics fitted on the
    training episodes), ``state_dim``, ``act_dim``, ``discrete``, ``max_episode_length``,
    ``train_episodes`` / ``val_episodes`` / ``test_episodes``, and ``env_id`` for evaluation
    rollouts.

    Whole episodes are split, seeded: ``val_fraction`` of them are held out (the training
    episodes are the rest), and the held-out episodes are cut into validation (``val_share`` of
    them) and test episodes, so ``unitok test``'s loss and accuracy read episodes that neither
    training nor checkpoint selection saw (built-in CartPole: 216 train / 12 val / 12 test).
    With one held-out episode (or ``val_share=1.0``) there is no test split and the test loader
    serves the validation episodes. The rollout return (the task's main test metric) plays
    fresh episodes in the environment and reads none of these.
    Batches are dicts with ``states``, ``actions``, ``returns_to_go``, ``timesteps``,
    ``attention_mask`` (Hugging Face's names), ``rewards`` and ``terminals``.

    Args:
        path: a ``.npz`` / ``.hdf5`` file of users' episodes (then no built-in data).
        env_id: the gymnasium environment: the built-in data's (CartPole-v1, Pendulum-v1)
            and, for either source, the one the task evaluates in (None: no rollouts). The
            default, ``"default"``, is CartPole-v1 for the built-in data and none (no rollouts)
            with ``path``: a file does not say where it was recorded, so name that environment to
            score rollouts in it. ``setup`` checks its observations and actions against the data.
        context_length: K, steps per window.
        expert_episodes / noisy_episodes / random_episodes / noise_range: the built-in mix.
        return_scale: divide returns-to-go by this (default: the largest |episode return|).
        val_fraction: held-out episodes, validation and test together (seeded split; at least
            one when there are two).
        val_share: the share of the held-out episodes that validate (at least one); the rest
            are the test episodes.
        batch_size / num_workers: data loading. seed: split and recording seed.
        cache_dir: where built-in recordings are cached (default: ``unitok fit``'s ``<run root>/cache``;
            in Python ``$UNITOK_CACHE_DIR`` or ``~/.cache/unitok``).
    """

    def __init__(
        self,
        path: str | None = None,
        env_id: str | None = DEFAULT_ENV,
        context_length: int = 20,
        expert_episodes: int = 40,
        noisy_episodes: int = 150,
        random_episodes: int = 50,
        noise_range: tuple[float, float] = (0.4, 1.0),
        return_scale: float | None = None,
        val_fraction: float = 0.1,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        cache_dir: str | None = None,
        val_share: float = 0.5,
    ) -> None:
        super().__init__(batch_size, num_workers)
        if env_id == DEFAULT_ENV:
            env_id = BUILTIN_ENV if path is None else None
        if path is None and env_id is None:
            raise ValueError("give a trajectory file (path: my_data.npz) or a built-in env_id "
                             f"({', '.join(EXPERTS)})")
        if path is None and env_id not in EXPERTS:
            raise ValueError(f"no built-in data for {env_id!r} (built-in: {', '.join(EXPERTS)}); "
                             "give your own trajectories with path: my_data.npz")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        if not 0.0 < val_share <= 1.0:
            raise ValueError(f"val_share must be in (0, 1], got {val_share}")
        check_int("context_length", context_length)
        self.path, self.env_id, self.context_length = path, env_id, context_length
        self.mix = dict(expert_episodes=expert_episodes, noisy_episodes=noisy_episodes,
                        random_episodes=random_episodes, noise_range=tuple(noise_range))
        self.return_scale, self.val_fraction, self.val_share = return_scale, val_fraction, val_share
        self.seed, self.cache_dir = seed, cache_dir
        self._tokenizer: TrajectoryTokenizer | None = None
        self._train: list[Episode] = []
        self._val: list[Episode] = []
        self._test: list[Episode] = []

    # ------------------------------------------------------------------ data
    def episodes(self) -> list[Episode]:
        """Every episode, before the split."""
        if self.path is not None:
            return load_trajectories(self.path)
        return builtin_trajectories(self.env_id, seed=self.seed, cache_dir=self.cache_dir, **self.mix)  # type: ignore[arg-type]

    def setup(self, stage: str | None = None) -> None:
        if self._tokenizer is not None:
            return
        episodes = self.episodes()
        order = np.random.default_rng(self.seed).permutation(len(episodes))
        n_val = int(round(self.val_fraction * len(episodes)))
        if self.val_fraction > 0 and len(episodes) > 1:
            n_val = min(max(n_val, 1), len(episodes) - 1)
        else:
            n_val = 0
        # The held-out episodes are the first n_val of the permutation (the training episodes do
        # not depend on val_share); the first val_share of those validate, the rest test.
        held = order[:n_val]
        n_validate = min(max(1, round(self.val_share * n_val)), n_val)
        self._val = [episodes[i] for i in sorted(held[:n_validate])]
        self._test = [episodes[i] for i in sorted(held[n_validate:])]
        self._train = [episodes[i] for i in sorted(order[n_val:])]
        all_discrete = episodes[0].discrete
        act_dim = None
        if all_discrete:  # the action count of the whole data, even if the split misses an id
            act_dim = max(2, int(max(ep.actions.max() for ep in episodes)) + 1)
        tokenizer = TrajectoryTokenizer.fit(self._train, self.context_length, act_dim=act_dim,
                                            return_scale=self.return_scale)
        if self.env_id is not None:  # rollouts in another environment fail (or mean nothing) after training
            check_env_id(self.env_id, tokenizer, source="the data has")
        self._tokenizer = tokenizer

    def data_key(self) -> str:
        """A hash of the training episodes (observations, actions, rewards, how each ended): the
        built-in ones are recorded by code (the simulator, the scripted policies) that another
        version may change; a file's are hashed alike."""
        train = self.train_episodes
        return self._content_key_of(train, lambda: [(ep.observations, ep.actions, ep.rewards, ep.terminated)
                                                    for ep in train])

    @property
    def train_episodes(self) -> list[Episode]:
        self.setup()
        return self._train

    @property
    def val_episodes(self) -> list[Episode]:
        self.setup()
        return self._val

    @property
    def test_episodes(self) -> list[Episode]:
        """The held-out episodes kept for ``unitok test`` (empty: the test loader serves validation's)."""
        self.setup()
        return self._test

    @property
    def tokenizer(self) -> TrajectoryTokenizer:
        """The tokenizer fitted on the training episodes (loads the data on first use)."""
        if self._tokenizer is None:
            self.setup()
        return self._tokenizer  # type: ignore[return-value]

    @property
    def state_dim(self) -> int:
        return self.tokenizer.state_dim

    @property
    def act_dim(self) -> int:
        return self.tokenizer.act_dim

    @property
    def discrete(self) -> bool:
        return self.tokenizer.discrete

    @property
    def max_episode_length(self) -> int:
        self.setup()
        return max(ep.length for ep in self.train_episodes + self.val_episodes + self.test_episodes)

    def episode_returns(self) -> np.ndarray:
        """The return of every episode (training and held out)."""
        self.setup()
        return np.array([ep.total_return for ep in self.train_episodes + self.val_episodes + self.test_episodes])

    # ------------------------------------------------------------------ loaders
    def dataset(self, split: Split) -> TrajectoryWindowDataset | None:
        """One window per step of the split's episodes (None: the split has no episodes)."""
        episodes = {"train": self.train_episodes, "val": self.val_episodes, "test": self.test_episodes}[split]
        return TrajectoryWindowDataset(episodes, self.tokenizer) if episodes else None

    def collate_fn(self, split: Split) -> Any:
        return collate_windows

    def loader(self, split: Split) -> DataLoader:
        """Training windows in a seeded order; no held-out episodes: an empty validation; no
        test episodes: the validation windows."""
        dataset = self.dataset(split)
        if dataset is None and split == "test":
            dataset = self.dataset("val")
        if dataset is None:
            return []  # type: ignore[return-value]
        if split == "train":
            seed = self.train_seed()
            batches = ResumableBatchSampler(SeededRandomSampler(dataset, seed), self.batch_size,
                                            len(dataset) >= self.batch_size, seed, self.take_resume_point())
            return resumable_loader(dataset, batches, collate_windows, self.num_workers)
        return DataLoader(dataset, batch_size=self.batch_size, collate_fn=collate_windows, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, generator=held_out_generator())

    def predict_dataloader(self) -> DataLoader:
        """One window per step of the test episodes (else the validation episodes, else every
        episode when none is held out), in order."""
        episodes = self.test_episodes or self.val_episodes or self.train_episodes
        dataset = TrajectoryWindowDataset(episodes, self.tokenizer)
        return DataLoader(dataset, batch_size=self.batch_size, collate_fn=collate_windows,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)
