"""How the edge writes a request's middles: PNGs (a PNG for one pair, a zip of them for a chunk), or
raw frames (:mod:`eden_serve.wire.raw`) for a client that asks for them in field ``answer`` (header
``X-Eden-Answer`` over HTTP) where ``handler.raw_answers`` allows: ``loopback`` (the default: a
request addressed to this machine, by its Host header), ``any``, or ``off``. A request that asks
where they are not allowed gets PNGs; the content type says which came (docs/serving.md, "Raw answers").
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from ..errors import BadInputError
from ..media.frames import is_deep, open_deep, open_image, png_of
from ..media.planes import PlaneFormat, swscale_planes
from ..wire.answers import zip_of
from ..wire.raw import MATRIX_FLAGS, RAW, encode_planes, encode_raw, loopback
from .fields import PNG, ZIP, text

ANSWERS = ("png", "raw", "yuv")  # yuv: raw 4:2:0 planes, yuv[:MATRIX[:full[:left]]] (BT.601, limited range, centred where unsaid)


class AnswerFormat(NamedTuple):
    name: str
    encode: Callable[[np.ndarray], bytes]  # one middle, H x W x 3 uint8 (uint16 for a chunk deeper than 8 bits), or its planes
    whole: Callable[[list[bytes]], tuple[bytes, str]]  # the middles of a whole answer -> body, content type
    copy: Callable[[bytes], bytes]  # a cut pair's middle, the PNG of its earlier frame (a payload's, judged), in this format
    planes: PlaneFormat | None = None  # the planes the middles are converted to on the device, where all of a forward's ask the same


def _pngs(middles: list[bytes]) -> tuple[bytes, str]:
    return (middles[0], PNG) if len(middles) == 1 else (zip_of(middles), ZIP)


def _raw_copy(png: bytes) -> bytes:
    if is_deep(png):
        return encode_raw(open_deep(png, "a cut pair's middle", max_pixels=None).numpy())
    return encode_raw(np.asarray(open_image(png, "a cut pair's middle", max_pixels=None).convert("RGB")))


PNG_ANSWER = AnswerFormat("png", lambda pixels: png_of(pixels), _pngs, lambda png: png)  # png_of looked up at each call: tests wrap it
RAW_ANSWER = AnswerFormat("raw", encode_raw, lambda middles: (b"".join(middles), RAW), _raw_copy)


def planes_answer(format: PlaneFormat) -> AnswerFormat:
    """Raw middles as ``format``'s 8-bit planes: converted on a GPU edge's device where a forward's
    middles all go this way, else here from their RGB by swscale (as the client's writer would: the
    same planes); a chunk deeper than 8 bits keeps its RGB, and so does one of an odd width or
    height, which 4:2:0 planes cannot hold (swscale refused it, and the request's whole batch failed)."""

    def encode(pixels: np.ndarray) -> bytes:
        if pixels.dtype == np.uint16 or (pixels.ndim == 3 and (pixels.shape[0] % 2 or pixels.shape[1] % 2)):
            return encode_raw(pixels)
        if pixels.ndim == 3:  # RGB: converted here
            height, width, _ = pixels.shape
            pixels = swscale_planes(pixels, format)
        else:  # planes from the device, [H 3/2, W]
            height, width = pixels.shape[0] * 2 // 3, pixels.shape[1]
        return encode_planes(pixels.reshape(-1), width, height, format.matrix, format.full, format.left)

    def copy(png: bytes) -> bytes:
        return encode(open_deep(png, "a cut pair's middle", max_pixels=None).numpy() if is_deep(png)
                      else np.asarray(open_image(png, "a cut pair's middle", max_pixels=None).convert("RGB")))

    return AnswerFormat("yuv", encode, lambda middles: (b"".join(middles), RAW), copy, format)


def _plane_format(name: str) -> PlaneFormat:
    """``yuv[:MATRIX[:RANGE[:SITING]]]`` as the planes it asks for: SITING ``left`` or ``centre``
    (the default), where their chroma sits (media/siting.py)."""
    parts = name.split(":")
    matrix, full, siting = (parts[1:] + ["bt601", "limited", "centre"][len(parts) - 1:])[:3] if len(parts) <= 4 else ("", "", "")
    if matrix not in MATRIX_FLAGS or full not in ("limited", "full") or siting not in ("left", "centre"):
        raise BadInputError(f"answer yuv takes yuv[:{'|'.join(MATRIX_FLAGS)}[:limited|full[:left|centre]]], got {name!r:.40}")
    return PlaneFormat("yuvj420p" if full == "full" and matrix == "bt601" else "yuv420p", matrix, full == "full",
                       left=siting == "left")


def answer_format(value: Any, host: Any, policy: str) -> AnswerFormat:
    """The format of a request's answer: its ``answer`` field (png, raw or yuv[:MATRIX[:RANGE[:SITING]]];
    absent: png), as the policy allows for a request addressed to ``host``."""
    name = "png" if value is None else text(value, "answer")
    if name.split(":")[0] not in ANSWERS or (":" in name and not name.startswith("yuv:")):
        raise BadInputError(f"answer must be one of {', '.join(ANSWERS)}, got {name!r:.40}")
    allowed = policy == "any" or (policy == "loopback" and host is not None and loopback(text(host, "host")))
    if name.startswith("yuv"):
        format = _plane_format(name)
        return planes_answer(format) if allowed else PNG_ANSWER
    return RAW_ANSWER if name == "raw" and allowed else PNG_ANSWER
