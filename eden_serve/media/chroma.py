"""Where a video's chroma samples sit (its chroma location), read from the sequence parameter set of
an H.264 or HEVC stream's extradata (docs/video.md, "Depth and colour").

PyAV 18 exposes no chroma location on streams, codec contexts or frames, though FFmpeg's decoders
read it; an encoder takes it through the ``chroma_sample_location`` option (:mod:`.colour`). So it is
read here from the bitstream: the VUI's ``chroma_sample_loc_type_top_field``, in the SPS that
``avcC``/``hvcC`` (MP4, Matroska) or Annex B extradata (MPEG-TS, raw streams) hold. Other codecs, a
Matroska ``ChromaSiting`` and streams whose SPS comes only in-band are not read: they stay unstated.
The parser only skips what precedes the VUI; any inconsistency (a truncated or foreign SPS) reads as
unstated, never as an error.
"""

from __future__ import annotations

from typing import Iterator

H264_SPS, HEVC_SPS = 7, 33  # nal_unit_type
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


def _h264_vui(bits: _Bits) -> bool:
    """Skip an H.264 SPS from its profile to its VUI flag; whether the VUI follows."""
    profile = bits.u(8)
    bits.u(16)  # constraint flags, level
    bits.ue()
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
    return bool(bits.u(1))


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


def _hevc_vui(bits: _Bits) -> bool:
    """Skip an HEVC SPS from after its NAL header to its VUI flag; whether the VUI follows."""
    bits.u(4)
    sub_layers = bits.u(3)
    bits.u(1)
    _profile_tier_level(bits, sub_layers)
    bits.ue()
    if bits.ue() == 3:  # chroma_format_idc 4:4:4
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
    return bool(bits.u(1))


def _vui_chroma(bits: _Bits) -> int:
    """The VUI's chroma_sample_loc_type_top_field as an AVChromaLocation (type + 1), 0 where unstated."""
    if bits.u(1) and bits.u(8) == _EXTENDED_SAR:  # aspect ratio
        bits.u(32)
    if bits.u(1):  # overscan
        bits.u(1)
    if bits.u(1):  # video signal type
        bits.u(4)
        if bits.u(1):
            bits.u(24)
    if not bits.u(1):
        return 0
    top = bits.ue()
    return top + 1 if top <= 5 else 0


def chroma_location(codec: str, extradata: bytes | None) -> int:
    """The chroma location that an H.264 or HEVC stream's SPS states, as FFmpeg's AVChromaLocation
    (1 left, 2 center, 3 top left, 4 top, 5 bottom left, 6 bottom); 0 where it states none or is not read."""
    kinds = {"h264": (H264_SPS, 1, _h264_vui), "hevc": (HEVC_SPS, 2, _hevc_vui)}
    if codec not in kinds or not extradata:
        return 0
    sps, header, skip = kinds[codec]
    for unit in _nal_units(codec, bytes(extradata)):
        kind = unit[0] & 0x1F if codec == "h264" else unit[0] >> 1 & 0x3F
        if kind != sps:
            continue
        bits = _Bits(unit[header:])
        try:
            return _vui_chroma(bits) if skip(bits) else 0
        except IndexError:
            return 0
    return 0
