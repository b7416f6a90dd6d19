"""Where a video's 4:2:0 chroma samples sit (its chroma location), as a player of it takes it
(docs/video.md, "Depth and colour"): read from the sequence parameter set of an H.264 or HEVC
stream's extradata and from an AV1 stream's ``av1C``, or fixed by the codec's standard.

PyAV 18 exposes no chroma location on streams, codec contexts or frames, though FFmpeg's decoders
read it; an encoder takes it through the ``chroma_sample_location`` option (:mod:`.colour`). So it is
read here from the bitstream: the VUI's ``chroma_sample_loc_type_top_field``, in the SPS that
``avcC``/``hvcC`` (MP4, Matroska) or Annex B extradata (MPEG-TS, raw streams) hold. An SPS read
whole that states none (no VUI, or a VUI without it) means the standards' default, left (type 0,
as FFmpeg's decoder reads it too), for 4:2:0; the location describes 4:2:0 alone. MPEG-1, MPEG-2,
MPEG-4 Part 2, H.263 (H.263+ too, the name of its encoder) and JPEG have no field for it: their
standards fix it (:data:`FIXED`). Other codecs (VP8, VP9, FFV1...), a Matroska ``ChromaSiting``,
Y4M's ``C420mpeg2`` and streams whose SPS comes only in-band are not read: they stay unknown, and
nothing is stated of them. The parser only
skips what precedes the VUI; any inconsistency (a truncated or foreign SPS) reads as unknown, never
as an error.
"""

from __future__ import annotations

from typing import Iterator

H264_SPS, HEVC_SPS = 7, 33  # nal_unit_type
UNKNOWN, LEFT, CENTER, TOP_LEFT = 0, 1, 2, 3  # AVChromaLocation
# Where the standard of a codec with no field for it sites 4:2:0 chroma: MPEG-1, H.263 and JPEG
# (JFIF) between the luma samples both ways, MPEG-2 and MPEG-4 Part 2 co-sited with them horizontally.
FIXED = {"mpeg1video": CENTER, "h263": CENTER, "h263p": CENTER, "mjpeg": CENTER, "mpeg2video": LEFT, "mpeg4": LEFT}
# AV1's chroma_sample_position (av1C): unknown, vertical (left), colocated (top left).
_AV1_POSITIONS = {0: UNKNOWN, 1: LEFT, 2: TOP_LEFT}
# H.264 profiles whose SPS states chroma_format_idc, bit depths and scaling matrices.
_HIGH_PROFILES = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}
_EXTENDED_SAR = 255


class _Bits:
    """An RBSP (emulation prevention bytes removed) read bit by bit; reading past its end raises IndexError."""

    def __init__(self, nal: bytes):
        self.data = nal.replace(b"\x00\x00\x03", b"\x00\x00")
        self.at = 0

    def u(self, n: int) -> int:
        value = 0
        for _ in range(n):
            value = value << 1 | (self.data[self.at >> 3] >> (7 - (self.at & 7))) & 1
            self.at += 1
        return value

    def ue(self) -> int:
        zeros = 0
        while not self.u(1):
            zeros += 1
            if zeros > 31:
                raise IndexError("an exp-Golomb code longer than 32 bits")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        code = self.ue()
        return (code + 1) // 2 if code & 1 else -(code // 2)


def _nal_units(codec: str, extradata: bytes) -> Iterator[bytes]:
    """The NAL units of an H.264 stream's ``avcC`` or an HEVC stream's ``hvcC``, or of Annex B extradata."""
    if extradata[:1] != b"\x01":  # not a configuration record: start codes
        for unit in extradata.split(b"\x00\x00\x01"):
            if unit.strip(b"\x00"):
                yield unit.rstrip(b"\x00")
        return
    if codec == "h264":
        at, sets = 6, extradata[5] & 0x1F if len(extradata) > 5 else 0  # avcC: its SPSs first
    else:
        at, sets = 23, 0  # hvcC: arrays of NAL units, by type
        for _ in range(extradata[22] if len(extradata) > 22 else 0):
            count = int.from_bytes(extradata[at + 1:at + 3], "big")
            at += 3
            for _ in range(count):
                size = int.from_bytes(extradata[at:at + 2], "big")
                yield extradata[at + 2:at + 2 + size]
                at += 2 + size
    for _ in range(sets):
        size = int.from_bytes(extradata[at:at + 2], "big")
        yield extradata[at + 2:at + 2 + size]
        at += 2 + size


def _scaling_lists(bits: _Bits, count: int) -> None:
    for i in range(count):
        if bits.u(1):
            last = following = 8
            for _ in range(16 if i < 6 else 64):
                if following:
                    following = (last + bits.se() + 256) % 256
                last = following or last


def _h264_vui(bits: _Bits) -> tuple[int, bool]:
    """Skip an H.264 SPS from its profile to its VUI flag; its chroma_format_idc, and whether the VUI follows."""
    profile = bits.u(8)
    bits.u(16)  # constraint flags, level
    bits.ue()
    chroma_format = 1  # 4:2:0, where the profile does not state it
    if profile in _HIGH_PROFILES:
        chroma_format = bits.ue()
        if chroma_format == 3:
            bits.u(1)
        bits.ue(), bits.ue(), bits.u(1)  # bit depths, lossless
        if bits.u(1):
            _scaling_lists(bits, 12 if chroma_format == 3 else 8)
    bits.ue()  # log2_max_frame_num_minus4
    order = bits.ue()
    if order == 0:
        bits.ue()
    elif order == 1:
        bits.u(1), bits.se(), bits.se()
        for _ in range(bits.ue()):
            bits.se()
    bits.ue(), bits.u(1), bits.ue(), bits.ue()  # references, gaps, width, height
    if not bits.u(1):  # frame_mbs_only
        bits.u(1)
    bits.u(1)
    if bits.u(1):  # cropping
        bits.ue(), bits.ue(), bits.ue(), bits.ue()
    return chroma_format, bool(bits.u(1))


def _profile_tier_level(bits: _Bits, sub_layers: int) -> None:
    bits.u(88), bits.u(8)  # the general profile, then its level
    present = [(bits.u(1), bits.u(1)) for _ in range(sub_layers)]
    if sub_layers:
        bits.u(2 * (8 - sub_layers))
    for profile, level in present:
        bits.u(88 if profile else 0), bits.u(8 if level else 0)


def _hevc_scaling_lists(bits: _Bits) -> None:
    for size in range(4):
        for _ in range(0, 6, 3 if size == 3 else 1):
            if not bits.u(1):
                bits.ue()
                continue
            if size > 1:
                bits.se()
            for _ in range(min(64, 1 << (4 + (size << 1)))):
                bits.se()


def _short_term_sets(bits: _Bits) -> None:
    counts: list[int] = []  # NumDeltaPocs of each set, which a predicted set's syntax depends on
    for index in range(bits.ue()):
        if index and bits.u(1):  # inter_ref_pic_set_prediction: from the set before
            bits.u(1), bits.ue()
            kept = 0
            for _ in range(counts[-1] + 1):
                used = bits.u(1)
                kept += 1 if used or bits.u(1) else 0
            counts.append(kept)
        else:
            negative, positive = bits.ue(), bits.ue()
            for _ in range(negative + positive):
                bits.ue(), bits.u(1)
            counts.append(negative + positive)


def _hevc_vui(bits: _Bits) -> tuple[int, bool]:
    """Skip an HEVC SPS from after its NAL header to its VUI flag; its chroma_format_idc, and whether the VUI follows."""
    bits.u(4)
    sub_layers = bits.u(3)
    bits.u(1)
    _profile_tier_level(bits, sub_layers)
    bits.ue()
    chroma_format = bits.ue()
    if chroma_format == 3:  # 4:4:4
        bits.u(1)
    bits.ue(), bits.ue()
    if bits.u(1):  # conformance window
        bits.ue(), bits.ue(), bits.ue(), bits.ue()
    bits.ue(), bits.ue()
    poc_bits = bits.ue() + 4
    for _ in range(sub_layers + 1 if bits.u(1) else 1):
        bits.ue(), bits.ue(), bits.ue()
    for _ in range(6):  # coding and transform block sizes, transform hierarchy depths
        bits.ue()
    if bits.u(1) and bits.u(1):  # scaling lists enabled, and stated here
        _hevc_scaling_lists(bits)
    bits.u(2)  # amp, sao
    if bits.u(1):  # pcm
        bits.u(8), bits.ue(), bits.ue(), bits.u(1)
    _short_term_sets(bits)
    if bits.u(1):  # long-term references
        for _ in range(bits.ue()):
            bits.u(poc_bits), bits.u(1)
    bits.u(2)  # temporal mvp, strong intra smoothing
    return chroma_format, bool(bits.u(1))


def _vui_chroma(bits: _Bits) -> int | None:
    """The VUI's chroma_sample_loc_type_top_field as an AVChromaLocation (type + 1), None where it
    states none, 0 for a reserved type."""
    if bits.u(1) and bits.u(8) == _EXTENDED_SAR:  # aspect ratio
        bits.u(32)
    if bits.u(1):  # overscan
        bits.u(1)
    if bits.u(1):  # video signal type
        bits.u(4)
        if bits.u(1):
            bits.u(24)
    if not bits.u(1):
        return None
    top = bits.ue()
    return top + 1 if top <= 5 else UNKNOWN


def chroma_location(codec: str, extradata: bytes | None, subsampled: bool = True) -> int:
    """Where ``codec``'s 4:2:0 chroma sits as a player of the stream takes it, as FFmpeg's
    AVChromaLocation (1 left, 2 center, 3 top left, 4 top, 5 bottom left, 6 bottom): as an H.264 or
    HEVC stream's SPS or an AV1 stream's ``av1C`` states it, the standard's default where an SPS
    read whole states none, or the location a codec's standard fixes; 0 where it is not known
    (not read, or not 4:2:0: ``subsampled`` says whether the stream's pixel format is)."""
    if codec in FIXED:
        return FIXED[codec] if subsampled else UNKNOWN
    if codec == "av1":
        return _av1_location(bytes(extradata or b""))
    kinds = {"h264": (H264_SPS, 1, _h264_vui), "hevc": (HEVC_SPS, 2, _hevc_vui)}
    if codec not in kinds or not extradata:
        return UNKNOWN
    sps, header, skip = kinds[codec]
    for unit in _nal_units(codec, bytes(extradata)):
        kind = unit[0] & 0x1F if codec == "h264" else unit[0] >> 1 & 0x3F
        if kind != sps:
            continue
        bits = _Bits(unit[header:])
        try:
            chroma_format, vui = skip(bits)
            stated = _vui_chroma(bits) if vui else None
        except IndexError:
            return UNKNOWN
        if stated is None:
            return LEFT if chroma_format == 1 else UNKNOWN
        return stated
    return UNKNOWN


def _av1_location(av1c: bytes) -> int:
    """The chroma_sample_position of an ``av1C`` (marker and version 1) of a 4:2:0 stream."""
    if len(av1c) < 4 or av1c[0] != 0x81 or av1c[2] & 0x1C != 0x0C:  # not monochrome, subsampled both ways
        return UNKNOWN
    return _AV1_POSITIONS.get(av1c[2] & 3, UNKNOWN)
