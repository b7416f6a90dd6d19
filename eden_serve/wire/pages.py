"""Pages of a stream's compressed packets, as the cloud sends a server-side source's streams to the
client (docs/cloud-sources.md): a client that writes the output needs the originals and the
audio, and the video's own bytes are the cheapest way to carry them.

A page is ``EDPK``, a version byte, a 4-byte big-endian header length, a JSON header, then the
stream's extradata and the packets' bytes back to back. The header states the stream's parameters,
each packet's size, time stamps and key flag (and an audio packet's samples its decoder drops, where
the demuxer said so), which packets the container discards (an edit list's hidden frames), and
where the next page starts. :func:`unpack` checks
every length and type before it slices a byte: what it returns is plain data, never code.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from fractions import Fraction

from ..errors import CodecError

MAGIC = b"EDPK"
VERSION = 1
_PREFIX = struct.Struct(">4sBI")
MAX_HEADER = 1 << 20
MAX_PAGE_PACKETS = 256  # per page; a page is also cut after MAX_PAGE_BYTES
MAX_PAGE_BYTES = 8 << 20
MAX_STAMP = 1 << 62
MAX_CODED_BITS = 64  # a coded sample's bits, as a probe states them (QuickTime RLE's: 1 to 40)
# The stream parameters a page states, with their types: enough to decode video and to mux audio.
PARAMETERS = {"index": int, "type": str, "codec": str, "time_base": str, "width": int, "height": int, "pix_fmt": str,
              "sample_rate": int, "layout": str, "format": str}


@dataclass(frozen=True)
class Packet:
    data: bytes
    pts: int | None
    dts: int | None
    duration: int
    key: bool
    skips: tuple[int, int] | None = None  # audio: the samples its decoder drops from the start and the end
    discard: bool = False  # the container discards its frame: hidden by an edit list, decoded only as a reference


@dataclass(frozen=True)
class Page:
    stream: dict  # PARAMETERS, those the stream's type has
    extradata: bytes
    packets: list[Packet]
    next: int | None  # the number of the next page's first packet; None: the stream ends here

    @property
    def time_base(self) -> Fraction:
        return Fraction(self.stream["time_base"])


def pack(page: Page) -> bytes:
    header = {"stream": page.stream, "extradata": len(page.extradata), "next": page.next,
              "packets": [[len(p.data), p.pts, p.dts, p.duration, p.key, *([list(p.skips)] if p.skips else [])]
                          for p in page.packets]}
    if any(p.discard for p in page.packets):  # stated only where some are: other pages read as before this key
        header["discard"] = [i for i, p in enumerate(page.packets) if p.discard]
    text = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_PREFIX.pack(MAGIC, VERSION, len(text)), text, page.extradata, *(p.data for p in page.packets)])


def _stamp(value, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or abs(value) > MAX_STAMP:
        raise CodecError(f"packet page: {what} must be an integer time stamp, got {str(value)[:20]!r}")
    return value


def _skips(given: list) -> bool:
    """Whether ``given`` is no entry, or one of two sample counts (FFmpeg takes 32-bit ones)."""
    return not given or isinstance(given[0], list) and len(given[0]) == 2 and all(
        type(v) is int and 0 <= v < 1 << 32 for v in given[0])


def unpack(data: bytes) -> Page:
    """The page ``data`` holds, or CodecError naming what is wrong with it."""
    if len(data) < _PREFIX.size:
        raise CodecError(f"packet page: {len(data)} bytes, too short for its prefix")
    magic, version, length = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CodecError("packet page: not a page of packets (wrong magic)")
    if version != VERSION:
        raise CodecError(f"packet page: version {version}, this client reads {VERSION}")
    if length > MAX_HEADER or _PREFIX.size + length > len(data):
        raise CodecError(f"packet page: a header of {length} bytes, over the limit or past the end")
    try:
        header = json.loads(data[_PREFIX.size:_PREFIX.size + length])
    except (UnicodeDecodeError, ValueError):
        raise CodecError("packet page: the header is not JSON") from None
    if not isinstance(header, dict) or not {"stream", "extradata", "next", "packets"} <= set(header) <= {
            "stream", "extradata", "next", "packets", "discard"}:
        raise CodecError("packet page: the header must hold exactly stream, extradata, next and packets (and discard)")
    stream, packets, extra, following = header["stream"], header["packets"], header["extradata"], header["next"]
    if not isinstance(stream, dict) or not set(stream) <= set(PARAMETERS) or not {"index", "type", "codec", "time_base"} <= set(stream):
        raise CodecError(f"packet page: stream parameters must be among {', '.join(PARAMETERS)}")
    for key, value in stream.items():
        if type(value) is not PARAMETERS[key] or (isinstance(value, int) and not 0 <= value < 1 << 31) or (
                isinstance(value, str) and len(value) > 64):
            raise CodecError(f"packet page: stream parameter {key} is not a small {PARAMETERS[key].__name__}")
    try:
        if Fraction(stream["time_base"]) <= 0:
            raise ValueError
    except (ValueError, ZeroDivisionError):
        raise CodecError(f"packet page: time base {stream['time_base']!r} is not a positive fraction") from None
    if type(extra) is not int or extra < 0 or (following is not None and (type(following) is not int or following < 0)):
        raise CodecError("packet page: extradata and next must be non-negative integers")
    if not isinstance(packets, list) or len(packets) > MAX_PAGE_PACKETS:
        raise CodecError(f"packet page: packets must be a list of at most {MAX_PAGE_PACKETS}")
    discard = header.get("discard", [])
    if not isinstance(discard, list) or not all(type(i) is int and 0 <= i < len(packets) for i in discard) or (
            discard != sorted(set(discard))):
        raise CodecError("packet page: discard must list packets of the page by their place, ascending, each once")
    offset = _PREFIX.size + length
    if offset + extra > len(data):
        raise CodecError("packet page: the extradata runs past the end")
    extradata, offset = data[offset:offset + extra], offset + extra
    read, hidden = [], set(discard)
    for i, entry in enumerate(packets):
        if not (isinstance(entry, list) and len(entry) in (5, 6) and type(entry[0]) is int and entry[0] >= 0
                and type(entry[3]) is int and entry[3] >= 0 and type(entry[4]) is bool and _skips(entry[5:])):
            raise CodecError(f"packet page: packet {i} must be [size, pts, dts, duration, key] or those and [skip start, end]")
        size = entry[0]
        if offset + size > len(data):
            raise CodecError(f"packet page: packet {i} of {size} bytes runs past the end")
        read.append(Packet(data[offset:offset + size], _stamp(entry[1], "pts"), _stamp(entry[2], "dts"), entry[3], entry[4],
                           tuple(entry[5]) if len(entry) == 6 else None, i in hidden))
        offset += size
    if offset != len(data):
        raise CodecError(f"packet page: {len(data) - offset} bytes after the last packet")
    return Page(stream, extradata, read, following)
