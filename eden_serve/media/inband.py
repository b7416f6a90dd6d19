"""Dynamic HDR metadata carried in a video's own packets, looked for in its first few, whatever its
colour tags say and without decoding a frame: Dolby Vision's RPUs, which a stream may carry with no
configuration record in its container (a raw ``.hevc``, an MPEG-TS without Dolby's descriptor), and
HDR10+'s (SMPTE ST 2094-40) ITU-T T.35 messages. FFmpeg's decoders hand either on as a frame's side
data only where a record announced an RPU or it parses whole, and HDR10+ not from H.264 at all; and
a frame is decoded for its side data only where the tags say HDR, so the first frame alone misses
both on a stream tagged otherwise.

HEVC carries an RPU as a NAL unit of type 62 (UNSPEC62) in layer 0, temporal id 0, whose payload
starts with Dolby's prefix byte 0x19; AV1 as a metadata OBU of ITU-T T.35 data from Dolby
(country 0xB5, provider 0x003B, provider code 0x00000800). H.264 has no carriage FFmpeg reads.
HDR10+ is an SEI message of type 4 (user_data_registered_itu_t_t35) in a prefix SEI NAL unit (HEVC's
type 39, H.264's type 6), or a metadata OBU of ITU-T T.35 data in AV1, whose T.35 header is
Samsung's: country 0xB5, provider 0x003C, provider oriented code 0x0001, application identifier 4."""

from __future__ import annotations

from typing import Iterator

DOLBY_VISION, HDR10_PLUS = "Dolby Vision", "HDR10+"
PACKETS = 8  # looked at: an RPU or HDR10+'s message goes with every picture, so the first one's packet shows it
_RPU_NAL, _RPU_PREFIX = 62, 0x19
_OBU_METADATA, _METADATA_T35 = 5, 4
_DOLBY_T35 = bytes([0xB5, 0x00, 0x3B, 0x00, 0x00, 0x08, 0x00])  # country, provider, provider's code
_HDR10_PLUS_T35 = bytes([0xB5, 0x00, 0x3C, 0x00, 0x01, 0x04])  # country, provider, provider's code, application
_SEI_NAL = {"hevc": 39, "h264": 6}  # prefix SEI
_SEI_T35 = 4  # user_data_registered_itu_t_t35
SEI_MESSAGES = 64  # read of one SEI unit at most: an encoder writes a handful


def annex_b(data: bytes) -> Iterator[bytes]:
    """The NAL units of an Annex B byte stream, split at each start code (00 00 01)."""
    starts = []
    at = data.find(b"\x00\x00\x01")
    while at >= 0:
        starts.append(at + 3)
        at = data.find(b"\x00\x00\x01", at + 3)
    for begin, end in zip(starts, starts[1:] + [len(data) + 3]):
        yield data[begin:end - 3]


def length_prefixed(data: bytes, size: int) -> Iterator[bytes]:
    """The NAL units of an MP4/Matroska sample, each after its ``size``-byte length; stops at a
    length past the sample's end (a damaged one)."""
    at = 0
    while at + size <= len(data):
        length = int.from_bytes(data[at:at + size], "big")
        at += size
        if at + length > len(data):
            return
        yield data[at:at + length]
        at += length


def hevc_units(data: bytes, extradata: bytes) -> Iterator[bytes]:
    """An HEVC packet's NAL units: length-prefixed where the extradata is an ``hvcC`` record
    (configurationVersion 1; its lengthSizeMinusOne in byte 21), else Annex B."""
    if len(extradata) >= 23 and extradata[0] == 1:
        return length_prefixed(data, (extradata[21] & 3) + 1)
    return annex_b(data)


def h264_units(data: bytes, extradata: bytes) -> Iterator[bytes]:
    """An H.264 packet's NAL units: length-prefixed where the extradata is an ``avcC`` record
    (configurationVersion 1; its lengthSizeMinusOne in byte 4), else Annex B."""
    if len(extradata) >= 7 and extradata[0] == 1:
        return length_prefixed(data, (extradata[4] & 3) + 1)
    return annex_b(data)


def _unescaped(unit: bytes) -> bytes:
    """A NAL unit's payload without its emulation prevention bytes (the 03 of each 00 00 03)."""
    return unit.replace(b"\x00\x00\x03", b"\x00\x00")


def sei_messages(rbsp: bytes) -> Iterator[tuple[int, bytes]]:
    """An SEI NAL unit's messages (its payload after the header, unescaped), as (type, payload):
    each type and size a run of 0xFF bytes and the byte ending it, summed; stops at the RBSP's stop
    bit, at a size past the end, or after :data:`SEI_MESSAGES` (a unit of countless empty messages is
    not read to its end)."""
    at = 0
    try:
        for _ in range(SEI_MESSAGES):
            if at >= len(rbsp) or at == len(rbsp) - 1 and rbsp[at] == 0x80:  # the stop bit's byte ends them
                return
            values = []
            for _ in range(2):
                value = 0
                while rbsp[at] == 0xFF:
                    value, at = value + 255, at + 1
                values.append(value + rbsp[at])
                at += 1
            kind, size = values
            if at + size > len(rbsp):
                return
            yield kind, rbsp[at:at + size]
            at += size
    except IndexError:
        return


def is_hdr10_plus_sei(unit: bytes, kind: str) -> bool:
    """Whether a NAL unit of an HEVC or H.264 (``kind``) stream is a prefix SEI holding HDR10+'s message."""
    header = 2 if kind == "hevc" else 1
    if len(unit) <= header or unit[0] & 0x80:
        return False
    nal_type = unit[0] >> 1 & 0x3F if kind == "hevc" else unit[0] & 0x1F
    return nal_type == _SEI_NAL[kind] and any(
        t == _SEI_T35 and payload.startswith(_HDR10_PLUS_T35) for t, payload in sei_messages(_unescaped(unit[header:])))


def is_rpu(unit: bytes) -> bool:
    """Whether an HEVC NAL unit is a Dolby Vision RPU. Its 2-byte header: forbidden_zero_bit (1 bit),
    nal_unit_type (6), nuh_layer_id (6), nuh_temporal_id_plus1 (3): 0x7C 0x01 for type 62, layer 0,
    temporal id 0; then the RPU's prefix byte."""
    if len(unit) < 3 or unit[0] & 0x80:
        return False
    kind, layer, temporal = unit[0] >> 1 & 0x3F, (unit[0] & 1) << 5 | unit[1] >> 3, unit[1] & 7
    return kind == _RPU_NAL and layer == 0 and temporal == 1 and unit[2] == _RPU_PREFIX


def _leb128(data: bytes, at: int) -> tuple[int, int]:
    """An unsigned LEB128 value at ``at`` and where it ends (at most 8 bytes, as AV1 bounds it)."""
    value = 0
    for i in range(8):
        if at + i >= len(data):
            raise ValueError("cut short")
        value |= (data[at + i] & 0x7F) << 7 * i
        if not data[at + i] & 0x80:
            return value, at + i + 1
    raise ValueError("too long")


def av1_obus(data: bytes) -> Iterator[tuple[int, bytes]]:
    """An AV1 packet's OBUs (low overhead format), as (type, payload). The header byte:
    obu_forbidden_bit, obu_type (4 bits), obu_extension_flag, obu_has_size_field, a reserved bit;
    one more byte where extended; then the payload's size as LEB128, or the rest of the packet."""
    at = 0
    try:
        while at < len(data):
            header = data[at]
            if header & 0x80:
                return
            at += 1 + (header >> 2 & 1)
            if header & 2:
                size, at = _leb128(data, at)
            else:
                size = len(data) - at
            if at + size > len(data):
                return
            yield header >> 3 & 0xF, data[at:at + size]
            at += size
    except ValueError:
        return


def t35(payload: bytes) -> bytes:
    """An AV1 metadata OBU's ITU-T T.35 data (from its country code on), or b"" for other metadata."""
    try:
        kind, at = _leb128(payload, 0)
    except ValueError:
        return b""
    return payload[at:] if kind == _METADATA_T35 else b""


def is_dolby_t35(payload: bytes) -> bool:
    """Whether an AV1 metadata OBU's payload is ITU-T T.35 data from Dolby: Dolby Vision's RPU."""
    return t35(payload).startswith(_DOLBY_T35)


def in_band(kind: str, packet: bytes, extradata: bytes = b"") -> tuple[str, ...]:
    """The dynamic HDR metadata that one ``packet`` of a video whose codec is of ``kind`` (FFmpeg's
    canonical name: ``"hevc"``, ``"h264"``, ``"av1"``; others carry none read here) holds, named."""
    dolby = plus = False
    if kind in _SEI_NAL:
        units = list((hevc_units if kind == "hevc" else h264_units)(packet, extradata))
        dolby = kind == "hevc" and any(is_rpu(unit) for unit in units)
        plus = any(is_hdr10_plus_sei(unit, kind) for unit in units)
    elif kind == "av1":
        data = [t35(payload) for t, payload in av1_obus(packet) if t == _OBU_METADATA]
        dolby, plus = (any(d.startswith(header) for d in data) for header in (_DOLBY_T35, _HDR10_PLUS_T35))
    return (DOLBY_VISION,) * dolby + (HDR10_PLUS,) * plus
