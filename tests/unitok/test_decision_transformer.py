"""The Decision Transformer model: interleaved (R̂, s, a) tokens, causal action prediction that
never reads the action it predicts, padding that changes nothing at real steps, discrete and
continuous actions, the behaviour-cloning variant, checkpoints that carry the tokenizer
statistics, gymnasium rollouts whose return-to-go drops by each reward, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.unitok.convert.perturb import perturbed
from tokenizers_mm import Episode, TrajectoryTokenizer
from unitok.models import DecisionTransformer, DecisionTransformerConfig, DecisionTransformerOutput
from unitok.rollouts import check_target_returns

TINY = dict(d_model=32, n_layers=2, n_heads=2, max_ep_len=600, context_length=6, dropout=0.0)


def model(**overrides) -> DecisionTransformer:
    torch.manual_seed(0)
    options = dict(state_dim=4, act_dim=3, **TINY)
    options.update(overrides)
    return DecisionTransformer(DecisionTransformerConfig(**options)).eval()


def inputs(m: DecisionTransformer, B: int = 2, K: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    c = m.config
    g = torch.Generator().manual_seed(seed)
    actions = (torch.randint(0, c.act_dim, (B, K), generator=g) if c.discrete
               else torch.rand(B, K, c.act_dim, generator=g) * 2 - 1)
    return dict(states=torch.randn(B, K, c.state_dim, generator=g), actions=actions,
                returns_to_go=torch.randn(B, K, 1, generator=g),
                timesteps=torch.arange(K).expand(B, K) + 3, attention_mask=torch.ones(B, K, dtype=torch.long))


# --------------------------------------------------------------------------- shapes and gradients


@pytest.mark.parametrize("variant", [{}, {"discrete": True}, {"condition_on_returns": False},
                                     {"predict_state": False, "predict_return": False}],
                         ids=["continuous", "discrete", "behaviour-cloning", "action-head-only"])
def test_outputs_have_their_shapes_and_every_parameter_learns(variant):
    m = model(**variant).train()
    x = inputs(m)
    out = m(**x)
    assert isinstance(out, DecisionTransformerOutput)
    G = m.config.tokens_per_step
    assert out.action_preds.shape == (2, 5, 3) and out.last_hidden_state.shape == (2, G * 5, 32)
    assert (out.state_preds is None) == (not m.config.predict_state)
    assert (out.return_preds is None) == (not (m.config.predict_return and m.config.condition_on_returns))
    if out.state_preds is not None:
        assert out.state_preds.shape == (2, 5, 4)
    loss = sum(t.float().pow(2).mean() for t in (out.action_preds, out.state_preds, out.return_preds) if t is not None)
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name} gets no gradient"
    if not m.config.discrete:
        assert out.action_preds.abs().max() <= 1.0  # tanh head


def test_continuous_actions_without_tanh_are_unbounded():
    m = model(action_tanh=False)
    with torch.no_grad():
        m.action_head.bias.fill_(5.0)
        assert m(**inputs(m)).action_preds.min() > 1.0


def test_behaviour_cloning_ignores_returns():
    m = model(condition_on_returns=False)
    x = inputs(m)
    a = m(**x).action_preds
    b = m(**{**x, "returns_to_go": x["returns_to_go"] * 100}).action_preds
    assert torch.equal(a, b) and m.embed_return is None and m.return_head is None
    assert torch.equal(m(**{**x, "returns_to_go": None}).action_preds, a)


# --------------------------------------------------------------------------- causality and padding


def test_the_action_at_a_step_is_predicted_without_reading_it_or_the_future():
    m = model()
    x = inputs(m, K=6)
    base = m(**x).action_preds
    t = 3
    changed = {k: v.clone() for k, v in x.items()}
    changed["actions"][:, t:] = -changed["actions"][:, t:]  # the action at t and after
    changed["states"][:, t + 1:] += 5.0  # states after t
    changed["returns_to_go"][:, t + 1:] += 5.0
    out = m(**changed).action_preds
    torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=0)
    assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])  # later steps do read them


def test_return_conditioning_reaches_the_action():
    m = model()
    x = inputs(m)
    other = m(**{**x, "returns_to_go": x["returns_to_go"] + 1.0}).action_preds
    assert not torch.allclose(other, m(**x).action_preds)


def test_left_padding_changes_nothing_at_real_steps():
    m = model()
    x = inputs(m, B=1, K=4)
    padded = {k: torch.cat([torch.full_like(v[:, :3], 7 if k != "attention_mask" else 0), v], dim=1)
              for k, v in x.items()}
    padded["timesteps"][:, :3] = 0
    out = m(**padded).action_preds[:, 3:]
    torch.testing.assert_close(out, m(**x).action_preds, atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", [{}, {"discrete": True}, {"condition_on_returns": False}],
                         ids=["continuous", "discrete", "behaviour-cloning"])
def test_actions_only_predicts_the_same_actions_and_gradients_as_the_full_forward(variant):
    m = model(n_layers=3, **variant).train()  # dropout 0: both passes are the same function
    x = inputs(m, B=3, K=5)
    x["attention_mask"][1, :2] = 0  # a left-padded window (an episode's start)
    x["timesteps"][1, :2] = 0
    real = x["attention_mask"].bool()
    full = m(**x)
    only = m(**x, actions_only=True)
    assert only.state_preds is None and only.return_preds is None
    assert only.last_hidden_state.shape == (3, 5, 32)  # the state tokens alone
    torch.testing.assert_close(only.action_preds[real], full.action_preds[real], atol=1e-6, rtol=0)
    grads = []
    for out in (full, only):
        m.zero_grad()
        out.action_preds[real].float().pow(2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_discrete_ids_and_one_hot_vectors_embed_alike():
    m = perturbed(model(discrete=True))  # every bias non-zero: the action embedding's too, which ids must add
    x = inputs(m)
    one_hot = torch.nn.functional.one_hot(x["actions"], 3).float()
    torch.testing.assert_close(m(**{**x, "actions": one_hot}).action_preds, m(**x).action_preds,
                               atol=1e-6, rtol=0)


def test_windows_from_the_tokenizer_are_read_directly():
    rng = np.random.default_rng(0)
    ep = Episode(rng.normal(size=(9, 4)), rng.integers(0, 3, 9), np.ones(9))
    tok = TrajectoryTokenizer.fit([ep], context_length=6, act_dim=3)
    m = model(discrete=True)
    windows = tok.encode(ep)
    torch.testing.assert_close(m(windows).action_preds, m(**windows.model_inputs()).action_preds)


def test_reference_kernel_and_attentions_agree_with_sdpa():
    m = model()
    x = inputs(m)
    x["attention_mask"][0, :2] = 0
    fused = m(**x).action_preds
    ref = m(**x, kernel="reference", output_attentions=True)
    real = x["attention_mask"].bool()
    torch.testing.assert_close(ref.action_preds[real], fused[real], atol=1e-5, rtol=0)
    assert len(ref.attentions) == 2 and ref.attentions[0].shape == (2, 2, 15, 15)


# --------------------------------------------------------------------------- config, tokenizer, checkpoints


def test_presets_build_and_configs_round_trip():
    for name in DecisionTransformerConfig.presets:
        config = DecisionTransformerConfig.from_name(name)
        assert DecisionTransformerConfig.from_dict(config.to_dict()) == config
    assert DecisionTransformerConfig.from_name("dt-tiny").d_model == 32
    with pytest.raises(ValueError, match="unknown DecisionTransformerConfig preset"):
        DecisionTransformerConfig.from_name("dt-huge")


def test_checkpoints_carry_the_tokenizer_statistics(tmp_path):
    rng = np.random.default_rng(0)
    eps = [Episode(rng.normal(size=(8, 4)) * 3, rng.uniform(-2, 2, size=(8, 3)), rng.normal(size=8)) for _ in range(3)]
    tok = TrajectoryTokenizer.fit(eps, context_length=6)
    m = model()
    m.config = m.config.with_tokenizer(tok)
    folder = m.save_pretrained(tmp_path / "dt")
    loaded = DecisionTransformer.from_pretrained(folder)
    assert loaded.tokenizer() == tok and loaded.config.return_scale == tok.return_scale
    windows = loaded.tokenizer().encode(eps[0])
    torch.testing.assert_close(loaded(windows).action_preds, m(windows).action_preds)


def test_statistics_must_fit_the_dimensions():
    with pytest.raises(ValueError, match="state_mean needs 4 values"):
        DecisionTransformerConfig(state_dim=4, act_dim=2, state_mean=(0.0, 1.0))
    with pytest.raises(ValueError, match="act_dim ≥ 2"):
        DecisionTransformerConfig(state_dim=4, act_dim=1, discrete=True)


def test_get_action_reads_the_last_context_window():
    m = model(discrete=True)
    x = inputs(m, B=1, K=9)
    hist = {k: x[k][0] for k in ("states", "actions", "returns_to_go", "timesteps")}
    action = m.get_action(**hist)
    assert action.shape == () and action.dtype == torch.long
    expected = m(**{k: v[:, -6:] for k, v in x.items()}).action_preds[0, -1].argmax()
    assert int(action) == int(expected)
    assert m.get_action(**{k: x[k] for k in hist}).shape == (1,)


@pytest.mark.parametrize("short", ["actions", "returns_to_go", "timesteps"])
def test_get_action_refuses_a_history_one_step_short_in_any_tensor(short):
    # Each tensor is cut to its own last K steps: with T > K, a tensor one step short would be
    # read shifted against the states (the T − 1 actions taken, without the placeholder).
    m = model(discrete=False)
    x = inputs(m, B=1, K=9)  # T = 9 steps of history, K = 6
    hist = {k: x[k][0] for k in ("states", "actions", "returns_to_go", "timesteps")}
    with pytest.raises(ValueError, match=rf"{short} must have the states' \(steps,\) = \(9,\) first, one entry per "
                                         r"step.*got shape \(8"):
        m.get_action(**{**hist, short: hist[short][:-1]})
    batched = {k: x[k] for k in hist}
    with pytest.raises(ValueError, match=rf"{short} must have the states' \(batch, steps\) = \(1, 9\) first"):
        m.get_action(**{**batched, short: batched[short][:, :-1]})


def test_get_action_names_a_timestep_row_given_for_a_batch():
    m = model(discrete=True)
    x = inputs(m, B=3, K=7)
    hist = {k: x[k] for k in ("states", "actions", "returns_to_go")}
    with pytest.raises(ValueError, match=r"timesteps must have the states' \(batch, steps\) = \(3, 7\) first.*"
                                         r"timesteps.expand\(3, -1\); got shape \(7,\)"):
        m.get_action(**hist, timesteps=torch.arange(7))
    assert m.get_action(**hist, timesteps=torch.arange(7).expand(3, -1)).shape == (3,)


# --------------------------------------------------------------------------- bad input


def test_action_dimension_mismatch_with_the_checkpoint_is_named(tmp_path):
    loaded = DecisionTransformer.from_pretrained(model().save_pretrained(tmp_path / "dt"))
    x = inputs(loaded)
    with pytest.raises(ValueError, match=r"actions have 2 dimensions but this model \(checkpoint\) was built for act_dim=3"):
        loaded(**{**x, "actions": x["actions"][..., :2]})
    with pytest.raises(ValueError, match="state_dim=4"):
        loaded(**{**x, "states": torch.zeros(2, 5, 6)})
    with pytest.raises(TypeError, match="actions must be floats"):
        loaded(**{**x, "actions": torch.zeros(2, 5, dtype=torch.long)})


def test_bad_inputs_are_named():
    m = model(discrete=True)
    x = inputs(m)
    with pytest.raises(ValueError, match=r"action ids must be in \[0, 3\), got 3\.\.3"):
        m(**{**x, "actions": torch.full((2, 5), 3)})
    with pytest.raises(ValueError, match=r"timesteps must be in \[0, max_ep_len=600\)"):
        m(**{**x, "timesteps": torch.full((2, 5), 600)})
    with pytest.raises(TypeError, match="timesteps must be integers"):
        m(**{**x, "timesteps": x["timesteps"].float()})
    with pytest.raises(ValueError, match=r"returns_to_go must be \(batch, steps, 1\)"):
        m(**{**x, "returns_to_go": torch.zeros(2, 5, 2)})
    with pytest.raises(ValueError, match="returns_to_go are required"):
        m(**{**x, "returns_to_go": None})
    with pytest.raises(ValueError, match="attention_mask must be"):
        m(**{**x, "attention_mask": torch.ones(2, 4)})
    # NaN or inf in would be NaN actions out
    for name in ("states", "returns_to_go"):
        bad = x[name].clone()
        bad.view(-1)[3] = float("nan")
        with pytest.raises(ValueError, match=f"{name} contain 1 NaN/inf values"):
            m(**{**x, name: bad})
    continuous = model(discrete=False)
    y = inputs(continuous)
    actions = y["actions"].clone()
    actions[0, 1, 0] = float("inf")
    with pytest.raises(ValueError, match="actions contain 1 NaN/inf values"):
        continuous(**{**y, "actions": actions})


@pytest.mark.parametrize("eps", [0.0, -1e-5])
def test_an_embedding_norm_epsilon_that_is_not_positive_is_refused(eps):
    # 0 divides a constant embedded token by 0, a negative one takes the root of < 0: NaN actions
    with pytest.raises(ValueError, match=f"embed_norm_eps must be a finite number > 0, got {eps}"):
        DecisionTransformerConfig.from_name("dt-tiny", embed_norm_eps=eps)
    assert DecisionTransformerConfig.from_name("dt-tiny", embed_norm_eps=1e-12).embed_norm_eps == 1e-12


@pytest.mark.parametrize("bad", ["500", ["100", 200], [True], None, {"a": 1}, []],
                         ids=["string", "string-in-list", "bool", "none", "dict", "empty"])
def test_target_returns_of_the_wrong_type_are_refused(bad):
    with pytest.raises((TypeError, ValueError), match="target"):
        check_target_returns(bad)


def test_target_returns_are_checked_before_any_environment_starts():
    m = model(state_dim=4, act_dim=2, discrete=True)
    with pytest.raises(TypeError, match="each target return must be a real number, got str '300'"):
        m.evaluate("CartPole-v1", [100, "300"], episodes=1)
    with pytest.raises(ValueError, match="finite"):
        m.evaluate("CartPole-v1", [float("nan")], episodes=1)
    assert check_target_returns(np.array([1, 2])) == [1.0, 2.0] and check_target_returns(5) == [5.0]


def test_an_environment_with_other_actions_is_refused():
    cartpole_model = model(state_dim=4, act_dim=2, discrete=True)
    with pytest.raises(ValueError, match="Pendulum-v1 observations"):
        cartpole_model.evaluate("Pendulum-v1", [0.0], episodes=1)
    three_actions = model(state_dim=4, act_dim=3, discrete=True)
    with pytest.raises(ValueError, match=r"trained with 3 discrete actions"):
        three_actions.evaluate("CartPole-v1", [10.0], episodes=1)


# --------------------------------------------------------------------------- rollouts


def test_rollouts_decrement_the_return_to_go_by_each_reward_in_scaled_units():
    m = model(state_dim=4, act_dim=2, discrete=True, return_scale=50.0)
    seen: list[torch.Tensor] = []
    forward = m.forward

    def recording(*args, **kwargs):
        seen.append(args[2][:, -1, 0].clone())  # the newest return-to-go of every running episode
        return forward(*args, **kwargs)

    m.forward = recording  # type: ignore[method-assign]
    result = m.evaluate("CartPole-v1", [30.0, 60.0], episodes=2, seed=1, max_steps=8)
    assert result.returns.shape == (2, 2) and (result.lengths <= 8).all()
    # CartPole pays 1 per step: R̂_t = (target - t) / return_scale, for every target and episode.
    for t, rtg in enumerate(seen[:4]):
        expected = torch.tensor([30.0 - t, 30.0 - t, 60.0 - t, 60.0 - t]) / 50.0
        torch.testing.assert_close(rtg, expected[: len(rtg)])


def test_rollouts_are_seeded_and_capped():
    m = model(state_dim=4, act_dim=2, discrete=True)
    a = m.evaluate("CartPole-v1", [100.0, 200.0], episodes=3, seed=5, max_steps=50)
    b = m.evaluate("CartPole-v1", [100.0, 200.0], episodes=3, seed=5, max_steps=50)
    assert np.array_equal(a.returns, b.returns) and a.max_steps == 50 and (a.lengths <= 50).all()
    assert set(a.mean_returns()) == {100.0, 200.0} and len(a[100]) == 3
    # Each episode has its own random stream: a target's results do not depend on the others.
    alone = m.evaluate("CartPole-v1", [200.0], episodes=3, seed=5, max_steps=50)
    assert np.array_equal(alone.returns[0], a.returns[1])
    greedy = m.evaluate("CartPole-v1", [100.0], episodes=2, seed=5, max_steps=50, sample=False)
    assert greedy.extra["sample"] is False


def test_continuous_rollouts_act_within_the_action_space():
    m = model(state_dim=3, act_dim=1, action_low=(-2.0,), action_high=(2.0,))
    result = m.evaluate("Pendulum-v1", [-200.0, -100.0], episodes=1, max_steps=20)
    assert result.lengths.tolist() == [[20], [20]] and (result.returns < 0).all()
    with pytest.raises(ValueError, match="sample=True draws discrete actions"):
        m.evaluate("Pendulum-v1", [-100.0], episodes=1, sample=True)


def test_a_target_held_in_a_0_d_array_is_a_number():
    from unitok.rollouts import check_target_returns

    assert check_target_returns(np.array(5.0)) == [5.0] and check_target_returns(np.array([5, 6])) == [5.0, 6.0]


def test_a_head_without_tanh_or_stored_range_acts_with_its_raw_actions(monkeypatch):
    # [-1, 1] is its range only with a tanh head or a stored range: raw 1.8 used to reach Pendulum as 1.0
    import gymnasium as gym

    m = model(state_dim=3, act_dim=1, action_tanh=False)
    sent = []
    step = gym.wrappers.TimeLimit.step
    monkeypatch.setattr(gym.wrappers.TimeLimit, "step", lambda env, a: (sent.append(float(np.ravel(a)[0])), step(env, a))[1])
    forward = m.forward

    def predicts(value):
        def run(*args, **kwargs):
            out = forward(*args, **kwargs)
            out.action_preds.fill_(value)
            return out
        return run

    monkeypatch.setattr(m, "forward", predicts(1.8))
    m.evaluate("Pendulum-v1", [-100.0], episodes=1, max_steps=3)
    monkeypatch.setattr(m, "forward", predicts(3.0))
    m.evaluate("Pendulum-v1", [-100.0], episodes=1, max_steps=3)
    assert sent == pytest.approx([1.8] * 3 + [2.0] * 3)  # beyond Pendulum's [-2, 2], the environment's bound
