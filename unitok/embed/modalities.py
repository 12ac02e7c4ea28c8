"""One embedder per modality, each turning its tokens into (B, n, D) vectors with positions of its
own: text ids (token embedding + 1-D positions), image patches (patch projection + 2-D
positions, optional class token), audio frames (the ×4 convolutional front end + time
positions) and trajectories (return / state / action embedders + a timestep embedding, as the
Decision Transformer). `unitok.models.MultimodalTransformer` holds one per named segment.

Axis legend: B batch, n tokens out, N patches / frames in, F features per patch or frame, D
width, K trajectory steps, S state width, A action width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unitok.checks import check_finite
from unitok.embed.frames import ConvSubsampling
from unitok.embed.patches import PatchEmbedding, resample_grid_positions, sincos_2d_table
from unitok.embed.positions import make_positions
from unitok.embed.tokens import TokenEmbedding


class TextEmbedder(nn.Module):
    """(B, n) ids -> token embedding + position embedding (GPT-2's ``wte`` + ``wpe``)."""

    def __init__(self, vocab_size: int, max_positions: int, d_model: int, positions: str = "learned") -> None:
        super().__init__()
        self.max_positions = max_positions
        self.tok_embed = TokenEmbedding(vocab_size, d_model)
        self.pos_embed = make_positions(positions, max_positions, d_model)

    def forward(self, ids: Tensor, mask: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        n = ids.shape[1]
        longest = n if mask is None or not mask.numel() else int(mask.long().sum(-1).max())  # real tokens, not padding
        if longest > self.max_positions:
            raise ValueError(f"a text segment of {longest} tokens is longer than its {self.max_positions} positions")
        x = self.tok_embed(ids)
        if self.pos_embed is None:
            return x
        if positions is None and (mask is None or bool(mask.all())):
            return x + self.pos_embed.span(0, n)  # (n, D) broadcast over the batch
        if positions is None:  # counted from each row's first real token, so left padding does not shift them
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        if positions.numel() and not 0 <= int(positions.min()) <= int(positions.max()) < self.max_positions:
            raise ValueError(f"text positions must lie in 0..{self.max_positions - 1} (the positions configured), "
                             f"got {int(positions.min())}..{int(positions.max())}")
        return x + self.pos_embed(positions)


class ImageEmbedder(nn.Module):
    """(B, N, C·P·P) patches on an h×w grid -> [class token] + patch projections + 2-D positions
    (ViT's embedding: learned positions resampled bicubically for other grids, or fixed sin-cos)."""

    def __init__(self, channels: int, patch_size: int, grid: tuple[int, int], d_model: int,
                 class_token: bool = True, positions: str = "learned", positions_cover_prefix: bool = True,
                 patch_bias: bool = True) -> None:
        super().__init__()
        if positions not in ("learned", "sincos", "none"):
            raise ValueError(f"image positions must be 'learned', 'sincos' or 'none', got {positions!r}")
        self.grid, self.positions, self.d_model = tuple(grid), positions, d_model
        self.n_prefix = int(class_token)
        # only a learned table can cover the class token (a sin-cos table is the patches' alone, as ViT's)
        self.cover_prefix = positions_cover_prefix and class_token and positions == "learned"
        self.patch_embed = PatchEmbedding(channels, patch_size, d_model, bias=patch_bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model)) if class_token else None
        n_pos = (self.n_prefix if self.cover_prefix else 0) + grid[0] * grid[1]
        self.pos_embed = nn.Parameter(torch.randn(1, n_pos, d_model) * 0.02) if positions == "learned" else None
        bound = 1 / math.sqrt(self.patch_embed.in_features)  # as a conv's fan-in init
        nn.init.uniform_(self.patch_embed.weight, -bound, bound)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)

    def forward(self, patches: Tensor, grid: tuple[int, int]) -> Tensor:
        if patches.shape[1] != grid[0] * grid[1]:
            raise ValueError(f"{patches.shape[1]} patches do not fill a {grid[0]}×{grid[1]} grid")
        x = self.patch_embed(patches)  # (B, N, D)
        table = None
        if self.positions == "sincos":
            table = sincos_2d_table(grid, self.d_model).to(x)
        elif self.pos_embed is not None:
            table = resample_grid_positions(self.pos_embed, self.grid, grid, self.n_prefix if self.cover_prefix else 0)
        if table is not None and not self.cover_prefix:
            x = x + table  # the class token carries no position
            table = None
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + table if table is not None else x


class AudioEmbedder(nn.Module):
    """(B, N, F) log-mel frames and (B,) lengths -> the ×4 convolutional front end + time positions:
    (B, n, D) with n = ⌊(⌊(N − 1)/2⌋ − 1)/2⌋, and the (B,) lengths after subsampling."""

    def __init__(self, n_mels: int, d_model: int, max_frames: int, channels: int | None = None,
                 positions: str = "sinusoidal") -> None:
        super().__init__()
        self.max_frames = max_frames
        self.frontend = ConvSubsampling(n_mels, d_model, channels)
        self.pos_embed = make_positions(positions, max_frames, d_model)

    def forward(self, frames: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        x, lengths = self.frontend(frames, lengths)
        if bool((lengths < 1).any()):
            raise ValueError("an utterance is too short for ×4 subsampling (needs ≥ 7 frames, 70 ms)")
        longest = int(lengths.max()) if lengths.numel() else 0
        if longest > self.max_frames:  # the real frames count, not a batch's padding
            raise ValueError(f"an utterance gives {longest} subsampled positions, more than the "
                             f"{self.max_frames} configured (max_frames; {self.max_frames * 4} input frames)")
        x = x[:, : min(x.shape[1], self.max_frames)]  # past every row's real positions: padding only
        if self.pos_embed is not None:
            x = x + self.pos_embed.span(0, x.shape[1])
        return x, lengths


class TrajectoryEmbedder(nn.Module):
    """(B, K) steps -> interleaved return-to-go, state and action tokens, each from its own linear
    layer plus the step's timestep embedding, then a LayerNorm (the Decision Transformer's
    embedding): (B, G·K, D) with G = 3, or 2 without return tokens."""

    def __init__(self, state_dim: int, act_dim: int, discrete: bool, max_ep_len: int, d_model: int,
                 condition_on_returns: bool = True, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.state_dim, self.act_dim, self.discrete, self.max_ep_len = state_dim, act_dim, discrete, max_ep_len
        self.embed_timestep = nn.Embedding(max_ep_len, d_model)
        self.embed_return = nn.Linear(1, d_model) if condition_on_returns else None
        self.embed_state = nn.Linear(state_dim, d_model)
        self.embed_action = nn.Linear(act_dim, d_model)  # discrete ids index its columns
        self.embed_norm = nn.LayerNorm(d_model, eps=norm_eps)

    @property
    def tokens_per_step(self) -> int:
        return 3 if self.embed_return is not None else 2

    def forward(self, states: Tensor, actions: Tensor, returns_to_go: Tensor | None, timesteps: Tensor) -> Tensor:
        B, K, S = states.shape
        if S != self.state_dim:
            raise ValueError(f"states have {S} dimensions, the trajectory embedder {self.state_dim}")
        if timesteps.numel() and (int(timesteps.min()) < 0 or int(timesteps.max()) >= self.max_ep_len):
            raise ValueError(f"timesteps must be in [0, max_ep_len={self.max_ep_len}), got "
                             f"{int(timesteps.min())}..{int(timesteps.max())}")
        check_finite(states, "states")
        time = self.embed_timestep(timesteps)  # (B, K, D): the position of every token of a step
        if self.discrete and not actions.dtype.is_floating_point:
            if actions.numel() and (int(actions.min()) < 0 or int(actions.max()) >= self.act_dim):
                raise ValueError(f"action ids must be in [0, {self.act_dim}), got {int(actions.min())}.."
                                 f"{int(actions.max())}")
            action = F.embedding(actions, self.embed_action.weight.t()) + self.embed_action.bias
        else:
            if actions.shape[-1] != self.act_dim:
                raise ValueError(f"actions have {actions.shape[-1]} dimensions, the trajectory embedder {self.act_dim}")
            action = self.embed_action(actions)
        parts = []
        if self.embed_return is not None:
            if returns_to_go is None:
                raise ValueError("returns_to_go are required by a return-conditioned trajectory segment")
            returns_to_go = returns_to_go if returns_to_go.dim() == 3 else returns_to_go.unsqueeze(-1)
            parts.append(self.embed_return(returns_to_go.to(states.dtype)) + time)
        parts += [self.embed_state(states) + time, action + time]
        x = torch.stack(parts, dim=2).reshape(B, len(parts) * K, -1)  # R̂_1 s_1 a_1 R̂_2 …
        return self.embed_norm(x)
