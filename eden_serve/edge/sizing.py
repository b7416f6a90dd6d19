"""Pairs per batched forward: a token budget on a CPU, the free memory on a GPU.

On a CPU, batching pays only where a pair's products are too thin to keep the cores busy: measured
at 136x240 and 256x448 it gains, at 480x854 a batch's attention outgrows the caches and it loses
(docs/performance.md "Clip chunks"). On a GPU a pair leaves most of the device idle (docs/gpu.md:
at 1080p a batch of 4 ran 1.7x faster per pair than a batch of 2), so a forward takes as many pairs
as its memory holds, within a cap.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from ..config import EdenConfig

# Condition tokens (one frame's per pair) per batched forward on a CPU: 6 pairs at 136x240, 2 at
# 256x448, 1 at 480x854 with the official patch grid.
CPU_BATCH_TOKENS = 1024
# A pair's memory at its peak, in float32 rows of hidden_dim per condition token, estimated from the
# tensors alive in the decoder's blocks (its widest part): the two frames' DiT and decoder tokens (4)
# and a graph's static copies of them (4), the stacked condition tokens (4), the self-attention's
# inputs, projections and output (about 6), the MLP's hidden tokens before and after the GELU (8).
# benchmarks/gpu_check.py measures the peak per pair, to check it.
ACTIVATION_ROWS = 26
MEMORY_SHARE = 0.5  # of the free memory, for a forward's activations: the rest for graphs, the allocator's slack
MAX_PAIRS = 16  # measured to still pay at 480x854 (8.0 ms/pair at 16 against 11.5 at 8; docs/gpu.md)
MAX_TOKENS = 1 << 16  # condition tokens per forward: 8 pairs of 1080p (8160 each)


def default_batch_tokens(device: torch.device) -> int | None:
    """The condition tokens per forward on ``device`` unless set (handler.max_batch_tokens); None:
    from the free memory, :func:`pairs_for_memory`."""
    return None if device.type == "cuda" else CPU_BATCH_TOKENS


def bytes_per_pair(config: EdenConfig, grid: tuple[int, int]) -> int:
    return ACTIVATION_ROWS * grid[0] * grid[1] * config.hidden_dim * 4


def pairs_for_memory(free_bytes: int, config: EdenConfig, grid: tuple[int, int]) -> int:
    """Pairs of ``grid`` per forward within ``free_bytes``: a share of it, at most the caps, at
    least one, and a power of two (a CUDA graph's batch: :func:`~.acceleration.bucket`)."""
    fit = int(free_bytes * MEMORY_SHARE) // bytes_per_pair(config, grid)
    pairs = max(1, min(fit, MAX_PAIRS, MAX_TOKENS // (grid[0] * grid[1])))
    return 1 << (pairs.bit_length() - 1)


def free_memory(device: torch.device) -> int:
    """Bytes a forward can still take on a CUDA device: the device's free memory and what
    PyTorch's caching allocator holds unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def batches(items: Sequence, tokens_each: int, max_batch_tokens: int) -> Iterator[Sequence]:
    """``items`` (pairs of one size, ``tokens_each`` condition tokens per frame) in consecutive
    batches of at most ``max_batch_tokens`` tokens, and of at least one pair."""
    size = max(1, max_batch_tokens // tokens_each)
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Sizing:
    """How many pairs of a patch grid one forward on ``device`` takes: ``batch_tokens`` condition
    tokens where set (handler.max_batch_tokens; a CPU's default), else as many as the device's free
    memory holds, decided once per grid."""

    def __init__(self, device: torch.device, config: EdenConfig):
        self.device, self.config = device, config
        self.batch_tokens: int | None = default_batch_tokens(device)
        self._pairs: dict[tuple[int, int], int] = {}

    def pairs(self, grid: tuple[int, int]) -> int:
        """Pairs of ``grid`` per forward."""
        if self.batch_tokens is not None:
            return max(1, self.batch_tokens // (grid[0] * grid[1]))
        if grid not in self._pairs:
            self._pairs[grid] = pairs_for_memory(free_memory(self.device), self.config, grid)
        return self._pairs[grid]

    def batches(self, items: Sequence, grid: tuple[int, int]) -> Iterator[Sequence]:
        """``items`` (pairs of ``grid``) in consecutive forwards of :meth:`pairs` each."""
        return batches(items, 1, self.pairs(grid))
