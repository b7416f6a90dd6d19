"""One pair through cloud -> wire -> edge in one process: what the two servers compute together."""

from __future__ import annotations

import torch

from . import wire
from .cloud import CloudEncoder
from .edge import AttentionPath, EdgeModel


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
