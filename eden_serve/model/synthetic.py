"""Synthetic stand-ins, made from a seed: weights, frames and conditions.

The official weights cannot be fetched here, so everything runs and is tested on these. The tests,
the benchmarks, the examples and the CLI's default all take them from this module: weights, frames
(:func:`scene`) and the conditions that cross the wire (:func:`chunk`).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from PIL import Image

from ..config import EdenConfig
from ..wire import Chunk, Decisions, Tokens
from .weights import expected_layout

WEIGHTS_WARNING = "no checkpoint given: using synthetic weights (seed {seed}); the output is NOT a real interpolation"


def state_dict(config: EdenConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights of the official layout: LayerNorm scales near one, small biases, matrices scaled by
    their fan-in so that activations keep their size. The same for the same seed anywhere."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in sorted(expected_layout(config).items()):
        if len(shape) == 1 and ("norm" in key or key.startswith("unpatchify.0")) and key.endswith(".weight"):
            value = 1 + 0.02 * torch.randn(shape, generator=generator)
        elif len(shape) == 1:
            value = 0.02 * torch.randn(shape, generator=generator)
        else:
            fan_in = int(torch.tensor(shape[1:]).prod())
            value = torch.randn(shape, generator=generator) / fan_in**0.5
        state[key] = value
    return state


def scene(height: int, width: int, t: float) -> np.ndarray:
    """A frame of a moving scene at time ``t``: H x W x 3 uint8.

    A sky-to-ground gradient with soft stripes, a ball moving right and down and a bar moving left,
    anti-aliased, laid out in units of a 448 x 256 frame (where one unit of ``t`` moves the ball by
    40 pixels); ``t`` from 0 to 5 keeps both on screen.
    """
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    sx, sy = width / 448, height / 256
    sky = np.stack([0.35 + 0.3 * y / height, 0.55 + 0.25 * y / height, 0.95 - 0.4 * y / height], axis=-1)
    image = sky + 0.04 * np.sin(x / 9.0 + y / 31.0)[..., None]
    # Coverage falls from 1 to 0 across one pixel of each edge.
    ball_x, ball_y, radius = (120 + 40 * t) * sx, (110 + 16 * t) * sy, 38 * sy
    ball = np.clip(radius + 0.5 - np.hypot(x - ball_x, y - ball_y), 0, 1)[..., None]
    shade = 0.75 + 0.25 * np.clip((ball_y - y) / radius, -1, 1)[..., None]
    image = image * (1 - ball) + ball * shade * np.array([0.95, 0.45, 0.15])
    bar_x = (330 - 30 * t) * sx
    bar = np.clip(26 * sx + 0.5 - np.abs(x - bar_x), 0, 1) * np.clip(70 * sy + 0.5 - np.abs(y - 180 * sy), 0, 1)
    image = image * (1 - bar[..., None]) + bar[..., None] * np.array([0.2, 0.6, 0.3])
    return (np.clip(image, 0, 1) * 255).round().astype(np.uint8)


def clip(count: int, height: int, width: int) -> list[Image.Image]:
    """``count`` consecutive frames of :func:`scene`, the motion spread so that it stays on screen."""
    return list(clip_frames(count, height, width))


def clip_frames(count: int, height: int, width: int) -> Iterator[Image.Image]:
    """:func:`clip`'s frames one at a time, for a clip too long to hold."""
    step = min(1.0, 5.0 / max(count - 1, 1))
    return (Image.fromarray(scene(height, width, i * step)) for i in range(count))


def write_clip(folder: str | Path, count: int, height: int, width: int) -> Path:
    """:func:`clip` as PNG files ``frame0.png``, ``frame1.png``, … in a new directory ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True)
    for i, frame in enumerate(clip(count, height, width)):
        frame.save(folder / f"frame{i}.png")
    return folder


def frame_pair(height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two consecutive frames of :func:`scene` as [3, H, W] float32 tensors in [0, 1]."""
    return tuple(torch.from_numpy(scene(height, width, t)).permute(2, 0, 1).float() / 255 for t in (0.0, 1.0))


def chunk(config: EdenConfig, size: tuple[int, int], frames: int = 2, profile: str = "plain", seed: int = 0) -> Chunk:
    """A chunk shaped like the cloud encoder's, for ``frames`` frames of ``size`` (height, width):
    tokens that are LayerNorm outputs (rows standardised, times an LN weight, plus a bias).

    ``plain``: Gaussian activations, LN weight 1 +- 0.2, bias +- 0.1. ``outliers``: heavy-tailed
    (Student t, 3 dof) activations and 1% of channels with a 10x LN weight, as trained transformers
    tend to have. Frames are independent draws, unlike a video's.
    """
    assert profile in ("plain", "outliers"), profile
    generator = torch.Generator().manual_seed(seed)
    grid = config.patch_grid(*size)
    n, d = grid[0] * grid[1], config.hidden_dim

    def tokens() -> Tokens:
        weight = 1 + 0.2 * torch.randn(d, generator=generator)
        bias = 0.1 * torch.randn(d, generator=generator)
        if profile == "plain":
            h = torch.randn(frames, n, d, generator=generator)
        else:
            # Student t with 3 dof: a standard normal over the root of a chi-square(3) / 3.
            chi2 = torch.randn(3, frames, n, d, generator=generator).square().sum(0)
            h = torch.randn(frames, n, d, generator=generator) / (chi2 / 3).sqrt()
            weight[torch.randperm(d, generator=generator)[: d // 100]] *= 10
        return Tokens(torch.nn.functional.layer_norm(h, (d,), weight, bias))

    pairs = frames - 1
    return Chunk(tokens(), tokens(), means=[0.45] * frames, stds=[0.27] * frames,
                 decisions=Decisions([-0.8] * pairs, list(range(seed, seed + pairs))), grid=grid, size=size)


def image_header(fmt: str, width: int, height: int) -> bytes:
    """A PNG, GIF or JPEG file that declares ``width`` x ``height`` pixels and holds none: what an
    image bomb shows before a decoder allocates for it."""
    if fmt == "PNG":
        chunk = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + b"\0\0\0\0IEND\xaeB`\x82"
    if fmt == "GIF":  # a screen and one image of that size, then the trailer
        return b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0) + b"," + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x44\x01\x00;"
    if fmt == "JPEG":  # SOI, a baseline frame header of 3 components, EOI
        return b"\xff\xd8\xff\xc0\x00\x11\x08" + struct.pack(">HH", height, width) + b"\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01\xff\xd9"
    raise ValueError(f"no header for {fmt}")
