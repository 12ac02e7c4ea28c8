"""Offline RL data: the scripted policies have the quality their names promise, built-in
recordings are seeded and cached (in $UNITOK_CACHE_DIR when set), users' .npz / .hdf5 files
with D4RL/Minari keys load into episodes, and the data module serves masked K-step windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks import (
    TrajectoryDataModule,
    builtin_trajectories,
    load_trajectories,
    record_episodes,
    save_trajectories,
)
from tasks.data import trajectories as rl_data
from tasks.data.base import CACHE_ENV
from tasks.data.trajectories import TrajectoryWindowDataset, collate_windows
from tokenizers_mm import Episode, episodes_to_arrays

SMALL = dict(expert_episodes=2, noisy_episodes=3, random_episodes=2)


# --------------------------------------------------------------------------- scripted policies


def test_cartpole_policies_range_from_expert_to_random():
    expert = [ep.total_return for ep in record_episodes("CartPole-v1", 3, "expert", seed=0)]
    random = [ep.total_return for ep in record_episodes("CartPole-v1", 5, "random", seed=0)]
    noisy = [ep.total_return for ep in record_episodes("CartPole-v1", 5, "noisy", seed=0)]
    assert expert == [500.0, 500.0, 500.0]
    assert max(random) < 200 and np.mean(random) < np.mean(noisy) < 500
    ep = record_episodes("CartPole-v1", 1, "random", seed=0)[0]
    assert ep.discrete and ep.observations.shape == (ep.length, 4) and ep.terminated


def test_pendulum_expert_beats_random_and_actions_are_continuous():
    expert = record_episodes("Pendulum-v1", 2, "expert", seed=0)
    random = record_episodes("Pendulum-v1", 2, "random", seed=0)
    assert np.mean([e.total_return for e in expert]) > np.mean([e.total_return for e in random]) + 300
    ep = expert[0]
    assert not ep.discrete and ep.actions.shape == (200, 1) and np.abs(ep.actions).max() <= 2.0
    assert not ep.terminated  # Pendulum only ends by its time limit


def test_recording_is_seeded_and_checks_its_arguments():
    a = record_episodes("CartPole-v1", 2, "noisy", seed=3)
    b = record_episodes("CartPole-v1", 2, "noisy", seed=3)
    assert [e.total_return for e in a] == [e.total_return for e in b]
    np.testing.assert_array_equal(a[1].observations, b[1].observations)
    with pytest.raises(ValueError, match="no scripted policy for 'MountainCar-v0'"):
        record_episodes("MountainCar-v0", 1, "expert")
    with pytest.raises(ValueError, match="quality must be one of"):
        record_episodes("CartPole-v1", 1, "great")


# --------------------------------------------------------------------------- cache


def test_builtin_data_is_cached_in_the_env_var_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    first = builtin_trajectories("CartPole-v1", **SMALL, seed=1)
    files = list((tmp_path / "trajectories").glob("CartPole-v1-*.npz"))
    assert len(files) == 1 and len(first) == 7

    def no_recording(*args, **kwargs):
        raise AssertionError("recorded again instead of reading the cache")

    monkeypatch.setattr(rl_data, "record_episodes", no_recording)
    again = builtin_trajectories("CartPole-v1", **SMALL, seed=1)
    assert [e.total_return for e in again] == [e.total_return for e in first]
    np.testing.assert_array_equal(again[-1].actions, first[-1].actions)
    # Another mix is another file.
    monkeypatch.undo()
    builtin_trajectories("CartPole-v1", **{**SMALL, "random_episodes": 1}, seed=1, cache_dir=tmp_path)
    assert len(list((tmp_path / "trajectories").glob("*.npz"))) == 2


# --------------------------------------------------------------------------- files


def episodes() -> list[Episode]:
    rng = np.random.default_rng(0)
    return [Episode(rng.normal(size=(n, 3)), rng.uniform(-1, 1, size=(n, 2)), rng.normal(size=n), terminated=n != 4)
            for n in (5, 4, 6)]


def test_npz_round_trip_with_d4rl_keys(tmp_path):
    path = save_trajectories(episodes(), tmp_path / "data.npz")
    with np.load(path) as data:
        assert set(data.files) == {"observations", "actions", "rewards", "terminals", "timeouts"}
    back = load_trajectories(path)
    assert [e.length for e in back] == [5, 4, 6] and [e.terminated for e in back] == [True, False, True]
    np.testing.assert_allclose(back[2].actions, episodes()[2].actions, rtol=1e-6)


def test_minari_names_are_read_too(tmp_path):
    arrays = episodes_to_arrays(episodes())
    arrays["terminations"], arrays["truncations"] = arrays.pop("terminals"), arrays.pop("timeouts")
    np.savez(tmp_path / "minari.npz", **arrays)
    assert [e.length for e in load_trajectories(tmp_path / "minari.npz")] == [5, 4, 6]


def test_hdf5_round_trip(tmp_path):
    pytest.importorskip("h5py")
    path = save_trajectories(episodes(), tmp_path / "data.hdf5")
    back = load_trajectories(path)
    assert [e.length for e in back] == [5, 4, 6]


def test_bad_files_are_named(tmp_path):
    arrays = episodes_to_arrays(episodes())
    np.savez(tmp_path / "no_rewards.npz", **{k: v for k, v in arrays.items() if k != "rewards"})
    with pytest.raises(ValueError, match=r"needs the keys .*it has \['actions', 'observations'"):
        load_trajectories(tmp_path / "no_rewards.npz")
    np.savez(tmp_path / "ragged.npz", **{**arrays, "rewards": arrays["rewards"][:-2]})
    with pytest.raises(ValueError, match=r"ragged.npz: the trajectory arrays must have one length"):
        load_trajectories(tmp_path / "ragged.npz")
    nan = arrays["rewards"].copy()
    nan[7] = np.nan
    np.savez(tmp_path / "nan.npz", **{**arrays, "rewards": nan})
    with pytest.raises(ValueError, match="nan.npz: rewards must be finite, got nan at step 2"):
        load_trajectories(tmp_path / "nan.npz")
    with pytest.raises(ValueError, match=r"\.npz, \.hdf5 or \.h5"):
        save_trajectories(episodes(), tmp_path / "data.csv")
    with pytest.raises(FileNotFoundError, match="no trajectory file"):
        load_trajectories(tmp_path / "missing.npz")


# --------------------------------------------------------------------------- data module


def test_cartpole_data_module_serves_masked_windows(tmp_path):
    dm = TrajectoryDataModule(env_id="CartPole-v1", context_length=5, batch_size=8, val_fraction=0.3,
                              cache_dir=str(tmp_path), **SMALL)
    assert (dm.state_dim, dm.act_dim, dm.discrete) == (4, 2, True)
    assert len(dm.train_episodes) == 5 and len(dm.val_episodes) == 1 and len(dm.test_episodes) == 1  # 2 held out
    assert {id(e) for e in dm.train_episodes}.isdisjoint(id(e) for e in dm.val_episodes + dm.test_episodes)
    batch = next(iter(dm.train_dataloader()))
    assert batch["states"].shape == (8, 5, 4) and batch["actions"].shape == (8, 5)
    assert batch["actions"].dtype == torch.long and batch["returns_to_go"].shape == (8, 5, 1)
    assert batch["attention_mask"][:, -1].all()  # every window ends at a real step
    assert dm.tokenizer.return_scale == 500.0  # the expert's return is the largest
    assert dm.max_episode_length == 500 and len(dm.episode_returns()) == 7
    val = next(iter(dm.val_dataloader()))
    assert val["timesteps"][0].tolist() == [0, 0, 0, 0, 0] and val["attention_mask"][0].tolist() == [0, 0, 0, 0, 1]


def test_batched_fetch_equals_item_by_item(tmp_path):
    dm = TrajectoryDataModule(env_id="CartPole-v1", context_length=4, cache_dir=str(tmp_path), **SMALL)
    dataset = TrajectoryWindowDataset(dm.train_episodes, dm.tokenizer)
    indices = [0, 3, 499, 500, len(dataset) - 1]
    batched = collate_windows(dataset.__getitems__(indices))
    single = collate_windows([dataset[i] for i in indices])
    for key in batched:
        assert torch.equal(batched[key], single[key]), key


def test_a_users_file_feeds_the_data_module(tmp_path):
    pendulum = record_episodes("Pendulum-v1", 3, "noisy", seed=0)
    path = save_trajectories(pendulum, tmp_path / "pendulum.npz")
    dm = TrajectoryDataModule(path=str(path), env_id=None, context_length=6, batch_size=4, val_fraction=0.0)
    assert (dm.state_dim, dm.act_dim, dm.discrete) == (3, 1, False) and dm.val_episodes == []
    assert dm.val_dataloader() == []
    batch = next(iter(dm.train_dataloader()))
    assert batch["actions"].shape == (4, 6, 1) and batch["actions"].abs().max() <= 1.0
    np.testing.assert_allclose(dm.tokenizer.action_high, [max(float(e.actions.max()) for e in pendulum)], rtol=1e-6)


def test_a_users_file_is_rolled_out_only_in_the_environment_named(tmp_path):
    # A file does not say where it was recorded: by default its policy is not scored in CartPole.
    path = save_trajectories(record_episodes("Pendulum-v1", 2, "random", seed=0), tmp_path / "pendulum.npz")
    assert TrajectoryDataModule(path=str(path)).env_id is None
    assert TrajectoryDataModule(path=str(path), env_id="Pendulum-v1").env_id == "Pendulum-v1"
    assert TrajectoryDataModule().env_id == "CartPole-v1"  # the built-in data's environment
    assert TrajectoryDataModule(env_id="Pendulum-v1").env_id == "Pendulum-v1"


def test_an_environment_unlike_the_data_is_refused_at_setup(tmp_path):
    path = save_trajectories(record_episodes("Pendulum-v1", 2, "random", seed=0), tmp_path / "pendulum.npz")
    dm = TrajectoryDataModule(path=str(path), env_id="CartPole-v1", context_length=4, val_fraction=0.0)
    with pytest.raises(ValueError, match=r"CartPole-v1 observations are Box.* but the data has state_dim=3"):
        dm.setup("fit")  # before training, not when the first validation rolls the policy out
    matching = TrajectoryDataModule(path=str(path), env_id="Pendulum-v1", context_length=4, val_fraction=0.0)
    assert matching.state_dim == 3


def test_data_module_arguments_are_checked():
    with pytest.raises(ValueError, match="give a trajectory file"):
        TrajectoryDataModule(path=None, env_id=None)
    with pytest.raises(ValueError, match="no built-in data for 'Hopper-v4'"):
        TrajectoryDataModule(env_id="Hopper-v4")
    with pytest.raises(ValueError, match=r"val_fraction must be in \[0, 1\), got 1\.0$"):
        TrajectoryDataModule(val_fraction=1.0)
