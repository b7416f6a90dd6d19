"""The ``frames`` kind, wire format 3: a chunk's frames themselves, losslessly compressed, and what
the cloud decided about its pairs. The edge re-derives the condition tokens from the frames with
the same E_cond weights (its own copy, :mod:`eden_serve.edge.conditions`), so it computes from
float32 conditions for about a twentieth of bf16+zstd's bytes (docs/wire-codecs.md has the
measurements and when to choose it).

The header has exactly these keys: ``fingerprint`` and ``hidden_dim`` of the model, ``codec``
("frames"), ``cloud`` (the digest of the cloud weights, which the edge must hold too), ``size``
(height, width), ``frames`` (F), ``differences`` (K = F - 1 float32 values), ``seeds`` (K integers),
``cuts`` (the pairs across a scene cut, increasing; the edge answers each with its earlier frame)
and ``lengths`` (the bytes of each frame's image), and ``depth`` (16) for frames deeper than 8 bits.
The frames' normalisation statistics are not sent: the edge computes them as it embeds the frames,
exactly as the cloud would have.

The body is the F images in order. 8-bit frames are each a lossless WebP (the simple VP8L format,
RGB): on real video it is a third smaller than PNG for the same CPU time, and smaller than zstd of
inter-frame differences too, whose camera noise does not cancel. 16-bit frames (a video deeper than
8 bits, 16-bit images), which WebP cannot hold, are each a 16-bit RGB PNG (:mod:`.png`). Before a
byte is decompressed, every image's own header must state the chunk's size and depth, and the
lengths must add up to the body.
"""

from __future__ import annotations

import io
import math
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from ..config import EdenConfig
from ..errors import CodecError
from .decisions import Decided, Decisions, check_header, header, read_decisions
from .envelope import FRAMES_VERSION, MAX_FRAMES, MAX_TOKENS, Limits, check_limits, cloud_digest, integer, integer_pair, invalid, seal
from .kinds import Cloud, Edge, Kind, Source, source_pixels
from .png import RGB16, most_png_bytes, png_header, rgb16_pixels, rgb16_png

FRAMES_CODEC = "frames"
WEBP_MAX_SIDE = 16383  # VP8L stores each side in 14 bits; the frames kind holds 16-bit frames to it too
_FRAMES_KEYS = {"fingerprint", "hidden_dim", "codec", "cloud", "size", "frames", "differences", "seeds", "cuts", "lengths"}
# RIFF header, chunk header and the VP8L signature byte, then 14 bits width - 1, 14 bits height - 1,
# 1 bit alpha (must be 0: RGB), 3 bits version (0).
_VP8L = struct.Struct("<4sI4s4sIBI")


@dataclass
class FramesChunk(Decided):
    """F consecutive frames and the cloud's decisions about their K = F - 1 pairs (the decisions
    name the cloud weights that the conditions are to be derived with, and the frames' depth)."""

    pixels: np.ndarray  # [F, H, W, 3] uint8, or uint16 where the decisions' depth is 16
    decisions: Decisions

    @property
    def frames(self) -> int:
        return len(self.pixels)

    @property
    def size(self) -> tuple[int, int]:
        return tuple(self.pixels.shape[1:3])


def encode_frames(chunk: FramesChunk, config: EdenConfig) -> bytes:
    pixels, dtype = chunk.pixels, np.uint16 if chunk.depth == 16 else np.uint8
    if not isinstance(pixels, np.ndarray) or pixels.dtype != dtype or pixels.ndim != 4 or pixels.shape[-1] != 3:
        raise invalid("pixels", f"must be a {np.dtype(dtype).name} array [F, H, W, 3] for frames of {chunk.depth} bits", payload=False)
    frames = integer(chunk.frames, "frames", MAX_FRAMES, lo=2, payload=False)
    size = integer_pair(chunk.size, "size", WEBP_MAX_SIDE, payload=False)
    n = math.prod(config.patch_grid(*size))
    if n > MAX_TOKENS:
        raise CodecError(f"{size[0]}x{size[1]} frames give {n} tokens, over the wire limit of {MAX_TOKENS}; downscale them")
    head = header(config, FRAMES_CODEC, chunk.decisions, frames, {"size": list(size), "frames": frames})
    images = [_webp(frame) if dtype == np.uint8 else rgb16_png(frame) for frame in pixels]
    return seal({**head, "lengths": [len(image) for image in images]}, images, FRAMES_VERSION)


def decode_frames(head: dict, body: memoryview, config: EdenConfig, limits: Limits) -> FramesChunk:
    """The frames chunk of a version 3 payload, checked in the order of ``wire.decode``'s docstring."""
    check_header(head, _FRAMES_KEYS, (FRAMES_CODEC,), FRAMES_VERSION, config)
    cloud = cloud_digest(head["cloud"])
    size = integer_pair(head["size"], "size", WEBP_MAX_SIDE)
    n = math.prod(config.patch_grid(*size))
    frames = integer(head["frames"], "frames", MAX_FRAMES, lo=2)
    check_limits(size, n, frames, limits)
    decisions = read_decisions(head, frames, cloud)
    lengths, depth = head["lengths"], decisions.depth
    # A lossless WebP of noise takes a little over the raw pixels; four bytes a pixel is plenty.
    most = 4 * size[0] * size[1] + 4096 if depth == 8 else most_png_bytes(size[1], size[0], depth)
    if not isinstance(lengths, list) or len(lengths) != frames:
        raise invalid("lengths", f"must be a list of {frames} integers, got {lengths!r:.60}")
    lengths = [integer(length, "lengths", most, lo=_VP8L.size) for length in lengths]
    if sum(lengths) != len(body):
        raise CodecError(f"malformed payload: the frames take {sum(lengths)} bytes, but the body has {len(body)}")
    starts = np.cumsum([0, *lengths])
    images = [body[start:end] for start, end in zip(starts[:-1], starts[1:])]
    check, read = (_check_webp, _unwebp) if depth == 8 else (_check_png16, _unpng16)
    for index, image in enumerate(images):
        check(image, size, index)  # every header before any pixel is decoded
    pixels = np.empty((frames, *size, 3), np.uint8 if depth == 8 else np.uint16)
    for index, image in enumerate(images):
        pixels[index] = read(image, size, index)
    return FramesChunk(pixels, decisions)


def _webp(frame: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    # Lossless, the fastest method: higher methods and qualities cost 5-200x the time for at most
    # a quarter fewer bytes (docs/wire-codecs.md).
    Image.fromarray(frame, "RGB").save(buffer, format="WEBP", lossless=True, quality=0, method=0, exact=True)
    return buffer.getvalue()


def _check_webp(data: memoryview, size: tuple[int, int], index: int) -> None:
    """A simple-format lossless WebP of ``size`` (height, width), judged by its 30 header bytes."""
    riff, riff_size, webp, chunk, chunk_size, signature, bits = _VP8L.unpack_from(data)
    width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if (riff, webp, chunk, signature, bits >> 28) != (b"RIFF", b"WEBP", b"VP8L", 0x2F, 0) or riff_size != len(data) - 8 \
            or chunk_size > len(data) - 20:
        raise CodecError(f"malformed payload: frame {index} is not a lossless WebP image; re-encode it with the frames codec")
    if (height, width) != size:
        raise CodecError(
            f"malformed payload: frame {index} is {width}x{height}, but the chunk's frames are {size[1]}x{size[0]}; "
            "a chunk's frames share one size"
        )


def _unwebp(data: memoryview, size: tuple[int, int], index: int) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data), formats=["WEBP"]) as image:
            if image.size != size[::-1] or image.mode != "RGB" or getattr(image, "n_frames", 1) != 1:
                raise ValueError("not one RGB image of the chunk's size")
            image.load()
            array = np.asarray(image)
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
        raise CodecError(f"malformed payload: frame {index} does not decode as a lossless WebP ({type(exc).__name__})") from None
    return array


def _check_png16(data: memoryview, size: tuple[int, int], index: int) -> None:
    """A 16-bit RGB PNG of ``size`` (height, width), judged by its header."""
    stated = png_header(data)
    if stated is None or stated[2:] != RGB16:
        raise CodecError(f"malformed payload: frame {index} is not a 16-bit RGB PNG image; re-encode it with the frames codec")
    if stated[1::-1] != size:
        raise CodecError(f"malformed payload: frame {index} is {stated[0]}x{stated[1]}, but the chunk's frames are "
                         f"{size[1]}x{size[0]}; a chunk's frames share one size")


def _unpng16(data: memoryview, size: tuple[int, int], index: int) -> np.ndarray:
    try:
        return rgb16_pixels(data, size)
    except ValueError as exc:
        raise CodecError(f"malformed payload: frame {index} does not decode as a 16-bit RGB PNG ({exc})") from None


class FramesKind(Kind):
    """The frames themselves: the cloud decides about the pairs only, the edge runs E_cond."""

    name = FRAMES_CODEC
    version = FRAMES_VERSION
    carries = FramesChunk
    carried = "the frames (CloudEncoder.frames_chunk); the token codecs carry the tokens (CloudEncoder.encode_chunk)"

    def make(self, cloud: Cloud, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None,
             source: Source | None = None, depth: int = 8) -> FramesChunk:
        return cloud.frames_chunk(frames, seed, scene_threshold, depth, source_pixels(source))

    def encode(self, chunk: FramesChunk, config: EdenConfig) -> bytes:
        return encode_frames(chunk, config)

    def open(self, head: dict, body: memoryview, config: EdenConfig, limits: Limits) -> FramesChunk:
        return decode_frames(head, body, config, limits)

    def conditions(self, chunk: FramesChunk, edge: Edge):
        return edge.embed(chunk)


FRAMES = FramesKind()
