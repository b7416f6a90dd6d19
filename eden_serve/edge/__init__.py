"""The edge side: :class:`~eden_serve.wire.Conditions` -> the middle frame, with G_DiT and D_dec.

:class:`EdgeModel` samples the latents (:meth:`~EdgeModel.denoise`) and turns them into pixels
(:meth:`~EdgeModel.decode_latents`) for a batch of pairs of one frame size at a time. Its blocks run
through one of two paths that compute the same function (:mod:`.paths`): the reference, step by step
as the official code, and the fast path (the default), which skips the work the reference discards
or repeats and runs its arithmetic through :mod:`.kernels`. :mod:`.precision` picks fp32 or bf16.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator, Literal, Sequence

import torch
import torch.nn.functional as F

from ..config import EdenConfig
from ..model import EdgeWeights, pos_embedding
from ..wire import Chunk, Conditions, Tokens
from .kernels import Linears, onednn_linear_available
from .paths import BlockPath, FastPath, ReferencePath, query_blocks
from .precision import PRECISIONS, Bf16Check, check_bf16, resolve

AttentionPath = Literal["fast", "reference"]
Precision = Literal["fp32", "bf16", "auto"]
# Condition tokens (one frame's per pair) per batched forward, by device type. A batch's activations
# grow with it. On a CPU, batching pays only where a pair's products are too thin to keep the cores
# busy: measured at 136x240 and 256x448 it gains, at 480x854 a batch's attention outgrows the caches
# and it loses (docs/performance.md "Clip chunks"); 1024 tokens is 6 pairs at 136x240, 2 at 256x448, 1 at 480p.
BATCH_TOKENS = {"cpu": 1024, "cuda": 16384}

__all__ = ["BATCH_TOKENS", "PRECISIONS", "AttentionPath", "EdgeModel", "Precision", "batches", "initial_noise", "synchronize",
           "upload"]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work: CUDA kernels run after the call that launched them returns,
    so a timer read without this charges a stage's kernels to whichever stage waits next."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def upload(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` in its own dtype; to a GPU from page-locked memory, without
    waiting for the copy (later kernels on the stream are ordered after it)."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def initial_noise(seed: int, num_tokens: int, config: EdenConfig) -> torch.Tensor:
    """The contract for reproducibility: drawn on the CPU from a seeded generator, moved later."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((1, num_tokens, config.latent_dim), generator=generator)


class EdgeModel:
    """G_DiT and D_dec: :meth:`denoise` samples the latents, :meth:`decode_latents` turns them into pixels."""

    def __init__(
        self,
        weights: EdgeWeights,
        config: EdenConfig,
        device: str | torch.device = "cpu",
        precision: Precision = "fp32",
        bf16_check: Callable[[torch.device], Bf16Check] = check_bf16,
    ):
        self.config = config
        self.device = torch.device(device)
        # The precision that runs (auto resolved) and why, for logs and the bench.
        self.precision, self.precision_reason = resolve(precision, self.device, bf16_check)
        self.weights = weights.to(self.device).eval()
        if self.precision == "bf16":
            # Matrix products in bf16; LayerNorm keeps float32 weights, since CPU autocast runs it
            # in the input's dtype and the residual stream is float32.
            for module in self.weights.modules():
                if isinstance(module, torch.nn.Linear):
                    module.to(torch.bfloat16)
        self.dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32  # of the matrix products
        self.linears = Linears("onednn" if onednn_linear_available(self.device, self.dtype) else "torch")
        # Condition tokens per batched forward unless a caller sets its own (handler.max_batch_tokens).
        self.batch_tokens = BATCH_TOKENS.get(self.device.type, BATCH_TOKENS["cuda"])

    def receive(self, chunk: Chunk) -> Chunk:
        """``chunk`` with its tokens on this model's device, in their wire dtype (bf16 or int8 move
        half or a quarter of float32's bytes): each frame crosses once, where its pairs would carry it
        twice, and :meth:`Chunk.pair` then converts them on the device."""
        if self.device.type == "cpu":
            return chunk

        def moved(tokens: Tokens) -> Tokens:
            return Tokens(*(None if t is None else upload(t, self.device) for t in tokens))

        return dataclasses.replace(chunk, cond_dit=moved(chunk.cond_dit), cond_dec=moved(chunk.cond_dec))

    def synchronize(self) -> None:
        synchronize(self.device)

    def warm_up(self) -> None:
        """One pair of the smallest frames (a 2 x 2 patch grid) through the DiT and the decoder at
        load: on a GPU the lazy set-up (context, cuBLAS handles, kernels) then happens before the
        first request, and a GPU that cannot run the model fails the load, not a request."""
        side = self.config.pad_multiple
        tokens = torch.zeros(2, 4, self.config.hidden_dim, device=self.device)
        pair = Conditions(tokens, tokens, 0.5, 0.25, 0.0, (2, 2), (side, side))
        self.decode_uint8(self.denoise([pair]), [pair])
        self.synchronize()

    def _path(self, path: AttentionPath) -> BlockPath:
        assert path in ("fast", "reference"), path
        return FastPath(self.linears, self.dtype) if path == "fast" else ReferencePath()

    def _autocast(self):
        if self.precision != "bf16":
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
        impl = self._path(path)
        # Each query token's 2x2 block of condition tokens in frame 0 and frame 1: [B Nq, 4, D] each.
        c0, c1 = (torch.cat([query_blocks(c.cond_dit[i].to(self.device), ph, pw) for c in batch]) for i in (0, 1))
        difference = torch.tensor([[c.difference] for c in batch], device=self.device)  # [B, 1]
        pos = pos_embedding(cfg, ph, pw, 2, self.device)
        z = upload(torch.cat([initial_noise(c.seed, (ph // 2) * (pw // 2), cfg) for c in batch]), self.device)
        with self._autocast():
            for t0, t1 in zip(cfg.timesteps[:-1], cfg.timesteps[1:]):
                t = torch.tensor([t0], device=self.device)
                c = w.denoise_timestep_embedder(t) + w.difference_embedder(difference)  # [B, D]
                mods = w.adaLN_modulation(c)[:, None].chunk(6, dim=-1)  # shift, scale, gate; twice: [B, 1, D] each
                x = w.proj_in(z) + pos  # [B, Nq, D]
                for blk in w.dit_blocks:
                    x = impl.dit_block(blk, x, mods, c0, c1)
                velocity = w.proj_out(w.norm_out(x))[..., : cfg.latent_dim]
                z = z + (t1 - t0) * velocity.float()
        return z / cfg.vae_scaler + cfg.vae_shift

    @torch.inference_mode()
    def decode_latents(self, latents: torch.Tensor, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """D_dec: latents and the decoder conditions -> pixels, de-normalised, cropped, clamped:
        [B, 3, H, W] float32 in [0, 1] on the CPU."""
        return self.decode_on_device(latents, batch, path).cpu()

    @torch.inference_mode()
    def decode_uint8(self, latents: torch.Tensor, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """:meth:`decode_latents` as 8-bit pixels, [B, H, W, 3] uint8 on the CPU: the rounding of
        :func:`~eden_serve.media.frames.to_uint8` done on the device, so a quarter of the bytes come back."""
        pixels = self.decode_on_device(latents, batch, path).mul_(255).round_().to(torch.uint8)
        return pixels.permute(0, 2, 3, 1).contiguous().cpu()

    @torch.inference_mode()
    def decode_on_device(self, latents: torch.Tensor, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """:meth:`decode_latents` on this model's device."""
        cfg, w = self.config, self.weights
        ph, pw = _same_grid(batch)
        p, b = cfg.patch_size, len(batch)
        impl = self._path(path)
        c0, c1 = (torch.cat([c.cond_dec[i].to(self.device) for c in batch]) for i in (0, 1))  # [B N, D] each
        with self._autocast():
            q = w.proj_token(latents)  # [B, Nq, D]
            grid = q.transpose(1, 2).reshape(b, cfg.hidden_dim, ph // 2, pw // 2)
            up = F.interpolate(grid, scale_factor=2, mode="bicubic", align_corners=False)
            r = up.flatten(2).transpose(1, 2) + pos_embedding(cfg, ph, pw, 1, self.device)  # [B, N, D]
            q = q + pos_embedding(cfg, ph, pw, 2, self.device)
            for blk in w.decoder_blocks:
                r = impl.decoder_block(blk, r, q, c0, c1)
            patches = w.unpatchify(r).float()  # [B, N, 3 p^2], each patch (p1, p2, channel)
        image = patches.reshape(b, ph, pw, p, p, 3).permute(0, 5, 1, 3, 2, 4).reshape(b, 3, ph * p, pw * p)
        stats = torch.tensor([[c.mean, c.std] for c in batch], device=self.device)[:, :, None, None, None]
        image = image * stats[:, 1] + stats[:, 0]
        height, width = batch[0].size
        top, _, left, _ = cfg.padding(height, width)
        return image[:, :, top : top + height, left : left + width].clamp(0, 1)


def batches(items: Sequence, tokens_each: int, max_batch_tokens: int) -> Iterator[Sequence]:
    """``items`` (pairs of one size, ``tokens_each`` condition tokens per frame) in consecutive
    batches of at most ``max_batch_tokens`` tokens, and of at least one pair."""
    size = max(1, max_batch_tokens // tokens_each)
    for start in range(0, len(items), size):
        yield items[start : start + size]


def earliest_first(chunks: Sequence, firsts: Sequence[int]) -> list[int]:
    """The requests of one worker call (indices into ``chunks``, each a wire Chunk or the refusal
    that failed it) in the order to compute their pairs: by the seed of the first pair each asks for
    (``firsts``). A client gives pair i of a clip the seed base + i, so a clip's chunks queued behind
    a busy worker run in the clip's order, not in the order their payloads happened to arrive:
    otherwise a first chunk that arrives last waits for the pairs of all the others
    (docs/streaming.md, "Where the first middle's time went"). Refusals come first (they cost nothing)."""

    def key(idx: int) -> int:
        chunk = chunks[idx]
        # A request from first = pairs asks for the end record alone (docs/streaming.md): its last seed will do.
        return chunk.seeds[min(firsts[idx], chunk.pairs - 1)] if isinstance(chunk, Chunk) else -1

    return sorted(range(len(chunks)), key=key)


def _same_grid(batch: Sequence[Conditions]) -> tuple[int, int]:
    assert batch and all(c.grid == batch[0].grid and c.size == batch[0].size for c in batch), "one frame size per batch"
    return batch[0].grid
