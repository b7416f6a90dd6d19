"""A video's colour, carried from the input's stream to the output's (docs/video.md, "Depth and
colour"): the tags (primaries, transfer, matrix, range: FFmpeg's AVColor* values), which the encoder
writes into its stream where the codec has a place for them (H.264's and HEVC's VUI, AV1's
sequence header) and the muxer into the container (Matroska's Colour, MP4's colr); and HDR10's
metadata, the mastering display and the content light level, which the encoders that hold them
(x264, x265, SVT-AV1) write into their stream as their own parameters, and Matroska, MP4 and MOV
into the container for FFV1, VP9 and ProRes (:mod:`.mastering`).

Read from the input's stream, and the metadata from its first frame's side data, where decoders put
it; the chroma location from an H.264 or HEVC stream's SPS, an AV1 stream's ``av1C`` or the codec's
standard (:mod:`.chroma`: PyAV exposes none),
written through the encoder's ``chroma_sample_location`` option. A cloud's probe of a server-side
source states them all (:meth:`Colour.fields`), and the client reads them back, checked
(:meth:`Colour.from_fields`).

:func:`tone_mapped` shows an HDR frame on an SDR screen (the page's previews, docs/video.md's picture).
"""

from __future__ import annotations

import re
import struct
import warnings
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from .chroma import chroma_location
from .encoding import import_av, side_data

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
    """What a video stream states of its colour; FFmpeg's values, 2 (0 for the range and the chroma
    location): unspecified."""

    primaries: int = UNSPECIFIED
    transfer: int = UNSPECIFIED
    matrix: int = UNSPECIFIED
    range: int = 0
    mastering: Mastering | None = None
    light: tuple[int, int] | None = None  # MaxCLL, MaxFALL in cd/m²
    chroma: int = 0  # AVChromaLocation: 1 left, 2 center, 3 top left, 4 top, 5 bottom left, 6 bottom

    @classmethod
    def of_stream(cls, context) -> Colour:
        """The tags of a stream's codec context (PyAV's), as its container and bitstream state them;
        a yuvj pixel format is full range whatever its tag says."""
        full = (context.pix_fmt or "").startswith("yuvj")
        return cls(int(context.color_primaries), int(context.color_trc), int(context.colorspace), FULL if full else int(context.color_range),
                   chroma=chroma_location(context.codec.canonical_name, context.extradata, _subsampled(context)))

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
        for side in side_data(frame):
            name = side.type.name
            if name == "MASTERING_DISPLAY_METADATA" and side.buffer_size >= _MASTERING.size:
                mastering = Mastering.from_side_data(bytes(side))
            elif name == "CONTENT_LIGHT_LEVEL" and side.buffer_size >= _LIGHT.size:
                light = _LIGHT.unpack_from(bytes(side))
        return replace(self, mastering=mastering, light=light)

    def options(self) -> dict[str, str]:
        """The chroma location as every encoder's option (FFmpeg's x264, x265 and SVT-AV1 wrappers write
        it into their stream, the Matroska and MP4 muxers into the container)."""
        return {"chroma_sample_location": str(self.chroma)} if self.chroma else {}

    def fields(self) -> dict:
        """As a cloud's probe states it (JSON): the tags, the chroma location, and HDR10's metadata
        (chromaticities and luminances as fractions ``N/D``; null where unstated)."""
        mastering = self.mastering and {name: [str(value) for value in getattr(self.mastering, name)] for name in _POINTS}
        return {"primaries": self.primaries, "transfer": self.transfer, "matrix": self.matrix, "range": self.range,
                "chroma": self.chroma, "mastering": mastering, "light": list(self.light) if self.light else None}

    @classmethod
    def from_fields(cls, fields: object) -> Colour:
        """What :meth:`fields` made, each value checked: ValueError saying what is wrong."""
        if not isinstance(fields, dict) or set(fields) != {*_TAGS, "mastering", "light"}:
            raise ValueError(f"colour must be an object of {', '.join(_TAGS)}, mastering and light")
        for name, largest in _TAGS.items():
            if type(fields[name]) is not int or not 0 <= fields[name] <= largest:
                raise ValueError(f"colour's {name} must be an integer from 0 to {largest}")
        mastering, light = fields["mastering"], fields["light"]
        if light is not None and not (isinstance(light, list) and len(light) == 2
                                      and all(type(v) is int and 0 <= v <= 0xFFFF for v in light)):
            raise ValueError("colour's light must be null or [MaxCLL, MaxFALL], integers from 0 to 65535")
        if mastering is not None:
            if not isinstance(mastering, dict) or set(mastering) != set(_POINTS):
                raise ValueError(f"colour's mastering must be null or an object of {', '.join(_POINTS)}")
            mastering = Mastering(*(_pair(mastering[name], name) for name in _POINTS))
        return cls(*(fields[name] for name in ("primaries", "transfer", "matrix", "range")), mastering,
                   tuple(light) if light else None, fields["chroma"])

    def tag(self, context) -> None:
        """Tag an encoder's codec context (before it opens) with the stated values."""
        for name, value, unstated in (("color_primaries", self.primaries, UNSPECIFIED), ("color_trc", self.transfer, UNSPECIFIED),
                                      ("colorspace", self.matrix, UNSPECIFIED), ("color_range", self.range, 0)):
            if value != unstated:
                setattr(context, name, value)

    def parameters(self, encoder: str) -> dict[str, str]:
        """The HDR metadata as ``encoder``'s own parameters (KEY=VALUE pairs of its params option);
        where it has none, a warning says the metadata is left out (asked only where the container
        does not hold it instead: :mod:`.mastering`)."""
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
        warnings.warn(f"{encoder} has no place for the input's HDR metadata (mastering display, content light level), nor has "
                      "this output's container (Matroska, MP4 and MOV hold it for FFV1, VP9 and FFmpeg's prores encoder): "
                      "the output keeps its colour tags without it")
        return {}


def _subsampled(context) -> bool:
    """Whether a stream's pixel format is 4:2:0 (a hardware decoder's: what its surfaces hold); False where not known."""
    av = import_av()
    name = context.pix_fmt
    if name is not None and not av.VideoFormat(name).components:
        name = getattr(getattr(context, "sw_format", None), "name", None)
    if name is None:
        return False
    format = av.VideoFormat(name, 16, 16)
    return len(format.components) >= 3 and (format.chroma_width(16), format.chroma_height(16)) == (8, 8)


# A probe's tags and the largest value each takes (AVColorPrimaries, ...: all well under 256).
_TAGS = {"primaries": 255, "transfer": 255, "matrix": 255, "range": 2, "chroma": 6}
_POINTS = ("red", "green", "blue", "white", "luminance")
_RATIO = re.compile(r"\d{1,10}(/[1-9]\d{0,9})?")


def _pair(values: object, name: str) -> tuple[Fraction, Fraction]:
    """Two fractions ``N/D`` of a probe's mastering display, within an AVRational's int32 and in
    range (chromaticities 0 to 1, luminances 0 to 10,000 cd/m²)."""
    largest = 10000 if name == "luminance" else 1
    if (isinstance(values, list) and len(values) == 2 and all(isinstance(v, str) and _RATIO.fullmatch(v) for v in values)):
        pair = tuple(Fraction(v) for v in values)
        if all(f.numerator < 1 << 31 and f.denominator < 1 << 31 and 0 <= f <= largest for f in pair):
            return pair
    raise ValueError(f"colour's mastering {name} must be two fractions N/D from 0 to {largest}")


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


# --- an HDR frame for an SDR screen --------------------------------------------------------------

_PQ = (2610 / 16384, 2523 / 4096 * 128, 3424 / 4096, 2413 / 4096 * 32, 2392 / 4096 * 32)  # m1, m2, c1, c2, c3
_HLG = (0.17883277, 0.28466892, 0.55991073)  # a, b, c
_BT2020_TO_BT709 = np.array([[1.6605, -0.5876, -0.0728], [-0.1246, 1.1329, -0.0083], [-0.0182, -0.1006, 1.1187]], np.float32)
_BT2020_LUMA = np.array([0.2627, 0.6780, 0.0593], np.float32)
REFERENCE_WHITE = 203.0  # cd/m²: HDR's diffuse white (ITU-R BT.2408), shown as SDR's


def _nits(signal: np.ndarray, colour: Colour) -> np.ndarray:
    """Display light in cd/m² of PQ- or HLG-coded RGB in [0, 1] (HLG on a 1000 cd/m² display)."""
    if colour.transfer == PQ:
        m1, m2, c1, c2, c3 = _PQ
        power = np.power(signal, 1 / m2)
        return 10000 * np.power(np.maximum(power - c1, 0) / (c2 - c3 * power), 1 / m1)
    a, b, c = _HLG
    scene = np.where(signal <= 0.5, signal * signal / 3, (np.exp((signal - c) / a) + b) / 12)
    luma = np.maximum(scene @ _BT2020_LUMA, 1e-6)[..., None]
    return 1000 * np.power(luma, 0.2) * scene  # the reference OOTF: system gamma 1.2


def tone_mapped(pixels: np.ndarray, colour: Colour) -> np.ndarray:
    """RGB pixels [H, W, 3] (8 or 16 bits) coded with the PQ or HLG transfer -> 8-bit BT.709 RGB for
    an SDR screen: display light, BT.2020 primaries to BT.709's, its luminance rolled off (extended
    Reinhard) from the clip's peak (MaxCLL, else the mastering display's, else 1000 cd/m²) to SDR's
    white at HDR's reference white, then BT.1886's gamma. A picture to look at, not a grade."""
    signal = pixels.astype(np.float32) / (65535.0 if pixels.dtype == np.uint16 else 255.0)
    light = _nits(signal, colour)
    if colour.primaries == BT2020:
        light = np.maximum(light @ _BT2020_TO_BT709.T, 0)
    peak = (colour.light[0] if colour.light and colour.light[0] else
            float(colour.mastering.luminance[1]) if colour.mastering else 1000.0) / REFERENCE_WHITE
    relative = light / REFERENCE_WHITE
    luma = np.maximum(relative @ np.array([0.2126, 0.7152, 0.0722], np.float32), 1e-6)[..., None]
    mapped = luma * (1 + luma / (peak * peak)) / (1 + luma)
    sdr = np.clip(relative * (mapped / luma), 0, 1)
    return np.round(np.power(sdr, 1 / 2.4) * 255).astype(np.uint8)
