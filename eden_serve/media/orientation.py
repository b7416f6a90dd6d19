"""An image's EXIF orientation: read from its header, and done to its pixels, Pillow's or a 16-bit
frame's alike, so that a frame reaches the model upright whatever its depth."""

from __future__ import annotations

import struct

import numpy as np
from PIL import ExifTags, Image

# What each EXIF orientation asks to be done to the stored pixels to show them upright.
ORIENTATIONS = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_90,
}
# The orientations that turn an image by 90 degrees, swapping its sides.
QUARTER_TURNS = (5, 6, 7, 8)


def orientation(image: Image.Image) -> int | None:
    """The EXIF orientation, from the header only. Pillow's ``getexif()`` of a PNG decodes the whole
    image to look for an eXIf chunk after the pixel data; one before it is all that is read here
    (what the PNG specification asks of writers). None where there is none, or where the EXIF
    does not parse: the image is then read as stored. None for a TIFF, which Pillow turns itself:
    its size is upright from the header on, its pixels as they load (:func:`tiff_orientation`
    says how, for a decoder that does not)."""
    if image.format == "TIFF":
        return None
    try:
        if image.format != "PNG":
            return image.getexif().get(ExifTags.Base.Orientation)
        exif = Image.Exif()
        if image.info.get("exif"):
            exif.load(image.info["exif"])
        return exif.get(ExifTags.Base.Orientation)
    except (SyntaxError, ValueError, OSError, struct.error, KeyError, TypeError, IndexError):
        return None


def tiff_orientation(image: Image.Image) -> int | None:
    """A TIFF's orientation tag, read before Pillow's load turns the image (and drops the tag)."""
    value = image.tag_v2.get(ExifTags.Base.Orientation) if image.format == "TIFF" else None
    return value if value in ORIENTATIONS else None


def upright(pixels: np.ndarray, orientation: int | None) -> np.ndarray:
    """Stored pixels [H, W, C] as ``orientation`` shows them: Pillow's transposes of
    :data:`ORIENTATIONS`, done on an array of any dtype (FFmpeg's image decoders leave them undone)."""
    if orientation in (5, 6, 7, 8):
        pixels = pixels.transpose(1, 0, 2)  # 5 is the transpose; 6, 7 and 8 are it and then a flip
    if orientation in (2, 3, 6):
        pixels = pixels[:, ::-1]
    if orientation in (3, 4, 8):
        pixels = pixels[::-1]
    if orientation == 7:
        pixels = pixels[::-1, ::-1]
    return np.ascontiguousarray(pixels)
