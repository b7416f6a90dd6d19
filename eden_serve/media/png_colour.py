"""How a PNG's colour chunks say its pixels are shown, as a video of its images states it
(:mod:`.sequence`), and what a pair's middle saved in another image format loses of them
(:func:`lost_in_copy`). The PNG specification (third edition) ranks them: cICP over iCCP over
sRGB over gAMA and cHRM; an image with none of them is sRGB, as is any image but a PNG (whose ICC
profile :mod:`.icc` judges).

- cICP (coding-independent code points: primaries, transfer, matrix, full-range flag, as a video
  states them): the video states its primaries and transfer, and with them HDR10's metadata of the
  same image, its mastering display (mDCv) and content light level (cLLi). The matrix, which a PNG
  must state as 0 (RGB), is the video's to choose (:func:`~.pixel_formats.yuv_matrix`: BT.2020's
  for BT.2020 primaries, else BT.709's). A cICP of another matrix is no PNG's: passed over, said.
  Narrow-range RGB (the flag 0) is converted as full-range RGB is, said.
- iCCP: the profile's colours (:mod:`.icc`: the video states none where it is not sRGB's).
- sRGB: sRGB.
- gAMA and cHRM: sRGB where each stated is sRGB's own (gamma 1/2.2, BT.709's primaries and D65's
  white); else they describe colours the video has no tag for: it states no primaries or transfer
  rather than sRGB's, said.
mDCv and cLLi without a cICP stand beside no HDR transfer: passed over, as a reader of the PNG does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from fractions import Fraction

from ..wire.png import chunk_bodies, icc_profile
from . import icc
from .colour import LIMITED, UNSPECIFIED, Colour, Mastering

# AVCOL_PRI_BT709, AVCOL_TRC_IEC61966_2_1 (sRGB), AVCOL_SPC_RGB: sRGB pixels; YUV made of them is
# converted by BT.709's matrix (:func:`~.pixel_formats.yuv_matrix`) into limited range.
SRGB = Colour(primaries=1, transfer=13, matrix=0, range=LIMITED)
UNSTATED = replace(SRGB, primaries=UNSPECIFIED, transfer=UNSPECIFIED)  # colours the video has no tag for
# gAMA's and cHRM's values of sRGB (in 1/100000): its gamma, then white, red, green and blue (x, y).
_SRGB_GAMMA = 45455
_SRGB_CHROMATICITIES = (31270, 32900, 64000, 33000, 30000, 60000, 15000, 6000)
_NEAR = 100  # 0.001: what writers' rounding of 1/2.2 and of the chromaticities leaves
_MDCV, _CLLI = struct.Struct(">8H2I"), struct.Struct(">2I")


@dataclass(frozen=True)
class Shown:
    """What an image's colour chunks say: the colour a video of it states, the chunk that decided it
    ("cICP", "iCCP", "sRGB", "gAMA/cHRM", or "" for none: sRGB), and a line for what of it the video
    does not state as the image is shown (None where nothing)."""

    colour: Colour
    by: str = ""
    said: str | None = None

    def tags(self) -> tuple:
        return self.colour.primaries, self.colour.transfer, self.colour.mastering, self.colour.light


def shown(chunks: bytes, profile: bytes | None = None) -> Shown:
    """How an image whose colour chunks are ``chunks`` (:attr:`~.base.Frame.shown_as`) and whose ICC
    profile is ``profile`` (None: the iCCP chunk's among ``chunks``) is shown, by the chunks' ranks."""
    found = chunk_bodies(chunks)
    passed = None
    if (cicp := found.get(b"cICP")) is not None:
        if len(cicp) == 4 and cicp[2] == 0:
            primaries, transfer, _, full = cicp
            colour = replace(SRGB, primaries=primaries, transfer=transfer, mastering=_mastering(found.get(b"mDCv")),
                             light=_light(found.get(b"cLLi")))
            return Shown(colour, "cICP", None if full else "its cICP chunk states narrow-range RGB, which is converted as full-range "
                                                           "RGB is: its blacks and whites are shown greyed")
        passed = (f"its cICP chunk is passed over: it states matrix {cicp[2] if len(cicp) == 4 else '(cut short)'}, and a PNG's "
                  "is 0 (RGB)")
    if icc.matters(profile if profile is not None else icc_profile(chunks)):
        return Shown(UNSTATED, "iCCP", passed)
    if b"iCCP" in found or b"sRGB" in found:
        return Shown(SRGB, "iCCP" if b"iCCP" in found else "sRGB", passed)
    gamma, chromaticities = found.get(b"gAMA"), found.get(b"cHRM")
    if gamma is None and chromaticities is None:
        return Shown(SRGB, "", passed)
    if _near(gamma, (_SRGB_GAMMA,)) and _near(chromaticities, _SRGB_CHROMATICITIES):
        return Shown(SRGB, "gAMA/cHRM", passed)
    line = ("its gAMA and cHRM chunks state a gamma or chromaticities other than sRGB's: the video states no primaries or "
            "transfer rather than sRGB's, which its colours are not")
    return Shown(UNSTATED, "gAMA/cHRM", f"{passed}; {line}" if passed else line)


def lost_in_copy(chunks: bytes) -> str | None:
    """The chunks an image shown as ``chunks`` loses, named, where a copy in a format with a place for
    an ICC profile alone is shown otherwise for it (its cICP, with its mDCv and cLLi; gAMA and cHRM
    of other than sRGB's values); None where the copy is shown as it is (the profile is
    :mod:`.icc`'s to say; sRGB's own values are what a reader takes anyway)."""
    seen = shown(chunks)
    if (seen.colour.primaries, seen.colour.transfer) == (SRGB.primaries, SRGB.transfer) or seen.by not in ("cICP", "gAMA/cHRM"):
        return None
    found = chunk_bodies(chunks)
    kinds = ("cICP", "mDCv", "cLLi") if seen.by == "cICP" else ("gAMA", "cHRM")
    named = [kind for kind in kinds if kind.encode() in found]
    return " and ".join(filter(None, (", ".join(named[:-1]), named[-1])))


def _near(body: bytes | None, values: tuple[int, ...]) -> bool:
    """Whether a gAMA or cHRM chunk's ``body`` states ``values`` (each to within :data:`_NEAR`); True for none."""
    if body is None:
        return True
    if len(body) != 4 * len(values):
        return False
    return all(abs(a - b) <= _NEAR for a, b in zip(struct.unpack(f">{len(values)}I", body), values))


def _mastering(body: bytes | None) -> Mastering | None:
    """An mDCv chunk's mastering display: red, green, blue and white (x, y) in 0.00002, then the
    greatest and least luminance in 0.0001 cd/m²; None where it is not that, or states no display."""
    if body is None or len(body) != _MDCV.size:
        return None
    *points, high, low = _MDCV.unpack(body)
    if not high or not all(points):
        return None
    xy = [(Fraction(points[i], 50000), Fraction(points[i + 1], 50000)) for i in range(0, 8, 2)]
    return Mastering(*xy, luminance=(Fraction(low, 10000), Fraction(high, 10000)))


def _light(body: bytes | None) -> tuple[int, int] | None:
    """A cLLi chunk's MaxCLL and MaxFALL (in 0.0001 cd/m²) in cd/m², as video states them (16 bits)."""
    if body is None or len(body) != _CLLI.size:
        return None
    return tuple(min(round(value / 10000), 0xFFFF) for value in _CLLI.unpack(body))
