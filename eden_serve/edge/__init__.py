"""The edge side: :class:`~eden_serve.wire.Conditions` -> the middle frame, with G_DiT and D_dec.

:class:`EdgeModel` prepares a batch of pairs of one frame size on the host (:meth:`~EdgeModel.prepare`),
runs the pure forward on its device (:meth:`~EdgeModel.forward`: :mod:`.forward`, run as
:mod:`.acceleration` says: eagerly, compiled, or replayed from CUDA graphs, :mod:`.graphs`), and the
middles come back after. Its blocks run through one of two paths that compute the same function
(:mod:`.paths`): the reference, step by step as the official code (always eager), and the fast path
(the default), which skips the work the reference discards or repeats and runs its arithmetic through
:mod:`.kernels`. :mod:`.precision` picks fp32 or bf16; :mod:`.sizing` the pairs per forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable, Iterator, Literal, Sequence

import torch

from ..config import EdenConfig
from ..model import EdgeWeights
from ..wire import Chunk, Conditions, Tokens
from . import sizing
from .acceleration import Acceleration, Compile, Runner
from .forward import (EdgeInputs, Regions, RenderInputs, SampleInputs, as_uint8, initial_noise, prepare, prepare_render,
                      prepare_sample, render, sample, to_host, upload)
from .graphs import GraphAPI
from .kernels import Linears, onednn_linear_available
from .paths import BlockPath, FastPath, ReferencePath
from .precision import PRECISIONS, Bf16Check, check_bf16, default_precision, resolve

AttentionPath = Literal["fast", "reference"]
Precision = Literal["fp32", "bf16", "auto"]

__all__ = ["PRECISIONS", "Acceleration", "AttentionPath", "Compile", "EdgeInputs", "EdgeModel", "Precision", "batches", "default_precision",
           "initial_noise", "synchronize", "to_host", "upload"]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work: CUDA kernels run after the call that launched them returns,
    so a timer read without this charges a stage's kernels to whichever stage waits next."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EdgeModel:
    """G_DiT and D_dec: :meth:`prepare` on the host, then :meth:`forward` on the device (its two
    stages :meth:`sample` and :meth:`render`), then :func:`to_host`. :meth:`middles` does all three;
    :meth:`interpolate_batch`, :meth:`denoise` and ``decode_*`` are the same steps for one call each."""

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
        self.timesteps = torch.tensor(config.timesteps, dtype=torch.float32).to(self.device)  # made once: the forward makes none
        # Condition tokens per batched forward where set (handler.max_batch_tokens); None: from the
        # device's free memory (:mod:`.sizing`), the pairs per frame size decided once.
        self.batch_tokens: int | None = sizing.default_batch_tokens(self.device)
        self._pairs: dict[tuple[int, int], int] = {}
        self.accelerate(Acceleration())

    def accelerate(self, acceleration: Acceleration, graph_api: GraphAPI | None = None) -> None:
        """Run the fast path's forward as ``acceleration`` says (graphs captured before are released,
        compilations under way dropped)."""
        old = getattr(self, "runner", None)
        if old is not None:
            old.close()
        self.acceleration = acceleration
        compile = acceleration.compiler(self.device)
        # Compiled, the products are the compiler's to choose: it cannot trace oneDNN on weights we
        # prepacked. Under a compilation in the background the eager forward runs torch's products too,
        # which the compiled one then replaces.
        onednn = compile is None and onednn_linear_available(self.device, self.dtype)
        self.linears = Linears("onednn" if onednn else "torch")
        self.paths: dict[str, BlockPath] = {"fast": FastPath(self.linears, self.dtype), "reference": ReferencePath()}
        stages = {"sample": self._sample, "render": self._render, "render_uint8": self._render_uint8}
        self.runner = Runner(acceleration, self.device, stages, compile and self._compiled(stages, compile), graph_api)

    def _compiled(self, stages: dict[str, Callable], compile: Compile) -> dict[str, Callable]:
        """The stages under ``torch.compile``: each whole, or (scope ``blocks``) through the fast
        path's regions compiled one by one, the block functions once for all their blocks."""
        if compile.scope == "stages":
            return {name: compile.wrap(stage) for name, stage in stages.items()}
        regions = Regions.of(self.paths["fast"]).compiled(compile.wrap)

        def render(inputs: RenderInputs) -> torch.Tensor:
            return self._render(inputs, regions=regions)

        return {"sample": functools.partial(self._sample, regions=regions), "render": render,
                "render_uint8": lambda inputs: as_uint8(render(inputs))}

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

    def pairs_per_forward(self, grid: tuple[int, int]) -> int:
        """How many pairs of ``grid`` one batched forward takes here (:mod:`.sizing`)."""
        tokens = grid[0] * grid[1]
        if self.batch_tokens is not None:
            return max(1, self.batch_tokens // tokens)
        if grid not in self._pairs:
            self._pairs[grid] = sizing.pairs_for_memory(sizing.free_memory(self.device), self.config, grid)
        return self._pairs[grid]

    def batched(self, items: Sequence, grid: tuple[int, int]) -> Iterator[Sequence]:
        """``items`` (pairs of ``grid``) in consecutive batches of :meth:`pairs_per_forward`."""
        return batches(items, 1, self.pairs_per_forward(grid))

    def warm_up(self) -> None:
        """One pair of the smallest frames (a 2 x 2 patch grid) through the DiT and the decoder at
        load, eagerly (no graph kept for it): on a GPU the lazy set-up (context, cuBLAS handles,
        kernels) then happens before the first request, and a GPU that cannot run the model fails
        the load, not a request."""
        side = self.config.pad_multiple
        tokens = torch.zeros(2, 4, self.config.hidden_dim, device=self.device)
        inputs = self.prepare([Conditions(tokens, tokens, 0.5, 0.25, 0.0, (2, 2), (side, side))])
        with torch.inference_mode():
            latents = self._sample(inputs.sample)
            to_host(as_uint8(self._render(dataclasses.replace(inputs.render, latents=latents))))

    def _autocast(self):
        if self.precision != "bf16":
            return contextlib.nullcontext()
        # No cache of cast weights: a captured graph must not read a cast freed when the context exits.
        return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=False)

    # --- the forward: prepared inputs -> middles on the device ---------------------------------

    def prepare(self, batch: Sequence[Conditions]) -> EdgeInputs:
        """The host's part of a forward of ``batch`` (pairs of one frame size): :func:`.forward.prepare`."""
        return prepare(batch, self.config, self.device, self.timesteps)

    @torch.inference_mode()
    def forward(self, inputs: EdgeInputs, uint8: bool = True) -> torch.Tensor:
        """The pure forward on the fast path: prepared inputs -> the middles on this model's device,
        [B, H, W, 3] uint8, or [B, 3, H, W] float32 in [0, 1]. No host work inside."""
        return self.render(self.sample(inputs), inputs, uint8=uint8)

    @torch.inference_mode()
    def sample(self, inputs: EdgeInputs | SampleInputs, path: AttentionPath = "fast") -> torch.Tensor:
        """G_DiT: the latents [B, Nq, L] on the device."""
        stage = inputs.sample if isinstance(inputs, EdgeInputs) else inputs
        if path == "fast":
            return self.runner("sample", stage)
        return self._sample(stage, self._path(path))

    @torch.inference_mode()
    def render(self, latents: torch.Tensor, inputs: EdgeInputs | RenderInputs, path: AttentionPath = "fast",
               uint8: bool = False) -> torch.Tensor:
        """D_dec: the middles on the device, [B, 3, H, W] float32 in [0, 1] (or as :meth:`forward`'s ``uint8``)."""
        stage = dataclasses.replace(inputs.render if isinstance(inputs, EdgeInputs) else inputs, latents=latents)
        if path == "fast":
            return self.runner("render_uint8" if uint8 else "render", stage)
        pixels = self._render(stage, self._path(path))
        return as_uint8(pixels) if uint8 else pixels

    def _sample(self, inputs: SampleInputs, impl: BlockPath | None = None, regions: Regions | None = None) -> torch.Tensor:
        with self._autocast():
            return sample(self.weights, self.config, impl or self.paths["fast"], inputs, regions)

    def _render(self, inputs: RenderInputs, impl: BlockPath | None = None, regions: Regions | None = None) -> torch.Tensor:
        with self._autocast():
            return render(self.weights, self.config, impl or self.paths["fast"], inputs, regions)

    def _render_uint8(self, inputs: RenderInputs) -> torch.Tensor:
        return as_uint8(self._render(inputs))

    def _path(self, path: AttentionPath) -> BlockPath:
        assert path in self.paths, path
        return self.paths[path]

    # --- whole calls: prepare, forward, copy back ----------------------------------------------

    def middles(self, batch: Sequence[Conditions], uint8: bool = True) -> torch.Tensor:
        """Pairs of one frame size -> their middles on the CPU, as :meth:`forward` gives them."""
        return to_host(self.forward(self.prepare(batch), uint8))

    @torch.inference_mode()
    def interpolate(self, cond: Conditions, path: AttentionPath = "fast") -> torch.Tensor:
        """Conditions -> the middle frame, [3, H, W] float32 in [0, 1] on the CPU."""
        return self.interpolate_batch([cond], path)[0]

    @torch.inference_mode()
    def interpolate_batch(self, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """Pairs of one frame size, in one batched forward -> their middle frames, [B, 3, H, W] on the CPU."""
        inputs = self.prepare(batch)
        return to_host(self.render(self.sample(inputs, path), inputs, path))

    @torch.inference_mode()
    def denoise(self, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """G_DiT sampled with Euler on the flow from noise to the latents, then unscaled: [B, Nq, L]."""
        return self.sample(prepare_sample(batch, self.config, self.device, self.timesteps), path)

    @torch.inference_mode()
    def decode_latents(self, latents: torch.Tensor, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """D_dec: latents and the decoder conditions -> pixels, de-normalised, cropped, clamped:
        [B, 3, H, W] float32 in [0, 1] on the CPU."""
        return to_host(self.decode_on_device(latents, batch, path))

    @torch.inference_mode()
    def decode_uint8(self, latents: torch.Tensor, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """:meth:`decode_latents` as 8-bit pixels, [B, H, W, 3] uint8 on the CPU: the rounding of
        :func:`~eden_serve.media.frames.to_uint8` done on the device, so a quarter of the bytes come back."""
        return to_host(self.render(latents, prepare_render(batch, self.config, self.device), path, uint8=True))

    @torch.inference_mode()
    def decode_on_device(self, latents: torch.Tensor, batch: Sequence[Conditions], path: AttentionPath = "fast") -> torch.Tensor:
        """:meth:`decode_latents` on this model's device."""
        return self.render(latents, prepare_render(batch, self.config, self.device), path)


def batches(items: Sequence, tokens_each: int, max_batch_tokens: int) -> Iterator[Sequence]:
    """``items`` (pairs of one size, ``tokens_each`` condition tokens per frame) in consecutive
    batches of at most ``max_batch_tokens`` tokens, and of at least one pair."""
    size = max(1, max_batch_tokens // tokens_each)
    for start in range(0, len(items), size):
        yield items[start : start + size]


def earliest_first(chunks: Sequence, firsts: Sequence[int]) -> list[int]:
    """The requests of one worker call (indices into ``chunks``: each a wire Chunk or what else
    states its pairs' ``seeds``, or the refusal that failed it) in the order to compute their pairs:
    by the seed of the first pair each asks for
    (``firsts``). A client gives pair i of a clip the seed base + i, so a clip's chunks queued behind
    a busy worker run in the clip's order, not in the order their payloads happened to arrive:
    otherwise a first chunk that arrives last waits for the pairs of all the others
    (docs/streaming.md, "Where the first middle's time went"). Refusals come first (they cost nothing)."""

    def key(idx: int) -> int:
        seeds = getattr(chunks[idx], "seeds", None)
        # A request from first = pairs asks for the end record alone (docs/streaming.md): its last seed will do.
        return seeds[min(firsts[idx], len(seeds) - 1)] if seeds else -1

    return sorted(range(len(chunks)), key=key)

