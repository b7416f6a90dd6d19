"""The edge's forward as functions of device tensors of fixed shape: what a CUDA graph captures and
``torch.compile`` traces.

:func:`prepare` does the host's part before the forward: each pair's noise drawn on the CPU from its
seed (the reproducibility contract), the pairs' differences and statistics gathered, each sent to
the device in one pinned, non-blocking copy; the condition tokens stacked on the device; the
positional embeddings taken from the cache (the inputs hold their own references, so an eviction
from the cache cannot free a tensor that a captured graph still reads). :func:`sample` (G_DiT) and
:func:`render` (D_dec) then run on the device alone: no copy to the host, no tensor made from Python
values, no synchronisation, no state kept between calls. :func:`to_host` is the copy back, after.
A :class:`StageClock` times the stages from marks the forward sets between them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..config import EdenConfig
from ..model.weights import EdgeWeights, pos_embedding
from ..wire import Conditions
from .blocks import BlockPath, query_blocks
from .kernels import bicubic_2x


def upload(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` in its own dtype; to a GPU from page-locked memory, without
    waiting for the copy (later kernels on the stream are ordered after it)."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


# How a thread waits for the GPU's copy of the middles: asleep until it is done. CUDA's default,
# with one context on a host of many cores, spins a core for the whole wait, which is the whole
# forward: a clip's 3 chunks in flight then kept up to 3 cores from x264, the 1080p clip's bound
# (benchmarks/host_ceiling.py). The GPU check times the clip with this off as well.
BLOCKING_WAIT = True


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU: from a GPU in one copy into page-locked memory, then a wait for that
    copy alone (the stream's work before it, the forward, is what it waits for), asleep
    (:data:`BLOCKING_WAIT`)."""
    if tensor.device.type != "cuda":
        return tensor.cpu()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    done = torch.cuda.Event(blocking=BLOCKING_WAIT)
    done.record(torch.cuda.current_stream(tensor.device))
    done.synchronize()
    return host


class StageClock:
    """The forward's own clock: made before :meth:`~eden_serve.edge.EdgeModel.prepare`, marked by the
    forward as each of its stages ends, read (:meth:`seconds`) once the middles are on the host. On
    a GPU its marks are CUDA events on the device's current stream, so the forward waits for nothing; on a
    CPU the host's clock, since a stage there has run when its call returns."""

    def __init__(self, device: torch.device):
        self.device, self.events = device, device.type == "cuda"
        self.marks: list[tuple[str, object]] = [("start", self._now())]

    def _now(self):
        if not self.events:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        # The device's stream, not the current device's: with --device cuda:1 (or cuda:0,cuda:1) the
        # thread's current GPU is 0, where the marks would time nothing.
        event.record(torch.cuda.current_stream(self.device))
        return event

    def mark(self, stage: str) -> None:
        """``stage`` ends here (it began at the mark before, the first at the clock's making)."""
        self.marks.append((stage, self._now()))

    def seconds(self) -> dict[str, float]:
        """Each stage's seconds, by name."""
        spans = {}
        for (_, begun), (stage, ended) in zip(self.marks, self.marks[1:]):
            if self.events:
                ended.synchronize()
                spans[stage] = begun.elapsed_time(ended) / 1000
            else:
                spans[stage] = ended - begun
        return spans


def initial_noise(seed: int, num_tokens: int, config: EdenConfig) -> torch.Tensor:
    """The contract for reproducibility: drawn on the CPU from a seeded generator, moved later."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((1, num_tokens, config.latent_dim), generator=generator)


def _constant():
    """A field that is a function of the forward's shape alone (the grid, the device, the config):
    a captured graph keeps the tensor it was captured with, and a replay never copies it."""
    return field(metadata={"constant": True})


class StageInputs:
    """What a stage reads, split into the tensors of each call (copied into a graph's static
    buffers at each replay, batch first) and the constants of its shape."""

    def per_call(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if not f.metadata.get("constant"))

    def with_per_call(self, tensors: Sequence[torch.Tensor]):
        names = [f.name for f in dataclasses.fields(self) if not f.metadata.get("constant")]
        return dataclasses.replace(self, **dict(zip(names, tensors, strict=True)))

    def shape_key(self) -> tuple:
        """The fixed shape these inputs stand for, besides the per-call tensors' own shapes."""
        return ()


@dataclass
class SampleInputs(StageInputs):
    noise: torch.Tensor  # [B, Nq, L] float32: each pair's initial latents
    cond_dit: torch.Tensor  # [B, 2, N, D] float32: the DiT's condition tokens, frame 0 first
    difference: torch.Tensor  # [B, 1] float32: each pair's standardised frame difference
    pos_query: torch.Tensor = _constant()  # [Nq, D]: the query grid's positional embedding
    timesteps: torch.Tensor = _constant()  # [S]: the Euler grid
    grid: tuple[int, int] = _constant()  # (ph, pw): the patch grid

    def shape_key(self) -> tuple:
        return self.grid


@dataclass
class RenderInputs(StageInputs):
    latents: torch.Tensor | None  # [B, Nq, L] float32: :func:`sample`'s output (None until it ran)
    cond_dec: torch.Tensor  # [B, 2, N, D] float32: the decoder's condition tokens
    stats: torch.Tensor  # [B, 2] float32: each pair's mean and std
    pos_query: torch.Tensor = _constant()  # [Nq, D]
    pos_patch: torch.Tensor = _constant()  # [N, D]: the patch grid's positional embedding
    grid: tuple[int, int] = _constant()
    size: tuple[int, int] = _constant()  # (height, width) of the frames: the crop

    def shape_key(self) -> tuple:
        return self.grid, self.size


@dataclass
class EdgeInputs:
    """One batched forward's inputs on the edge's device: B pairs of one frame size."""

    sample: SampleInputs
    render: RenderInputs

    @property
    def batch(self) -> int:
        return self.sample.noise.shape[0]


def _gathered(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    return upload(torch.stack(list(tensors)), device)


def prepare(batch: Sequence[Conditions], config: EdenConfig, device: torch.device, timesteps: torch.Tensor) -> EdgeInputs:
    """The host's part of a forward of ``batch`` (pairs of one frame size), done before it."""
    return EdgeInputs(prepare_sample(batch, config, device, timesteps), prepare_render(batch, config, device))


def prepare_sample(batch: Sequence[Conditions], config: EdenConfig, device: torch.device, timesteps: torch.Tensor) -> SampleInputs:
    ph, pw = _grid(batch)
    noise = torch.cat([initial_noise(c.seed, (ph // 2) * (pw // 2), config) for c in batch])
    difference = torch.tensor([[c.difference] for c in batch], dtype=torch.float32)
    return SampleInputs(upload(noise, device), _gathered([c.cond_dit for c in batch], device), upload(difference, device),
                        pos_embedding(config, ph, pw, 2, device), timesteps, (ph, pw))


def prepare_render(batch: Sequence[Conditions], config: EdenConfig, device: torch.device) -> RenderInputs:
    """Without the latents, which :func:`sample` makes."""
    ph, pw = _grid(batch)
    stats = torch.tensor([[c.mean, c.std] for c in batch], dtype=torch.float32)
    return RenderInputs(None, _gathered([c.cond_dec for c in batch], device), upload(stats, device),
                        pos_embedding(config, ph, pw, 2, device), pos_embedding(config, ph, pw, 1, device), (ph, pw), batch[0].size)


def _grid(batch: Sequence[Conditions]) -> tuple[int, int]:
    assert batch and all(c.grid == batch[0].grid and c.size == batch[0].size for c in batch), "one frame size per batch"
    return batch[0].grid


@dataclass(frozen=True)
class Regions:
    """The parts of the two stages that ``torch.compile`` takes one at a time (docs/gpu.md, "Regional
    compilation"): each block function once for all its blocks (the DiT's 12 share one compiled
    artefact per shape, the decoder's 4 another), and the small work before and after them. Eager,
    they are the functions themselves."""

    dit_block: Callable
    decoder_block: Callable
    dit_input: Callable
    dit_velocity: Callable
    decoder_input: Callable
    decoder_output: Callable

    @classmethod
    def of(cls, impl: BlockPath) -> "Regions":
        return cls(impl.dit_block, impl.decoder_block, dit_input, dit_velocity, decoder_input, decoder_output)

    def compiled(self, wrap: Callable[[Callable], Callable]) -> "Regions":
        return Regions(*(wrap(getattr(self, f.name)) for f in dataclasses.fields(self)))


def dit_input(w: EdgeWeights, inputs: SampleInputs, z: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """The query tokens [B, Nq, D] of the latents ``z`` at time ``t`` ([1]), and the blocks' six
    modulations (shift, scale, gate; twice: [B, 1, D] each)."""
    c = w.denoise_timestep_embedder(t) + w.difference_embedder(inputs.difference)  # [B, D]
    return w.proj_in(z) + inputs.pos_query, w.adaLN_modulation(c)[:, None].chunk(6, dim=-1)


def dit_velocity(w: EdgeWeights, x: torch.Tensor, latent_dim: int) -> torch.Tensor:
    return w.proj_out(w.norm_out(x))[..., :latent_dim].float()


def sample(w: EdgeWeights, config: EdenConfig, impl: BlockPath, inputs: SampleInputs, regions: Regions | None = None) -> torch.Tensor:
    """G_DiT sampled with Euler on the flow from noise to the latents, then unscaled: [B, Nq, L]."""
    z, (ph, pw), r = inputs.noise, inputs.grid, regions or Regions.of(impl)
    # Each query token's 2x2 block of condition tokens in frame 0 and frame 1: [B Nq, 4, D] each.
    cond = impl.dit_conditions(*(query_blocks(inputs.cond_dit[:, i], ph, pw) for i in (0, 1)))
    steps = config.timesteps
    for i, (t0, t1) in enumerate(zip(steps[:-1], steps[1:])):
        x, mods = r.dit_input(w, inputs, z, inputs.timesteps[i : i + 1])
        for blk in w.dit_blocks:
            x = r.dit_block(blk, x, mods, cond)
        z = z + (t1 - t0) * r.dit_velocity(w, x, config.latent_dim)
    return z / config.vae_scaler + config.vae_shift


def decoder_input(w: EdgeWeights, inputs: RenderInputs, hidden_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reconstruction tokens [B, N, D] (the latents' tokens upsampled bicubically to the patch
    grid) and the query tokens [B, Nq, D], with their positions."""
    (ph, pw), q = inputs.grid, w.proj_token(inputs.latents)  # [B, Nq, D]
    if q.is_cuda:
        up = bicubic_2x(q, ph // 2, pw // 2)
    else:
        grid = q.transpose(1, 2).reshape(len(q), hidden_dim, ph // 2, pw // 2)
        up = F.interpolate(grid, scale_factor=2, mode="bicubic", align_corners=False).flatten(2).transpose(1, 2)
    return up + inputs.pos_patch, q + inputs.pos_query


def decoder_output(w: EdgeWeights, r: torch.Tensor, inputs: RenderInputs, padding: tuple[int, int], patch: int) -> torch.Tensor:
    """The tokens as pixels, de-normalised, cropped from the padded frame at ``padding`` (top,
    left), clamped: [B, 3, H, W] float32 in [0, 1]."""
    (ph, pw), b = inputs.grid, len(r)
    patches = w.unpatchify(r).float()  # [B, N, 3 p^2], each patch (p1, p2, channel)
    image = patches.reshape(b, ph, pw, patch, patch, 3).permute(0, 5, 1, 3, 2, 4).reshape(b, 3, ph * patch, pw * patch)
    stats = inputs.stats[:, :, None, None, None]
    image = image * stats[:, 1] + stats[:, 0]
    (height, width), (top, left) = inputs.size, padding
    return image[:, :, top : top + height, left : left + width].clamp(0, 1)


def render(w: EdgeWeights, config: EdenConfig, impl: BlockPath, inputs: RenderInputs, regions: Regions | None = None) -> torch.Tensor:
    """D_dec: latents and the decoder conditions -> pixels, de-normalised, cropped, clamped:
    [B, 3, H, W] float32 in [0, 1]."""
    (ph, pw), b, r = inputs.grid, len(inputs.latents), regions or Regions.of(impl)
    cond = impl.decoder_conditions(*(inputs.cond_dec[:, i].reshape(b * ph * pw, -1) for i in (0, 1)))  # [B N, D] each
    tokens, q = r.decoder_input(w, inputs, config.hidden_dim)
    for blk in w.decoder_blocks:
        tokens = r.decoder_block(blk, tokens, q, cond)
    top, _, left, _ = config.padding(*inputs.size)
    return r.decoder_output(w, tokens, inputs, (top, left), config.patch_size)


def as_uint8(pixels: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] float32 in [0, 1] -> [B, H, W, 3] uint8, rounded as :func:`~eden_serve.frames.to_uint8`
    rounds, on the pixels' device (a quarter of the bytes then come back). Consumes ``pixels``."""
    return pixels.mul_(255).round_().to(torch.uint8).permute(0, 2, 3, 1).contiguous()

