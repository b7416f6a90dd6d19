"""The ``bitstream`` codec, wire format 4: a chunk as the compressed video's own packets, from a key
frame on, in decode order, with what the decoder needs besides them and what the cloud decided
about the chunk's pairs. The edge decodes the packets (``eden_serve.media.packets``), checks each
frame against the cloud's digest of it, and re-derives the conditions as for the frames codec:
for real video that is a hundredth of the frames codec's bytes (docs/wire-codecs.md, "bitstream").

The header has exactly these keys: ``fingerprint``, ``hidden_dim`` and ``cloud`` as in format 3,
``codec`` ("bitstream"), ``stream`` (the decoder and its parameters: :meth:`StreamParameters.to_header`),
``packets`` (P), ``skip`` (frames to drop before the chunk's first), ``frames`` (F),
``differences`` and ``seeds`` (K = F - 1 each), ``cuts`` and ``digests`` (F: each frame's
:func:`~eden_serve.media.packets.frame_digest`). The body is a table of P records, each
``<IIqq``: the packet's bytes, its flags (1: a key frame), its pts and its dts (``NO_TIME`` where
the container gives none), then the P packets' bytes, in order.

Decoding a packet list that lies can cost what its length implies, so before anything is decoded:
the decoder must be one of :data:`DECODERS`, the frame size that the header declares within the
receiver's limits (413), the packets' lengths must add up to the body, the first packet must be a
key frame, dts must increase, and the packets must number between ``skip + frames`` (one per
frame) and that plus :data:`REORDER_SLACK`. The decoder is then told to refuse any frame larger
than the declared size when it parses the stream's own headers.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass

import numpy as np

from ..config import MAX_SEED, EdenConfig
from ..errors import CodecError
from .envelope import (
    BITSTREAM_VERSION,
    MAX_FRAMES,
    MAX_SIDE,
    MAX_TOKENS,
    Limits,
    check_limits,
    check_model,
    cloud_digest,
    cut_pairs,
    float32_list,
    integer,
    integer_pair,
    invalid,
    seal,
    seed_list,
    to_float32,
)

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
_STREAM_KEYS = {"decoder", "extradata", "width", "height", "pix_fmt", "codec_tag", "color_range", "colorspace", "color_primaries",
                "color_trc"}
_COLOURS = ("color_range", "colorspace", "color_primaries", "color_trc")
# A packet's record in the body's table (wire.elision reads it too).
RECORD = np.dtype([("length", "<u4"), ("flags", "<u4"), ("pts", "<i8"), ("dts", "<i8")])
_PIX_FMT = re.compile(r"[a-z0-9_]{1,32}")


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
        header = {key: getattr(self, key) for key in _STREAM_KEYS - {"extradata"}}
        return {**header, "extradata": base64.b64encode(self.extradata).decode()}

    @classmethod
    def from_header(cls, value: object, *, payload: bool = True) -> StreamParameters:
        """The parameters a header's ``stream`` states, each checked (:class:`CodecError`)."""
        if not isinstance(value, dict) or set(value) != _STREAM_KEYS:
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
class BitstreamChunk:
    """F consecutive frames as the packets that decode to them, and the cloud's decisions about
    their K = F - 1 pairs (those of a :class:`~eden_serve.wire.FramesChunk`)."""

    parameters: StreamParameters
    packets: list[Packet]  # from a key frame, in decode order
    skip: int  # frames to drop before the chunk's first (after those timed before the key frame)
    frames: int  # F
    digests: list[str]  # F: each frame's digest, of the cloud's pixels
    differences: list[float]  # K: each pair's frame-difference scalar
    seeds: list[int]  # K: each pair's noise seed
    cuts: list[int]  # the pairs across a scene cut, increasing
    cloud: str  # digest of the cloud weights that the conditions are to be derived with

    @property
    def pairs(self) -> int:
        return len(self.seeds)

    @property
    def size(self) -> tuple[int, int]:
        return self.parameters.size


def encode_bitstream(chunk: BitstreamChunk, config: EdenConfig) -> bytes:
    parameters = StreamParameters.from_header(chunk.parameters.to_header(), payload=False)
    frames = integer(chunk.frames, "frames", MAX_FRAMES, lo=2, payload=False)
    if math.prod(config.patch_grid(*parameters.size)) > MAX_TOKENS:
        raise CodecError(f"{parameters.width}x{parameters.height} frames give more tokens than the wire limit of {MAX_TOKENS}")
    if len(chunk.differences) != frames - 1 or len(chunk.seeds) != frames - 1:
        raise invalid("differences", f"and seeds must number {frames - 1}, one per pair", payload=False)
    skip = integer(chunk.skip, "skip", MAX_PACKETS, payload=False)
    table = np.array([_record(p) for p in chunk.packets], RECORD)
    _check_table(table, skip, frames, parameters, payload=False)
    header = {
        "fingerprint": config.fingerprint(),
        "hidden_dim": config.hidden_dim,
        "codec": BITSTREAM_CODEC,
        "cloud": cloud_digest(chunk.cloud, payload=False),
        "stream": parameters.to_header(),
        "packets": len(table),
        "skip": skip,
        "frames": frames,
        "differences": [to_float32(v, "differences") for v in chunk.differences],
        "seeds": [integer(s, "seeds", MAX_SEED, payload=False) for s in chunk.seeds],
        "cuts": [integer(j, "cuts", frames - 2, payload=False) for j in sorted(set(chunk.cuts))],
        "digests": _digests(chunk.digests, frames, payload=False),
    }
    return seal(header, [table.tobytes(), *(p.data for p in chunk.packets)], BITSTREAM_VERSION)


def decode_bitstream(header: dict, body: memoryview, config: EdenConfig, limits: Limits) -> BitstreamChunk:
    """The bitstream chunk of a version 4 payload, checked as the module's docstring says; nothing
    is decoded here."""
    keys = set(header)
    if keys != _KEYS:
        raise CodecError(f"malformed payload: header has {str(sorted(keys)):.200}, not the keys {sorted(_KEYS)} of the bitstream codec")
    check_model(header, config)
    if header["codec"] != BITSTREAM_CODEC:
        raise invalid("codec", f"is {header['codec']!r:.40}, but format {BITSTREAM_VERSION} carries only {BITSTREAM_CODEC!r}")
    cloud = cloud_digest(header["cloud"])
    parameters = StreamParameters.from_header(header["stream"])
    frames = integer(header["frames"], "frames", MAX_FRAMES, lo=2)
    check_limits(parameters.size, math.prod(config.patch_grid(*parameters.size)), frames, limits)
    differences = float32_list(header["differences"], "differences", frames - 1)
    seeds = seed_list(header["seeds"], frames - 1)
    cuts = cut_pairs(header["cuts"], frames - 1)
    digests = _digests(header["digests"], frames)
    skip = integer(header["skip"], "skip", MAX_PACKETS)
    count = integer(header["packets"], "packets", MAX_PACKETS, lo=1)
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
    return BitstreamChunk(parameters, packets, skip, frames, digests, differences, seeds, cuts, cloud)


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
