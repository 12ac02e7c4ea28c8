"""Gymnasium rollouts (`unitok.rollouts`): they run a model in whatever precision it holds, refuse a
seed that is not a whole number ≥ 0 before any environment starts, and name the dimensions an
environment does not share with a model or with the data."""

from __future__ import annotations

import pytest
import torch

from tokenizers_mm import TrajectoryTokenizer
from unitok.models import DecisionTransformer, DecisionTransformerConfig
from unitok.rollouts import check_env_id

TINY = dict(d_model=16, n_layers=1, n_heads=2, context_length=4, max_ep_len=600, dropout=0.0)


def model(**overrides) -> DecisionTransformer:
    torch.manual_seed(0)
    return DecisionTransformer(DecisionTransformerConfig(**{**TINY, **overrides})).eval()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=["bfloat16", "float64"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_rollouts_feed_the_model_in_its_own_precision(dtype, env_id):
    # (a Lightning fit with precision="bf16-true" rolls out a bfloat16 model at each validation)
    spaces = (dict(state_dim=4, act_dim=2, discrete=True) if env_id == "CartPole-v1"
              else dict(state_dim=3, act_dim=1, action_low=(-2.0,), action_high=(2.0,)))
    m = model(**spaces).to(dtype)
    seen = []
    forward = m.forward

    def recording(*args, **kwargs):
        seen.append({args[0].dtype, args[2].dtype} | ({args[1].dtype} if args[1].is_floating_point() else set()))
        return forward(*args, **kwargs)

    m.forward = recording  # type: ignore[method-assign]
    result = m.evaluate(env_id, [10.0], episodes=2, max_steps=4)
    assert result.lengths.tolist() == [[4, 4]] and seen and all(s == {dtype} for s in seen)


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True, None])
def test_the_seed_must_be_a_whole_number_at_least_0(seed, monkeypatch):
    import gymnasium as gym

    monkeypatch.setattr(gym, "make", lambda *a, **k: pytest.fail("an environment started before the check"))
    with pytest.raises(ValueError, match=r"seed must be an integer ≥ 0, got"):
        model(state_dim=4, act_dim=2, discrete=True).evaluate("CartPole-v1", [50.0], episodes=1, seed=seed)


def test_numpy_counts_roll_out_as_the_python_ints_they_equal():
    # a numpy episodes count made the reset seeds numpy ints, which gymnasium refused (after every
    # environment was built) in an error that did not name episodes
    import numpy as np

    m = model(state_dim=4, act_dim=2, discrete=True)
    expected = m.evaluate("CartPole-v1", [50.0], episodes=2, seed=3, max_steps=3)
    result = m.evaluate("CartPole-v1", [50.0], episodes=np.int64(2), seed=np.int32(3), max_steps=np.int64(3))
    assert result.lengths.tolist() == expected.lengths.tolist() == [[3, 3]]
    assert result.returns.tolist() == expected.returns.tolist()
    assert type(result.max_steps) is int and result.max_steps == 3
    with pytest.raises(ValueError, match=r"episodes must be an integer ≥ 1, got (np\.int64\()?0"):
        m.evaluate("CartPole-v1", [50.0], episodes=np.int64(0))


def test_environment_dimensions_are_checked_against_a_model_or_the_data():
    pendulum_data = TrajectoryTokenizer(state_dim=3, act_dim=1, discrete=False)
    check_env_id("Pendulum-v1", pendulum_data, source="the data has")  # the same spaces: passes
    with pytest.raises(ValueError, match=r"CartPole-v1 observations are Box.*but the data has state_dim=3"):
        check_env_id("CartPole-v1", pendulum_data, source="the data has")
    three_actions = model(state_dim=4, act_dim=3, discrete=True).config
    with pytest.raises(ValueError, match=r"CartPole-v1 actions are Discrete\(2\), but the model \(checkpoint\) was "
                                         r"trained with 3 discrete actions"):
        check_env_id("CartPole-v1", three_actions)
