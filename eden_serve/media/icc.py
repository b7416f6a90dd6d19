"""An image's own ICC profile, carried into every output that can hold it and said to be left out
of one that cannot. The pixels are interpolated as they are encoded, in the profile's space, as an
sRGB image's are in sRGB's, so the profile describes the middles as it does the originals: an
image output states it (PNG's iCCP chunk, or Pillow's ``icc_profile`` for JPEG, WebP, TIFF, AVIF),
and a video, or an image format without a place for one (BMP, GIF, PPM...), says in one warning
that it is left out, and does not claim sRGB's colours for images whose profile says otherwise.

A profile describes the pixels written only where its colour space is theirs: an RGB profile for
colour, a grey one for grey. A CMYK JPEG's profile, or a Lab TIFF's, does not describe the RGB
pixels its frames are converted to (by Pillow's plain conversion, which applies no profile), so it
is left out too, and said."""

from __future__ import annotations

import functools
import io
import warnings

from PIL import Image, ImageCms, ImageMode

# The formats Pillow writes a profile into, given as ``icc_profile`` (checked by reading it back).
HOLDS_ICC = frozenset({"PNG", "JPEG", "MPO", "WEBP", "TIFF", "AVIF"})
_GREY_BANDS = {"1", "L", "I", "F", "A", "a"}  # (A: the alpha of LA and its premultiplied La)


def colour_space(profile: bytes) -> str:
    """The colour space a profile's header states (bytes 16 to 20): "RGB", "GRAY", "CMYK", "Lab"..."""
    return profile[16:20].decode("latin-1").strip()


def written_space(mode: str) -> str:
    """The colour space of the pixels an image of ``mode`` is written in: grey stays grey, every other
    mode is written as RGB (CMYK, YCbCr, Lab and HSV converted by Pillow, a palette's colours)."""
    return "GRAY" if set(ImageMode.getmode(mode).bands) <= _GREY_BANDS else "RGB"


def fits(profile: bytes | None, mode: str) -> bool:
    """Whether ``profile`` describes the pixels an image of ``mode`` is written in."""
    return bool(profile) and colour_space(profile) == written_space(mode)


@functools.lru_cache(maxsize=4)
def is_srgb(profile: bytes) -> bool:
    """Whether ``profile`` is sRGB's, or as good as: it takes a grid of colours to within one 8-bit
    level of themselves in sRGB's (littleCMS, through Pillow's ImageCms). False where it does not
    parse, or where Pillow was built without littleCMS: then it is not known to be sRGB."""
    try:
        levels = bytes(range(0, 256, 17))
        grid = Image.frombytes("RGB", (len(levels) ** 2, len(levels)),
                               bytes(v for b in levels for g in levels for r in levels for v in (r, g, b)))
        shown = ImageCms.profileToProfile(grid, ImageCms.ImageCmsProfile(io.BytesIO(profile)), ImageCms.createProfile("sRGB"),
                                          renderingIntent=ImageCms.Intent.RELATIVE_COLORIMETRIC, outputMode="RGB")
    except (ImportError, OSError, ValueError, TypeError, ImageCms.PyCMSError):  # ImportError: Pillow's, on first use
        return False
    return max(abs(a - b) for a, b in zip(grid.tobytes(), shown.tobytes())) <= 1


def matters(profile: bytes | None) -> bool:
    """Whether leaving ``profile`` out changes how the pixels are shown: any but sRGB's, which a reader takes anyway."""
    return bool(profile) and not is_srgb(profile)


class LeftOut:
    """One warning per output, at the first image whose profile it leaves out."""

    def __init__(self):
        self.said = False

    def say(self, line: str) -> None:
        if not self.said:
            self.said = True
            warnings.warn(line)
