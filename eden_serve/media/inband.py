"""Dynamic HDR metadata carried in a video's own packets, looked for in its first few: Dolby
Vision's RPUs, which a stream may carry with no configuration record in its container (a raw
``.hevc``, an MPEG-TS without Dolby's descriptor). FFmpeg's decoder reads an RPU only where a
record announced it or where it parses whole, so a stream's first frame alone can miss one.

HEVC carries an RPU as a NAL unit of type 62 (UNSPEC62) in layer 0, temporal id 0, whose payload
starts with Dolby's prefix byte 0x19; AV1 as a metadata OBU of ITU-T T.35 data from Dolby
(country 0xB5, provider 0x003B, provider code 0x00000800). H.264 has no carriage FFmpeg reads."""

from __future__ import annotations

from typing import Iterator

DOLBY_VISION = "Dolby Vision"
PACKETS = 8  # looked at: an RPU goes with every picture, so the first one's packet shows it
_RPU_NAL, _RPU_PREFIX = 62, 0x19
_OBU_METADATA, _METADATA_T35 = 5, 4
_DOLBY_T35 = bytes([0xB5, 0x00, 0x3B, 0x00, 0x00, 0x08, 0x00])  # country, provider, provider's code


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


def is_dolby_t35(payload: bytes) -> bool:
    """Whether an AV1 metadata OBU's payload is ITU-T T.35 data from Dolby: Dolby Vision's RPU."""
    try:
        kind, at = _leb128(payload, 0)
    except ValueError:
        return False
    return kind == _METADATA_T35 and payload[at:at + len(_DOLBY_T35)] == _DOLBY_T35


def in_band(kind: str, packet: bytes, extradata: bytes = b"") -> tuple[str, ...]:
    """The dynamic HDR metadata that one ``packet`` of a video whose codec is of ``kind``
    (``"hevc"``, ``"av1"``: others carry none read here) holds, named."""
    if kind == "hevc":
        found = any(is_rpu(unit) for unit in hevc_units(packet, extradata))
    elif kind == "av1":
        found = any(t == _OBU_METADATA and is_dolby_t35(payload) for t, payload in av1_obus(packet))
    else:
        found = False
    return (DOLBY_VISION,) if found else ()
