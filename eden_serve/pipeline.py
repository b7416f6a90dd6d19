"""The whole computation in one process: a pair, and a clip, through cloud -> wire -> edge.

What the two servers compute together, payload included, so the results equal theirs bit for bit
for the same seed, codec and thread count.
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from . import wire
from .clips import Frame
from .cloud import CloudEncoder
from .edge import AttentionPath, EdgeModel
from .frames import DEFAULT_MAX_PIXELS, check_pair, to_uint8
from .streaming import Middle, Processor, Summary, interpolate_clip

# The model already uses every core; a second pair overlaps reading, writing and codec work.
DEFAULT_INFLIGHT = 2


def interpolate_pair(
    cloud: CloudEncoder,
    edge: EdgeModel,
    frame0: torch.Tensor,
    frame1: torch.Tensor,
    seed: int = 0,
    codec: str = wire.DEFAULT_CODEC,
    path: AttentionPath = "fast",
) -> tuple[torch.Tensor, int]:
    """The middle frame [3, H, W] in [0, 1], and the size of the wire payload it crossed as."""
    payload = wire.encode(cloud.encode(frame0, frame1, seed), cloud.config, codec)
    return edge.interpolate(wire.decode(payload, edge.config), path), len(payload)


def in_process(cloud: CloudEncoder, edge: EdgeModel, codec: str = wire.DEFAULT_CODEC) -> Processor:
    """The processor of one machine: the same computation as the servers', payload included, so the
    middles equal theirs bit for bit for the same seed, codec and thread count."""

    def process(index: int, frame0: Frame, frame1: Frame, seed: int) -> Middle:
        check_pair(frame0.tensor, frame1.tensor)
        middle, payload_bytes = interpolate_pair(cloud, edge, frame0.tensor, frame1.tensor, seed, codec)
        return Middle(Image.fromarray(to_uint8(middle)), payload_bytes=payload_bytes)

    return process


def interpolate_clip_in_process(
    src: str | Path,
    dst: str | Path,
    cloud: CloudEncoder,
    edge: EdgeModel,
    codec: str = wire.DEFAULT_CODEC,
    seed: int = 0,
    inflight: int = DEFAULT_INFLIGHT,
    progress: bool | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Summary:
    """``eden-serve interpolate`` on a clip: :func:`interpolate_clip` with :func:`in_process`."""
    wire.parse_codec(codec)  # a bad name fails before the first pair, not as the first pair's error
    processor = in_process(cloud, edge, codec)
    return interpolate_clip(src, dst, processor, seed=seed, inflight=inflight, progress=progress, max_pixels=max_pixels)
