"""A video's colour, carried from the input's stream to the output's (docs/video.md, "Depth and
colour"): the tags (primaries, transfer, matrix, range: FFmpeg's AVColor* values), which the encoder
writes into its stream where the codec has a place for them (H.264's and HEVC's VUI, AV1's
sequence header) and the muxer into the container (Matroska's Colour, MP4's colr); and HDR10's
metadata, the mastering display and the content light level, which the encoders that hold them
(x264, x265, SVT-AV1) write into their stream as their own parameters.

Read from the input's stream, and the metadata from its first frame's side data, where decoders put
it. PyAV cannot tag a stream's container with the metadata itself, nor read a stream's chroma
location: an encoder that has no place for the metadata (FFV1, VP9) leaves it out, saying so in one line.
"""

from __future__ import annotations

import struct
import warnings
from dataclasses import dataclass, replace
from fractions import Fraction

UNSPECIFIED = 2  # AVCOL_PRI_, AVCOL_TRC_ and AVCOL_SPC_UNSPECIFIED
PQ, HLG = 16, 18  # AVCOL_TRC_SMPTE2084, AVCOL_TRC_ARIB_STD_B67
BT2020 = 9  # AVCOL_PRI_BT2020
LIMITED, FULL = 1, 2  # AVCOL_RANGE_MPEG, AVCOL_RANGE_JPEG
# AVMasteringDisplayMetadata: primaries R, G, B and the white point as (x, y) rationals, the
# minimum and maximum luminance as rationals, then has_primaries and has_luminance; AVContentLightMetadata.
_MASTERING = struct.Struct("=22i")
_LIGHT = struct.Struct("=2I")


@dataclass(frozen=True)
class Mastering:
    """The mastering display: CIE 1931 (x, y) of its red, green and blue primaries and its white
    point, and its least and greatest luminance in cd/m²."""

    red: tuple[Fraction, Fraction]
    green: tuple[Fraction, Fraction]
    blue: tuple[Fraction, Fraction]
    white: tuple[Fraction, Fraction]
    luminance: tuple[Fraction, Fraction]  # (min, max)

    @classmethod
    def from_side_data(cls, data: bytes) -> Mastering | None:
        values = _MASTERING.unpack_from(data)
        if not values[20] or not values[21] or any(d == 0 for d in values[1:20:2]):
            return None  # a display without both its primaries and its luminance: nothing to write
        ratios = [Fraction(n, d) for n, d in zip(values[0:20:2], values[1:20:2])]
        return cls(*(tuple(ratios[i:i + 2]) for i in range(0, 10, 2)))

    def units(self) -> str:
        """As x265 and x264 take it: G(x,y)B(x,y)R(x,y)WP(x,y)L(max,min), chromaticities in 0.00002
        and luminance in 0.0001 cd/m²."""
        def xy(point):
            return f"({round(point[0] * 50000)},{round(point[1] * 50000)})"
        low, high = self.luminance
        return (f"G{xy(self.green)}B{xy(self.blue)}R{xy(self.red)}WP{xy(self.white)}"
                f"L({round(high * 10000)},{round(low * 10000)})")

    def decimals(self) -> str:
        """As SVT-AV1 takes it: the same order, in decimals."""
        def xy(point):
            return f"({float(point[0]):.5f},{float(point[1]):.5f})"
        low, high = self.luminance
        return f"G{xy(self.green)}B{xy(self.blue)}R{xy(self.red)}WP{xy(self.white)}L({float(high):.4f},{float(low):.4f})"


@dataclass(frozen=True)
class Colour:
    """What a video stream states of its colour; FFmpeg's values, 2 (0 for the range): unspecified."""

    primaries: int = UNSPECIFIED
    transfer: int = UNSPECIFIED
    matrix: int = UNSPECIFIED
    range: int = 0
    mastering: Mastering | None = None
    light: tuple[int, int] | None = None  # MaxCLL, MaxFALL in cd/m²

    @classmethod
    def of_stream(cls, context) -> Colour:
        """The tags of a stream's codec context (PyAV's), as its container and bitstream state them;
        a yuvj pixel format is full range whatever its tag says."""
        full = (context.pix_fmt or "").startswith("yuvj")
        return cls(int(context.color_primaries), int(context.color_trc), int(context.colorspace),
                   FULL if full else int(context.color_range))

    @property
    def hdr(self) -> bool:
        """Coded with the PQ or the HLG transfer: a browser shows it only tone-mapped (docs/page.md)."""
        return self.transfer in (PQ, HLG)

    @property
    def may_hold_metadata(self) -> bool:
        """Whether its frames may carry HDR metadata worth reading (PQ, HLG or BT.2020 primaries)."""
        return self.hdr or self.primaries == BT2020

    def with_side_data(self, frame) -> Colour:
        """These tags with the mastering display and content light level of a decoded frame's side data."""
        mastering, light = self.mastering, self.light
        for side in frame.side_data:
            name = side.type.name
            if name == "MASTERING_DISPLAY_METADATA" and side.buffer_size >= _MASTERING.size:
                mastering = Mastering.from_side_data(bytes(side))
            elif name == "CONTENT_LIGHT_LEVEL" and side.buffer_size >= _LIGHT.size:
                light = _LIGHT.unpack_from(bytes(side))
        return replace(self, mastering=mastering, light=light)

    def tag(self, context) -> None:
        """Tag an encoder's codec context (before it opens) with the stated values."""
        for name, value in (("color_primaries", self.primaries), ("color_trc", self.transfer),
                            ("colorspace", self.matrix), ("color_range", self.range)):
            if value not in (UNSPECIFIED, 0):
                setattr(context, name, value)

    def parameters(self, encoder: str) -> dict[str, str]:
        """The HDR metadata as ``encoder``'s own parameters (KEY=VALUE pairs of its params option);
        where it has none, a warning says the metadata is left out."""
        if self.mastering is None and self.light is None:
            return {}
        if encoder in ("libx265", "libx264"):
            light = "max-cll" if encoder == "libx265" else "cll"
            return {**({"master-display" if encoder == "libx265" else "mastering-display": self.mastering.units()}
                       if self.mastering else {}),
                    **({light: f"{self.light[0]},{self.light[1]}"} if self.light else {})}
        if encoder == "libsvtav1":
            return {**({"mastering-display": self.mastering.decimals()} if self.mastering else {}),
                    **({"content-light": f"{self.light[0]},{self.light[1]}"} if self.light else {})}
        warnings.warn(f"{encoder} has no place for the input's HDR metadata (mastering display, content light level), "
                      "and PyAV cannot write it into the container: the output keeps its colour tags without it")
        return {}


# Each encoder's option that takes its own parameters as KEY=VALUE pairs joined by ':'.
PARAMS_OPTION = {"libx265": "x265-params", "libx264": "x264-params", "libsvtav1": "svtav1-params"}


def merged(options: dict[str, str], encoder: str, defaults: dict[str, str]) -> dict[str, str]:
    """``options`` with ``defaults`` added to ``encoder``'s params option, the parameters it already
    names (the user's) kept as they are."""
    key = PARAMS_OPTION.get(encoder)
    if key is None or not defaults:
        return options
    given = [pair for pair in options.get(key, "").split(":") if pair]
    named = {pair.partition("=")[0] for pair in given}
    added = [f"{name}={value}" for name, value in defaults.items() if name not in named]
    return {**options, key: ":".join(added + given)}
