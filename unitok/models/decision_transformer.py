"""Decision Transformer (Chen et al., 2021): reinforcement learning as sequence modelling.

A trajectory becomes interleaved tokens R̂_1, s_1, a_1, R̂_2, s_2, a_2, … (return-to-go, state,
action), each embedded by its own linear layer plus a learned timestep embedding, normalised,
and read by the shared causal backbone; the output at s_t predicts a_t. Conditioning on a
high return-to-go asks for the behaviour that earned high returns in the data. With
``condition_on_returns=False`` the return tokens are left out: the same network is then a
behaviour-cloning baseline over (s, a) tokens.

Axis legend: B batch, K steps in the window, G tokens per step (3, or 2 without returns),
N = G·K tokens, D width, S state width, A action width or number of discrete actions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenizers_mm.checks import check_int, check_number
from tokenizers_mm.processor import Processor
from tokenizers_mm.trajectory import TOKENIZER_FIELDS, TrajectoryTokenizer, TrajectoryWindows
from unitok.backbone import Backbone, BackboneConfig, init_weights
from unitok.checks import check_dtype, check_finite, host_values
from unitok.config import Config
from unitok.layers.activations import Activation
from unitok.layers.attention import Kernel
from unitok.models.base import PretrainedModel

if TYPE_CHECKING:
    from unitok.rollouts import EvaluationResult


@dataclass(frozen=True)
class DecisionTransformerConfig(Config):
    """A Decision Transformer and the data normalisation it was trained with.

    Args:
        state_dim: S. act_dim: A, the action width, or the number of actions when ``discrete``.
        discrete: actions are ids; the action head gives logits.
        action_tanh: continuous actions go through tanh, so into [-1, 1] (the tokenizer maps
            the data's action range there).
        context_length: K, the steps a window holds when acting (3K tokens).
        max_ep_len: size of the timestep embedding (episodes may not be longer).
        d_model / n_layers / n_heads / d_ff / activation / norm_eps: the GPT-2 style backbone.
        embed_norm_eps: epsilon of the LayerNorm on the embedded tokens.
        dropout: on embeddings, residual branches and attention weights.
        condition_on_returns: False leaves the return tokens out (behaviour cloning).
        predict_state / predict_return: the optional heads reading each action token.
        state_mean / state_std / return_scale / action_low / action_high: the
            `TrajectoryTokenizer` statistics (saved with the checkpoint so it acts correctly).
    """

    state_dim: int = 17
    act_dim: int = 4
    discrete: bool = False
    action_tanh: bool = True
    context_length: int = 20
    max_ep_len: int = 4096
    d_model: int = 128
    n_layers: int = 3
    n_heads: int = 1
    d_ff: int | None = None
    activation: Activation = "relu"
    norm_eps: float = 1e-5
    embed_norm_eps: float = 1e-5
    dropout: float = 0.1
    condition_on_returns: bool = True
    predict_state: bool = True
    predict_return: bool = True
    state_mean: tuple[float, ...] | None = None
    state_std: tuple[float, ...] | None = None
    return_scale: float = 1.0
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None

    presets = {
        # The paper's (and Hugging Face's) gym-MuJoCo model: 3 layers, width 128, one head, K = 20.
        "dt-hopper": dict(state_dim=11, act_dim=3, max_ep_len=1000, return_scale=1000.0),
        "dt-halfcheetah": dict(state_dim=17, act_dim=6, max_ep_len=1000, return_scale=1000.0),
        "dt-walker2d": dict(state_dim=17, act_dim=6, max_ep_len=1000, return_scale=1000.0),
        # CPU-sized models for the built-in data (dimensions are set from the data).
        # (No dropout: on a CPU it costs a third of a training step, and the built-in data is plenty.)
        "dt-tiny": dict(d_model=32, n_layers=1, n_heads=2, context_length=10, max_ep_len=1024, dropout=0.0),
        "dt-small": dict(d_model=64, n_layers=2, n_heads=2, context_length=10, max_ep_len=1024, dropout=0.0),
        "dt-cartpole": dict(state_dim=4, act_dim=2, discrete=True, d_model=64, n_layers=2, n_heads=2,
                            context_length=10, max_ep_len=1024, dropout=0.0),
        "dt-pendulum": dict(state_dim=3, act_dim=1, d_model=64, n_layers=2, n_heads=2, context_length=10,
                            max_ep_len=1024, dropout=0.0),
    }

    def __post_init__(self) -> None:
        for name in ("state_dim", "act_dim", "context_length", "max_ep_len"):
            value = getattr(self, name)
            check_int(name, value)
        if self.discrete and self.act_dim < 2:
            raise ValueError(f"a discrete action space needs act_dim ≥ 2 actions, got {self.act_dim}")
        check_number("embed_norm_eps", self.embed_norm_eps, 0, low_open=True)  # ≤ 0: NaN embeddings, as norm_eps
        self.tokenizer()  # validates the statistics against the dimensions
        self.backbone_config()

    def backbone_config(self) -> BackboneConfig:
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff,
            block=("attn", "mlp"), norm="layernorm", norm_position="pre", norm_eps=self.norm_eps,
            bias=True, activation=self.activation, causal=True, dropout=self.dropout,
            attn_dropout=self.dropout, final_norm=True,
        )

    @property
    def tokens_per_step(self) -> int:
        return 3 if self.condition_on_returns else 2

    def tokenizer(self) -> TrajectoryTokenizer:
        """The `TrajectoryTokenizer` with this model's statistics (raw episodes -> model inputs)."""
        return TrajectoryTokenizer(**{name: getattr(self, name) for name in TOKENIZER_FIELDS})

    def with_tokenizer(self, tokenizer: TrajectoryTokenizer) -> DecisionTransformerConfig:
        """This config with a tokenizer's dimensions and statistics."""
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in tokenizer.to_dict().items()}
        return self.replace(**values)


@dataclass
class DecisionTransformerOutput:
    """``action_preds`` (B, K, A): actions (in [-1, 1] with tanh) or logits (discrete),
    predicted at each state token; ``state_preds`` (B, K, S) and ``return_preds`` (B, K, 1) at
    each action token (None without those heads); ``last_hidden_state`` (B, N, D) for the
    interleaved tokens ((B, K, D), the state tokens', with ``actions_only``), plus what the
    backbone returned when asked."""

    action_preds: Tensor
    state_preds: Tensor | None
    return_preds: Tensor | None
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class DecisionTransformer(PretrainedModel):
    """Return-conditioned policy on the shared causal backbone (Hugging Face's
    ``DecisionTransformerModel`` when built with the same config; see `unitok.convert`)."""

    config_class = DecisionTransformerConfig

    def __init__(self, config: DecisionTransformerConfig) -> None:
        super().__init__()
        self.config = config
        D = config.d_model
        self.embed_timestep = nn.Embedding(config.max_ep_len, D)
        self.embed_return = nn.Linear(1, D) if config.condition_on_returns else None
        self.embed_state = nn.Linear(config.state_dim, D)
        # Discrete actions index this layer's columns: the same map as a Linear on one-hot vectors.
        self.embed_action = nn.Linear(config.act_dim, D)
        self.embed_norm = nn.LayerNorm(D, eps=config.embed_norm_eps)
        self.drop = nn.Dropout(config.dropout)
        self.backbone = Backbone(config.backbone_config())  # GPT-2 style: no MLP hidden dropout
        self.action_head = nn.Linear(D, config.act_dim)
        self.state_head = nn.Linear(D, config.state_dim) if config.predict_state else None
        self.return_head = nn.Linear(D, 1) if config.predict_return and config.condition_on_returns else None
        init_weights(self, std=0.02, residual_std=0.02 / math.sqrt(2 * config.n_layers))

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        states: Tensor | TrajectoryWindows,
        actions: Tensor | None = None,
        returns_to_go: Tensor | None = None,
        timesteps: Tensor | None = None,
        attention_mask: Tensor | None = None,
        rewards: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        kernel: Kernel = "sdpa",
        actions_only: bool = False,
    ) -> DecisionTransformerOutput:
        """Predict the action at every step of (B, K) windows, in the model's units.

        Args:
            states: (B, K, S) normalised states, or a `TrajectoryWindows` batch (then the other
                tensors come from it).
            actions: (B, K, A) continuous actions in [-1, 1], or (B, K) ids / (B, K, A) one-hot
                for discrete models. The action at the last step may be anything: no
                prediction of it reads it.
            returns_to_go: (B, K, 1) or (B, K) scaled returns-to-go (ignored without return
                tokens). timesteps: (B, K) step indices in [0, max_ep_len).
            attention_mask: (B, K) 1 for real steps, 0 for padding.
            rewards: accepted for Hugging Face compatibility and ignored (as there).
            actions_only: predict actions alone (``state_preds`` and ``return_preds`` None):
                the last block then computes only the state tokens the action head reads
                (`Backbone.forward`'s ``keep_last``), the same actions and gradients for about
                two thirds of a layer less work; how `tasks.DecisionTransformerTask` trains.
        """
        if isinstance(states, TrajectoryWindows):
            batch = states
            states, actions = batch.states, batch.actions if actions is None else actions
            returns_to_go = batch.returns_to_go if returns_to_go is None else returns_to_go
            timesteps = batch.timesteps if timesteps is None else timesteps
            attention_mask = batch.attention_mask if attention_mask is None else attention_mask
        states, actions, returns_to_go, timesteps = self._check_inputs(
            states, actions, returns_to_go, timesteps, attention_mask)
        B, K = states.shape[:2]
        c = self.config
        time = self.embed_timestep(timesteps)  # (B, K, D); acts as a position embedding
        parts = []
        if self.embed_return is not None:
            parts.append(self.embed_return(returns_to_go) + time)
        parts.append(self.embed_state(states) + time)
        parts.append(self._embed_actions(actions) + time)
        G = len(parts)
        x = torch.stack(parts, dim=2).reshape(B, G * K, c.d_model)  # (B, N, D): R̂_1 s_1 a_1 R̂_2 …
        x = self.embed_norm(x)
        if self.training and self.drop.p > 0:
            x = self.drop(x)
        mask = None if attention_mask is None else attention_mask.repeat_interleave(G, dim=1)  # (B, N)
        keep = None
        if actions_only:  # the state tokens s_1 … s_K sit at G − 2, 2G − 2, …
            keep = torch.arange(G - 2, G * K, G, device=x.device)
        out = self.backbone(x, mask, output_hidden_states=output_hidden_states,
                            output_attentions=output_attentions, kernel=kernel, keep_last=keep)
        if actions_only:
            state_tok, action_tok = out.last_hidden_state, None  # (B, K, D)
        else:
            h = out.last_hidden_state.reshape(B, K, G, c.d_model)  # (B, K, G, D)
            state_tok, action_tok = h[:, :, G - 2], h[:, :, G - 1]  # (B, K, D) each
        action_preds = self.action_head(state_tok)  # a_t from the tokens up to s_t
        if not c.discrete and c.action_tanh:
            action_preds = torch.tanh(action_preds)
        return DecisionTransformerOutput(
            action_preds=action_preds,
            state_preds=self.state_head(action_tok) if self.state_head is not None and action_tok is not None else None,
            return_preds=(self.return_head(action_tok) if self.return_head is not None and action_tok is not None
                          else None),
            last_hidden_state=out.last_hidden_state,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )

    def _embed_actions(self, actions: Tensor) -> Tensor:
        if self.config.discrete and not actions.dtype.is_floating_point:
            # Column `id` of the weight plus the bias = the Linear applied to a one-hot vector.
            return F.embedding(actions, self.embed_action.weight.t()) + self.embed_action.bias
        return self.embed_action(actions)

    def _check_inputs(self, states, actions, returns_to_go, timesteps, attention_mask):
        """Shapes, types and ranges, named in the error; returns the tensors in canonical form."""
        c = self.config
        if not isinstance(states, Tensor) or states.dim() != 3:
            shape = tuple(states.shape) if isinstance(states, Tensor) else type(states).__name__
            raise ValueError(f"states must be (batch, steps, state_dim={c.state_dim}), got {shape}")
        B, K, S = states.shape
        if S != c.state_dim:
            raise ValueError(f"states have {S} dimensions but this model (checkpoint) was built for "
                             f"state_dim={c.state_dim}")
        if K == 0:
            raise ValueError("the window is empty: give at least one step")
        check_dtype(states, self.embed_state.weight, "states")
        check_finite(states, "states")
        if actions is None:
            raise ValueError("actions are required (zeros will do for the step being predicted)")
        if c.discrete and not actions.dtype.is_floating_point:
            if tuple(actions.shape) != (B, K):
                raise ValueError(f"discrete action ids must be (batch, steps) = {(B, K)}, got {tuple(actions.shape)}")
            if actions.numel():
                lo, hi = torch.aminmax(host_values(actions))  # under torch.func.vmap: every sample's
                if int(lo) < 0 or int(hi) >= c.act_dim:
                    raise ValueError(f"action ids must be in [0, {c.act_dim}), got {int(lo)}..{int(hi)}")
        else:
            if not actions.dtype.is_floating_point:
                raise TypeError(f"this model has continuous actions: actions must be floats, got {actions.dtype}")
            check_dtype(actions, self.embed_action.weight, "actions")
            check_finite(actions, "actions")
            if actions.dim() != 3 or tuple(actions.shape[:2]) != (B, K):
                raise ValueError(f"actions must be (batch, steps, act_dim) = {(B, K, c.act_dim)}, "
                                 f"got {tuple(actions.shape)}")
            if actions.shape[-1] != c.act_dim:
                raise ValueError(f"actions have {actions.shape[-1]} dimensions but this model (checkpoint) was "
                                 f"built for act_dim={c.act_dim}")
        if c.condition_on_returns:
            if returns_to_go is None:
                raise ValueError("returns_to_go are required by a return-conditioned model")
            if returns_to_go.dim() == 2:
                returns_to_go = returns_to_go.unsqueeze(-1)
            if tuple(returns_to_go.shape) != (B, K, 1):
                raise ValueError(f"returns_to_go must be (batch, steps, 1) = {(B, K, 1)}, "
                                 f"got {tuple(returns_to_go.shape)}")
            check_finite(returns_to_go, "returns_to_go")
            returns_to_go = returns_to_go.to(states.dtype)
        if timesteps is None:
            timesteps = torch.arange(K, device=states.device).expand(B, K)
        if timesteps.dtype.is_floating_point:
            raise TypeError(f"timesteps must be integers, got {timesteps.dtype}")
        if tuple(timesteps.shape) != (B, K):
            raise ValueError(f"timesteps must be (batch, steps) = {(B, K)}, got {tuple(timesteps.shape)}")
        lo, hi = torch.aminmax(host_values(timesteps))
        if int(lo) < 0 or int(hi) >= c.max_ep_len:
            raise ValueError(f"timesteps must be in [0, max_ep_len={c.max_ep_len}), got {int(lo)}..{int(hi)}; "
                             "episodes longer than max_ep_len need a model with a larger one")
        if attention_mask is not None and tuple(attention_mask.shape) != (B, K):
            raise ValueError(f"attention_mask must be (batch, steps) = {(B, K)}, got {tuple(attention_mask.shape)}")
        return states, actions, returns_to_go, timesteps.long()

    # ------------------------------------------------------------------ acting
    def tokenizer(self) -> TrajectoryTokenizer:
        """The tokenizer with the statistics this model was trained with."""
        return self.config.tokenizer()

    def default_processor(self) -> Processor:
        """Episodes -> windows with the stored return / state / action statistics."""
        return Processor(trajectory=self.config.tokenizer())

    @torch.no_grad()
    def get_action(
        self,
        states: Tensor,
        actions: Tensor,
        returns_to_go: Tensor | None,
        timesteps: Tensor,
    ) -> Tensor:
        """The next action from a history in the model's units, as Hugging Face's example acts:
        (B, T, …) tensors — states (B, T, S), actions (B, T, A) or (B, T) ids, returns_to_go
        (B, T, 1) or (B, T), timesteps (B, T) — or the same without the batch axis, all of the
        same T steps. The last step holds the current state; its action entry is a placeholder
        (zeros will do), so ``actions`` has T entries, not the T − 1 taken. Only the last
        ``context_length`` steps are read. Returns (B, A) continuous actions in [-1, 1] or (B,)
        ids (argmax), without the batch axis for unbatched input."""
        if not isinstance(states, Tensor) or states.dim() not in (2, 3):
            shape = tuple(states.shape) if isinstance(states, Tensor) else type(states).__name__
            raise ValueError(f"states must be (steps, state_dim) or (batch, steps, state_dim), got {shape}")
        unbatched = states.dim() == 2
        # Each tensor is cut to its own last K steps below: a history one step short in any of
        # them would be read shifted against the states, so all must cover the same steps.
        lead = tuple(states.shape[:1 if unbatched else 2])
        history = {"actions": actions, "returns_to_go": returns_to_go, "timesteps": timesteps}
        for name, value in history.items():
            if value is None and name == "returns_to_go":  # a behaviour-cloning model reads none
                continue
            if not isinstance(value, Tensor) or tuple(value.shape[:len(lead)]) != lead:
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                what = "(steps,)" if unbatched else "(batch, steps)"
                note = ("; the action at the last step is a placeholder (zeros), so T actions, not the T − 1 taken"
                        if name == "actions" else "")
                if not unbatched and isinstance(value, Tensor) and value.dim() == 1 and name == "timesteps":
                    note = f"; a row shared by the batch: timesteps.expand({lead[0]}, -1)"
                raise ValueError(f"{name} must have the states' {what} = {lead} first, one entry per step{note}; "
                                 f"got shape {shape}")
        if unbatched:
            states, actions, timesteps = states[None], actions[None], timesteps[None]
            returns_to_go = None if returns_to_go is None else returns_to_go[None]
        K = self.config.context_length
        was_training = self.training
        self.eval()
        try:
            out = self(states[:, -K:], actions[:, -K:], None if returns_to_go is None else returns_to_go[:, -K:],
                       timesteps[:, -K:], actions_only=True)
        finally:
            self.train(was_training)
        last = out.action_preds[:, -1]
        action = last.argmax(-1) if self.config.discrete else last
        return action[0] if unbatched else action

    def evaluate(
        self,
        env_id: str,
        target_returns: float | list[float] | tuple[float, ...],
        episodes: int = 10,
        seed: int = 0,
        max_steps: int | None = None,
        device: torch.device | str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        sample: bool | None = None,
    ) -> EvaluationResult:
        """Roll the policy out in the gymnasium environment ``env_id``, ``episodes`` times for
        each target return (discrete actions sampled from the softmax unless ``sample=False``);
        see `unitok.rollouts.evaluate_returns`."""
        from unitok.rollouts import evaluate_returns

        return evaluate_returns(self, env_id, target_returns, episodes=episodes, seed=seed,
                                max_steps=max_steps, device=device, env_kwargs=env_kwargs, sample=sample)
