"""The cloud side: consecutive frames -> what the cloud decides about their pairs, and their
condition tokens.

:meth:`CloudEncoder.encode_chunk` makes a :class:`~eden_serve.wire.Chunk`: E_cond's tokens
(:mod:`eden_serve.model.e_cond`) and the decisions (each pair's frame-difference scalar and seed, and
the scene cuts, :mod:`.scene_cuts`, so that a pair across a cut costs the edge nothing). With the
frames and bitstream kinds the cloud sends the frames and its decisions instead
(:meth:`CloudEncoder.frames_chunk`), and the edge runs E_cond on them itself
(:mod:`eden_serve.edge.conditions`). Only the four ``*_cond_*`` modules' weights are needed here.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import torch

from ..config import EdenConfig
from ..errors import BadInputError
from ..media.frames import from_pixels, to_pixels, to_png
from ..model.e_cond import embed_frames, weights_digest
from ..model.weights import CloudWeights
from ..wire import DEFAULT_CODEC, Chunk, Conditions, Decisions, FramesChunk, Tokens
from .scene_cuts import scene_cuts


class CloudEncoder:
    def __init__(self, weights: CloudWeights, config: EdenConfig, device: str | torch.device = "cpu"):
        self.config = config
        self.device = torch.device(device)
        self.weights = weights.to(self.device).eval()
        # The decisions' arithmetic run once, on two blank frames, before any frame is decoded: on a
        # 2-core AVX512 machine its first run in a process, after PyAV had decoded, gave a pair's
        # difference other bits (a channel norm's sum off by 1e-5) in 4 of 10 test runs, and a
        # served clip's first middle 5 levels off its in-process one in 2 of 6; after this, in none
        # (10 and 6 runs). Why its first run differs is not known.
        self._decide([torch.full((3, 8, 8), 0.5, device=self.device)] * 2, 0, None, 8)

    @torch.inference_mode()
    def encode_chunk(self, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None,
                     on_device: bool = False, depth: int = 8) -> Chunk:
        """F >= 2 consecutive [3, H, W] float frames in [0, 1] -> their chunk for the edge: every frame
        embedded once, in batched patch embeddings; pair j gets seed ``seed + j``. A pair that
        :func:`~.scene_cuts.scene_cuts` finds across a cut at ``scene_threshold`` (None: detection
        off) has the earlier frame for its middle, which travels as a PNG instead of costing the
        edge its DiT. The tokens come back on the CPU for the wire, or with ``on_device`` where
        they were made, for an edge in the same process: then each cut's middle is the earlier
        frame's pixels [H, W, 3] on the device, no PNG made. ``depth``: the bits of the pixels the
        frames were (8, or 16 for frames deeper than 8), which the copies and the edge's middles keep."""
        x = self._frames(frames)
        decisions = self._decide(x, seed, scene_threshold, depth)
        cond_dit, cond_dec, means, stds = embed_frames(self.weights, self.config, x)
        return Chunk(
            cond_dit=Tokens(cond_dit if on_device else cond_dit.cpu()),
            cond_dec=Tokens(cond_dec if on_device else cond_dec.cpu()),
            means=means,
            stds=stds,
            decisions=decisions,
            grid=self.config.patch_grid(*x[0].shape[-2:]),
            size=tuple(x[0].shape[-2:]),
            copies={j: to_pixels(x[j], decisions.depth) if on_device else to_png(x[j].cpu(), decisions.depth) for j in decisions.cuts},
        )

    @torch.inference_mode()
    def frames_chunk(self, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None,
                     depth: int = 8, pixels: np.ndarray | None = None) -> FramesChunk:
        """What the frames kind sends: the frames as pixels of ``depth`` bits (8, or 16 for frames
        deeper than 8), and the same decisions about their pairs as :meth:`encode_chunk` makes,
        naming these weights (:attr:`digest`), which the edge must hold too. Frames of more bits than
        that (16-bit grey said to be 8, 32-bit float images) are refused: their pixels would not give
        back the same tensors. ``pixels``: the [F, H, W, 3] pixels of ``depth`` bits that the frames
        were made of (:func:`~eden_serve.media.frames.frames_on`, a source's frames as decoded),
        taken as they are rather than made again from the frames and checked (at 1080p on this
        CPU, 0.7 s of a 17-frame chunk's 1.2 s)."""
        x = self._frames(frames)
        if pixels is not None:
            if pixels.dtype != (np.uint16 if depth == 16 else np.uint8) or pixels.shape[0] != len(x):
                raise ValueError(f"{pixels.shape[0]} frames of {pixels.dtype} given for {len(x)} of {depth} bits")
        else:
            pixels = np.stack([to_pixels(frame, depth).cpu().numpy() for frame in x])
            for i, frame in enumerate(x):
                if not torch.equal(from_pixels(pixels[i]).to(self.device), frame):
                    raise BadInputError(f"frame{i} has more than {depth} bits per channel, which the frames codec does not carry "
                                        f"as they are; use a token codec such as {DEFAULT_CODEC}")
        decisions = self._decide(x, seed, scene_threshold, depth)
        decisions.cloud = self.digest
        return FramesChunk(pixels, decisions)

    @functools.cached_property
    def digest(self) -> str:
        """The weights' digest (:func:`~eden_serve.model.e_cond.weights_digest`), which a frames payload names."""
        return weights_digest(self.weights)

    def encode(self, frame0: torch.Tensor, frame1: torch.Tensor, seed: int = 0) -> Conditions:
        """Two frames -> the conditions of their pair (the chunk of two, unpacked)."""
        return self.encode_chunk([frame0, frame1], seed).pair(0)

    def _frames(self, frames: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        shape = frames[0].shape
        assert len(frames) >= 2 and len(shape) == 3 and shape[0] == 3 and all(f.shape == shape for f in frames), "checked by the caller"
        return [frame.to(self.device, torch.float32) for frame in frames]

    def _decide(self, x: list[torch.Tensor], seed: int, scene_threshold: float | None, depth: int) -> Decisions:
        """Each pair's difference scalar and seed, the pairs across a scene cut, and the frames' depth."""
        norms = [self._channel_norm(frame) for frame in x]  # each frame's once, not once per pair
        differences = [self._difference(x[j], x[j + 1], norms[j], norms[j + 1]).item() for j in range(len(x) - 1)]
        del norms
        return Decisions(differences, [seed + j for j in range(len(x) - 1)], scene_cuts(x, scene_threshold), depth=depth)

    @staticmethod
    def _channel_norm(frame: torch.Tensor) -> torch.Tensor:
        """[3, H, W] -> [H, W]: each pixel's colour norm, as ``cosine_similarity`` takes it (eps 1e-8)."""
        return (frame * frame).sum(0).sqrt().clamp_min(1e-8)

    def _difference(self, a: torch.Tensor, b: torch.Tensor, norm_a: torch.Tensor, norm_b: torch.Tensor) -> torch.Tensor:
        """Standardised mean cosine similarity of two unpadded frames along channels, given their
        :meth:`_channel_norm`.

        Written out (as ``cosine_similarity`` defines it): its norm kernel reduces over the
        3-channel axis about 20x slower than these sums.
        """
        cos = ((a * b).sum(0) / (norm_a * norm_b)).mean()
        return (cos - self.config.cos_sim_mean) / self.config.cos_sim_std
