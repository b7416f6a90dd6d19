"""``--process-size HxW``: interpolate at a smaller size than the clip's.

EDEN was trained on small frames and its quality falls away from those sizes (the maintainers
say so in the official repository's issue 8); frames over the pixel limit cannot be sent at all.
The model then sees each frame scaled to the process size (Lanczos, Pillow's, which filters out
what the smaller grid cannot hold), and each middle comes back scaled to the clip's size, bicubic
(smooth where Lanczos would ring on the model's soft edges). Originals are written untouched.
Frames of 16 bits stay at 16 bits: :func:`resized` scales them with the same kernels, each channel
a 32-bit float image, where Pillow's RGB would hold 8 bits (docs/video.md, "Depth and colour").
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from ..media.base import Frame
from ..media.frames import Picture, as_image, check_size
from .processors import Processor


def resized(pixels: torch.Tensor, size: tuple[int, int], resample: Image.Resampling) -> torch.Tensor:
    """16-bit RGB pixels [H, W, 3] scaled to ``size`` (width, height) as Pillow scales 8-bit RGB:
    ``resample``'s kernel across, the result clamped to the pixels' range, then down; but each
    channel a float image, rounded once, at the end, to 16 bits (8-bit RGB is rounded after each pass)."""
    planes = []
    for c in range(3):
        plane = Image.fromarray(pixels[..., c].numpy().astype(np.float32), "F")
        across = np.clip(np.asarray(plane.resize((size[0], plane.height), resample)), 0, 65535)
        planes.append(np.asarray(Image.fromarray(across, "F").resize(size, resample)))
    return torch.from_numpy(np.clip(np.rint(np.stack(planes, axis=-1)), 0, 65535).astype(np.uint16))


def _scaled_back(middle: Picture, size: tuple[int, int]) -> Picture:
    if isinstance(middle, torch.Tensor) and middle.dtype == torch.uint16:
        return resized(middle, size, Image.Resampling.BICUBIC)
    return as_image(middle).resize(size, Image.Resampling.BICUBIC)


class AtSize(Processor):
    """``inner`` run on the frames scaled to ``size`` (height, width), its middles scaled back;
    ``max_pixels`` (None: no limit) applies to ``size``. It streams nothing: its middles come
    whole, each scaled back."""

    def __init__(self, inner: Processor, size: tuple[int, int], max_pixels: int | None):
        height, width = size
        if max_pixels is not None:
            check_size(width, height, max_pixels, "--process-size")
        self.inner, self.size = inner, size

    def stopped(self) -> None:
        self.inner.stopped()

    def scaled(self, frame: Frame) -> Picture:
        if frame.pixels is not None and frame.depth == 16:
            return resized(frame.pixels, self.size[::-1], Image.Resampling.LANCZOS)
        image = frame.image
        # The model sees colour only (frames.image_to_tensor); palettes and alpha cannot be filtered.
        image = image if image.mode in ("RGB", "L", "I", "I;16", "F") else image.convert("RGB")
        return image.resize(self.size[::-1], Image.Resampling.LANCZOS)

    def __call__(self, index: int, frames: list[Frame], seed: int, arrived=None):
        small = [Frame(f.index, f.name, image=self.scaled(f)) for f in frames]
        result = self.inner(index, small, seed)
        images = getattr(result, "images", result)
        full = [_scaled_back(image, frames[0].size) for image in images]
        if hasattr(result, "images"):
            result.images = full
            return result
        return full
