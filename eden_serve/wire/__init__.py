"""What crosses the wire between the cloud encoder and the edge DiT+decoder.

A :class:`Chunk` holds F consecutive frames' condition tokens, each frame once, with each frame's own
normalisation statistics, and each of its K = F - 1 pairs' frame-difference scalar and noise seed. A
pair is the chunk of two frames. :meth:`Chunk.pair` gives the edge one pair's :class:`Conditions`.
A pair across a scene cut carries its middle instead: the earlier frame, as an 8-bit RGB PNG.
Positional embeddings and padding are *not* here: the edge recomputes them from ``grid`` and ``size``.

The payload (:mod:`.envelope` has the byte layout, :mod:`.tensors` the body) has a JSON header with
exactly these keys: ``fingerprint`` and ``hidden_dim`` of the model that made it, ``codec``, ``size``
(height, width), ``grid`` (the patch grid), ``frames`` (F), ``means`` and ``stds`` (F float32 values),
``differences`` (K float32 values), ``seeds`` (K integers) and ``cuts`` (``[pair, bytes]`` of each
pair across a scene cut, in pair order; the PNGs follow the tensors in the body, in that order).
That is wire format 2. The ``frames`` codec (format 3, :mod:`.pixels`) sends a :class:`FramesChunk`
instead: the frames themselves, from which the edge re-derives the chunk. The ``bitstream`` codec
(format 4, :mod:`.bitstream`) sends a :class:`BitstreamChunk`: the video's own packets, which the
edge decodes to those frames (``eden_serve.media.packets.to_frames_chunk``).

:func:`decode` never unpickles, and checks in order: prefix, magic, version, header length, the
digest, the header's keys, types and ranges, model fingerprint and width, grid against size, the
frame count, the tokens and pixels against the receiver's limits, the body's size against what the
header implies (format 3: every frame's image header; format 4: the packet table), and only then
reads the tensors (or decompresses the frames), frame by frame, into arrays of the body's own dtype;
a format 4 payload's packets are decoded later, by ``clips.packets``. It raises only
:class:`CodecError` (or a subclass).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np
import torch
import zstandard

from ..config import MAX_SEED, EdenConfig
from ..errors import BadInputError, CodecError
from .bitstream import BITSTREAM_CODEC, BitstreamChunk, decode_bitstream, encode_bitstream
from .envelope import (
    BITSTREAM_VERSION,
    FORMAT_VERSION,
    FRAMES_VERSION,
    MAGIC,
    MAX_FRAMES,
    MAX_SIDE,
    MAX_TOKENS,
    REENCODE,
    TOKENS_VERSION,
    Limits,
    check_limits,
    check_model,
    float32_list,
    integer,
    integer_pair,
    invalid,
    open_envelope,
    seal,
    to_float32,
)
from .pixels import FRAMES_CODEC, FramesChunk, decode_frames, encode_frames
from .tensors import CODECS as TOKEN_CODECS
from .tensors import Codec, Tokens, finite, layout, pack, unpack
from .tensors import parse_codec as token_codec

__all__ = ["BITSTREAM_CODEC", "CODECS", "DEFAULT_CODEC", "FORMAT_VERSION", "FRAMES_CODEC", "MAGIC", "MAX_FRAMES", "MAX_TOKENS", "NO_WIRE", "TOKEN_CODECS",
           "BitstreamChunk", "Chunk", "Codec", "Conditions", "FramesChunk", "Tokens", "check_codec", "decode", "encode", "parse_codec", "token_codec"]

CODECS: tuple[str, ...] = (*TOKEN_CODECS, FRAMES_CODEC)
# bf16+zstd: half of fp32's bytes and less again inside a chunk, a relative error of at most 2**-8
# whatever the token distribution, and fp32's range (docs/wire-format.md).
DEFAULT_CODEC = "bf16+zstd"
# Where both halves share a process: the chunk's tensors handed from the cloud's device to the
# edge's, never encoded (so exactly what fp32 would deliver).
NO_WIRE = "none"
_ZSTD_LEVEL = 3  # higher levels cost several times the CPU for under 1% smaller payloads
_HEADER_KEYS = {"fingerprint", "hidden_dim", "codec", "size", "grid", "frames", "means", "stds", "differences", "seeds", "cuts"}
_PNG_RGB8 = struct.Struct(">8sI4sIIBB")  # signature, IHDR length and type, width, height, bit depth, colour type


@dataclass
class Conditions:
    """Everything the edge needs for one pair besides its own weights, in float32."""

    cond_dit: torch.Tensor  # [2, N, D], frame 0 first; N = grid[0] * grid[1]
    cond_dec: torch.Tensor  # [2, N, D]
    mean: float  # the pair's averaged normalisation statistics
    std: float
    difference: float  # standardised frame-difference scalar
    grid: tuple[int, int]  # (ph, pw): patch grid of the padded frames
    size: tuple[int, int]  # (height, width) of the original frames
    seed: int = 0  # noise seed of the edge sampler


@dataclass
class Chunk:
    """F consecutive frames' conditions; pair j is frames j and j + 1."""

    cond_dit: Tokens  # [F, N, D]
    cond_dec: Tokens
    means: list[float]  # F: each frame's own normalisation statistics (float32 values)
    stds: list[float]
    differences: list[float]  # K = F - 1: each pair's frame-difference scalar
    seeds: list[int]  # K: each pair's noise seed
    grid: tuple[int, int]
    size: tuple[int, int]
    # pair -> its middle, the earlier frame as PNG (in one process without the wire: its uint8 pixels [H, W, 3])
    cuts: dict[int, bytes | torch.Tensor] = field(default_factory=dict)

    @property
    def frames(self) -> int:
        return len(self.means)

    @property
    def pairs(self) -> int:
        return len(self.seeds)

    def pair(self, j: int) -> Conditions:
        """Pair j's conditions: its two frames in float32, their statistics averaged in float32 (as
        the official code averages a pair's)."""
        stats = torch.tensor([self.means[j : j + 2], self.stds[j : j + 2]], dtype=torch.float32).mean(dim=1)
        return Conditions(
            self.cond_dit.frames(j, j + 2), self.cond_dec.frames(j, j + 2), stats[0].item(), stats[1].item(),
            self.differences[j], self.grid, self.size, self.seeds[j],
        )


def parse_codec(name: str) -> str:
    """``name`` if it is a codec of this release (:data:`CODECS`), else :class:`BadInputError`."""
    if not isinstance(name, str) or name not in CODECS:
        raise BadInputError(f"unknown codec {name!r:.60}; choose one of {', '.join(CODECS)}")
    return name


def check_codec(name: str) -> None:
    """A codec of one process: a wire codec (:func:`parse_codec`) or :data:`NO_WIRE`."""
    if name != NO_WIRE:
        parse_codec(name)


def encode(chunk: Chunk | FramesChunk | BitstreamChunk, config: EdenConfig, codec: str = DEFAULT_CODEC) -> bytes:
    """Serialise ``chunk`` for a receiver running a model with the same ``config``: a :class:`Chunk`
    with a token codec, a :class:`FramesChunk` with the frames codec, a :class:`BitstreamChunk`
    with the bitstream codec (:data:`BITSTREAM_CODEC`, not one of :data:`CODECS`: only a cloud that
    holds the video can make one)."""
    if codec == BITSTREAM_CODEC or isinstance(chunk, BitstreamChunk):
        if codec != BITSTREAM_CODEC or not isinstance(chunk, BitstreamChunk):
            raise CodecError(f"codec {codec} does not carry a {type(chunk).__name__}: the bitstream codec carries a "
                             "BitstreamChunk, made of a video's packets")
        return encode_bitstream(chunk, config)
    if parse_codec(codec) == FRAMES_CODEC or isinstance(chunk, FramesChunk):
        if codec != FRAMES_CODEC or not isinstance(chunk, FramesChunk):
            raise CodecError(f"codec {codec} does not carry a {type(chunk).__name__}: the frames codec carries the frames "
                             "(CloudEncoder.frames_chunk), the others the tokens (CloudEncoder.encode_chunk)")
        return encode_frames(chunk, config)
    spec = token_codec(codec)
    size = integer_pair(chunk.size, "size", MAX_SIDE, payload=False)
    grid = integer_pair(chunk.grid, "grid", MAX_SIDE, payload=False)
    n = _tokens(grid, size, config)
    frames = integer(chunk.frames, "frames", MAX_FRAMES, lo=2, payload=False)
    if n > MAX_TOKENS:
        raise CodecError(f"{size[0]}x{size[1]} frames give {n} tokens, over the wire limit of {MAX_TOKENS}; downscale them")
    if len(chunk.stds) != frames or len(chunk.differences) != frames - 1 or len(chunk.seeds) != frames - 1:
        raise invalid("stds", f"must number {frames} (one per frame), and differences and seeds {frames - 1}", payload=False)
    header = {
        "fingerprint": config.fingerprint(),
        "hidden_dim": config.hidden_dim,
        "codec": spec.name,
        "size": list(size),
        "grid": list(grid),
        "frames": frames,
        **{key: [to_float32(v, key) for v in getattr(chunk, key)] for key in ("means", "stds", "differences")},
        "seeds": [integer(s, "seeds", MAX_SEED, payload=False) for s in chunk.seeds],
        "cuts": [[integer(j, "cuts", frames - 2, payload=False), len(chunk.cuts[j])] for j in sorted(chunk.cuts)],
    }
    shape = (frames, n, config.hidden_dim)
    parts = []
    for name in ("cond_dit", "cond_dec"):
        x = getattr(chunk, name).frames(0, frames)
        if tuple(x.shape) != shape:
            raise invalid(name, f"must have shape {shape} for grid {grid}, got {tuple(x.shape)}", payload=False)
        if not finite(x):
            raise invalid(name, "contains NaN or infinity", payload=False)
        parts += pack(name, x.contiguous(), spec.encoding, delta=spec.zstd)
    if spec.zstd:
        compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compressobj(size=sum(p.nbytes for p in parts))
        parts = [b"".join([*(compressor.compress(np.ascontiguousarray(p)) for p in parts), compressor.flush()])]
    else:
        parts = [np.ascontiguousarray(p) for p in parts]
    copies = [chunk.cuts[j] for j in sorted(chunk.cuts)]
    for png in copies:
        _check_png(png, size, payload=False)
    return seal(header, parts + copies, TOKENS_VERSION)


def decode(
    data: bytes | bytearray | memoryview,
    config: EdenConfig,
    *,
    max_tokens: int | None = None,
    max_frames: int | None = None,
    max_chunk_tokens: int | None = None,
    max_pixels: int | None = None,
) -> Chunk | FramesChunk | BitstreamChunk:
    """Parse and validate a payload for a receiver running ``config``: a :class:`Chunk`, or for the
    frames codec a :class:`FramesChunk` (its conditions are then ``CloudEncoder.restore``'s to make),
    for the bitstream codec a :class:`BitstreamChunk` (``clips.packets.to_frames_chunk`` decodes it).

    ``max_tokens`` caps the tokens per frame, ``max_frames`` the frames, ``max_chunk_tokens`` the
    tokens of all frames together and ``max_pixels`` each frame's pixels (on top of the format's own
    caps); they are checked before anything proportional to the payload's declared size is allocated.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"payload must be bytes, got {type(data).__name__}; pass the raw request body")
    version, header, body = open_envelope(memoryview(data).cast("B"))
    limits = Limits(max_tokens, max_frames, max_chunk_tokens, max_pixels)
    if version == FRAMES_VERSION:
        return decode_frames(header, body, config, limits)
    if version == BITSTREAM_VERSION:
        return decode_bitstream(header, body, config, limits)
    keys = set(header)
    if keys != _HEADER_KEYS:
        raise CodecError(f"malformed payload: header has {str(sorted(keys)):.200}, not the keys {sorted(_HEADER_KEYS)}; {REENCODE}")

    check_model(header, config)
    codec = header["codec"]
    if codec not in TOKEN_CODECS:
        raise invalid("codec", f"is {codec!r:.40}, not one of format {TOKENS_VERSION} ({', '.join(TOKEN_CODECS)})")
    spec = token_codec(codec)
    size = integer_pair(header["size"], "size", MAX_SIDE)
    grid = integer_pair(header["grid"], "grid", MAX_SIDE)
    n = _tokens(grid, size, config)
    frames = integer(header["frames"], "frames", MAX_FRAMES, lo=2)
    check_limits(size, n, frames, limits)
    means, stds = (float32_list(header[key], key, frames) for key in ("means", "stds"))
    differences = float32_list(header["differences"], "differences", frames - 1)
    seeds = header["seeds"]
    if not isinstance(seeds, list) or len(seeds) != frames - 1:
        raise invalid("seeds", f"must be a list of {frames - 1} integers, got {seeds!r:.60}")
    seeds = [integer(s, "seeds", MAX_SEED) for s in seeds]
    cuts = _cut_lengths(header["cuts"], frames - 1, size)

    copies_start = len(body) - sum(cuts.values())
    if copies_start < 0:
        raise CodecError(f"malformed payload: the body is shorter than the PNGs of its scene cuts; {REENCODE}")
    copies = {}
    for j, length in cuts.items():
        copies[j] = bytes(body[copies_start : copies_start + length])
        _check_png(copies[j], size)
        copies_start += length
    parts = layout(spec.encoding, frames, n, config.hidden_dim)
    read = _reader(body[: len(body) - sum(cuts.values())], sum(length for _, length in parts), spec.zstd)
    tokens = {name: unpack(read, spec.encoding, spec.zstd, frames, n, config.hidden_dim) for name in ("cond_dit", "cond_dec")}
    read(0)  # the tensors must end here
    return Chunk(tokens["cond_dit"], tokens["cond_dec"], means, stds, differences, seeds, grid, size, copies)


def _cut_lengths(value: object, pairs: int, size: tuple[int, int]) -> dict[int, int]:
    """{pair: PNG bytes} of the header's ``cuts``, pairs increasing, each PNG at most what an
    uncompressed 8-bit RGB PNG of the frame takes."""
    most = size[0] * (3 * size[1] + 1) * 2 + (1 << 16)
    if not isinstance(value, list) or len(value) > pairs:
        raise invalid("cuts", f"must be a list of at most {pairs} [pair, bytes] entries, got {value!r:.60}")
    cuts, last = {}, -1
    for entry in value:
        if not isinstance(entry, list) or len(entry) != 2:
            raise invalid("cuts", f"entries must be [pair, bytes], got {entry!r:.40}")
        j = integer(entry[0], "cuts", pairs - 1, lo=last + 1)
        cuts[j], last = integer(entry[1], "cuts", most, lo=_PNG_RGB8.size), j
    return cuts


def _check_png(data: bytes, size: tuple[int, int], *, payload: bool = True) -> None:
    """An 8-bit RGB PNG of ``size`` (height, width), judged by its header."""
    signature, length, kind, width, height, depth, colour = _PNG_RGB8.unpack_from(data) if len(data) >= _PNG_RGB8.size else (None,) * 7
    if (signature, length, kind, depth, colour) != (b"\x89PNG\r\n\x1a\n", 13, b"IHDR", 8, 2) or (height, width) != size:
        raise invalid("cuts", f"must name 8-bit RGB PNGs of {size[1]}x{size[0]}, the frames' size", payload=payload)


def _reader(body: memoryview, expected: int, compressed: bool):
    """``read(count)``: the body's next ``count`` bytes as a new writable array; ``read(0)`` checks
    that the body ends there. The zstd frame is read as a stream, so only the result is allocated."""
    if not compressed:
        if len(body) != expected:
            raise CodecError(f"malformed payload: the body has {len(body)} bytes, but its tensors take {expected}; {REENCODE}")
        offset = 0

        def read(count: int) -> np.ndarray:
            nonlocal offset
            part = np.frombuffer(body, np.uint8, count, offset).copy() if count else np.empty(0, np.uint8)
            offset += count
            return part

        return read
    try:
        # zstd allocates what a frame declares, so that is checked first.
        declared = zstandard.get_frame_parameters(body).content_size
    except zstandard.ZstdError as exc:
        raise CodecError(f"malformed payload: invalid zstd body ({exc}); {REENCODE}") from exc
    if declared != expected:
        raise CodecError(f"malformed payload: the zstd frame declares {declared} bytes, but the tensors take {expected}; {REENCODE}")
    stream = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)

    def read(count: int) -> np.ndarray:
        part = np.empty(count, np.uint8)
        view, filled = memoryview(part), 0
        try:
            while filled < count:
                got = stream.readinto(view[filled:])
                if not got:
                    raise CodecError(f"malformed payload: the zstd body ends early; {REENCODE}")
                filled += got
            if count == 0 and stream.read(1):
                raise CodecError(f"malformed payload: the zstd body goes on past its tensors; {REENCODE}")
        except zstandard.ZstdError as exc:
            raise CodecError(f"malformed payload: invalid zstd body ({exc}); {REENCODE}") from exc
        return part

    return read


def _tokens(grid: tuple[int, int], size: tuple[int, int], config: EdenConfig) -> int:
    expected = config.patch_grid(*size)
    if grid != expected:
        raise CodecError(
            f"grid {grid} does not fit {size[0]}x{size[1]} frames, which pad to multiples of {config.pad_multiple} and "
            f"give {expected} with patch size {config.patch_size}; the sender's model config differs or its conditions are malformed"
        )
    return math.prod(grid)
