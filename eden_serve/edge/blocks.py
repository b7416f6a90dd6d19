"""The two ways through the DiT's and the decoder's blocks, side by side: the same function.

* :class:`ReferencePath`: the official computation step by step (9-token temporal attention
  sequences in the DiT, 3-token ones in the decoder, attention over every token, the condition
  tokens re-projected in every block and Euler step). It is the tests' oracle.
* :class:`FastPath` (the default): the same numbers with less work, up to float rounding.

Both take a batch of pairs of one frame size: the tokens [B, T, D], each pair's modulations
[B, 1, D], and the condition tokens of all the pairs' rows together, in the form each path made of
them once per forward (:meth:`BlockPath.dit_conditions`, :meth:`BlockPath.decoder_conditions`). Neither
keeps state between calls: a forward captured as a CUDA graph replays without Python.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from ..model.weights import Block
from .kernels import (
    Linears,
    absorbed_temporal_attention,
    modulated_layer_norm,
    three_token_attention,
)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


def query_blocks(cond: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
    """[N, D] or [B, N, D] condition tokens -> [B Nq, 4, D]: the 2x2 block each query token (r, c)
    owns, ordered (2r,2c), (2r,2c+1), (2r+1,2c), (2r+1,2c+1); pair after pair."""
    d = cond.shape[-1]
    return cond.reshape(-1, ph // 2, 2, pw // 2, 2, d).permute(0, 1, 3, 2, 4, 5).reshape(-1, 4, d)


class BlockPath(Protocol):
    """What both paths implement: the two kinds of block, and the condition tokens in the form
    their blocks take (made once per forward, the same in every block and Euler step)."""

    def dit_conditions(self, c0: torch.Tensor, c1: torch.Tensor):
        """``c0``, ``c1``: each query token's 2x2 condition block in frame 0 and frame 1, [B Nq, 4, D]."""

    def decoder_conditions(self, c0: torch.Tensor, c1: torch.Tensor):
        """``c0``, ``c1``: the frames' condition tokens, [B N, D]."""

    def dit_block(self, blk: Block, x: torch.Tensor, mods: tuple[torch.Tensor, ...], cond) -> torch.Tensor:
        """One DiT block on the query tokens x [B, Nq, D]; ``mods``: the six [B, 1, D] modulations
        (shift, scale, gate; twice); ``cond``: :meth:`dit_conditions`."""

    def decoder_block(self, blk: Block, r: torch.Tensor, q: torch.Tensor, cond) -> torch.Tensor:
        """One decoder block on the reconstruction tokens r [B, N, D]; ``q``: the query tokens
        [B, Nq, D]; ``cond``: :meth:`decoder_conditions`."""


class ReferencePath:
    """The official computation, one step after the other."""

    def dit_conditions(self, c0, c1):
        return c0, c1

    def decoder_conditions(self, c0, c1):
        return c0, c1

    def dit_block(self, blk, x, mods, cond):
        c0, c1 = cond
        shift1, scale1, gate1, shift2, scale2, gate2 = mods
        x = x + gate1 * blk.self_attn(modulate(blk.norm_self_attn(x), shift1, scale1))
        h = blk.norm_temp_attn(x).reshape(-1, 1, x.shape[-1])  # [B Nq, 1, D]
        sequence = torch.cat([c0, h, c1], dim=1)  # [B Nq, 9, D]; the query token is index 4
        x = x + blk.temp_attn(sequence)[:, 4].reshape(x.shape)
        return x + gate2 * blk.mlp(modulate(blk.norm_mlp(x), shift2, scale2))

    def decoder_block(self, blk, r, q, cond):
        c0, c1 = cond
        x = torch.cat([r, q], dim=1)
        x = x + blk.self_attn(blk.norm_self_attn(x))
        r = x[:, : r.shape[1]]
        sequence = torch.stack([c0, blk.norm_temp_attn(r).reshape(-1, r.shape[-1]), c1], dim=1)  # [B N, 3, D]
        r = r + blk.temp_attn(sequence)[:, 1].reshape(r.shape)
        return r + blk.mlp(blk.norm_mlp(r))


def _heads(y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """[..., T, n, H, hd] projections -> n views [..., H, T, hd], the layout attention takes."""
    return tuple(t.transpose(-3, -2) for t in y.unbind(-3))


class FastPath:
    """Skips work whose result the reference discards or recomputes; exact up to float rounding.

    Only the query token's row of each temporal attention is computed (the reference attends over
    all 9 (DiT) or 3 (decoder) tokens and keeps one row), and in the DiT without ever forming the
    condition tokens' keys and values (:func:`~.kernels.absorbed_temporal_attention`); the
    decoder's self-attention computes query rows only for the tokens it keeps; self-attention runs
    through ``scaled_dot_product_attention`` on views of the projections; the adaLN modulation is
    folded into the LayerNorm; the residual stream is updated in place (a block owns the tokens it
    is given); the matrix products go through :class:`~.kernels.Linears`; the condition tokens,
    the same in every block and step, are stacked and cast to the products' ``dtype`` once per
    forward. Its only state is :class:`~.kernels.Linears`' prepared weights (CPU only: made from the
    weights on first use, never from the inputs).
    """

    def __init__(self, linears: Linears, dtype: torch.dtype = torch.float32):
        self.linears = linears
        self.dtype = dtype

    def dit_conditions(self, c0, c1):
        return torch.cat([c0, c1], dim=1).to(self.dtype)  # [B Nq, 8, D]

    def decoder_conditions(self, c0, c1):
        return torch.stack([c0, c1]).to(self.dtype)  # [2, B N, D]

    def dit_block(self, blk, x, mods, cond):
        lin, attn = self.linears, blk.self_attn
        shift1, scale1, gate1, shift2, scale2, gate2 = mods
        h = _modulated(blk.norm_self_attn, x, shift1, scale1)
        x.addcmul_(gate1, lin.output(attn, F.scaled_dot_product_attention(*_heads(lin.project(attn, h)))))
        h = blk.norm_temp_attn(x).reshape(-1, x.shape[-1])
        x += absorbed_temporal_attention(lin, blk.temp_attn, h, cond).view(x.shape)
        x.addcmul_(gate2, lin.mlp(blk.mlp, _modulated(blk.norm_mlp, x, shift2, scale2)))
        return x

    def decoder_block(self, blk, r, q, cond):
        lin, attn, n = self.linears, blk.self_attn, r.shape[1]
        h = blk.norm_self_attn(torch.cat([r, q], dim=1))
        (queries,) = _heads(lin.project(attn, h[:, :n], "q"))
        keys, values = _heads(lin.project(attn, h, "kv"))
        r += lin.output(attn, F.scaled_dot_product_attention(queries, keys, values))
        kv0, kv1 = lin.project(blk.temp_attn, cond, "kv")  # [B N, 2, H, hd] each
        h = blk.norm_temp_attn(r).reshape(-1, r.shape[-1])
        r += three_token_attention(lin, blk.temp_attn, h, kv0, kv1).view(r.shape)
        r += lin.mlp(blk.mlp, blk.norm_mlp(r))
        return r


def _modulated(norm: torch.nn.LayerNorm, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``norm(x) * (1 + scale) + shift`` of [B, T, D] tokens, each pair with its own [B, 1, D]
    modulation. One pair: one folded LayerNorm. A batch: one LayerNorm of all its tokens without
    affine parameters and one fused multiply-add with every pair's folded ones ([B, 1, D] each),
    the same few kernels whatever the batch size."""
    if len(x) == 1:
        return modulated_layer_norm(norm, x, shift.reshape(-1), scale.reshape(-1))
    gain = 1 + scale
    normed = F.layer_norm(x, norm.normalized_shape, None, None, norm.eps)
    return torch.addcmul(torch.addcmul(shift, norm.bias, gain), normed, norm.weight * gain)
