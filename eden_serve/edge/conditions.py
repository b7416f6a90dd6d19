"""Conditions from what a payload carries, on the edge's device: the edge's own copy of E_cond
(:class:`EdgeEncoder`) for the frames that the frames and bitstream kinds carry, and the
:class:`Intake` that a payload kind's edge half works with (:class:`eden_serve.wire.kinds.Edge`).

The frames go to the device once, as the cloud would have sent its frames' tokens; E_cond runs
there and the tokens stay there, for the DiT to read. Only a cut pair's middle, the earlier frame,
is made on the host, as the PNG the answer carries.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..config import EdenConfig
from ..e_cond import embed_frames, weights_digest
from ..errors import ModelMismatchError
from ..media.frames import from_pixels, to_png
from ..media.packets import decode_chunk
from ..model import CloudWeights
from ..wire import DEFAULT_CODEC, BitstreamChunk, Chunk, FramesChunk, Tokens
from . import EdgeModel


class EdgeEncoder:
    """E_cond at the edge: the weights of the cloud half on the edge's device."""

    def __init__(self, weights: CloudWeights, config: EdenConfig, device: str | torch.device = "cpu"):
        self.config = config
        self.device = torch.device(device)
        self.weights = weights.to(self.device).eval()

    @functools.cached_property
    def digest(self) -> str:
        return weights_digest(self.weights)

    @torch.inference_mode()
    def conditions(self, chunk: FramesChunk) -> Chunk:
        """The chunk that the cloud's :meth:`~eden_serve.cloud.encoder.CloudEncoder.encode_chunk`
        makes of these frames, with the cloud's decisions, its tokens on this device. The same
        weights, frames and threads give the same tokens bit for bit, so the edge computes what the
        fp32 codec would have given it."""
        if chunk.cloud != self.digest:
            raise ModelMismatchError(
                f"payload's frames are for cloud weights {chunk.cloud[:16]}, but this edge derives conditions with "
                f"{self.digest[:16]}; deploy the archives of one archive.sh run to cloud and edge"
            )
        frames = [from_pixels(pixels) for pixels in chunk.pixels]
        cond_dit, cond_dec, means, stds = embed_frames(self.weights, self.config, [frame.to(self.device) for frame in frames])
        return Chunk(Tokens(cond_dit), Tokens(cond_dec), means, stds, chunk.decisions, self.config.patch_grid(*chunk.size),
                     chunk.size, {j: to_png(frames[j], chunk.depth) for j in chunk.cuts})


@dataclass
class Intake:
    """What a payload kind's edge half asks of the edge: a token chunk moved to the model's device
    (:meth:`receive`), a frames chunk through the edge's E_cond (:meth:`embed`; ``encoder`` None:
    this edge holds no cloud weights), and a bitstream chunk's packets decoded within ``max_pixels``
    by ``decode`` (:func:`~eden_serve.media.packets.decode_chunk`'s signature)."""

    model: EdgeModel
    encoder: EdgeEncoder | None = None
    max_pixels: int | None = None
    decode: Callable[[BitstreamChunk, int | None], np.ndarray] = decode_chunk

    @classmethod
    def beside(cls, model: EdgeModel, cloud_weights: CloudWeights, **options) -> "Intake":
        """The intake of ``model`` with E_cond on its device, from ``cloud_weights``."""
        return cls(model, EdgeEncoder(cloud_weights, model.config, model.device), **options)

    @property
    def config(self) -> EdenConfig:
        return self.model.config

    def receive(self, chunk: Chunk) -> Chunk:
        return self.model.receive(chunk)

    def embed(self, chunk: FramesChunk) -> Chunk:
        if self.encoder is None:
            raise ModelMismatchError("this edge's archive carries no cloud weights to derive conditions from frames with; "
                                     f"rebuild it with this release's archive.sh, or ask the cloud for codec {DEFAULT_CODEC}")
        return self.encoder.conditions(chunk)

    def decoded(self, chunk: BitstreamChunk) -> np.ndarray:
        return self.decode(chunk, self.max_pixels)
