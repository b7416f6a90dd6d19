"""Conditions from what a payload carries, on the edge's device: the edge's own copy of E_cond
(:class:`EdgeEncoder`) for the frames that the frames and bitstream kinds carry, the decoder of
the bitstream kind's packets (:class:`PacketDecoder`), and :class:`EdgeSide`, which holds both from
its making and is what a payload kind's edge half works with (:class:`eden_serve.wire.kinds.Edge`).

The frames go to the device once, as the cloud would have sent its frames' tokens; E_cond runs
there and the tokens stay there, for the DiT to read. Only a cut pair's middle, the earlier frame,
is made on the host, as the PNG the answer carries.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from ..config import EdenConfig
from ..errors import ModelMismatchError, TooMuchWorkError, UnauthenticPayloadError
from ..media import sandboxed
from ..media.frames import frames_on, from_pixels, to_png
from ..model.e_cond import embed_frames, weights_digest
from ..model.weights import CloudWeights
from ..wire import DEFAULT_CODEC, BitstreamChunk, Chunk, FramesChunk, Tokens
from . import EdgeModel, upload
from .continued import Continuations


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
        cond_dit, cond_dec, means, stds = embed_frames(self.weights, self.config, frames_on(np.asarray(chunk.pixels), self.device))
        return Chunk(Tokens(cond_dit), Tokens(cond_dec), means, stds, chunk.decisions, self.config.patch_grid(*chunk.size),
                     chunk.size, {j: to_png(from_pixels(chunk.pixels[j]), chunk.depth) for j in chunk.cuts})


@dataclass(frozen=True)
class PacketDecoder:
    """How this edge decodes a bitstream payload's packets (docs/errors-and-limits.md, "The decoder's
    sandbox"): its work bounded first (every packet is decoded, at the declared frame size: at most
    ``max_decoded_pixels``, None: unbounded), then decoded ``where`` says: in this ``process`` (a
    payload its cloud signed, or an edge in one process with its cloud), in the ``sandbox``
    within ``deadline_s``, or not at all (``refuse``). Frames over ``max_pixels`` are refused."""

    max_pixels: int | None = None
    max_decoded_pixels: int | None = None
    where: Literal["process", "sandbox", "refuse"] = "process"
    deadline_s: float = sandboxed.DEADLINE_S
    # In this process, a stream's decoder goes on from one chunk to the next (in the sandbox, a kept
    # child's does: media/sandboxed.py).
    kept: Continuations = field(default_factory=Continuations, compare=False, repr=False)

    def decode(self, chunk: BitstreamChunk) -> np.ndarray:
        """The frames of ``chunk``, [F, H, W, 3] uint8 (the bitstream kind checks each against the
        cloud's digest: 409 where one differs)."""
        self.check_work(chunk)
        if self.where == "process":
            return self.kept.decode(chunk.parameters, chunk.packets, chunk.skip, chunk.frames, self.max_pixels)
        if self.where == "refuse":
            raise UnauthenticPayloadError("this edge decodes only bitstream payloads its cloud signed (handler.unkeyed_bitstream: "
                                          "refuse), and it holds no wire key; send the frames codec, or give both a wire key")
        return sandboxed.decode_chunk(chunk, self.max_pixels, self.deadline_s)

    def check_work(self, chunk: BitstreamChunk) -> None:
        """Refuses a payload whose packets would decode to more pixels than the edge decodes for one
        request (each packet a frame, skipped ones included: the decoder makes them all)."""
        height, width = chunk.size
        work = len(chunk.packets) * height * width
        if self.max_decoded_pixels is not None and work > self.max_decoded_pixels:
            raise TooMuchWorkError(f"the payload's {len(chunk.packets)} packets decode to {len(chunk.packets)} frames of {width}x{height}, "
                                   f"{work} pixels, over this edge's {self.max_decoded_pixels} for one request "
                                   "(handler.max_decoded_pixels); send shorter chunks, or the frames codec")


@dataclass
class EdgeSide:
    """What a payload kind's edge half asks of the edge, each part given at its making: a token chunk
    moved to the model's device (:meth:`receive`), a frames chunk through the edge's E_cond
    (:meth:`embed`; ``encoder`` None: this edge holds no cloud weights), and a bitstream chunk's
    packets decoded by ``decoder`` (:meth:`decode`)."""

    model: EdgeModel
    encoder: EdgeEncoder | None = None
    decoder: PacketDecoder = field(default_factory=PacketDecoder)

    @classmethod
    def beside(cls, model: EdgeModel, cloud_weights: CloudWeights, decoder: PacketDecoder | None = None) -> "EdgeSide":
        """The edge side of ``model`` with E_cond on its device, from ``cloud_weights``."""
        return cls(model, EdgeEncoder(cloud_weights, model.config, model.device), decoder or PacketDecoder())

    @property
    def config(self) -> EdenConfig:
        return self.model.config

    def receive(self, chunk: Chunk) -> Chunk:
        """``chunk`` with its tokens on the model's device, in their wire dtype (bf16 or int8 move
        half or a quarter of float32's bytes): each frame crosses once, where its pairs would carry it
        twice, and :meth:`Chunk.pair` then converts them on the device."""
        device = self.model.device
        if device.type == "cpu":
            return chunk

        def moved(tokens: Tokens) -> Tokens:
            return Tokens(*(None if t is None else upload(t, device) for t in tokens))

        return dataclasses.replace(chunk, cond_dit=moved(chunk.cond_dit), cond_dec=moved(chunk.cond_dec))

    def embed(self, chunk: FramesChunk) -> Chunk:
        if self.encoder is None:
            raise ModelMismatchError("this edge's archive carries no cloud weights to derive conditions from frames with; "
                                     f"rebuild it with this release's archive.sh, or ask the cloud for codec {DEFAULT_CODEC}")
        return self.encoder.conditions(chunk)

    def decode(self, chunk: BitstreamChunk) -> np.ndarray:
        return self.decoder.decode(chunk)
