"""The token kinds, wire format 2: a chunk's condition tokens themselves, in one of the codecs of
:mod:`.tensors`; and the hand-over of the same tokens between two halves in one process.

A :class:`Chunk` holds F consecutive frames' condition tokens, each frame once, with each frame's own
normalisation statistics, and the cloud's :class:`~.decisions.Decisions` about its K = F - 1 pairs.
A pair is the chunk of two frames; :meth:`Chunk.pair` gives the edge one pair's :class:`Conditions`.
A pair across a scene cut carries its middle instead: the earlier frame, as an RGB PNG of the
chunk's depth (8 bits, or 16).
Positional embeddings and padding are *not* here: the edge recomputes them from ``grid`` and ``size``.

The header has exactly these keys: ``fingerprint`` and ``hidden_dim`` of the model that made it,
``codec``, ``size`` (height, width), ``grid`` (the patch grid), ``frames`` (F), ``means`` and
``stds`` (F float32 values), ``differences`` (K float32 values), ``seeds`` (K integers) and ``cuts``
(``[pair, bytes]`` of each pair across a scene cut, in pair order; the PNGs follow the tensors in
the body, in that order), and ``depth`` where it is 16 (:mod:`.decisions`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
import zstandard

from ..config import EdenConfig
from ..errors import CodecError
from .decisions import Decided, Decisions, check_header, header, read_decisions, read_depth
from .envelope import (
    MAX_FRAMES, MAX_SIDE, MAX_TOKENS, REENCODE, TOKENS_VERSION, Limits, check_limits, float32_list, integer, integer_pair,
    invalid, seal, to_float32,
)
from .kinds import Cloud, Edge, Kind, Source
from .png import PNG_HEADER_BYTES, most_png_bytes, png_header
from .tensors import CODECS, Codec, Tokens, finite, layout, pack, unpack

NO_WIRE = "none"
_ZSTD_LEVEL = 3  # higher levels cost several times the CPU for under 1% smaller payloads
_KEYS = {"fingerprint", "hidden_dim", "codec", "size", "grid", "frames", "means", "stds", "differences", "seeds", "cuts"}


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
class Chunk(Decided):
    """F consecutive frames' conditions; pair j is frames j and j + 1."""

    cond_dit: Tokens  # [F, N, D]
    cond_dec: Tokens
    means: list[float]  # F: each frame's own normalisation statistics (float32 values)
    stds: list[float]
    decisions: Decisions
    grid: tuple[int, int]
    size: tuple[int, int]
    # each cut pair's middle: its earlier frame as PNG (handed over in one process: its pixels [H, W, 3] at the chunk's depth)
    copies: dict[int, bytes | torch.Tensor] = field(default_factory=dict)

    @property
    def frames(self) -> int:
        return len(self.means)

    def pair(self, j: int) -> Conditions:
        """Pair j's conditions: its two frames in float32, their statistics averaged in float32 (as
        the official code averages a pair's)."""
        stats = torch.tensor([self.means[j : j + 2], self.stds[j : j + 2]], dtype=torch.float32).mean(dim=1)
        return Conditions(
            self.cond_dit.frames(j, j + 2), self.cond_dec.frames(j, j + 2), stats[0].item(), stats[1].item(),
            self.differences[j], self.grid, self.size, self.seeds[j],
        )


def encode_tokens(chunk: Chunk, config: EdenConfig, spec: Codec) -> bytes:
    size = integer_pair(chunk.size, "size", MAX_SIDE, payload=False)
    grid = integer_pair(chunk.grid, "grid", MAX_SIDE, payload=False)
    n = _tokens(grid, size, config)
    frames = integer(chunk.frames, "frames", MAX_FRAMES, lo=2, payload=False)
    if n > MAX_TOKENS:
        raise CodecError(f"{size[0]}x{size[1]} frames give {n} tokens, over the wire limit of {MAX_TOKENS}; downscale them")
    if len(chunk.stds) != frames:
        raise invalid("stds", f"must number {frames} (one per frame), like the means", payload=False)
    if set(chunk.copies) != set(chunk.cuts):
        raise invalid("copies", "must hold the middle of each pair across a cut, and no other", payload=False)
    statistics = {key: [to_float32(v, key) for v in getattr(chunk, key)] for key in ("means", "stds")}
    head = header(config, spec.name, chunk.decisions, frames, {"size": list(size), "grid": list(grid), "frames": frames, **statistics},
                  cloud=False)
    copies = [chunk.copies[j] for j in head["cuts"]]
    head["cuts"] = [[j, len(png)] for j, png in zip(head["cuts"], copies)]
    parts = _tensor_parts(chunk, (frames, n, config.hidden_dim), spec)
    for png in copies:
        _check_png(png, size, chunk.depth, payload=False)
    return seal(head, parts + copies, TOKENS_VERSION)


def _tensor_parts(chunk: Chunk, shape: tuple[int, int, int], spec: Codec) -> list:
    parts = []
    for name in ("cond_dit", "cond_dec"):
        x = getattr(chunk, name).frames(0, shape[0])
        if tuple(x.shape) != shape:
            raise invalid(name, f"must have shape {shape} for grid {chunk.grid}, got {tuple(x.shape)}", payload=False)
        if not finite(x):
            raise invalid(name, "contains NaN or infinity", payload=False)
        parts += pack(name, x.contiguous(), spec.encoding, delta=spec.zstd)
    if spec.zstd:
        compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compressobj(size=sum(p.nbytes for p in parts))
        return [b"".join([*(compressor.compress(np.ascontiguousarray(p)) for p in parts), compressor.flush()])]
    return [np.ascontiguousarray(p) for p in parts]


def open_tokens(head: dict, body: memoryview, config: EdenConfig, limits: Limits) -> Chunk:
    """The chunk of a version 2 payload, checked in the order of ``wire.decode``'s docstring."""
    spec = Codec.named(check_header(head, _KEYS, CODECS, TOKENS_VERSION, config))
    size = integer_pair(head["size"], "size", MAX_SIDE)
    grid = integer_pair(head["grid"], "grid", MAX_SIDE)
    n = _tokens(grid, size, config)
    frames = integer(head["frames"], "frames", MAX_FRAMES, lo=2)
    check_limits(size, n, frames, limits)
    means, stds = (float32_list(head[key], key, frames) for key in ("means", "stds"))
    depth = read_depth(head)
    cuts = _cut_lengths(head["cuts"], frames - 1, size, depth)
    decisions = read_decisions(head, frames, cuts=list(cuts))

    copies_start = len(body) - sum(cuts.values())
    if copies_start < 0:
        raise CodecError(f"malformed payload: the body is shorter than the PNGs of its scene cuts; {REENCODE}")
    copies = {}
    for j, length in cuts.items():
        copies[j] = bytes(body[copies_start : copies_start + length])
        _check_png(copies[j], size, depth)
        copies_start += length
    parts = layout(spec.encoding, frames, n, config.hidden_dim)
    read = _reader(body[: len(body) - sum(cuts.values())], sum(length for _, length in parts), spec.zstd)
    tokens = {name: unpack(read, spec.encoding, spec.zstd, frames, n, config.hidden_dim) for name in ("cond_dit", "cond_dec")}
    read(0)  # the tensors must end here
    return Chunk(tokens["cond_dit"], tokens["cond_dec"], means, stds, decisions, grid, size, copies)


def _cut_lengths(value: object, pairs: int, size: tuple[int, int], depth: int) -> dict[int, int]:
    """{pair: PNG bytes} of the header's ``cuts``, pairs increasing, each PNG at most what an
    uncompressed RGB PNG of the frame at ``depth`` bits takes."""
    most = most_png_bytes(size[1], size[0], depth)
    if not isinstance(value, list) or len(value) > pairs:
        raise invalid("cuts", f"must be a list of at most {pairs} [pair, bytes] entries, got {value!r:.60}")
    cuts, last = {}, -1
    for entry in value:
        if not isinstance(entry, list) or len(entry) != 2:
            raise invalid("cuts", f"entries must be [pair, bytes], got {entry!r:.40}")
        j = integer(entry[0], "cuts", pairs - 1, lo=last + 1)
        cuts[j], last = integer(entry[1], "cuts", most, lo=PNG_HEADER_BYTES), j
    return cuts


def _check_png(data: bytes, size: tuple[int, int], depth: int, *, payload: bool = True) -> None:
    """An RGB PNG of ``size`` (height, width) and the chunk's ``depth``, judged by its header."""
    stated = png_header(data)
    if stated is None or stated[2:] != (depth, 2) or stated[1::-1] != size:
        raise invalid("cuts", f"must name {depth}-bit RGB PNGs of {size[1]}x{size[0]}, the frames' size", payload=payload)


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


class TokenKind(Kind):
    """The conditions themselves, in one of the codecs of :mod:`.tensors`: the cloud runs E_cond,
    the edge uploads the tokens to its device."""

    version = TOKENS_VERSION
    carries = Chunk
    carried = "the tokens (CloudEncoder.encode_chunk); the frames codec carries the frames (CloudEncoder.frames_chunk)"

    def __init__(self, name: str):
        self.name, self.spec = name, Codec.named(name)

    def make(self, cloud: Cloud, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None,
             source: Source | None = None, depth: int = 8) -> Chunk:
        return cloud.encode_chunk(frames, seed, scene_threshold, depth=depth)

    def encode(self, chunk: Chunk, config: EdenConfig) -> bytes:
        return encode_tokens(chunk, config, self.spec)

    def open(self, head: dict, body: memoryview, config: EdenConfig, limits: Limits) -> Chunk:
        return open_tokens(head, body, config, limits)

    def conditions(self, chunk: Chunk, edge: Edge) -> Chunk:
        return edge.receive(chunk)


class HandOver(TokenKind):
    """Where both halves share a process: the chunk's tensors handed from the cloud's device to the
    edge's, never encoded (so exactly what fp32 would deliver)."""

    version = None
    listed = False

    def __init__(self):
        self.name, self.spec = NO_WIRE, None

    def make(self, cloud: Cloud, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None,
             source: Source | None = None, depth: int = 8) -> Chunk:
        return cloud.encode_chunk(frames, seed, scene_threshold, on_device=True, depth=depth)

    def cross(self, chunk: Chunk, cloud: EdenConfig, edge: EdenConfig) -> tuple[Chunk, int]:
        return chunk, 0


TOKEN_KINDS = tuple(TokenKind(name) for name in CODECS)
