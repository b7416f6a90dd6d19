"""Raw middles: the edge's answer for a client on the edge's own host, where a PNG's encoding and
decoding cost more than the bytes they save (docs/serving.md, "Raw answers").

A raw middle is a small header, then the frame's RGB pixels, rows top to bottom, never
compressed and never pickled::

    offset  size  field
    0       8     magic b"EDENRAWF"
    8       2     format version, u16: 1
    10      2     flags, u16: 0 for 8-bit channels, 1 for 16-bit ones (a chunk deeper than 8 bits);
                  or 2 (PLANES) for 8-bit 4:2:0 planes, with 4 for full range and 8 for BT.709 or
                  16 for BT.2020 (else limited range, BT.601), and 32 for chroma sited left
                  (co-sited with the even luma columns; else centred between them)
    12      4     width, u32
    16      4     height, u32
    20      3WH   the pixels (6WH at 16 bits, each channel u16); or 3WH/2: the planes Y, U, V
                  (U and V of (W/2) x (H/2)), as the edge converts to what the client writes

(integers little-endian). A whole answer to K pairs is K raw middles back to back; a streamed one
carries each in its record (:mod:`.answers`). A reader knows the frame size it asked for, so a
middle is judged by its header and its exact length before a pixel is read.
"""

from __future__ import annotations

import ipaddress
import struct
import urllib.parse
from typing import NamedTuple

import numpy as np

from ..errors import ServerError

RAW_MAGIC = b"EDENRAWF"
RAW_VERSION = 1
RAW = "application/x-eden-raw-frames"  # the content type of a whole raw answer
_HEADER = struct.Struct("<8sHHII")
RAW_HEADER_BYTES = _HEADER.size
DEEP = 1  # the flag of 16-bit channels
PLANES, FULL_RANGE, SITED_LEFT = 2, 4, 32  # 4:2:0 planes, their range, and their chroma's siting
MATRIX_FLAGS = {"bt601": 0, "bt709": 8, "bt2020": 16}
_DTYPES = {0: np.dtype(np.uint8), DEEP: np.dtype("<u2")}
_PLANE_FLAGS = {PLANES | full | matrix | left for full in (0, FULL_RANGE) for matrix in MATRIX_FLAGS.values()
                for left in (0, SITED_LEFT)}


class RawPlanes(NamedTuple):
    """A raw middle's 4:2:0 planes: ``data`` [W H 3/2] uint8, Y then U then V."""

    data: np.ndarray
    width: int
    height: int
    matrix: str
    full: bool
    left: bool = False  # chroma sited left, else centred (media/siting.py)


def raw_bytes(width: int, height: int, depth: int = 8, planes: bool = False) -> int:
    """The length of one raw middle of ``width`` x ``height`` at ``depth`` bits a channel (or as 8-bit planes)."""
    return _HEADER.size + (width * height * 3 // 2 if planes else 3 * depth // 8 * width * height)


def encode_planes(data: np.ndarray, width: int, height: int, matrix: str, full: bool, left: bool = False) -> bytes:
    """8-bit 4:2:0 planes, Y then U then V, as a raw middle (``left``: their chroma sited left)."""
    if data.dtype != np.uint8 or data.size != width * height * 3 // 2 or width % 2 or height % 2:
        raise ValueError(f"raw planes are W H 3/2 uint8 samples of an even size, got {data.dtype} {data.shape} for {width}x{height}")
    flags = PLANES | (FULL_RANGE if full else 0) | MATRIX_FLAGS[matrix] | (SITED_LEFT if left else 0)
    return _HEADER.pack(RAW_MAGIC, RAW_VERSION, flags, width, height) + np.ascontiguousarray(data).tobytes()


def encode_raw(pixels: np.ndarray) -> bytes:
    """H x W x 3 uint8 or uint16 pixels as a raw middle."""
    if pixels.dtype not in (np.uint8, np.uint16) or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"a raw middle is H x W x 3 uint8 or uint16 pixels, got {pixels.dtype} {pixels.shape}")
    height, width, _ = pixels.shape
    flags = DEEP if pixels.dtype == np.uint16 else 0
    # One copy of the pixels, not two (tobytes, then the sum): a 1080p middle is 6 MB.
    return b"".join((_HEADER.pack(RAW_MAGIC, RAW_VERSION, flags, width, height), np.ascontiguousarray(pixels, _DTYPES[flags]).data))


def is_raw(data: bytes | memoryview) -> bool:
    return bytes(data[: len(RAW_MAGIC)]) == RAW_MAGIC


def raw_depth(data: bytes | memoryview, where: str) -> int:
    """The bits a channel of a raw middle holds, from its header, which must be this format's."""
    if len(data) < _HEADER.size:
        raise ServerError(502, "bad_answer", f"the raw middle is {len(data)} bytes, shorter than its header {where}")
    magic, version, flags, _, _ = _HEADER.unpack_from(data)
    if magic != RAW_MAGIC:
        raise ServerError(502, "bad_answer", f"the answer is not a raw middle {where}")
    if version != RAW_VERSION or (flags not in _DTYPES and flags not in _PLANE_FLAGS):
        raise ServerError(502, "bad_answer", f"the raw middle has version {version}, flags {flags:#06x}; this client reads "
                                             f"version {RAW_VERSION} with flags 0, 1 or planes': run one eden-serve release on both {where}")
    return 8 * _DTYPES[flags].itemsize if flags in _DTYPES else 8


def _planes(data: bytes | memoryview) -> bool:
    return bool(_HEADER.unpack_from(data)[2] & PLANES)


def decode_raw(data: bytes | memoryview, size: tuple[int, int], where: str) -> np.ndarray | RawPlanes:
    """The pixels [H, W, 3] (uint8, or uint16 where its flags say so) of one raw middle of ``size``
    (width, height), or its planes where its flags say so, judged first."""
    width, height = size
    depth = raw_depth(data, where)
    _, _, flags, stated_w, stated_h = _HEADER.unpack_from(data)
    planes = bool(flags & PLANES)
    if (stated_w, stated_h) != (width, height):
        raise ServerError(502, "bad_answer", f"the raw middle is {stated_w}x{stated_h}, for frames of {width}x{height} {where}")
    if len(data) != raw_bytes(width, height, depth, planes):
        raise ServerError(502, "bad_answer", f"the raw middle is {len(data)} bytes, not the {raw_bytes(width, height, depth, planes)} "
                                             f"of a {width}x{height} frame of {depth} bits{' in planes' if planes else ''} {where}")
    if planes:
        matrix = next(name for name, flag in MATRIX_FLAGS.items() if flags & 24 == flag)
        return RawPlanes(np.frombuffer(data, np.uint8, offset=_HEADER.size), width, height, matrix, bool(flags & FULL_RANGE),
                         bool(flags & SITED_LEFT))
    return np.frombuffer(data, _DTYPES[flags], offset=_HEADER.size).reshape(height, width, 3)


def whole_raw(content: bytes, pairs: int, size: tuple[int, int], where: str) -> list[np.ndarray | RawPlanes]:
    """The ``pairs`` middles of a whole raw answer, all of the first one's depth and layout."""
    each = raw_bytes(*size, raw_depth(content, where), _planes(content))
    if len(content) != pairs * each:
        raise ServerError(502, "bad_answer", f"the raw answer is {len(content)} bytes, not {pairs} middles of {each} {where}")
    view = memoryview(content)
    return [decode_raw(view[j * each : (j + 1) * each], size, where) for j in range(pairs)]


def loopback(host: str | None) -> bool:
    """Whether ``host`` (a URL's host, or an HTTP Host header: a name or address, a port after it)
    is this machine: where raw answers pay by default."""
    try:
        name = urllib.parse.urlsplit(f"//{host}").hostname if host else None
    except ValueError:  # a malformed one, "[::1" say: not this machine's name
        return False
    if not name:
        return False
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return name == "localhost" or name.endswith(".localhost")
