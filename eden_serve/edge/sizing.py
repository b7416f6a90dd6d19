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
# In bf16: the H100's eager peak per pair at 1080p was 315 MiB in bf16 against 527 in fp32
# (docs/gpu.md), 0.6 of it; 26 rows came to 1.2 times the fp32 peak, 16 come to 1.2 times bf16's.
BF16_ACTIVATION_ROWS = 16
MEMORY_SHARE = 0.5  # of the free memory, for the forwards' activations: the rest for graphs, the allocator's slack
MAX_PAIRS = 16  # measured to still pay at 480x854 (8.0 ms/pair at 16 against 11.5 at 8; docs/gpu.md)
MAX_TOKENS = 1 << 16  # condition tokens per forward: 8 pairs of 1080p (8160 each)


def default_batch_tokens(device: torch.device) -> int | None:
    """The condition tokens per forward on ``device`` unless set (handler.max_batch_tokens); None:
    from the free memory, :func:`pairs_for_memory`."""
    return None if device.type == "cuda" else CPU_BATCH_TOKENS


def bytes_per_pair(config: EdenConfig, grid: tuple[int, int], precision: str = "fp32") -> int:
    rows = BF16_ACTIVATION_ROWS if precision == "bf16" else ACTIVATION_ROWS
    return rows * grid[0] * grid[1] * config.hidden_dim * 4


def pairs_for_memory(free_bytes: int, config: EdenConfig, grid: tuple[int, int], precision: str = "fp32", forwards: int = 1) -> int:
    """Pairs of ``grid`` per forward within ``free_bytes``: a share of it for ``forwards`` forwards
    at once (each its own activations), at most the caps, at least one, and a power of two (a CUDA
    graph's batch: :func:`~.acceleration.bucket`)."""
    fit = int(free_bytes * MEMORY_SHARE) // forwards // bytes_per_pair(config, grid, precision)
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
    memory holds for ``forwards`` forwards at once in ``precision``, decided once per grid.

    ``forwards``: a served edge runs one forward at a time; a clip in process as many as it has
    chunks in flight (3 on a GPU), each uncaptured until its key's graph is (and a key met once or
    twice never is), so each needs its own activations. Counted as one, a 16 GB card in fp32 (a T4,
    a V100) took 8 pairs of 1080p, three forwards of which need about 12.6 GB of its 14.5 free beside
    their graph's pool."""

    def __init__(self, device: torch.device, config: EdenConfig, precision: str = "fp32"):
        self.device, self.config, self.precision = device, config, precision
        self.batch_tokens: int | None = default_batch_tokens(device)
        self.forwards = 1
        self._pairs: dict[tuple[tuple[int, int], int], int] = {}

    def pairs(self, grid: tuple[int, int]) -> int:
        """Pairs of ``grid`` per forward."""
        if self.batch_tokens is not None:
            return max(1, self.batch_tokens // (grid[0] * grid[1]))
        if (grid, self.forwards) not in self._pairs:
            self._pairs[grid, self.forwards] = pairs_for_memory(free_memory(self.device), self.config, grid, self.precision,
                                                                self.forwards)
        return self._pairs[grid, self.forwards]

    def batches(self, items: Sequence, grid: tuple[int, int]) -> Iterator[Sequence]:
        """``items`` (pairs of ``grid``) in consecutive forwards of :meth:`pairs` each."""
        return batches(items, 1, self.pairs(grid))
