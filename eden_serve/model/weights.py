"""EDEN's building blocks and its two weight halves, named exactly as in the official checkpoint.

Read top-down: embeddings, attention and MLP, the transformer block, then the two halves:
:class:`CloudWeights` (the cloud's four ``*_cond_*`` modules) and :class:`EdgeWeights`
(everything else, for the edge). Together their state dicts are the official ``eden.pt`` state dict.
The computations that use these modules live in ``cloud/encoder.py`` and ``edge/``.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EdenConfig

CLOUD_PREFIXES = ("patch_cond_dit.", "norm_cond_dit.", "patch_cond_dec.", "norm_cond_dec.")


# --- embeddings ---------------------------------------------------------------------------------


def _sincos_1d(dim: int, coords: torch.Tensor) -> torch.Tensor:
    """[M] float64 coordinates -> [M, dim]: dim/2 frequencies 1/10000^(k/(dim/2)), [sin | cos]."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2))
    angles = coords[:, None] * omega[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


# Positional embeddings kept for reuse, in all (every device's together): a 4K frame's are about
# 100 MB at stride 1 and 25 MB at stride 2, so a count of entries would not bound the memory of a
# worker that sees many frame sizes.
EMBEDDING_CACHE_BYTES = 256 << 20


class EmbeddingCache:
    """Least recently used positional embeddings, by grid, stride and device, within a byte budget.
    Every caller of a key gets the one tensor stored for it, also threads that miss it at once (the
    first stored wins; the others' are dropped), so that tensors of one key are not made twice. A
    CUDA graph does not rely on the cache to keep what it reads: its entry holds it (edge/graphs.py)."""

    def __init__(self, max_bytes: int = EMBEDDING_CACHE_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()  # a worker's chunks may be encoded on several threads

    def get(self, key: tuple, make) -> torch.Tensor:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = make()
        size = value.numel() * value.element_size()
        with self._lock:
            if key in self._entries:  # another thread stored it meanwhile
                return self._entries[key]
            if size <= self.max_bytes:
                self._entries[key] = value
                self.bytes += size
                while self.bytes > self.max_bytes:
                    _, old = self._entries.popitem(last=False)
                    self.bytes -= old.numel() * old.element_size()
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0


EMBEDDINGS = EmbeddingCache()


def pos_embedding(config: EdenConfig, ph: int, pw: int, stride: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """[ (ph//stride)*(pw//stride), D ] positional embedding of a token grid, row-major, on ``device``
    (cached there: see :data:`EMBEDDINGS`). Callers must not modify it.

    Coordinates are scaled by the *full* patch grid in units of ``config.pos_grid`` (row i at
    i / (ph / 16), column j at j / (pw / 28)), even for the stride-2 query grid; the first half of
    the channels embeds the column, the second the row.
    """
    device = torch.device(device)
    return EMBEDDINGS.get((config, ph, pw, stride, device), lambda: _pos_embedding(config, ph, pw, stride).to(device))


def _pos_embedding(config: EdenConfig, ph: int, pw: int, stride: int) -> torch.Tensor:
    dim, (unit_rows, unit_cols) = config.hidden_dim, config.pos_grid
    gh, gw = ph // stride, pw // stride
    rows = torch.arange(gh, dtype=torch.float64) / (ph / unit_rows)
    cols = torch.arange(gw, dtype=torch.float64) / (pw / unit_cols)
    col_emb = _sincos_1d(dim // 2, cols)  # [gw, dim/2]
    row_emb = _sincos_1d(dim // 2, rows)  # [gh, dim/2]
    grid = torch.cat(
        [col_emb[None, :, :].expand(gh, gw, -1), row_emb[:, None, :].expand(gh, gw, -1)], dim=-1
    )
    return grid.reshape(gh * gw, dim).to(torch.float32)


def timestep_features(t: torch.Tensor, dim: int = 256) -> torch.Tensor:
    """[B] times in [0, 1] (unscaled) -> [B, dim] features [cos(t f) | sin(t f)]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angles = t[:, None].float() * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class TimestepEmbedder(nn.Module):
    def __init__(self, dim: int, features: int = 256):
        super().__init__()
        self.features = features
        self.mlp = nn.Sequential(nn.Linear(features, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_features(t, self.features).to(self.mlp[0].weight.dtype))


# --- attention and MLP --------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head attention with one shared ``qkv`` and an output ``proj``, both without bias."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def project(self, x: torch.Tensor, parts: str = "qkv") -> torch.Tensor:
        """[..., T, D] -> [..., T, len(parts), H, hd]: the q, k and/or v heads, as a view of one product."""
        dim = self.proj.weight.shape[0]
        first = "qkv".index(parts[0])
        weight = self.qkv.weight[first * dim : (first + len(parts)) * dim]
        return F.linear(x, weight).unflatten(-1, (len(parts), self.num_heads, -1))

    def output(self, y: torch.Tensor) -> torch.Tensor:
        """[..., H, T, hd] attention output -> proj of [..., T, D]."""
        return self.proj(y.transpose(-3, -2).flatten(-2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Plain attention of every token over [..., T, D], softmax written out (the reference)."""
        q, k, v = self.project(x).movedim(-3, 0).transpose(-3, -2)  # each [..., H, T, hd]
        weights = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(dim=-1)
        return self.output(weights @ v)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Self-attention, temporal attention over the two frames' tokens, MLP; each pre-normalised.

    The DiT and the decoder wire these parts differently (see ``edge/forward.py``), so there is no forward.
    """

    def __init__(self, config: EdenConfig):
        super().__init__()
        dim, eps = config.hidden_dim, config.ln_eps
        self.norm_self_attn = nn.LayerNorm(dim, eps=eps)
        self.self_attn = Attention(dim, config.num_heads)
        self.norm_temp_attn = nn.LayerNorm(dim, eps=eps)
        self.temp_attn = Attention(dim, config.num_heads)
        self.norm_mlp = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, config.mlp_dim)


# --- the two halves -----------------------------------------------------------------------------


class CloudWeights(nn.Module):
    """E_cond's weights (cloud): one patch embedding and LayerNorm for the DiT, one for the decoder."""

    def __init__(self, config: EdenConfig):
        super().__init__()
        p, dim = config.patch_size, config.hidden_dim
        self.patch_cond_dit = nn.Conv2d(3, dim, kernel_size=p, stride=p)
        self.norm_cond_dit = nn.LayerNorm(dim, eps=config.ln_eps)
        self.patch_cond_dec = nn.Conv2d(3, dim, kernel_size=p, stride=p)
        self.norm_cond_dec = nn.LayerNorm(dim, eps=config.ln_eps)


class EdgeWeights(nn.Module):
    """G_DiT's and D_dec's weights (edge)."""

    def __init__(self, config: EdenConfig):
        super().__init__()
        dim, latent, p = config.hidden_dim, config.latent_dim, config.patch_size
        self.proj_in = nn.Linear(latent, dim)
        self.dit_blocks = nn.ModuleList(Block(config) for _ in range(config.dit_depth))
        self.norm_out = nn.LayerNorm(dim, eps=config.ln_eps)
        self.proj_out = nn.Linear(dim, 2 * latent)  # only the first `latent` outputs are the velocity
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.difference_embedder = nn.Linear(1, dim)
        self.denoise_timestep_embedder = TimestepEmbedder(dim)
        self.proj_token = nn.Linear(latent, dim)
        self.decoder_blocks = nn.ModuleList(Block(config) for _ in range(config.decoder_depth))
        self.unpatchify = nn.Sequential(
            nn.LayerNorm(dim, eps=config.ln_eps),
            nn.Linear(dim, 3 * p * p),
            nn.GELU(),
            nn.Linear(3 * p * p, 3 * p * p),
        )


def expected_layout(config: EdenConfig) -> dict[str, tuple[int, ...]]:
    """Every key of the official state dict with its shape, for ``config``."""
    with torch.device("meta"):
        halves = (CloudWeights(config), EdgeWeights(config))
    return {k: tuple(v.shape) for half in halves for k, v in half.state_dict().items()}


def is_cloud_key(key: str) -> bool:
    return key.startswith(CLOUD_PREFIXES)
