"""The ``bitstream`` kind, wire format 4: a chunk as the compressed video's own packets, from a key
frame on, in decode order, with what the decoder needs besides them and what the cloud decided
about the chunk's pairs. Only a cloud that holds the video makes one (a server-side source). The
edge decodes the packets (``eden_serve.media.packets``), checks each frame against the cloud's
digest of it (:func:`to_frames`), and re-derives the conditions as for the frames kind: for real
video that is a hundredth of the frames codec's bytes (docs/wire-codecs.md, "The bitstream codec").

The header has exactly these keys: ``fingerprint``, ``hidden_dim`` and ``cloud`` as in format 3,
``codec`` ("bitstream"), ``stream`` (the decoder and its parameters: :meth:`StreamParameters.to_header`),
``packets`` (P), ``skip`` (frames to drop before the chunk's first), ``frames`` (F),
``differences`` and ``seeds`` (K = F - 1 each), ``cuts`` and ``digests`` (F: each frame's
:func:`frame_digest`). The body is a table of P records, each ``<IIqq``: the packet's bytes, its
flags (1: a key frame), its pts and its dts (``NO_TIME`` where the container gives none), then the
P packets' bytes, in order.

Decoding a packet list that lies can cost what its length implies, so before anything is decoded:
the decoder must be one of :data:`DECODERS`, the frame size that the header declares within the
receiver's limits (413), the packets' lengths must add up to the body, the first packet must be a
key frame, dts must increase, and the packets must number between ``skip + frames`` (one per
frame) and that plus :data:`REORDER_SLACK`. The decoder is then told to refuse any frame larger
than the declared size when it parses the stream's own headers.

The client holds the packets already (it read them to write the originals), so the cloud answers
it with the payload less the packets' bytes (:func:`elide`), and the client puts its own copies
back (:func:`fill`) before handing the payload to the edge. The edge gets the very bytes the cloud
sealed and signed: each packet crosses the link once, keyed payloads keep working, and a packet
the client got wrong fails the payload's digest (400) like any corruption.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..config import EdenConfig
from ..errors import BadInputError, CodecError, DigestMismatchError
from .decisions import Decided, Decisions, check_header, header, read_decisions
from .envelope import (
    BITSTREAM_VERSION, DIGEST_SIZE, MAX_FRAMES, MAX_SIDE, MAX_TOKENS, PREFIX, Limits, check_limits, cloud_digest, integer,
    integer_pair, invalid, seal,
)
from .keyed import TAGGED_PREFIX, is_tagged
from .kinds import Cloud, Edge, Held, Kind, Source, source_pixels
from .frames import FRAMES_CODEC, FramesChunk

BITSTREAM_CODEC = "bitstream"
# FFmpeg's software decoders of the codecs whose decoding is bit-exact by their specification, the
# ones PyAV picks by default (AV1: libdav1d; FFmpeg's own "av1" decodes only through a GPU). Not
# MPEG-4 Part 2 or MPEG-2: their inverse DCT is exact only to a tolerance, and builds differ in it.
DECODERS = ("h264", "hevc", "vp8", "vp9", "libdav1d")
# Packets beyond one per frame: the leading pictures of an open GOP before the chunk, and those
# after its last frame that reordering needs (H.264 and HEVC hold at most 16 frames back each).
REORDER_SLACK = 32
MAX_PACKETS = 1 << 12
MAX_EXTRADATA = 1 << 14
NO_TIME = -(1 << 63)  # FFmpeg's AV_NOPTS_VALUE
KEY = 1
DIGEST_CHARS = 32  # BLAKE2b-128, hex
_KEYS = {"fingerprint", "hidden_dim", "codec", "cloud", "stream", "packets", "skip", "frames", "differences", "seeds", "cuts", "digests"}
# In this order in a header: a payload's bytes are the same whatever the process's string hashing.
_STREAM_KEYS = ("decoder", "width", "height", "pix_fmt", "codec_tag", "color_range", "colorspace", "color_primaries", "color_trc",
                "extradata")
_COLOURS = ("color_range", "colorspace", "color_primaries", "color_trc")
# A packet's record in the body's table.
RECORD = np.dtype([("length", "<u4"), ("flags", "<u4"), ("pts", "<i8"), ("dts", "<i8")])
_PIX_FMT = re.compile(r"[a-z0-9_]{1,32}")
# BLAKE2b lets go of the GIL while it hashes, so a chunk's frames are checked on these threads at
# once: a 1080p frame is 6 MB, about 9 ms of one core here, on the served edge's preparation thread.
_HASHERS = ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="eden-digest")


@dataclass(frozen=True)
class StreamParameters:
    """What decoding a video stream's packets takes besides them, as its container states it: the
    decoder, its extradata (H.264's avcC: the parameter sets), the frame size and pixel format, the
    fourcc (MPEG-4 Part 2 works around encoders' bugs by it) and the colour tags that the RGB
    conversion follows where the bitstream leaves them out (FFmpeg's AVColor* values)."""

    decoder: str
    extradata: bytes
    width: int
    height: int
    pix_fmt: str
    codec_tag: str = "\0\0\0\0"
    color_range: int = 0
    colorspace: int = 2
    color_primaries: int = 2
    color_trc: int = 2

    @property
    def size(self) -> tuple[int, int]:
        return self.height, self.width

    def to_header(self) -> dict:
        header = {key: getattr(self, key) for key in _STREAM_KEYS[:-1]}
        return {**header, "extradata": base64.b64encode(self.extradata).decode()}

    @classmethod
    def from_header(cls, value: object, *, payload: bool = True) -> StreamParameters:
        """The parameters a header's ``stream`` states, each checked (:class:`CodecError`)."""
        if not isinstance(value, dict) or set(value) != set(_STREAM_KEYS):
            raise invalid("stream", f"must be an object with the keys {sorted(_STREAM_KEYS)}", payload=payload)
        decoder = value["decoder"]
        if decoder not in DECODERS:
            raise invalid("stream", f"names decoder {decoder!r:.40}, not one of {', '.join(DECODERS)}", payload=payload)
        extradata = value["extradata"]
        try:
            extradata = base64.b64decode(extradata, validate=True) if isinstance(extradata, str) else None
        except (binascii.Error, ValueError):
            extradata = None
        if extradata is None or len(extradata) > MAX_EXTRADATA:
            raise invalid("stream", f"extradata must be base64 of at most {MAX_EXTRADATA} bytes", payload=payload)
        height, width = integer_pair([value["height"], value["width"]], "stream", MAX_SIDE, payload=payload)
        pix_fmt, tag = value["pix_fmt"], value["codec_tag"]
        if not isinstance(pix_fmt, str) or not _PIX_FMT.fullmatch(pix_fmt):
            raise invalid("stream", f"pix_fmt must name a pixel format, got {pix_fmt!r:.40}", payload=payload)
        if not isinstance(tag, str) or len(tag) != 4 or max(map(ord, tag)) > 255:
            raise invalid("stream", f"codec_tag must be four 8-bit characters, got {tag!r:.40}", payload=payload)
        colours = [integer(value[key], "stream", 255, payload=payload) for key in _COLOURS]
        return cls(decoder, extradata, width, height, pix_fmt, tag, *colours)


@dataclass(frozen=True)
class Packet:
    """One compressed packet of the stream; ``index`` is its place in decode order."""

    data: bytes
    pts: int
    dts: int | None
    key: bool
    index: int = 0


@dataclass
class BitstreamChunk(Decided):
    """F consecutive frames as the packets that decode to them, and the cloud's decisions about
    their K = F - 1 pairs (those of a :class:`~eden_serve.wire.FramesChunk`)."""

    parameters: StreamParameters
    packets: list[Packet]  # from a key frame, in decode order
    skip: int  # frames to drop before the chunk's first (after those timed before the key frame)
    frames: int  # F
    digests: list[str]  # F: each frame's digest, of the cloud's pixels
    decisions: Decisions

    @property
    def size(self) -> tuple[int, int]:
        return self.parameters.size


def encode_bitstream(chunk: BitstreamChunk, config: EdenConfig) -> bytes:
    parameters = StreamParameters.from_header(chunk.parameters.to_header(), payload=False)
    frames = integer(chunk.frames, "frames", MAX_FRAMES, lo=2, payload=False)
    if math.prod(config.patch_grid(*parameters.size)) > MAX_TOKENS:
        raise CodecError(f"{parameters.width}x{parameters.height} frames give more tokens than the wire limit of {MAX_TOKENS}")
    skip = integer(chunk.skip, "skip", MAX_PACKETS, payload=False)
    table = np.array([_record(p) for p in chunk.packets], RECORD)
    _check_table(table, skip, frames, parameters, payload=False)
    fields = {"stream": parameters.to_header(), "packets": len(table), "skip": skip, "frames": frames}
    head = header(config, BITSTREAM_CODEC, chunk.decisions, frames, fields)
    head["digests"] = _digests(chunk.digests, frames, payload=False)
    return seal(head, [table.tobytes(), *(p.data for p in chunk.packets)], BITSTREAM_VERSION)


def decode_bitstream(head: dict, body: memoryview, config: EdenConfig, limits: Limits) -> BitstreamChunk:
    """The bitstream chunk of a version 4 payload, checked as the module's docstring says; nothing
    is decoded here."""
    check_header(head, _KEYS, (BITSTREAM_CODEC,), BITSTREAM_VERSION, config)
    cloud = cloud_digest(head["cloud"])
    parameters = StreamParameters.from_header(head["stream"])
    frames = integer(head["frames"], "frames", MAX_FRAMES, lo=2)
    check_limits(parameters.size, math.prod(config.patch_grid(*parameters.size)), frames, limits)
    decisions = read_decisions(head, frames, cloud)
    digests = _digests(head["digests"], frames)
    skip = integer(head["skip"], "skip", MAX_PACKETS)
    count = integer(head["packets"], "packets", MAX_PACKETS, lo=1)
    if len(body) < count * RECORD.itemsize:
        raise CodecError(f"malformed payload: the body has {len(body)} bytes, too few for a table of {count} packets")
    table = np.frombuffer(body, RECORD, count)
    _check_table(table, skip, frames, parameters)
    data = body[count * RECORD.itemsize :]
    if int(table["length"].sum()) != len(data):
        raise CodecError(f"malformed payload: the packets take {int(table['length'].sum())} bytes, but the body holds {len(data)}")
    starts = np.cumsum([0, *table["length"].tolist()]).tolist()
    packets = [
        Packet(bytes(data[starts[i] : starts[i + 1]]), int(pts), None if dts == NO_TIME else int(dts), bool(flags & KEY), i)
        for i, (flags, pts, dts) in enumerate(zip(table["flags"].tolist(), table["pts"].tolist(), table["dts"].tolist()))
    ]
    return BitstreamChunk(parameters, packets, skip, frames, digests, decisions)


def _check_table(table: np.ndarray, skip: int, frames: int, parameters: StreamParameters, *, payload: bool = True) -> None:
    """The packet table of a chunk of ``frames`` frames after ``skip``: the counts, lengths, flags
    and times that decoding relies on."""
    least, most = skip + frames, skip + frames + REORDER_SLACK
    if not least <= len(table) <= min(most, MAX_PACKETS):
        raise invalid("packets", f"must number from {least} (one per frame) to {min(most, MAX_PACKETS)}, got {len(table)}",
                      payload=payload)
    # No video codec's frame takes more than its raw pixels at 4:4:4 and 16 bits: 6 bytes a pixel.
    largest = 6 * parameters.width * parameters.height + 4096
    lengths, flags, pts, dts = (table[name] for name in ("length", "flags", "pts", "dts"))
    if lengths.min() < 1 or lengths.max() > largest:
        raise invalid("packets", f"must each hold 1 to {largest} bytes", payload=payload)
    if (flags > KEY).any() or not flags[0] & KEY:
        raise invalid("packets", "must start with a key frame and carry no flags but the key frame's (1)", payload=payload)
    if (pts == NO_TIME).any() or len(np.unique(pts)) != len(pts):
        raise invalid("packets", "must each have a pts of their own", payload=payload)
    timed = dts[dts != NO_TIME]
    if (np.diff(timed) <= 0).any():
        raise invalid("packets", "must be in decode order: their dts must increase", payload=payload)


def _record(packet: Packet) -> tuple[int, int, int, int]:
    pts = integer(packet.pts, "packets", -NO_TIME - 1, lo=NO_TIME + 1, payload=False)
    dts = NO_TIME if packet.dts is None else integer(packet.dts, "packets", -NO_TIME - 1, lo=NO_TIME + 1, payload=False)
    return len(packet.data), KEY if packet.key else 0, pts, dts


def _digests(value: object, frames: int, *, payload: bool = True) -> list[str]:
    if not isinstance(value, list) or len(value) != frames or not all(
        isinstance(d, str) and len(d) == DIGEST_CHARS and not d.strip("0123456789abcdef") for d in value
    ):
        raise invalid("digests", f"must be a list of {frames} frame digests, {DIGEST_CHARS} hex digits each", payload=payload)
    return value


def frame_digest(pixels: np.ndarray) -> str:
    """BLAKE2b-128 of an RGB frame's size, depth (16-bit ones) and bytes, in hex: what the cloud states of each frame."""
    deep = "x16" if pixels.dtype == np.uint16 else ""
    digest = hashlib.blake2b(f"{pixels.shape[1]}x{pixels.shape[0]}{deep}:".encode(), digest_size=16)
    digest.update(np.ascontiguousarray(pixels, np.uint16 if deep else np.uint8))
    return digest.hexdigest()


def to_frames(chunk: BitstreamChunk, pixels: np.ndarray) -> FramesChunk:
    """The frames chunk of ``chunk``, whose packets decoded to ``pixels`` [F, H, W, 3] here (16-bit
    for a stream deeper than 8 bits, as the cloud read them), each frame checked against the cloud's
    digest of it: a mismatch means this edge's decoder is another build, or a damaged packet was concealed
    otherwise here (:class:`DigestMismatchError`)."""
    for i, (digest, expected) in enumerate(zip(_HASHERS.map(frame_digest, pixels), chunk.digests)):
        if digest != expected:
            import av  # the decoder that differs is PyAV's: name its build

            raise DigestMismatchError(
                f"frame {i} of the chunk decodes on this edge to other pixels than on the cloud: its {chunk.parameters.decoder} "
                f"decoder (libavcodec {'.'.join(map(str, av.library_versions['libavcodec']))}) is another build, or the "
                "packets are damaged, which each decoder conceals as its threads go; "
                "send this chunk with the frames codec"
            )
    return FramesChunk(pixels, chunk.decisions)


# --- the payload without its packets, for a client that holds them ------------------------------


def _table(data: bytes) -> tuple[np.ndarray, int]:
    """The packet table of a (possibly tagged, possibly elided) bitstream payload, and where the
    packets' bytes start."""
    start = TAGGED_PREFIX if is_tagged(data) else 0
    if len(data) < start + PREFIX.size + DIGEST_SIZE:
        raise CodecError("bitstream answer: too short for a payload")
    _, _, _, header_len = PREFIX.unpack_from(data, start)
    body = start + PREFIX.size + header_len
    try:
        count = json.loads(bytes(data[start + PREFIX.size:body]))["packets"]
    except (ValueError, KeyError, TypeError):
        raise CodecError("bitstream answer: its header is not a bitstream payload's") from None
    if type(count) is not int or not 0 < count or body + count * RECORD.itemsize > len(data) - DIGEST_SIZE:
        raise CodecError("bitstream answer: its packet table does not fit")
    table = np.frombuffer(data, RECORD, count, body)
    return table, body + count * RECORD.itemsize


def elide(payload: bytes) -> bytes:
    """``payload`` less its packets' bytes (which end where its digest starts)."""
    table, start = _table(payload)
    total = int(table["length"].sum())
    return payload[:start] + payload[start + total:]


def wanted(elided: bytes) -> list[tuple[int, int | None, int]]:
    """(pts, dts, length) of each packet an elided payload lacks, in order."""
    table, _ = _table(elided)
    return [(int(r["pts"]), None if r["dts"] == NO_TIME else int(r["dts"]), int(r["length"])) for r in table]


def fill(elided: bytes, packets: list[bytes]) -> bytes:
    """The whole payload: ``elided`` with the packets' bytes back in place."""
    table, start = _table(elided)
    if start != len(elided) - DIGEST_SIZE:
        raise CodecError("bitstream answer: bytes where its packets belong; it is not an elided payload")
    if [len(p) for p in packets] != [int(n) for n in table["length"]]:
        raise CodecError("bitstream answer: the packets held here differ in size from those it names")
    return b"".join([elided[:start], *packets, elided[start:]])


class BitstreamKind(Kind):
    """A source video's own packets: the cloud decides about the frames it decoded, and sends the
    packets that decode to them; the edge decodes them (:meth:`Edge.decoded`) and runs E_cond."""

    name = BITSTREAM_CODEC
    version = BITSTREAM_VERSION
    listed = False
    from_source = True
    carries = BitstreamChunk
    carried = "a BitstreamChunk, made of a video's packets"
    # A chunk the edge decodes to other pixels (another libavcodec), one put together wrong, or one
    # of a video whose packets the cloud cannot send so (untimed, a decoder not allowed): the frames
    # kind carries it instead (a chunk bad for any kind then fails with the frames kind's answer).
    fallback = FRAMES_CODEC
    fallback_on = frozenset({DigestMismatchError.kind, CodecError.kind, BadInputError.kind})

    def make(self, cloud: Cloud, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None,
             source: Source | None = None, depth: int = 8) -> BitstreamChunk:
        if source is None:
            raise CodecError("the bitstream codec carries a video's own packets: only a chunk of a source the cloud holds has them")
        decided = cloud.frames_chunk(frames, seed, scene_threshold, depth, source_pixels(source))
        parameters, packets, skip = source.packets()
        return BitstreamChunk(parameters, packets, skip, decided.frames, list(_HASHERS.map(frame_digest, decided.pixels)), decided.decisions)

    def encode(self, chunk: BitstreamChunk, config: EdenConfig) -> bytes:
        return encode_bitstream(chunk, config)

    def open(self, head: dict, body: memoryview, config: EdenConfig, limits: Limits) -> BitstreamChunk:
        return decode_bitstream(head, body, config, limits)

    def answer(self, payload: bytes) -> bytes:
        return elide(payload)

    def complete(self, answer: bytes, held: Held | None) -> bytes:
        return fill(answer, held.packets(wanted(answer)))

    def conditions(self, chunk: BitstreamChunk, edge: Edge):
        return edge.embed(to_frames(chunk, edge.decode(chunk)))


BITSTREAM = BitstreamKind()
