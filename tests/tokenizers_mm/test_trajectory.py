"""Trajectories -> Decision Transformer windows: returns-to-go are exact suffix sums, windows at
an episode's start are left-padded and masked, decode(encode(episode)) is the episode,
statistics come from the data and survive JSON, and bad input is named in the error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenizers_mm import (
    Episode,
    TrajectoryTokenizer,
    TrajectoryWindows,
    episodes_from_arrays,
    episodes_to_arrays,
    returns_to_go,
)


def continuous_episode(T: int = 6, S: int = 3, A: int = 2, seed: int = 0, terminated: bool = True) -> Episode:
    rng = np.random.default_rng(seed)
    return Episode(rng.normal(size=(T, S)) * 3 + 1, rng.uniform(-2, 2, size=(T, A)), rng.normal(size=T),
                   terminated=terminated)


def discrete_episode(T: int = 5, seed: int = 0) -> Episode:
    rng = np.random.default_rng(seed)
    return Episode(rng.normal(size=(T, 4)), (np.arange(T) + seed) % 3, np.ones(T), terminated=False)  # ids 0, 1, 2


# --------------------------------------------------------------------------- returns-to-go


@settings(max_examples=50, deadline=None)
@given(rewards=st.lists(st.integers(-5, 5), min_size=1, max_size=30))
def test_returns_to_go_are_exact_suffix_sums(rewards):
    rtg = returns_to_go(rewards)
    assert rtg.tolist() == [float(sum(rewards[t:])) for t in range(len(rewards))]


def test_encoded_returns_to_go_are_suffix_sums_divided_by_the_scale():
    ep = Episode(np.zeros((4, 1)), np.zeros(4, dtype=np.int64), [1.0, 2.0, 3.0, 4.0])
    tok = TrajectoryTokenizer(state_dim=1, act_dim=2, discrete=True, context_length=4, return_scale=5.0)
    w = tok.encode(ep, ends=[3])
    assert w.returns_to_go[0, :, 0].tolist() == pytest.approx([10 / 5, 9 / 5, 7 / 5, 4 / 5])


# --------------------------------------------------------------------------- windows


def test_windows_at_the_episode_start_are_left_padded_and_masked():
    ep = continuous_episode(T=6)
    tok = TrajectoryTokenizer.fit([ep], context_length=4)
    w = tok.encode(ep)  # one window per step
    assert isinstance(w, TrajectoryWindows) and w.states.shape == (6, 4, 3) and w.actions.shape == (6, 4, 2)
    assert w.returns_to_go.shape == (6, 4, 1) and w.timesteps.dtype == torch.long
    assert w.attention_mask.tolist() == [[0, 0, 0, 1], [0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1],
                                         [1, 1, 1, 1], [1, 1, 1, 1]]
    assert w.timesteps[1].tolist() == [0, 0, 0, 1] and w.timesteps[5].tolist() == [2, 3, 4, 5]
    padded = ~w.attention_mask.bool()
    for name in ("states", "actions", "returns_to_go", "rewards"):
        assert torch.all(getattr(w, name)[padded] == 0), f"{name} is not zero at padding"
    # The last real slot of the window ending at t is step t, normalised.
    expected = (ep.observations[2] - tok.state_mean) / tok.state_std
    np.testing.assert_allclose(w.states[2, -1].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_windows_end_where_asked():
    ep = continuous_episode(T=10)
    tok = TrajectoryTokenizer.fit([ep], context_length=3)
    w = tok.encode(ep, ends=[9, 0, 4])
    assert w.timesteps.tolist() == [[7, 8, 9], [0, 0, 0], [2, 3, 4]]
    with pytest.raises(ValueError, match=r"window ends must be steps in \[0, 10\)"):
        tok.encode(ep, ends=[10])
    with pytest.raises(ValueError, match=r"window ends must be whole step numbers, got \[1.7\]"):
        tok.encode(ep, ends=[1.7])  # not cut to step 1
    assert tok.encode(ep, ends=np.array([4.0])).timesteps.tolist() == [[2, 3, 4]]


def test_a_numpy_return_scale_is_a_number():
    assert TrajectoryTokenizer(4, 2, True, 3, return_scale=np.float32(2.0)).return_scale == 2.0
    with pytest.raises(ValueError, match="return_scale must be a positive finite number"):
        TrajectoryTokenizer(4, 2, True, 3, return_scale=np.float32("nan"))


@pytest.mark.parametrize("make", [continuous_episode, discrete_episode], ids=["continuous", "discrete"])
@pytest.mark.parametrize("K", [1, 3, 20])
def test_decode_recovers_the_episode(make, K):
    ep = make()
    tok = TrajectoryTokenizer.fit([ep, make(seed=1)], context_length=K)
    back = tok.decode(tok.encode(ep))
    np.testing.assert_allclose(back.observations, ep.observations, rtol=1e-5, atol=1e-5)
    if ep.discrete:
        assert back.actions.dtype == np.int64 and back.actions.tolist() == ep.actions.tolist()
    else:
        np.testing.assert_allclose(back.actions, ep.actions, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back.rewards, ep.rewards, rtol=1e-6)
    assert back.terminated == ep.terminated and back.length == ep.length


def test_decode_needs_every_step():
    ep = continuous_episode(T=8)
    tok = TrajectoryTokenizer.fit([ep], context_length=2)
    with pytest.raises(ValueError, match="steps .*missing"):
        tok.decode(tok.encode(ep, ends=[1, 7]))


@pytest.mark.parametrize("make", [continuous_episode, discrete_episode], ids=["continuous", "discrete"])
def test_decode_refuses_windows_of_more_than_one_episode(make):
    # e.g. a data loader's batch: the windows holding step t disagree, and picking one per step
    # would splice the episodes together
    a, b = make(T=6), make(T=4, seed=1)
    tok = TrajectoryTokenizer.fit([a, b], context_length=3)
    mixed = TrajectoryTokenizer.collate([tok.encode(a), tok.encode(b)])
    with pytest.raises(ValueError, match="the windows come from more than one episode: their states at step 0 differ"):
        tok.decode(mixed)
    same = TrajectoryTokenizer.collate([tok.encode(a, ends=[5, 2]), tok.encode(a)])  # overlapping, one episode
    np.testing.assert_allclose(tok.decode(same).observations, a.observations, rtol=1e-5, atol=1e-5)


def test_decode_refuses_episodes_that_differ_only_in_their_rewards():
    a = discrete_episode(T=5)
    b = Episode(a.observations, a.actions, a.rewards + 1.0, terminated=a.terminated)
    tok = TrajectoryTokenizer.fit([a, b], context_length=2)
    with pytest.raises(ValueError, match="more than one episode: their returns_to_go at step 0 differ"):
        tok.decode(TrajectoryTokenizer.collate([tok.encode(a), tok.encode(b)]))


def test_collate_concatenates_windows():
    ep = continuous_episode()
    tok = TrajectoryTokenizer.fit([ep], context_length=3)
    batch = tok.collate([tok.encode(ep, ends=[2]), tok.encode(ep, ends=[0, 5])])
    assert batch.batch_size == 3 and batch.timesteps[:, -1].tolist() == [2, 0, 5]
    assert set(batch.model_inputs()) == {"states", "actions", "returns_to_go", "timesteps", "attention_mask"}


# --------------------------------------------------------------------------- statistics


def test_statistics_come_from_the_data():
    eps = [continuous_episode(seed=s, T=5 + s) for s in range(3)]
    tok = TrajectoryTokenizer.fit(eps, context_length=5)
    states = np.concatenate([e.observations for e in eps])
    np.testing.assert_allclose(tok.state_mean, states.mean(0), rtol=1e-6)
    np.testing.assert_allclose(tok.state_std, states.std(0), rtol=1e-5)
    assert tok.return_scale == pytest.approx(max(abs(e.total_return) for e in eps))
    actions = np.concatenate([e.actions for e in eps])
    np.testing.assert_allclose(tok.action_low, actions.min(0), rtol=1e-6)
    w = tok.encode(eps[0])
    assert float(w.actions.abs().max()) <= 1.0 + 1e-6  # continuous actions land in [-1, 1]


def test_discrete_action_count_is_inferred_or_given():
    assert TrajectoryTokenizer.fit([discrete_episode()]).act_dim == 3
    assert TrajectoryTokenizer.fit([discrete_episode()], act_dim=5).act_dim == 5
    with pytest.raises(ValueError, match="action id 2"):
        TrajectoryTokenizer.fit([discrete_episode()], act_dim=2)


def test_statistics_round_trip_through_json(tmp_path):
    tok = TrajectoryTokenizer.fit([continuous_episode(), continuous_episode(seed=3)], context_length=7)
    path = tok.save(tmp_path)
    assert json.loads(path.read_text())["context_length"] == 7
    loaded = TrajectoryTokenizer.load(tmp_path)
    assert loaded == tok
    ep = continuous_episode(seed=9)
    assert torch.equal(loaded.encode(ep).states, tok.encode(ep).states)
    assert TrajectoryTokenizer.from_dict(tok.to_dict()) == tok
    with pytest.raises(ValueError, match="unknown TrajectoryTokenizer key"):
        TrajectoryTokenizer.from_dict({**tok.to_dict(), "gamma": 0.99})


def test_the_tokenizer_holds_no_parameters_and_pickles():
    import pickle

    tok = TrajectoryTokenizer.fit([discrete_episode()])
    assert not isinstance(tok, torch.nn.Module)
    assert pickle.loads(pickle.dumps(tok)) == tok


# --------------------------------------------------------------------------- flat arrays


def test_flat_arrays_split_into_episodes_and_back():
    eps = [continuous_episode(T=3, terminated=True), continuous_episode(T=4, seed=1, terminated=False),
           continuous_episode(T=2, seed=2, terminated=True)]
    arrays = episodes_to_arrays(eps)
    assert arrays["terminals"].tolist() == [0, 0, 1, 0, 0, 0, 0, 0, 1]
    assert arrays["timeouts"].tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 0]
    back = episodes_from_arrays(**arrays)
    assert [e.length for e in back] == [3, 4, 2] and [e.terminated for e in back] == [True, False, True]
    np.testing.assert_array_equal(back[1].observations, eps[1].observations)


def test_trailing_steps_without_an_end_flag_form_an_unterminated_episode():
    arrays = episodes_to_arrays([discrete_episode(T=3)])
    arrays["timeouts"][:] = False
    (ep,) = episodes_from_arrays(**arrays)
    assert ep.length == 3 and not ep.terminated


# --------------------------------------------------------------------------- bad input


def test_ragged_arrays_are_refused():
    with pytest.raises(ValueError, match="observations is ragged"):
        Episode([[0.0, 1.0], [2.0]], [0, 1], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"one length .*'observations': 3, 'actions': 2"):
        Episode(np.zeros((3, 2)), [0, 1], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"one length .*'rewards': 4"):
        episodes_from_arrays(np.zeros((5, 2)), np.zeros(5, dtype=int), np.zeros(4), np.zeros(5))


def test_nan_rewards_are_refused_with_their_step():
    with pytest.raises(ValueError, match="rewards must be finite, got nan at step 2"):
        Episode(np.zeros((4, 2)), [0, 1, 0, 1], [1.0, 1.0, float("nan"), 1.0])
    with pytest.raises(ValueError, match="observations must be finite"):
        Episode(np.array([[0.0, np.inf]]), [0], [1.0])


def test_wrong_types_are_refused():
    with pytest.raises(TypeError, match="rewards must be an array of numbers, got str"):
        Episode(np.zeros((2, 1)), [0, 1], "1, 1")
    with pytest.raises(TypeError, match="rewards must hold numbers"):
        Episode(np.zeros((2, 1)), [0, 1], ["a", "b"])
    with pytest.raises(TypeError, match="encode takes an Episode, got dict"):
        TrajectoryTokenizer(2, 2, discrete=True).encode({"observations": np.zeros((2, 2))})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fit takes Episode objects"):
        TrajectoryTokenizer.fit([np.zeros(3)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="discrete actions must be ≥ 0"):
        Episode(np.zeros((2, 1)), [0, -1], [1.0, 1.0])


def test_episodes_must_fit_the_tokenizer():
    tok = TrajectoryTokenizer.fit([continuous_episode(S=3, A=2)])
    with pytest.raises(ValueError, match="state_dim=3"):
        tok.encode(continuous_episode(S=4, A=2))
    with pytest.raises(ValueError, match="act_dim=2"):
        tok.encode(continuous_episode(S=3, A=1))
    with pytest.raises(ValueError, match="expects continuous actions"):
        tok.encode(Episode(np.zeros((2, 3)), [0, 1], [1.0, 1.0]))
    with pytest.raises(ValueError, match="state_std must be positive"):
        TrajectoryTokenizer(2, 1, state_std=[1.0, 0.0])
    with pytest.raises(ValueError, match="return_scale must be a positive"):
        TrajectoryTokenizer(2, 1, return_scale=0.0)
