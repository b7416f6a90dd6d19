"""Middles as the output's own planes (docs/video.md, "Middles as YUV"): where a video's writer takes
4:2:0 planes, the edge converts its middles on the device, so half the bytes of 8-bit RGB come back
and the writer's thread hands the planes to the encoder without converting them.

:class:`Colour` is what the conversion must match: the output's matrix (BT.601 or BT.709), range
(limited, or full for the JPEG formats) and depth (8 or 10 bits), read from the output stream as its
writer converts RGB today (FFmpeg's swscale). :class:`Planes` is a middle so converted, on the host:
its Y, U and V planes back to back, as FFmpeg lays out ``yuv420p`` (and ``yuv420p10le``) in one
buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Pixel formats whose planes the edge can make: 4:2:0, three planes, 8 or 10 bits.
FORMATS = {"yuv420p": (8, False), "yuvj420p": (8, True), "yuv420p10le": (10, False)}
MATRICES = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}  # (Kr, Kb)


@dataclass(frozen=True)
class Colour:
    """The planes' colour: ``matrix`` (a key of :data:`MATRICES`), ``full`` range or limited, ``depth``
    bits, and the pixel format that holds them."""

    pix_fmt: str
    matrix: str = "bt601"
    full: bool = False
    depth: int = 8

    @property
    def swscale_colorspace(self) -> str:
        """The name PyAV's ``reformat`` takes for the matrix (its RGB conversion uses the same)."""
        return {"bt601": "ITU601", "bt709": "ITU709"}[self.matrix]


def output_colour(pix_fmt: str, width: int, height: int, colorspace: object = None) -> Colour | None:
    """The colour of an output's planes, where the edge can make them: a 4:2:0 format of
    :data:`FORMATS`, an even size, and the matrix the stream's colour space tag says (BT.709 where it
    says so, else BT.601: what swscale assumes untagged)."""
    if pix_fmt not in FORMATS or width % 2 or height % 2:
        return None
    depth, full = FORMATS[pix_fmt]
    matrix = "bt709" if "709" in str(getattr(colorspace, "name", colorspace) or "") else "bt601"
    return Colour(pix_fmt, matrix, full, depth)


class Planes:
    """One frame's planes on the host: ``data`` [H W 3/2] (uint8, or int16 holding 10-bit samples),
    Y then U then V, of ``height`` x ``width`` in ``colour``."""

    __slots__ = ("data", "width", "height", "colour")

    def __init__(self, data: torch.Tensor, width: int, height: int, colour: Colour):
        assert data.numel() == width * height * 3 // 2, (data.shape, width, height)
        self.data, self.width, self.height, self.colour = data, width, height, colour

    @property
    def size(self) -> tuple[int, int]:
        """(width, height), as an image's."""
        return self.width, self.height

    def array(self) -> np.ndarray:
        """[H 3/2, W]: the layout PyAV's ``VideoFrame.from_ndarray`` takes for the 4:2:0 formats."""
        data = self.data.numpy()
        if self.colour.depth > 8:
            data = data.view(np.uint16)
        return data.reshape(self.height * 3 // 2, self.width)
