"""A cloud request's frames, read within the server's limits: the pixels and sides of each frame, the
tokens it pads to, and the tokens of the whole chunk, judged from the image headers before a pixel
is decoded (docs/errors-and-limits.md)."""

from __future__ import annotations

from typing import Sequence

import torch

from ..config import EdenConfig
from ..errors import BadInputError, ChunkTooLargeError, FrameTooLargeError
from ..media.frames import SIXTEEN_BIT_MODES, check_frame, image_to_tensor, is_deep, open_deep, open_image, open_mode, pixels_to_tensor
from ..wire.envelope import Limits


def read_chunk(images: Sequence[bytes], config: EdenConfig, max_pixels: int, max_side: int, max_tokens: int,
               max_chunk_tokens: int) -> torch.Tensor:
    """A request's frames, image files ``frame0`` ... ``frameK`` -> [F, 3, H, W] float32 in [0, 1].

    Judged from the headers before a pixel is decoded, with the statuses decoding them first would
    give: each frame readable (400), within ``max_pixels``, ``max_side`` and ``max_tokens`` (413);
    all of one size (400); ``max_chunk_tokens`` in all (413). Then decoded one at a time into the
    batch, so a request's memory is bounded by the chunk limit: the batch, plus one frame's
    decoding (its pixels), whatever its files declare. A 16-bit RGB PNG or TIFF keeps its 16 bits.
    """
    limits = Limits(tokens=max_tokens, chunk_tokens=max_chunk_tokens, pixels=max_pixels)
    sizes = []
    for i, data in enumerate(images):
        width, height = check_frame(data, f"frame{i}", max_pixels, max_side)
        check_tokens(width, height, 1, config, limits, f"frame{i}")
        sizes.append((width, height))
    (width, height), count = sizes[0], len(sizes)
    for i, size in enumerate(sizes[1:], 1):
        if size != (width, height):
            raise BadInputError(f"frames differ in size: frame0 is {width}x{height}, frame{i} is {size[0]}x{size[1]}")
    check_tokens(width, height, count, config, limits)
    batch = torch.empty(count, 3, height, width)
    for i, data in enumerate(images):
        if is_deep(data, f"frame{i}"):  # 16-bit RGB, which Pillow would read as 8 bits
            pixels = open_deep(data, f"frame{i}", max_pixels, max_side)
            if pixels.shape[:2] != (height, width):
                raise BadInputError(f"frame{i} decodes to {pixels.shape[1]}x{pixels.shape[0]}, not the {width}x{height} its header states")
            batch[i] = pixels_to_tensor(pixels)
            continue
        image = open_image(data, f"frame{i}", max_pixels, max_side)
        if image.size != (width, height):  # an orientation stated after the pixel data, which the header read skips
            raise BadInputError(f"frame{i} decodes to {image.width}x{image.height}, not the {width}x{height} its header states")
        image_to_tensor(image, batch[i])
        del image
    return batch


def images_depth(images: Sequence[bytes]) -> int:
    """16 where a request's frames hold more than 8 bits a channel (16-bit RGB or grey), else 8: the
    depth the chunk's middles keep; from the headers, as :func:`read_chunk` has judged them."""
    for i, data in enumerate(images):
        if is_deep(data, f"frame{i}") or open_mode(data, f"frame{i}") in SIXTEEN_BIT_MODES:
            return 16
    return 8


def check_tokens(width: int, height: int, count: int, config: EdenConfig, limits: Limits, name: str = "frame") -> None:
    """``count`` frames of ``width`` x ``height`` within the token limits of one frame (413
    ``frame_too_large``) and of one request (413 ``chunk_too_large``)."""
    ph, pw = config.patch_grid(height, width)
    if ph * pw > limits.tokens:
        raise FrameTooLargeError(
            f"{name} is {width}x{height}, which pads to {ph * pw} tokens, over this server's {limits.tokens} "
            f"(frames of up to {limits.pixels} pixels and aspect ratio up to 4:1)"
        )
    if count * ph * pw > limits.chunk_tokens:
        raise ChunkTooLargeError(
            f"{count} frames of {width}x{height} are {count * ph * pw} tokens, over this server's {limits.chunk_tokens} "
            f"per request; send at most {limits.chunk_tokens // (ph * pw)} frames of this size"
        )
