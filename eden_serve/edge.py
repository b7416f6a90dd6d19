"""The edge side: :class:`~eden_serve.wire.Conditions` -> the middle frame, with G_DiT and D_dec.

Two paths compute the same function and sit side by side:

* ``reference``: the official computation step by step (9-token temporal attention sequences in the
  DiT, 3-token ones in the decoder, attention over every token, the condition tokens re-projected in
  every Euler step). It is the tests' oracle.
* ``fast`` (the default): the same numbers with less work; see :class:`FastPath`.

Both implement :class:`AttentionImpl`: the four places where the two differ are the attention calls.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Literal, Protocol, Sequence

import torch
import torch.nn.functional as F

from .config import EdenConfig
from .model import Attention, Block, EdgeWeights, pos_embedding
from .wire import Conditions

AttentionPath = Literal["fast", "reference"]
Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
# Condition tokens per batched forward (the pairs' frames together): the activations of a batch
# grow with it (README "Performance": measured at about ... per 1000 tokens).
DEFAULT_BATCH_TOKENS = 16384


def initial_noise(seed: int, num_tokens: int, config: EdenConfig) -> torch.Tensor:
    """The contract for reproducibility: drawn on the CPU from a seeded generator, moved later."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((1, num_tokens, config.latent_dim), generator=generator)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


def query_blocks(cond: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
    """[N, D] condition tokens -> [Nq, 4, D]: the 2x2 block each query token (r, c) owns,
    ordered (2r,2c), (2r,2c+1), (2r+1,2c), (2r+1,2c+1)."""
    d = cond.shape[-1]
    return cond.reshape(ph // 2, 2, pw // 2, 2, d).permute(0, 2, 1, 3, 4).reshape(-1, 4, d)


class AttentionImpl(Protocol):
    """The attention steps of the DiT and decoder blocks; each returns what is added to the stream."""

    def self_attn(self, attn: Attention, x: torch.Tensor) -> torch.Tensor: ...

    def temporal_dit(self, blk: Block, x: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor) -> torch.Tensor: ...

    def decoder_self_attn(self, blk: Block, r: torch.Tensor, q: torch.Tensor) -> torch.Tensor: ...

    def temporal_dec(self, blk: Block, r: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor) -> torch.Tensor: ...


class ReferencePath:
    """The official computation, one step after the other."""

    def temporal_dit(self, blk: Block, x: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor) -> torch.Tensor:
        h = blk.norm_temp_attn(x).reshape(-1, 1, x.shape[-1])  # [B Nq, 1, D]
        sequence = torch.cat([c0, h, c1], dim=1)  # [B Nq, 9, D]; the query token is index 4
        return blk.temp_attn(sequence)[:, 4].reshape(x.shape)

    def self_attn(self, attn: Attention, x: torch.Tensor) -> torch.Tensor:
        return attn(x)

    def decoder_self_attn(self, blk: Block, r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        x = torch.cat([r, q], dim=1)
        x = x + blk.self_attn(blk.norm_self_attn(x))
        return x[:, : r.shape[1]]

    def temporal_dec(self, blk: Block, r: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor) -> torch.Tensor:
        sequence = torch.stack([c0, blk.norm_temp_attn(r).reshape(-1, r.shape[-1]), c1], dim=1)  # [B N, 3, D]
        return blk.temp_attn(sequence)[:, 1].reshape(r.shape)


def _heads(y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """[..., T, n, H, hd] projections -> n views [..., H, T, hd], the layout attention takes."""
    return tuple(t.transpose(-3, -2) for t in y.unbind(-3))


class FastPath:
    """Skips work whose result the reference discards or recomputes; exact up to float rounding.

    Only the query token's row of each temporal attention is computed (the reference attends over
    all 9 (DiT) or 3 (decoder) tokens and keeps one row); the condition tokens' keys and values
    do not depend on the latents, so they are projected once per pair and reused in both Euler
    steps; the decoder's self-attention computes query rows only for the tokens it keeps; all
    attention runs through ``scaled_dot_product_attention``, on views of the projections.
    """

    def __init__(self):
        self._slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _kv_slots(self, attn: Attention, cond: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [T, H, C+1, hd] of the [T, C, D] condition tokens, projected once per
        pair, with position ``at`` left for the token that changes every call."""
        key = id(attn)
        if key not in self._slots:
            t, c, _ = cond.shape
            kv = _heads(attn.project(cond, "kv"))  # 2 x [T, H, C, hd]
            slots = tuple(kv[0].new_empty(t, attn.num_heads, c + 1, kv[0].shape[-1]) for _ in kv)
            for slot, cond_part in zip(slots, kv):
                slot[:, :, :at] = cond_part[:, :, :at]
                slot[:, :, at + 1 :] = cond_part[:, :, at:]
            self._slots[key] = slots
        return self._slots[key]

    def _query_row(self, attn: Attention, h: torch.Tensor, cond: torch.Tensor, at: int) -> torch.Tensor:
        """Attention output of token ``h`` ([T, D]) placed at position ``at`` among ``cond``'s
        [T, C, D] tokens: [T, D]."""
        q, k, v = attn.project(h).unbind(-3)  # [T, H, hd] each
        keys, values = self._kv_slots(attn, cond, at)
        keys[:, :, at] = k
        values[:, :, at] = v
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values)  # [T, H, 1, hd]
        return attn.proj(out.flatten(1))

    def temporal_dit(self, blk: Block, x: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor) -> torch.Tensor:
        h = blk.norm_temp_attn(x).reshape(-1, x.shape[-1])
        return self._query_row(blk.temp_attn, h, torch.cat([c0, c1], dim=1), 4).reshape(x.shape)

    def self_attn(self, attn: Attention, x: torch.Tensor) -> torch.Tensor:
        return attn.output(F.scaled_dot_product_attention(*_heads(attn.project(x))))

    def decoder_self_attn(self, blk: Block, r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        attn, n = blk.self_attn, r.shape[1]
        h = blk.norm_self_attn(torch.cat([r, q], dim=1))
        (queries,) = _heads(attn.project(h[:, :n], "q"))
        keys, values = _heads(attn.project(h, "kv"))
        return r + attn.output(F.scaled_dot_product_attention(queries, keys, values))

    def temporal_dec(self, blk: Block, r: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor) -> torch.Tensor:
        h = blk.norm_temp_attn(r).reshape(-1, r.shape[-1])
        return self._query_row(blk.temp_attn, h, torch.stack([c0, c1], dim=1), 1).reshape(r.shape)


def attention_impl(path: AttentionPath) -> AttentionImpl:
    assert path in ("fast", "reference"), path
    return FastPath() if path == "fast" else ReferencePath()


class EdgeModel:
    """G_DiT and D_dec: :meth:`denoise` samples the latents, :meth:`decode_latents` turns them into pixels."""

    def __init__(
        self,
        weights: EdgeWeights,
        config: EdenConfig,
        device: str | torch.device = "cpu",
        precision: Precision = "fp32",
    ):
        assert precision in PRECISIONS, precision
        self.config = config
        self.device = torch.device(device)
        self.precision = precision
        self.weights = weights.to(self.device).eval()
        if precision == "bf16":
            # Matrix products in bf16; LayerNorm keeps float32 weights, since CPU autocast runs it
            # in the input's dtype and the residual stream is float32.
            for module in self.weights.modules():
                if isinstance(module, torch.nn.Linear):
                    module.to(torch.bfloat16)

    def _autocast(self):
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    @torch.inference_mode()
    def interpolate(self, cond: Conditions, path: AttentionPath = "fast") -> torch.Tensor:
        """Conditions -> the middle frame, [3, H, W] float32 in [0, 1] on the CPU."""
        return self.interpolate_batch([cond], path)[0]

    @torch.inference_mode()
    def interpolate_batch(self, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """Pairs of one frame size, in one batched forward -> their middle frames, [B, 3, H, W]."""
        return self.decode_latents(self.denoise(batch, path), batch, path)

    @torch.inference_mode()
    def denoise(self, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """G_DiT sampled with Euler on the flow from noise to the latents, then unscaled: [B, Nq, L]."""
        cfg, w = self.config, self.weights
        ph, pw = _same_grid(batch)
        impl = attention_impl(path)
        # Each query token's 2x2 block of condition tokens in frame 0 and frame 1: [B Nq, 4, D] each.
        c0, c1 = (torch.cat([query_blocks(c.cond_dit[i].to(self.device), ph, pw) for c in batch]) for i in (0, 1))
        difference = torch.tensor([[c.difference] for c in batch], device=self.device)  # [B, 1]
        pos = pos_embedding(cfg, ph, pw, 2).to(self.device)
        z = torch.cat([initial_noise(c.seed, (ph // 2) * (pw // 2), cfg) for c in batch]).to(self.device)
        with self._autocast():
            for t0, t1 in zip(cfg.timesteps[:-1], cfg.timesteps[1:]):
                t = torch.tensor([t0], device=self.device)
                c = w.denoise_timestep_embedder(t) + w.difference_embedder(difference)  # [B, D]
                shift1, scale1, gate1, shift2, scale2, gate2 = w.adaLN_modulation(c)[:, None].chunk(6, dim=-1)
                x = w.proj_in(z) + pos  # [B, Nq, D]
                for blk in w.dit_blocks:
                    x = x + gate1 * impl.self_attn(blk.self_attn, modulate(blk.norm_self_attn(x), shift1, scale1))
                    x = x + impl.temporal_dit(blk, x, c0, c1)
                    x = x + gate2 * blk.mlp(modulate(blk.norm_mlp(x), shift2, scale2))
                velocity = w.proj_out(w.norm_out(x))[..., : cfg.latent_dim]
                z = z + (t1 - t0) * velocity.float()
        return z / cfg.vae_scaler + cfg.vae_shift

    @torch.inference_mode()
    def decode_latents(self, latents: torch.Tensor, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """D_dec: latents and the decoder conditions -> pixels, de-normalised, cropped, clamped:
        [B, 3, H, W] float32 in [0, 1] on the CPU."""
        cfg, w = self.config, self.weights
        ph, pw = _same_grid(batch)
        p, b = cfg.patch_size, len(batch)
        impl = attention_impl(path)
        c0, c1 = (torch.cat([c.cond_dec[i].to(self.device) for c in batch]) for i in (0, 1))  # [B N, D] each
        with self._autocast():
            q = w.proj_token(latents)  # [B, Nq, D]
            grid = q.transpose(1, 2).reshape(b, cfg.hidden_dim, ph // 2, pw // 2)
            up = F.interpolate(grid, scale_factor=2, mode="bicubic", align_corners=False)
            r = up.flatten(2).transpose(1, 2) + pos_embedding(cfg, ph, pw, 1).to(self.device)  # [B, N, D]
            q = q + pos_embedding(cfg, ph, pw, 2).to(self.device)
            for blk in w.decoder_blocks:
                r = impl.decoder_self_attn(blk, r, q)
                r = r + impl.temporal_dec(blk, r, c0, c1)
                r = r + blk.mlp(blk.norm_mlp(r))
            patches = w.unpatchify(r).float()  # [B, N, 3 p^2], each patch (p1, p2, channel)
        image = patches.reshape(b, ph, pw, p, p, 3).permute(0, 5, 1, 3, 2, 4).reshape(b, 3, ph * p, pw * p)
        stats = torch.tensor([[c.mean, c.std] for c in batch], device=self.device)[:, :, None, None, None]
        image = image * stats[:, 1] + stats[:, 0]
        height, width = batch[0].size
        top, _, left, _ = cfg.padding(height, width)
        return image[:, :, top : top + height, left : left + width].clamp(0, 1).cpu()


def batches(items: Sequence, tokens_each: int, max_batch_tokens: int) -> Iterator[Sequence]:
    """``items`` (pairs of one size, ``tokens_each`` condition tokens per frame) in consecutive
    batches of at most ``max_batch_tokens`` tokens, and of at least one pair."""
    size = max(1, max_batch_tokens // tokens_each)
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _same_grid(batch: Sequence[Conditions]) -> tuple[int, int]:
    assert batch and all(c.grid == batch[0].grid and c.size == batch[0].size for c in batch), "one frame size per batch"
    return batch[0].grid
