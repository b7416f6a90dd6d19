"""Middles as the output's own planes (docs/video.md, "Middles as the output's planes"): where a video's writer takes
4:2:0 planes, the edge converts its middles on the device, so half the bytes of 8-bit RGB come back
and the writer's thread hands the planes to the encoder without converting them.

:class:`PlaneFormat` is what the conversion must match: the output's matrix (BT.601, BT.709 or
BT.2020), range (limited, or full) and depth (8 or 10 bits), those its writer converts RGB to with
FFmpeg's swscale (:class:`~.colour.Colour`). :class:`Planes` is a middle so converted, on the host:
its Y, U and V planes back to back, as FFmpeg lays out ``yuv420p`` (and ``yuv420p10le``) in one
buffer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from .chroma import CENTER, LEFT
from .siting import Subsampler

# Pixel formats whose planes the edge can make: 4:2:0, three planes, 8 or 10 bits.
FORMATS = {"yuv420p": 8, "yuvj420p": 8, "yuv420p10le": 10}
MATRICES = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722), "bt2020": (0.2627, 0.0593),  # (Kr, Kb)
            "fcc": (0.30, 0.11), "smpte240m": (0.212, 0.087)}
# FFmpeg's AVColorSpace values to the matrices swscale converts by: unspecified (2) is BT.601 to it,
# as are BT.470BG (5) and SMPTE 170M (6). Any other matrix (FCC, SMPTE 240M, YCgCo, BT.2020's
# constant-luminance form): the writer converts RGB itself.
SWSCALE_MATRICES = {1: "bt709", 2: "bt601", 5: "bt601", 6: "bt601", 9: "bt2020"}
# Every matrix swscale converts YUV to RGB by (video.CONVERTIBLE's, RGB aside), FCC and SMPTE 240M
# too: what a frame decoded on the device is converted by (:func:`nv12_to_rgb`), as the host converts it.
YUV_MATRICES = {**SWSCALE_MATRICES, 4: "fcc", 7: "smpte240m"}


@dataclass(frozen=True)
class PlaneFormat:
    """The planes the writer takes: ``matrix`` (a key of :data:`MATRICES`), ``full`` range or
    limited, ``depth`` bits, the pixel format that holds them, and where their chroma sits: ``left``
    (co-sited with the even luma columns, H.264's and HEVC's default), else centred between them;
    vertically centred (:mod:`.siting`)."""

    pix_fmt: str
    matrix: str = "bt601"
    full: bool = False
    depth: int = 8
    left: bool = False


def plane_format(pix_fmt: str, width: int, height: int, matrix: int = 2, full: bool = False,
                 siting: int = CENTER) -> PlaneFormat | None:
    """The planes of an output, where the edge can make them: a 4:2:0 format of :data:`FORMATS`, an
    even size, a matrix swscale converts by (``matrix``: FFmpeg's value, as the writer converts
    to it; ``full``: the range it converts to), and its chroma sited left or centre (``siting``: an
    AVChromaLocation, :func:`~.siting.output_siting`; the top and bottom ones the writer makes itself)."""
    if pix_fmt not in FORMATS or width % 2 or height % 2 or matrix not in SWSCALE_MATRICES or siting not in (LEFT, CENTER):
        return None
    return PlaneFormat(pix_fmt, SWSCALE_MATRICES[matrix], full, FORMATS[pix_fmt], siting == LEFT)


# swscale's names of the matrices (AVColorSpace values) and of full range (AVCOL_RANGE_JPEG).
SWSCALE_COLORSPACES = {"bt601": None, "bt709": 1, "bt2020": 9}
FULL_RANGE = 2


def swscale_planes(pixels: np.ndarray, format: PlaneFormat) -> np.ndarray:
    """8-bit RGB [H, W, 3] as ``format``'s planes [H W 3/2], converted by swscale on the host, as a
    video writer converts RGB: on a CPU, where it is the cheaper conversion and the same one."""
    import av

    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
    kept = vars(_SUBSAMPLERS).setdefault("by_format", {})
    if format not in kept:
        matrix = SWSCALE_COLORSPACES[format.matrix]
        kept[format] = Subsampler(format.pix_fmt, 2 if matrix is None else matrix, FULL_RANGE if format.full else 0,
                                  LEFT if format.left else CENTER)
    return kept[format](frame).to_ndarray(format=format.pix_fmt).reshape(-1)


# This thread's subsamplers by format: a left-sited one's filter graph (about 0.5 ms to make at 1080p)
# made once, not for each middle, and never shared between the threads that answer at once.
_SUBSAMPLERS = threading.local()


# The pixel formats whose pictures PyAV makes on an array's own memory (VideoFrame.from_numpy_buffer), of those a writer takes.
BUFFER_FORMATS = {"yuv420p", "yuvj420p", "rgb24", "rgb48le"}
# PyAV reads a 4:2:0 array [H 3/2, W] on its memory as H/4 whole rows of each chroma plane (its height
# is rows // 6 * 4): for a height of 2 mod 4 it made a picture 2 rows short, its chroma read from the
# wrong samples (a 96x66 middle came out in other colours), so those are copied by from_ndarray.
HALF_ROW_FORMATS = {"yuv420p", "yuvj420p"}


def picture_of(pixels: np.ndarray, pix_fmt: str):
    """A PyAV picture of ``pixels`` (a middle's own array, which nothing writes again), for the
    writer: on their memory where PyAV can, not a copy (at 1080p the copy of a middle's planes cost
    the writer's thread 1.5 ms, docs/gpu.md "Middles, the encoder, the decoder"); it holds the array."""
    import av

    whole_rows = pix_fmt not in HALF_ROW_FORMATS or pixels.shape[0] % 6 == 0
    if pix_fmt in BUFFER_FORMATS and pixels.flags.c_contiguous and whole_rows:
        return av.VideoFrame.from_numpy_buffer(pixels, format=pix_fmt)
    return av.VideoFrame.from_ndarray(pixels, format=pix_fmt)


class Planes:
    """One frame's planes on the host: ``data`` [H W 3/2] (uint8, or int16 holding 10-bit samples),
    Y then U then V, of ``height`` x ``width`` in ``format``."""

    __slots__ = ("data", "width", "height", "format")

    def __init__(self, data: torch.Tensor, width: int, height: int, format: PlaneFormat):
        assert data.numel() == width * height * 3 // 2, (data.shape, width, height)
        self.data, self.width, self.height, self.format = data, width, height, format

    @property
    def size(self) -> tuple[int, int]:
        """(width, height), as an image's."""
        return self.width, self.height

    def array(self) -> np.ndarray:
        """[H 3/2, W]: the layout PyAV's ``VideoFrame.from_ndarray`` takes for the 4:2:0 formats."""
        data = self.data.numpy()
        if self.format.depth > 8:
            data = data.view(np.uint16)
        return data.reshape(self.height * 3 // 2, self.width)


def nv12_to_rgb(luma: torch.Tensor, chroma: torch.Tensor, matrix: str = "bt601", full: bool = False) -> torch.Tensor:
    """An 8-bit NV12 picture (``luma`` [H, W], ``chroma`` [H/2, W]: U and V interleaved) -> RGB [H, W, 3]
    uint8 on their device, as swscale converts 4:2:0 to RGB: each chroma sample for its 2 x 2 pixels.
    Float arithmetic where swscale's tables are fixed point: within 3 levels of it (tests/test_decoders.py)."""
    kr, kb = MATRICES[matrix]
    kg = 1 - kr - kb
    y = luma.float() if full else (luma.float() - 16) * (255 / 219)
    uv = chroma.float().reshape(chroma.shape[0], -1, 2) - 128  # [H/2, W/2, 2]
    uv = (uv if full else uv * (255 / 224)).repeat_interleave(2, 0).repeat_interleave(2, 1)[: luma.shape[0], : luma.shape[1]]
    u, v = uv.unbind(-1)
    rgb = torch.stack((y + 2 * (1 - kr) * v, y - (2 * kb * (1 - kb) * u + 2 * kr * (1 - kr) * v) / kg, y + 2 * (1 - kb) * u), -1)
    return rgb.round_().clamp_(0, 255).to(torch.uint8)
