"""``--process-size HxW``: interpolate at a smaller size than the clip's.

EDEN was trained on small frames and its quality falls away from those sizes (the maintainers
say so in the official repository's issue 8); frames over the pixel limit cannot be sent at all.
The model then sees each frame scaled to the process size (Lanczos, Pillow's, which filters out
what the smaller grid cannot hold), and each middle comes back scaled to the clip's size, bicubic
(smooth where Lanczos would ring on the model's soft edges). Originals are written untouched.
"""

from __future__ import annotations

import warnings

from PIL import Image

from ..media.base import Frame
from ..media.frames import as_image, check_size
from .processors import Processor


class AtSize(Processor):
    """``inner`` run on the frames scaled to ``size`` (height, width), its middles scaled back;
    ``max_pixels`` (None: no limit) applies to ``size``. It streams nothing: its middles come
    whole, each scaled back."""

    def __init__(self, inner: Processor, size: tuple[int, int], max_pixels: int | None):
        height, width = size
        if max_pixels is not None:
            check_size(width, height, max_pixels, "--process-size")
        self.inner, self.size = inner, size

    def scaled(self, image: Image.Image) -> Image.Image:
        # The model sees colour only (frames.image_to_tensor); palettes and alpha cannot be filtered.
        image = image if image.mode in ("RGB", "L", "I", "I;16", "F") else image.convert("RGB")
        return image.resize(self.size[::-1], Image.Resampling.LANCZOS)

    def __call__(self, index: int, frames: list[Frame], seed: int, arrived=None):
        if any(f.depth == 16 for f in frames):  # said once: Python shows a warning once per place and text
            warnings.warn("--process-size scales with Pillow at 8 bits: the 16-bit frames reach the model, and its middles "
                          "the output, at 8 bits")
        small = [Frame(f.index, f.name, image=self.scaled(f.image)) for f in frames]
        result = self.inner(index, small, seed)
        images = getattr(result, "images", result)
        full = [as_image(image).resize(frames[0].size, Image.Resampling.BICUBIC) for image in images]
        if hasattr(result, "images"):
            result.images = full
            return result
        return full
