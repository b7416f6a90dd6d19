"""PNG images judged by their header before a pixel is decoded: a cut pair's middle in a token
payload, a middle in an edge's answer, a frame of a frames payload deeper than 8 bits. They are RGB
images of the chunk's frame size, 8 bits a channel, or 16 where the frames are deeper than 8.

Pillow holds no 16-bit RGB image, so 16-bit RGB PNGs are written and read here (:func:`rgb16_png`,
which writes 16-bit RGBA too, and :func:`rgb16_pixels`): every row filtered by its left neighbour ("Sub"), one zlib stream. The reader
takes what this writer makes (filters None, Sub and Up, no interlacing), checks every chunk's CRC,
and inflates no more than the header's size implies; other 16-bit PNGs are media's (PyAV's) to read.
A PNG's colour chunks (its ICC profile, gamma, cICP...) are read as they are and put into another
(:func:`colour_chunks`, :func:`with_chunks`): a middle is shown as the frame before it.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import BinaryIO

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The signature, the IHDR chunk's length and type, then width, height, bit depth and colour type.
_HEADER = struct.Struct(">8sI4sIIBB")
PNG_HEADER_BYTES = _HEADER.size
RGB8 = (8, 2)  # bit depth 8, colour type 2: RGB
RGB16 = (16, 2)
RGBA16 = (16, 6)  # bit depth 16, colour type 6: RGB and alpha
GREY_ALPHA16 = (16, 4)  # colour type 4: grey and alpha, which media reads as RGBA
_CHUNK = struct.Struct(">I4s")
# zlib level 1: at 1080p a 16-bit frame takes a third of a second to deflate at level 1, and the
# higher levels cost several times that for a few per cent fewer bytes.
_LEVEL = 1
_SUB, _UP = 1, 2


# The chunks that say how a PNG's colours are shown: an ICC profile, sRGB's rendering intent, gamma,
# chromaticities, coding-independent code points, HDR's mastering display and content light level.
COLOUR_CHUNKS = frozenset({b"iCCP", b"sRGB", b"gAMA", b"cHRM", b"cICP", b"mDCv", b"cLLi"})
_HEADER_END = len(PNG_SIGNATURE) + _CHUNK.size + 13 + 4  # the signature and IHDR, whose body is 13 bytes


def colour_chunks(file: BinaryIO) -> bytes:
    """The colour chunks (:data:`COLOUR_CHUNKS`) of the PNG read from ``file``, whole and in their
    order, of those before its palette and pixels, where PNG places them; nothing for another image."""
    if file.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
        return b""
    found = []
    while len(head := file.read(_CHUNK.size)) == _CHUNK.size:
        length, kind = _CHUNK.unpack(head)
        if kind in (b"PLTE", b"IDAT", b"IEND"):
            break
        if kind in COLOUR_CHUNKS:
            found.append(head + file.read(length + 4))
        else:
            file.seek(length + 4, io.SEEK_CUR)
    return b"".join(found)


def icc_chunk(profile: bytes) -> bytes:
    """An ICC profile (another image format's) as a PNG's iCCP chunk."""
    return _chunk(b"iCCP", b"ICC profile\0\0" + zlib.compress(profile))


MAX_PROFILE_BYTES = 1 << 24  # an ICC profile inflated from an iCCP chunk, at most: a JPEG's APP2 segments hold about as much


def icc_profile(chunks: bytes) -> bytes | None:
    """The ICC profile of the iCCP chunk among whole ``chunks`` (:func:`colour_chunks`), inflated; None
    where there is none, or it does not inflate within :data:`MAX_PROFILE_BYTES`."""
    at = 0
    while at + _CHUNK.size <= len(chunks):
        length, kind = _CHUNK.unpack_from(chunks, at)
        body = chunks[at + _CHUNK.size:at + _CHUNK.size + length]
        at += _CHUNK.size + length + 4
        if kind == b"iCCP" and (name_end := body.find(b"\0")) >= 0:  # a name, a NUL, the compression method, the profile
            inflater = zlib.decompressobj()
            try:
                profile = inflater.decompress(body[name_end + 2:], MAX_PROFILE_BYTES)
            except zlib.error:
                return None
            return profile if profile and not inflater.unconsumed_tail else None
    return None


def with_chunks(png: bytes, chunks: bytes) -> bytes:
    """``png`` with whole ``chunks`` (:func:`colour_chunks`) after its header, where it states no colour of its own."""
    if not chunks or colour_chunks(io.BytesIO(png[:_HEADER_END + (1 << 16)])):
        return png
    return png[:_HEADER_END] + chunks + png[_HEADER_END:]


def without_chunks(png: bytes, kinds: frozenset[bytes]) -> bytes:
    """``png`` without its chunks of ``kinds``: the same bytes where it has none, or where its chunks do
    not walk to IEND (its decoder then says what is wrong)."""
    at, kept, dropped = len(PNG_SIGNATURE), [], False
    while at + _CHUNK.size <= len(png):
        length, kind = _CHUNK.unpack_from(png, at)
        end = at + _CHUNK.size + length + 4
        if end > len(png):
            return png
        if kind in kinds:
            dropped = True
        else:
            kept.append(memoryview(png)[at:end])
        at = end
        if kind == b"IEND":
            return b"".join([PNG_SIGNATURE, *kept]) if dropped else png
    return png


def png_header(data: bytes) -> tuple[int, int, int, int] | None:
    """(width, height, bit depth, colour type) that a PNG's header states; None where ``data`` does
    not start as a PNG does."""
    if len(data) < _HEADER.size:
        return None
    signature, length, kind, width, height, depth, colour = _HEADER.unpack_from(data)
    if (signature, length, kind) != (PNG_SIGNATURE, 13, b"IHDR"):
        return None
    return width, height, depth, colour


def most_png_bytes(width: int, height: int, depth: int = 8) -> int:
    """The largest PNG of an RGB frame of ``depth`` bits we accept: an uncompressed one, twice over."""
    return height * (3 * depth // 8 * width + 1) * 2 + (1 << 16)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return _CHUNK.pack(len(data), kind) + data + struct.pack(">I", zlib.crc32(kind + data))


def rgb16_png(pixels: np.ndarray) -> bytes:
    """H x W x 3 uint16 pixels as a 16-bit RGB PNG; H x W x 4 (RGB and alpha) as a 16-bit RGBA one."""
    height, width, channels = pixels.shape
    step = 2 * channels  # bytes a pixel: the Sub filter's distance
    row = np.ascontiguousarray(pixels, ">u2").view(np.uint8).reshape(height, step * width)
    filtered = np.empty((height, step * width + 1), np.uint8)
    filtered[:, 0] = _SUB
    filtered[:, 1:step + 1] = row[:, :step]
    np.subtract(row[:, step:], row[:, :-step], out=filtered[:, step + 1:])  # modulo 256, byte by byte, as PNG filters are
    header = struct.pack(">IIBBBBB", width, height, 16, (RGB16 if channels == 3 else RGBA16)[1], 0, 0, 0)
    return b"".join((PNG_SIGNATURE, _chunk(b"IHDR", header), _chunk(b"IDAT", zlib.compress(filtered, _LEVEL)), _chunk(b"IEND", b"")))


def rgb16_pixels(data: bytes | memoryview, size: tuple[int, int]) -> np.ndarray:
    """The H x W x 3 uint16 pixels of a 16-bit RGB PNG of ``size`` (height, width) as
    :func:`rgb16_png` writes them; ValueError for anything else, before a byte is inflated where
    the header or a chunk is wrong."""
    data = memoryview(data)
    stated = png_header(data)
    height, width = size
    if stated is None or stated != (width, height, *RGB16) or bytes(data[_HEADER.size:_HEADER.size + 3]) != b"\0\0\0":
        raise ValueError(f"not a non-interlaced 16-bit RGB PNG of {width}x{height}")
    expected = height * (6 * width + 1)
    inflater, parts, at = zlib.decompressobj(), [], len(PNG_SIGNATURE)
    while True:
        if at + _CHUNK.size + 4 > len(data):
            raise ValueError("cut short")
        length, kind = _CHUNK.unpack_from(data, at)
        body = data[at + _CHUNK.size : at + _CHUNK.size + length]
        if len(body) != length or struct.unpack_from(">I", data, at + _CHUNK.size + length)[0] != zlib.crc32(kind + body):
            raise ValueError(f"its {kind!r:.12} chunk fails its CRC")
        at += _CHUNK.size + length + 4
        if kind == b"IEND":
            break
        if kind == b"IDAT":
            parts.append(inflater.decompress(body, expected + 1 - sum(map(len, parts))))
    raw = b"".join(parts)
    if len(raw) != expected or not inflater.eof:
        raise ValueError(f"its pixels inflate to {len(raw)} bytes, not the {expected} of its size")
    rows = np.frombuffer(raw, np.uint8).reshape(height, 6 * width + 1)
    return _unfiltered(rows).view(">u2").reshape(height, width, 3).astype(np.uint16)


def _unfiltered(rows: np.ndarray) -> np.ndarray:
    """The rows of a 6-byte-a-pixel image without their filters (None, Sub, Up)."""
    filters, out = rows[:, 0], rows[:, 1:].copy()
    if (filters > _UP).any():
        raise ValueError("it uses a filter other than None, Sub or Up")
    height = len(out)
    for y in range(height):
        if filters[y] == _SUB:
            pixels = out[y].reshape(-1, 6)
            np.cumsum(pixels, axis=0, dtype=np.uint8, out=pixels)  # modulo 256
        elif filters[y] == _UP and y:
            out[y] += out[y - 1]
    return out
