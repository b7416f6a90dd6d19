"""Frames in and out: image bytes or files <-> float tensors [3, H, W] in [0, 1], and the middle
frame back in its neighbours' pixel format.

Any Pillow-readable format and mode is accepted and converted to RGB; 16-bit images keep their
precision. The pixel limit is checked from the header, before any pixel is decoded.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Iterator, Union

import numpy as np
import torch
from PIL import ExifTags, Image, ImageChops, ImageOps, UnidentifiedImageError

from ..errors import BadInputError, FrameTooLargeError

DEFAULT_MAX_PIXELS = 3840 * 2160  # 4K UHD


# Modes a PNG can hold; a middle frame of any other mode (CMYK, YCbCr, LAB, F...) is written as TIFF.
PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}

_SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


def check_size(width: int, height: int, max_pixels: int, name: str = "frame") -> None:
    if width * height > max_pixels:
        raise FrameTooLargeError(f"{name} is {width}x{height} = {width * height} pixels, over the limit of {max_pixels}")


def check_sides(width: int, height: int, max_side: int, name: str = "frame") -> None:
    if max(width, height) > max_side:
        raise FrameTooLargeError(f"{name} is {width}x{height}: a side over {max_side} pixels, more than the wire format can carry")


def image_to_tensor(image: Image.Image, out: torch.Tensor | None = None) -> torch.Tensor:
    """A decoded image (oriented already, see :func:`open_image`) -> [3, H, W] float32 in [0, 1],
    written into ``out`` where given (a frame of a batch): 8-bit pixels then cost no float copy
    beyond it."""
    if out is None:
        out = torch.empty(3, image.height, image.width)
    if image.mode in _SIXTEEN_BIT_MODES or image.mode == "F":
        scale = 65535.0 if image.mode in _SIXTEEN_BIT_MODES else 1.0
        gray = np.clip(np.asarray(image, dtype=np.float32) / scale, 0, 1)
        out.copy_(torch.from_numpy(gray)[None].expand(3, -1, -1))
        return out
    rgb = np.array(image.convert("RGB"))  # writable, as torch.from_numpy wants: an 8-bit copy, not a float one
    return out.copy_(torch.from_numpy(rgb).permute(2, 0, 1)).div_(255.0)


def from_uint8(pixels: np.ndarray) -> torch.Tensor:
    """H x W x 3 uint8 -> [3, H, W] float32 in [0, 1], x / 255: every 8-bit frame goes through here,
    so that the edge re-derives from a frames payload exactly the tensor the cloud computed from."""
    array = pixels.astype(np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def _bomb(name: str, max_pixels: int | None) -> FrameTooLargeError:
    limit = 2 * Image.MAX_IMAGE_PIXELS
    return FrameTooLargeError(f"{name} declares more than {limit} pixels in its header, over the limit of {max_pixels or limit}")


@contextlib.contextmanager
def _opened(source: bytes | str | Path, name: str, max_pixels: int | None = None) -> Iterator[Image.Image]:
    """Image bytes or a file path, opened by Pillow (header only). What goes wrong while the block
    reads it is one clear error: unreadable is :class:`BadInputError`, too large (Pillow's own
    header check, or ours) :class:`FrameTooLargeError`."""
    try:
        stream = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else open(source, "rb")
    except OSError as exc:
        raise BadInputError(f"cannot read {name} {str(source)!r}: {exc.strerror}") from None
    with stream:
        try:
            yield Image.open(stream)
        except FrameTooLargeError:
            raise
        except Image.DecompressionBombError:  # Pillow's own limit, checked from the header inside Image.open
            raise _bomb(name, max_pixels) from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
            raise BadInputError(f"{name} is not a readable image ({type(exc).__name__})") from None


def open_image(source: bytes | str | Path, name: str = "frame", max_pixels: int | None = DEFAULT_MAX_PIXELS,
               max_side: int | None = None) -> Image.Image:
    """Image bytes or a file path -> the decoded image, EXIF orientation applied.

    ``max_pixels`` (None: no limit) and ``max_side`` are checked from the header, before any pixel
    is decoded.
    """
    with _opened(source, name, max_pixels) as image:
        if max_pixels is not None:
            check_size(*image.size, max_pixels, name)
        if max_side is not None:
            check_sides(*image.size, max_side, name)
        image.load()
    return ImageOps.exif_transpose(image)


def _orientation(image: Image.Image) -> int | None:
    """The EXIF orientation, from the header only. Pillow's ``getexif()`` of a PNG decodes the whole
    image to look for an eXIf chunk after the pixel data; one before it is all that is read here
    (what the PNG specification asks of writers)."""
    if image.format != "PNG":
        return image.getexif().get(ExifTags.Base.Orientation)
    exif = Image.Exif()
    if image.info.get("exif"):
        exif.load(image.info["exif"])
    return exif.get(ExifTags.Base.Orientation)


def header_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) of an opened image as :func:`open_image` returns it, from its header: the
    EXIF orientations that turn it by 90 degrees swap the sides."""
    return (image.height, image.width) if _orientation(image) in (5, 6, 7, 8) else image.size


def oriented_size(source: bytes | str | Path, name: str = "frame") -> tuple[int, int]:
    """(width, height) of an image as :func:`open_image` returns it, read from its header. Nothing
    is decoded."""
    with _opened(source, name) as image:
        return header_size(image)


def check_frame(source: bytes | str | Path, name: str, max_pixels: int, max_side: int | None = None) -> tuple[int, int]:
    """(width, height) of an image as :func:`open_image` returns it, with the pixel and side limits
    checked; from the header, before any pixel is decoded."""
    with _opened(source, name, max_pixels) as image:
        width, height = header_size(image)
    check_size(width, height, max_pixels, name)
    if max_side is not None:
        check_sides(width, height, max_side, name)
    return width, height


def load_frame(source: bytes | str | Path, name: str = "frame", max_pixels: int | None = DEFAULT_MAX_PIXELS,
               max_side: int | None = None) -> torch.Tensor:
    """Image bytes or a file path -> [3, H, W] float32 in [0, 1]."""
    return image_to_tensor(open_image(source, name, max_pixels, max_side))


def check_pair(frame0: torch.Tensor, frame1: torch.Tensor) -> None:
    if frame0.shape != frame1.shape:
        (_, h0, w0), (_, h1, w1) = frame0.shape, frame1.shape
        raise BadInputError(f"frames differ in size: frame0 is {w0}x{h0}, frame1 is {w1}x{h1}")


def to_pixels(frame: torch.Tensor) -> torch.Tensor:
    """[3, H, W] in [0, 1] -> [H, W, 3] uint8, round(x * 255), on the frame's device."""
    return (frame.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()


def to_uint8(frame: torch.Tensor) -> np.ndarray:
    """[3, H, W] in [0, 1] -> H x W x 3 uint8, round(x * 255)."""
    return to_pixels(frame).cpu().numpy()


# zlib level of the PNGs that travel between the client and the servers (frames up, middles down,
# scene cuts' copies): on real frames level 1 encodes 3x faster than the default 6 for 7-15% more
# bytes (85 ms against 26 ms at 854x480 here), which on a GPU edge would rival the model's time.
TRANSPORT_PNG_LEVEL = 1


def png_bytes(image: Image.Image, compress_level: int = 6) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def to_png(frame: torch.Tensor) -> bytes:
    """A middle frame as the edge answers it: an 8-bit RGB PNG at :data:`TRANSPORT_PNG_LEVEL`."""
    return png_of(to_uint8(frame))


def png_of(pixels: np.ndarray) -> bytes:
    """H x W x 3 uint8 pixels (:func:`to_uint8`'s) as :func:`to_png` encodes them."""
    return png_bytes(Image.fromarray(pixels), TRANSPORT_PNG_LEVEL)


# A picture: an image, or 8-bit RGB pixels as a tensor [H, W, 3] (a video's frames and the middles an
# edge in this process makes: they go from the decoder to the encoder without an image).
Picture = Union[Image.Image, torch.Tensor]


def pixels_to_tensor(pixels: torch.Tensor) -> torch.Tensor:
    """[H, W, 3] uint8 -> [3, H, W] float32 in [0, 1], on the pixels' device: what
    :func:`image_to_tensor` makes of their image, bit for bit."""
    return pixels.permute(2, 0, 1).float().div_(255.0)


def picture_size(picture: Picture) -> tuple[int, int]:
    """(width, height)."""
    return (picture.shape[1], picture.shape[0]) if isinstance(picture, torch.Tensor) else picture.size


def as_image(picture: Picture) -> Image.Image:
    """The picture as an image, for what only takes images (frame files, animations, previews)."""
    return Image.fromarray(picture.cpu().numpy()) if isinstance(picture, torch.Tensor) else picture


def match_mode(middle: Picture, before: Image.Image, after: Image.Image) -> Image.Image:
    """The RGB middle frame in the pixel format of the frame before it.

    The model only sees colour, so an alpha channel is the mean of the neighbours' alphas; a palette
    image is mapped onto the palette of the frame before; 16- and 32-bit grey keeps its range.
    """
    middle, mode = as_image(middle), before.mode
    if middle.mode == mode:
        return middle
    if mode in ("RGBA", "LA"):
        alpha0 = before.getchannel("A")
        alpha1 = after.getchannel("A") if "A" in after.getbands() and after.size == before.size else alpha0
        out = middle.convert(mode[:-1]).convert(mode)
        out.putalpha(ImageChops.add(alpha0, alpha1, scale=2.0))
        return out
    if mode == "P":
        out = middle.quantize(palette=before, dither=Image.Dither.NONE)
        if "transparency" in before.info:
            out.info["transparency"] = before.info["transparency"]
        return out
    if mode.startswith("I;16") or mode in ("I", "F"):
        grey = np.asarray(middle.convert("L"), dtype=np.float32) / 255.0
        if mode == "F":
            return Image.fromarray(grey)
        levels = np.round(grey * 65535.0)
        return Image.fromarray(levels.astype(np.int32 if mode == "I" else np.uint16))
    return middle.convert(mode)
