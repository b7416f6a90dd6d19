"""E_cond, the condition encoder: consecutive frames -> their condition tokens and statistics.

Pad to whole query patches, normalise each frame by its own statistics, embed patches twice (one
embedding for the DiT, one for the decoder), add positions, LayerNorm. The cloud runs it
(:mod:`eden_serve.cloud.encoder`), and the edge runs it again on the frames that the frames and
bitstream kinds carry (:mod:`eden_serve.edge.conditions`): the same weights, frames and threads
give the same tokens bit for bit, which :func:`weights_digest` lets the two sides check.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F

from ..config import EdenConfig
from .weights import CloudWeights, pos_embedding

# Tokens per batched patch embedding (see embed_frames): 8192 x 768 float32 is 25 MB.
EMBED_TOKENS = 8192


def pad_frames(frames: torch.Tensor, config: EdenConfig) -> torch.Tensor:
    """[B, 3, H, W] -> [B, 3, H_pad, W_pad], replicating the border."""
    top, bottom, left, right = config.padding(*frames.shape[-2:])
    return F.pad(frames, (left, right, top, bottom), mode="replicate")


def embed_frames(weights: CloudWeights, config: EdenConfig,
                 x: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[float], list[float]]:
    """F frames [3, H, W] in [0, 1], on the weights' device -> their tokens [F, N, D] for the DiT and
    for the decoder, there, and each frame's normalisation statistics (mean, std)."""
    device = x[0].device
    ph, pw = config.patch_grid(*x[0].shape[-2:])
    pos = pos_embedding(config, ph, pw, 1, device)
    cond_dit = torch.empty(len(x), ph * pw, config.hidden_dim, device=device)
    cond_dec = torch.empty_like(cond_dit)
    means, stds = [], []
    # Frames go through in groups of at most EMBED_TOKENS tokens: each intermediate then stays
    # under glibc's 32 MB mmap ceiling and is reused from the heap, rather than mapped and
    # faulted in afresh for every chunk (which cost a long chunk a third more time per frame).
    step = max(1, EMBED_TOKENS // (ph * pw))
    w = weights
    for start in range(0, len(x), step):
        padded = pad_frames(torch.stack(x[start : start + step]), config)
        mean = padded.mean(dim=(1, 2, 3), keepdim=True)
        std = padded.std(dim=(1, 2, 3), keepdim=True) + 1e-8
        patches = _patches(padded.sub_(mean).div_(std), config.patch_size)
        for conv, norm, out in ((w.patch_cond_dit, w.norm_cond_dit, cond_dit), (w.patch_cond_dec, w.norm_cond_dec, cond_dec)):
            out[start : start + step] = norm(_embed(conv, patches).add_(pos))
        means += mean.flatten().tolist()
        stds += std.flatten().tolist()
    return cond_dit, cond_dec, means, stds


def _patches(frames: torch.Tensor, p: int) -> torch.Tensor:
    """[B, 3, H, W] -> [B, N, 3 p p]: non-overlapping patches, row-major, in the conv's order."""
    b, c, h, w = frames.shape
    patches = frames.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(b, (h // p) * (w // p), c * p * p)


def _embed(conv: torch.nn.Conv2d, patches: torch.Tensor) -> torch.Tensor:
    # A stride-p conv with a p x p kernel is one matrix product over the patches, which the CPU
    # runs several times faster than its convolution kernel for this shape.
    return F.linear(patches, conv.weight.flatten(1), conv.bias)


def weights_digest(weights: CloudWeights) -> str:
    """SHA-256 of E_cond's weights (names, shapes and float32 values), which a frames payload names."""
    hasher = hashlib.sha256()
    for name, value in sorted(weights.state_dict().items()):
        hasher.update(f"{name}:{tuple(value.shape)}:".encode())
        hasher.update(value.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return hasher.hexdigest()
