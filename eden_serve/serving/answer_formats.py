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
from ..wire.answers import zip_of
from ..wire.raw import RAW, encode_raw, loopback
from .fields import PNG, ZIP, text

ANSWERS = ("png", "raw")


class AnswerFormat(NamedTuple):
    name: str
    encode: Callable[[np.ndarray], bytes]  # one middle, H x W x 3 uint8 (uint16 for a chunk deeper than 8 bits)
    whole: Callable[[list[bytes]], tuple[bytes, str]]  # the middles of a whole answer -> body, content type
    copy: Callable[[bytes], bytes]  # a cut pair's middle, the PNG of its earlier frame (a payload's, judged), in this format


def _pngs(middles: list[bytes]) -> tuple[bytes, str]:
    return (middles[0], PNG) if len(middles) == 1 else (zip_of(middles), ZIP)


def _raw_copy(png: bytes) -> bytes:
    if is_deep(png):
        return encode_raw(open_deep(png, "a cut pair's middle", max_pixels=None).numpy())
    return encode_raw(np.asarray(open_image(png, "a cut pair's middle", max_pixels=None).convert("RGB")))


PNG_ANSWER = AnswerFormat("png", lambda pixels: png_of(pixels), _pngs, lambda png: png)  # png_of looked up at each call: tests wrap it
RAW_ANSWER = AnswerFormat("raw", encode_raw, lambda middles: (b"".join(middles), RAW), _raw_copy)


def answer_format(value: Any, host: Any, policy: str) -> AnswerFormat:
    """The format of a request's answer: its ``answer`` field (png or raw; absent: png), as the
    policy allows for a request addressed to ``host``."""
    name = "png" if value is None else text(value, "answer")
    if name not in ANSWERS:
        raise BadInputError(f"answer must be one of {', '.join(ANSWERS)}, got {name!r:.40}")
    allowed = policy == "any" or (policy == "loopback" and host is not None and loopback(text(host, "host")))
    return RAW_ANSWER if name == "raw" and allowed else PNG_ANSWER
