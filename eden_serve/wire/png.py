"""PNG images judged by their header before a pixel is decoded: a cut pair's middle in a token
payload, a middle in an edge's answer. Both are 8-bit RGB images of the chunk's frame size."""

from __future__ import annotations

import struct

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The signature, the IHDR chunk's length and type, then width, height, bit depth and colour type.
_HEADER = struct.Struct(">8sI4sIIBB")
PNG_HEADER_BYTES = _HEADER.size
RGB8 = (8, 2)  # bit depth 8, colour type 2: RGB


def png_header(data: bytes) -> tuple[int, int, int, int] | None:
    """(width, height, bit depth, colour type) that a PNG's header states; None where ``data`` does
    not start as a PNG does."""
    if len(data) < _HEADER.size:
        return None
    signature, length, kind, width, height, depth, colour = _HEADER.unpack_from(data)
    if (signature, length, kind) != (PNG_SIGNATURE, 13, b"IHDR"):
        return None
    return width, height, depth, colour


def most_png_bytes(width: int, height: int) -> int:
    """The largest PNG of an 8-bit RGB frame we accept: an uncompressed one, twice over."""
    return height * (3 * width + 1) * 2 + (1 << 16)
