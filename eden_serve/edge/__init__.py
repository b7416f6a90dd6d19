"""The edge side: :class:`~eden_serve.wire.Conditions` -> the middle frame, with G_DiT and D_dec.

One way in, as gpt-fast has one forward: :class:`EdgeModel` prepares a batch of pairs of one frame
size on the host (:meth:`~EdgeModel.prepare`), runs the pure forward on its device
(:meth:`~EdgeModel.forward`: :mod:`.forward`, run as :mod:`.acceleration` says: eagerly, compiled,
or replayed from CUDA graphs, :mod:`.graphs`), and copies the middles back
(:meth:`~EdgeModel.to_host`); :meth:`~EdgeModel.accelerate` and :meth:`~EdgeModel.warm_up` set it
up. A :class:`~.forward.StageClock` given to the forward times its stages; :mod:`.sizing` says how
many pairs one forward takes. Its blocks run through one of two paths that compute the same function
(:mod:`.paths`): the reference, step by step as the official code (always eager: the oracle the
tests compare with), and the fast path (the default), which skips the work the reference discards
or repeats and runs its arithmetic through :mod:`.kernels`. :mod:`.precision` picks fp32 or bf16.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable, Literal, Sequence

import torch

from ..config import EdenConfig
from ..model.weights import EdgeWeights
from ..wire import Conditions
from .acceleration import Acceleration, Compile, Runner
from .blocks import BlockPath, FastPath, ReferencePath
from .forward import (EdgeInputs, Regions, RenderInputs, SampleInputs, StageClock, as_uint8, initial_noise, prepare, render,
                      sample, to_host, upload)
from .graphs import GraphAPI
from .kernels import Linears, onednn_linear_available
from .precision import PRECISIONS, Bf16Check, check_bf16, default_precision, resolve
from .sizing import Sizing
from .streams import capture_gate, indexed

AttentionPath = Literal["fast", "reference"]
Precision = Literal["fp32", "bf16", "auto"]

__all__ = ["PRECISIONS", "Acceleration", "AttentionPath", "Compile", "EdgeInputs", "EdgeModel", "Precision", "StageClock",
           "default_precision", "initial_noise", "middles_of", "synchronize", "upload"]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work: CUDA kernels run after the call that launched them returns,
    so a timer read without this charges a stage's kernels to whichever stage waits next."""
    if device.type == "cuda":
        with capture_gate(device).shared():  # a wait for the whole device fails while a graph is captured
            torch.cuda.synchronize(device)


class EdgeModel:
    """G_DiT and D_dec: :meth:`prepare` on the host, then :meth:`forward` on the device (G_DiT's
    sampling, then D_dec's rendering), then :meth:`to_host`; :func:`middles_of` does the three in turn.
    ``sizing``: the pairs one forward takes (:class:`~.sizing.Sizing`)."""

    def __init__(
        self,
        weights: EdgeWeights,
        config: EdenConfig,
        device: str | torch.device = "cpu",
        precision: Precision = "fp32",
        bf16_check: Callable[[torch.device], Bf16Check] = check_bf16,
    ):
        self.config = config
        self.device = indexed(device)
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
        self.sizing = Sizing(self.device, config, self.precision)
        self.accelerate(Acceleration())

    # --- set-up --------------------------------------------------------------------------------

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
            self.to_host(as_uint8(self._render(dataclasses.replace(inputs.render, latents=latents))))

    def _autocast(self):
        if self.precision != "bf16":
            return contextlib.nullcontext()
        # No cache of cast weights: a captured graph must not read a cast freed when the context exits.
        return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=False)

    # --- prepare -> forward -> to host ---------------------------------------------------------

    def prepare(self, batch: Sequence[Conditions]) -> EdgeInputs:
        """The host's part of a forward of ``batch`` (pairs of one frame size): :func:`.forward.prepare`."""
        return prepare(batch, self.config, self.device, self.timesteps)

    @torch.inference_mode()
    def forward(self, inputs: EdgeInputs, uint8: bool = True, path: AttentionPath = "fast",
                clock: StageClock | None = None) -> torch.Tensor:
        """The pure forward: prepared inputs -> the middles on this model's device, [B, H, W, 3]
        uint8, or [B, 3, H, W] float32 in [0, 1]. No host work inside. The fast path runs through
        the runner (:attr:`acceleration`); the reference path, step by step and eagerly. ``clock``
        is marked as each stage ends: ``denoise`` (G_DiT), then ``decode`` (D_dec)."""
        latents = self._stage("sample", inputs.sample, path)
        if clock is not None:
            clock.mark("denoise")
        pixels = self._stage("render_uint8" if uint8 else "render", dataclasses.replace(inputs.render, latents=latents), path)
        if clock is not None:
            clock.mark("decode")
        return pixels

    def to_host(self, middles: torch.Tensor) -> torch.Tensor:
        """The forward's ``middles`` on the CPU (:func:`.forward.to_host`: from a GPU in one copy)."""
        return to_host(middles)

    def _stage(self, name: str, inputs: SampleInputs | RenderInputs, path: AttentionPath) -> torch.Tensor:
        if path == "fast":
            return self.runner(name, inputs)
        assert path in self.paths, path
        impl = self.paths[path]
        if name == "sample":
            return self._sample(inputs, impl)
        pixels = self._render(inputs, impl)
        return as_uint8(pixels) if name == "render_uint8" else pixels

    def _sample(self, inputs: SampleInputs, impl: BlockPath | None = None, regions: Regions | None = None) -> torch.Tensor:
        with self._autocast():
            return sample(self.weights, self.config, impl or self.paths["fast"], inputs, regions)

    def _render(self, inputs: RenderInputs, impl: BlockPath | None = None, regions: Regions | None = None) -> torch.Tensor:
        with self._autocast():
            return render(self.weights, self.config, impl or self.paths["fast"], inputs, regions)

    def _render_uint8(self, inputs: RenderInputs) -> torch.Tensor:
        return as_uint8(self._render(inputs))


def middles_of(model: EdgeModel, batch: Sequence[Conditions], uint8: bool = True, path: AttentionPath = "fast") -> torch.Tensor:
    """Pairs of one frame size -> their middles on the host: ``model``'s prepare, forward and to host in turn."""
    return model.to_host(model.forward(model.prepare(batch), uint8, path))
