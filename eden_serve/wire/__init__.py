"""What crosses the wire between the cloud encoder and the edge DiT+decoder: payload kinds, one
object per codec name (:class:`~.kinds.Kind`), registered here in :data:`KINDS`.

- the token kinds (:mod:`.tokens`, wire format 2): a :class:`Chunk` of condition tokens in one of
  the codecs of :mod:`.tensors`; and the hand-over :data:`NO_WIRE`, the same tokens handed from
  the cloud's device to the edge's in one process, never encoded;
- the frames kind (:mod:`.pixels`, format 3): a :class:`FramesChunk`, the frames themselves, from
  which the edge re-derives the chunk;
- the bitstream kind (:mod:`.bitstream`, format 4): a :class:`BitstreamChunk`, a source video's own
  packets, which the edge decodes to those frames.

Every kind carries the cloud's :class:`Decisions` about the chunk's pairs. Code that handles a
codec name asks :func:`kind` for its object and calls it; adding a kind is a module here that
defines it, a line in :data:`KINDS`, and its tests (docs/development.md).

:func:`decode` never unpickles, and checks in order: prefix, magic, version, header length, the
digest, the header's keys, types and ranges, model fingerprint and width, grid against size, the
frame count, the tokens and pixels against the receiver's limits, the body's size against what the
header implies (format 3: every frame's image header; format 4: the packet table), and only then
reads the tensors (or decompresses the frames), frame by frame, into arrays of the body's own
dtype; a format 4 payload's packets are decoded later, at the edge. It raises only
:class:`CodecError` (or a subclass).
"""

from __future__ import annotations

from ..config import EdenConfig
from ..errors import BadInputError, CodecError
from .bitstream import BITSTREAM, BITSTREAM_CODEC, BitstreamChunk
from .decisions import Decisions
from .envelope import FORMAT_VERSION, MAGIC, MAX_FRAMES, MAX_SIDE, MAX_TOKENS, Limits, open_envelope
from .kinds import Kind
from .frames import FRAMES, FRAMES_CODEC, FramesChunk
from .tensors import CODECS as TOKEN_CODECS
from .tensors import Codec, Tokens
from .tokens import NO_WIRE, TOKEN_KINDS, Chunk, Conditions, HandOver

__all__ = ["BITSTREAM_CODEC", "CODECS", "DEFAULT_CODEC", "FORMAT_VERSION", "FRAMES_CODEC", "KINDS", "MAGIC", "MAX_FRAMES",
           "MAX_SIDE", "MAX_TOKENS", "NO_WIRE", "TOKEN_CODECS", "BitstreamChunk", "Chunk", "Codec", "Conditions", "Decisions",
           "FramesChunk", "Kind", "Tokens", "decode", "encode", "kind", "kind_of"]

KINDS: dict[str, Kind] = {k.name: k for k in (*TOKEN_KINDS, FRAMES, BITSTREAM, HandOver())}
# The codecs anyone may ask for, by name; the others only where their condition holds (kind()).
CODECS: tuple[str, ...] = tuple(name for name, k in KINDS.items() if k.listed)
# bf16+zstd: half of fp32's bytes and less again inside a chunk, a relative error of at most 2**-8
# whatever the token distribution, and fp32's range (docs/wire-format.md).
DEFAULT_CODEC = "bf16+zstd"
_BY_VERSION = {k.version: k for k in KINDS.values() if k.version is not None}
_BY_CHUNK = {k.carries: k for k in (FRAMES, BITSTREAM, KINDS[DEFAULT_CODEC])}


def kind(name: object, *, in_process: bool = False, source: bool = False) -> Kind:
    """The kind of codec ``name``: one of :data:`CODECS`; the hand-over too where cloud and edge
    share a process (``in_process``); the bitstream kind too for a chunk of a video the cloud holds
    (``source``). Anything else is a :class:`BadInputError` that names the choices."""
    found = KINDS.get(name) if isinstance(name, str) else None
    if found is None or not (found.listed or (in_process and not found.crosses) or (source and found.from_source)):
        choices = ", ".join(CODECS) + (f", or {NO_WIRE} in one process" if in_process else "")
        raise BadInputError(f"unknown codec {name!r:.60}; choose one of {choices}")
    return found


def kind_of(chunk: Chunk | FramesChunk | BitstreamChunk) -> Kind:
    """The kind that carries ``chunk`` (any token kind for a :class:`Chunk`: they open alike)."""
    return _BY_CHUNK[type(chunk)]


def encode(chunk: Chunk | FramesChunk | BitstreamChunk, config: EdenConfig, codec: str = DEFAULT_CODEC) -> bytes:
    """Serialise ``chunk`` for a receiver running a model with the same ``config``: a :class:`Chunk`
    with a token codec, a :class:`FramesChunk` with the frames codec, a :class:`BitstreamChunk`
    with the bitstream codec (only a cloud that holds the video can make one)."""
    return kind(codec, source=True).seal(chunk, config)


def decode(
    data: bytes | bytearray | memoryview,
    config: EdenConfig,
    *,
    max_tokens: int | None = None,
    max_frames: int | None = None,
    max_chunk_tokens: int | None = None,
    max_pixels: int | None = None,
) -> Chunk | FramesChunk | BitstreamChunk:
    """Parse and validate a payload for a receiver running ``config``: a :class:`Chunk`, a
    :class:`FramesChunk` or a :class:`BitstreamChunk` (:func:`kind_of` it makes the conditions).

    ``max_tokens`` caps the tokens per frame, ``max_frames`` the frames, ``max_chunk_tokens`` the
    tokens of all frames together and ``max_pixels`` each frame's pixels (on top of the format's own
    caps); they are checked before anything proportional to the payload's declared size is allocated.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"payload must be bytes, got {type(data).__name__}; pass the raw request body")
    version, header, body = open_envelope(memoryview(data).cast("B"))
    return _BY_VERSION[version].open(header, body, config, Limits(max_tokens, max_frames, max_chunk_tokens, max_pixels))
