"""The edge's middles converted on its device to the output's 4:2:0 planes
(:mod:`eden_serve.media.planes`), as the writer's RGB conversion (FFmpeg's swscale) would make them,
within one level: so half the bytes of 8-bit RGB cross back to the host, and the writer's thread no
longer converts.

swscale's conversion, measured against PyAV 18's (least squares over random frames): each pixel's
Y, U and V by the matrix, scaled to the range and depth; the chroma then taken at every other row
and column, averaging two columns (2i, 2i + 1) and four rows (2j - 1 to 2j + 2, weighted 1, 3, 3, 1;
the edge rows repeated). Chroma sited left (:mod:`eden_serve.media.siting`: FFmpeg's ``scale``
filter told ``out_chroma_loc=left`` and ``full_chroma_inp``) takes three columns instead, 2i - 1 to
2i + 1 weighted 1, 2, 1 (the first column repeated), the rows alike. The arithmetic here is float32
rounded once, where swscale's is fixed point: samples differ by at most one level
(``tests/test_planes.py``, ``tests/test_siting.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..media.planes import MATRICES, PlaneFormat


def to_planes(pixels: torch.Tensor, format: PlaneFormat) -> torch.Tensor:
    """[B, H, W, 3] uint8 RGB -> [B, H W 3/2]: each frame's Y, U and V planes back to back, uint8
    for 8 bits, int16 for more, on the pixels' device. (From 16-bit RGB swscale filters the chroma
    otherwise, 2-4 levels away from this: deeper middles stay RGB.)"""
    assert pixels.dtype == torch.uint8, pixels.dtype
    batch, height, width, _ = pixels.shape
    kr, kb = MATRICES[format.matrix]
    rgb = pixels.permute(0, 3, 1, 2).float()  # [B, 3, H, W]
    r, g, b = rgb.unbind(1)
    luma = kr * r + (1 - kr - kb) * g + kb * b
    chroma = torch.stack(((b - luma) / (2 * (1 - kb)), (r - luma) / (2 * (1 - kr))), 1)  # [B, 2, H, W], in [-127.5, 127.5]
    top = (1 << format.depth) - 1
    if format.full:
        y_plane, c_scale, c_offset = luma * (top / 255), top / 255, float(1 << (format.depth - 1))
    else:
        unit = 1 << (format.depth - 8)
        y_plane, c_scale, c_offset = (16 + luma * (219 / 255)) * unit, 224 / 255 * unit, float(128 * unit)
    # Two columns averaged (or three weighted 1, 2, 1 about column 2i, for chroma sited left), then
    # rows 2j - 1 .. 2j + 2 weighted 1, 3, 3, 1 (edge rows repeated).
    if format.left:
        before = torch.cat((chroma[..., :1], chroma[..., 1:-1:2]), -1)  # column 2i - 1; at i = 0, column 0
        columns = 0.25 * (before + 2 * chroma[..., 0::2] + chroma[..., 1::2])
    else:
        columns = 0.5 * (chroma[..., 0::2] + chroma[..., 1::2])
    padded = F.pad(columns, (0, 0, 1, 1), mode="replicate")
    rows = (padded[..., 0:-2:2, :] + 3 * padded[..., 1:-1:2, :] + 3 * padded[..., 2::2, :] + padded[..., 3::2, :]) / 8
    planes = torch.cat((y_plane.reshape(batch, -1), (rows * c_scale + c_offset).reshape(batch, -1)), 1)
    samples = planes.round_().clamp_(0, top)
    return samples.to(torch.uint8 if format.depth == 8 else torch.int16)
