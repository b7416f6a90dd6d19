"""Frames in and out: image bytes or files <-> float tensors [3, H, W] in [0, 1], and the middle
frame back in its neighbours' pixel format.

Any Pillow-readable format and mode is accepted and converted to RGB; 16-bit images keep their
precision: grey through Pillow, RGB PNG and TIFF (which Pillow reads as 8 bits) through PyAV's
decoders (:func:`open_deep`). The pixel limit is checked from the header, before any pixel is decoded.

A frame's pixels are 8-bit (uint8) or, from a source deeper than 8 bits, 16-bit (uint16): the
depth is the pixels' dtype, and every conversion here scales by it (x / 255 or x / 65535), so
that one path serves both (docs/video.md, "Depth and colour").
"""

from __future__ import annotations

import contextlib
import functools
import io
from pathlib import Path
from typing import Iterator, Union

import numpy as np
import torch
from PIL import Image, ImageChops, UnidentifiedImageError

from ..errors import BadInputError, FrameTooLargeError
from ..wire.png import GREY_ALPHA16, PNG_HEADER_BYTES, RGB16, RGBA16, png_header, rgb16_png, without_chunks
from .orientation import ORIENTATIONS, QUARTER_TURNS, orientation, tiff_orientation, upright

DEFAULT_MAX_PIXELS = 3840 * 2160  # 4K UHD


# Modes Pillow writes as PNG; any other (CMYK, YCbCr, LAB, 32-bit grey...) is written as :func:`png_ready` makes it.
PNG_MODES = {"1", "L", "LA", "I;16", "P", "RGB", "RGBA"}

SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}
# The pixels' dtype of each depth, and the largest value of each dtype.
DEPTHS = {8: torch.uint8, 16: torch.uint16}
_LEVELS = {torch.uint8: 255.0, torch.uint16: 65535.0, np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}


def levels(dtype) -> float:
    """The largest value of a pixels' dtype (uint8: 255, uint16: 65535), by which they are scaled to [0, 1]."""
    return _LEVELS[dtype]


def depth_of(pixels: torch.Tensor | np.ndarray) -> int:
    """8 or 16: the bits a channel of ``pixels`` holds."""
    return 16 if _LEVELS[pixels.dtype] > 255 else 8


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
    if image.mode in SIXTEEN_BIT_MODES or image.mode == "F":
        out.copy_(torch.from_numpy(grey_levels(image))[None].expand(3, -1, -1))
        return out
    rgb = np.array(image.convert("RGB"))  # writable, as torch.from_numpy wants: an 8-bit copy, not a float one
    return out.copy_(torch.from_numpy(rgb).permute(2, 0, 1)).div_(255.0)


def grey_levels(image: Image.Image) -> np.ndarray:
    """A grey image deeper than 8 bits (16- or 32-bit integers, 32-bit floats) in [0, 1], as the
    model reads it: integers over 65535, floats as they are (0 black, 1 white), clipped."""
    scale = 1.0 if image.mode == "F" else 65535.0
    return np.clip(np.asarray(image, dtype=np.float32) / np.float32(scale), 0, 1)


def from_pixels(pixels: np.ndarray) -> torch.Tensor:
    """H x W x 3 uint8 or uint16 -> [3, H, W] float32 in [0, 1], x / 255 or x / 65535: every frame of
    a payload goes through here, so that the edge re-derives from it exactly the tensor the cloud
    computed from."""
    array = pixels.astype(np.float32) / _LEVELS[pixels.dtype]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def frames_on(pixels: np.ndarray, device: torch.device) -> list[torch.Tensor]:
    """Frames [F, H, W, 3] as :func:`from_pixels` makes each, on ``device``, bit for bit, with less
    of the host's time (the served edge's frames and bitstream payloads: a 1080p frame took the host
    28 ms through from_pixels and its 25 MB upload). On a CPU in one pass into the frames' tensor;
    elsewhere 8-bit frames cross as they are, a quarter of float32's bytes, and are scaled there by
    a table of from_pixels' own value of each level: a GPU divides by a scalar as a product with its
    reciprocal, which can differ in the last bit. Deeper frames take from_pixels' own path."""
    if device.type == "cpu":
        scaled = torch.empty(len(pixels), 3, *pixels.shape[1:3], dtype=torch.float32)
        scaled.copy_(torch.from_numpy(pixels).permute(0, 3, 1, 2))
        return list(scaled.div_(_LEVELS[pixels.dtype]))
    if pixels.dtype != np.uint8:
        return [from_pixels(frame).to(device) for frame in pixels]
    return scaled_by_table(torch.from_numpy(pixels).to(device))


def scaled_by_table(frames: torch.Tensor) -> list[torch.Tensor]:
    """8-bit frames [F, H, W, 3] on a device, scaled there as :func:`frames_on` says."""
    table = _levels_table(frames.device)
    return [table[frame.permute(2, 0, 1).int()].contiguous() for frame in frames]


@functools.lru_cache(maxsize=8)
def _levels_table(device: torch.device) -> torch.Tensor:
    """from_pixels' value of each 8-bit level, on ``device``: made once, not per request."""
    return from_pixels(np.arange(256, dtype=np.uint8).reshape(1, 256, 1).repeat(3, axis=2))[0, 0].to(device)


def _bomb(name: str, max_pixels: int | None) -> FrameTooLargeError:
    limit = 2 * Image.MAX_IMAGE_PIXELS
    return FrameTooLargeError(f"{name} declares more than {limit} pixels in its header, over the limit of {max_pixels or limit}")


def _unreadable(name: str, source, exc: OSError) -> BadInputError:
    """A file that cannot be read, named by ``name`` and its path, or by its path alone where that names it (a pair's)."""
    return BadInputError(f"cannot read {'' if name == str(source) else f'{name} '}{str(source)!r}: {exc.strerror}")


@contextlib.contextmanager
def _opened(source: bytes | str | Path, name: str, max_pixels: int | None = None) -> Iterator[Image.Image]:
    """Image bytes or a file path, opened by Pillow (header only). What goes wrong while the block
    reads it is one clear error: unreadable is :class:`BadInputError`, too large (Pillow's own
    header check, or ours) :class:`FrameTooLargeError`."""
    try:
        stream = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else open(source, "rb")
    except OSError as exc:
        raise _unreadable(name, source, exc) from None
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
        # The header's orientation, as header_size reads it: not ImageOps.exif_transpose's after the
        # load, which for a PNG would take an eXIf chunk after the pixel data (the PNG specification,
        # 3rd edition, places it before them, and browsers ignore a late one), and which refuses an
        # image whose EXIF does not parse rather than showing it as stored, as a browser does.
        turn = ORIENTATIONS.get(orientation(image))
        image.load()
    return image if turn is None else image.transpose(turn)


def header_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) of an opened image as :func:`open_image` returns it, from its header: the
    EXIF orientations that turn it by 90 degrees swap the sides."""
    return (image.height, image.width) if orientation(image) in QUARTER_TURNS else image.size


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


def is_deep(source: bytes | str | Path, name: str = "frame") -> bool:
    """Whether the image is 16-bit RGB, a PNG (with or without alpha, or grey with alpha) or a TIFF,
    which Pillow would read as 8 bits; from its header."""
    try:
        head = bytes(source[:PNG_HEADER_BYTES]) if isinstance(source, (bytes, bytearray)) else _head(source)
    except OSError as exc:
        raise _unreadable(name, source, exc) from None
    stated = png_header(head)
    if stated is not None:
        return stated[2:] in (RGB16, RGBA16, GREY_ALPHA16)
    if not head.startswith((b"II*\0", b"MM\0*")):
        return False
    with _opened(source, name) as image:
        return image.tag_v2.get(258) == (16, 16, 16)


def open_mode(source: bytes | str | Path, name: str = "frame") -> str:
    """The mode Pillow reads the image in, from its header."""
    with _opened(source, name) as image:
        return image.mode


def _head(path: str | Path) -> bytes:
    with open(path, "rb") as file:
        return file.read(PNG_HEADER_BYTES)


def open_deep(source: bytes | str | Path, name: str = "frame", max_pixels: int | None = DEFAULT_MAX_PIXELS,
              max_side: int | None = None, alpha: bool = False) -> torch.Tensor:
    """A 16-bit RGB PNG or TIFF (:func:`is_deep`) -> its pixels [H, W, 3] uint16, decoded by PyAV's
    (FFmpeg's) PNG or TIFF decoder after the limits are checked from its header; with ``alpha``, an
    image that has an alpha channel gives [H, W, 4], its alpha last (the model takes the colours
    alone, as an 8-bit image's). Turned by its EXIF orientation, as :func:`open_image` turns an 8-bit one."""
    with _opened(source, name, max_pixels) as image:
        width, height, codec = *header_size(image), image.format.lower()
        turn = orientation(image) or tiff_orientation(image)
    if max_pixels is not None:
        check_size(width, height, max_pixels, name)
    if max_side is not None:
        check_sides(width, height, max_side, name)
    try:
        import av
    except ImportError:
        raise BadInputError(f"{name} is a 16-bit RGB {codec.upper()}, which needs PyAV to read at its depth: "
                            "pip install 'eden-serve[video]'") from None
    data = source if isinstance(source, (bytes, bytearray)) else Path(source).read_bytes()
    if codec == "png":  # its orientation is read above; FFmpeg refuses the whole image for an eXIf it cannot parse
        data = without_chunks(bytes(data), frozenset({b"eXIf"}))
    try:
        frames = av.CodecContext.create(codec, "r").decode(av.Packet(bytes(data)))
        stored = (height, width) if turn in QUARTER_TURNS else (width, height)
        if len(frames) != 1 or (frames[0].width, frames[0].height) != stored:
            raise ValueError("not one frame of the size its header states")
        has_alpha = any(c.is_alpha for c in frames[0].format.components)
        pixels = frames[0].to_ndarray(format="rgba64le" if alpha and has_alpha else "rgb48le")
    except (av.error.FFmpegError, ValueError) as exc:
        raise BadInputError(f"{name} is not a readable 16-bit RGB {codec.upper()} ({exc})") from None
    return torch.from_numpy(upright(pixels, turn))


def load_frame(source: bytes | str | Path, name: str = "frame", max_pixels: int | None = DEFAULT_MAX_PIXELS,
               max_side: int | None = None) -> torch.Tensor:
    """Image bytes or a file path -> [3, H, W] float32 in [0, 1]; at 16 bits where the image holds them."""
    if is_deep(source, name):
        return pixels_to_tensor(open_deep(source, name, max_pixels, max_side))
    return image_to_tensor(open_image(source, name, max_pixels, max_side))


def check_pair(frame0: torch.Tensor, frame1: torch.Tensor, names: tuple[str, str] = ("frame0", "frame1")) -> None:
    if frame0.shape != frame1.shape:
        (_, h0, w0), (_, h1, w1) = frame0.shape, frame1.shape
        raise BadInputError(f"frames differ in size: {names[0]} is {w0}x{h0}, {names[1]} is {w1}x{h1}")


def to_pixels(frame: torch.Tensor, depth: int = 8) -> torch.Tensor:
    """[3, H, W] in [0, 1] -> [H, W, 3] of ``depth`` bits, round(x * 255) or round(x * 65535), on the frame's device."""
    dtype = DEPTHS[depth]
    return (frame.clamp(0, 1) * _LEVELS[dtype]).round().to(dtype).permute(1, 2, 0).contiguous()


def as_pixels(frames: torch.Tensor, depth: int) -> torch.Tensor:
    """[B, 3, H, W] float32 in [0, 1] (the edge's middles, clamped) -> [B, H, W, 3] of ``depth``
    bits, rounded as :func:`to_pixels` rounds, on their device."""
    dtype = DEPTHS[depth]
    return frames.mul(_LEVELS[dtype]).round_().to(dtype).permute(0, 2, 3, 1).contiguous()


def to_uint8(frame: torch.Tensor) -> np.ndarray:
    """[3, H, W] in [0, 1] -> H x W x 3 uint8, round(x * 255)."""
    return to_pixels(frame).cpu().numpy()


# zlib level of the PNGs that travel between the client and the servers (frames up, middles down,
# scene cuts' copies): on real frames level 1 encodes 3x faster than the default 6 for 7-15% more
# bytes (85 ms against 26 ms at 854x480 here), which on a GPU edge would rival the model's time.
TRANSPORT_PNG_LEVEL = 1


def png_ready(image: Image.Image) -> Image.Image:
    """The image in a mode a PNG holds: as it is where it can; 32-bit grey (integers, floats) and
    16-bit grey of another byte order as 16-bit grey at the levels the model reads
    (:func:`grey_levels`), where Pillow's own conversion clips a float's 0 to 1 to black; any other
    mode as its colours, with alpha where it has one (CMYK, YCbCr, LAB...)."""
    if image.mode in PNG_MODES:
        return image
    if image.mode in SIXTEEN_BIT_MODES or image.mode == "F":
        return Image.fromarray(np.round(grey_levels(image) * np.float32(65535.0)).astype(np.uint16))
    return image.convert("RGBA" if image.has_transparency_data else "RGB")  # not a band named "A": LAB's is a colour


def png_bytes(image: Image.Image, compress_level: int = 6) -> bytes:
    """``image`` as a PNG (:func:`png_ready`) stating no colours: a profile it was read with is the caller's to add (:mod:`.icc`)."""
    buffer = io.BytesIO()
    png_ready(image).save(buffer, format="PNG", compress_level=compress_level, icc_profile=None)
    return buffer.getvalue()


def to_png(frame: torch.Tensor, depth: int = 8) -> bytes:
    """A middle frame as the edge answers it: an RGB PNG of ``depth`` bits, at :data:`TRANSPORT_PNG_LEVEL`."""
    return png_of(to_pixels(frame, depth).cpu().numpy())


def png_of(pixels: np.ndarray) -> bytes:
    """H x W x 3 uint8 or uint16 pixels as :func:`to_png` encodes them; H x W x 4 uint16 (RGB and
    alpha) as a 16-bit RGBA PNG."""
    if pixels.dtype == np.uint16:
        return rgb16_png(pixels)
    return png_bytes(Image.fromarray(pixels), TRANSPORT_PNG_LEVEL)


# A picture: an image, or RGB pixels (8 or 16 bits) as a tensor [H, W, 3] (a video's frames and the
# middles an edge in this process makes: they go from the decoder to the encoder without an image).
Picture = Union[Image.Image, torch.Tensor]


def pixels_to_tensor(pixels: torch.Tensor) -> torch.Tensor:
    """[H, W, 3] uint8 or uint16 -> [3, H, W] float32 in [0, 1], on the pixels' device: for 8 bits
    what :func:`image_to_tensor` makes of their image, bit for bit."""
    return pixels.permute(2, 0, 1).float().div_(_LEVELS[pixels.dtype])


def widened(pixels: torch.Tensor, depth: int) -> torch.Tensor:
    """``pixels`` at ``depth`` bits (8-bit values times 257 make the same fractions of 16 bits
    exactly); deeper pixels are rounded down to 8 bits only where ``depth`` asks it."""
    if depth_of(pixels) == depth:
        return pixels
    if depth == 16:
        return pixels.to(torch.int32).mul_(257).to(torch.uint16)
    return pixels.to(torch.int32).add_(128).div_(257, rounding_mode="floor").to(torch.uint8)


def picture_size(picture: Picture) -> tuple[int, int]:
    """(width, height)."""
    return (picture.shape[1], picture.shape[0]) if isinstance(picture, torch.Tensor) else picture.size


def as_image(picture: Picture) -> Image.Image:
    """The picture as an image, for what only takes images (animations, previews, resizing): 16-bit
    pixels rounded to 8 bits, which Pillow's RGB holds."""
    return Image.fromarray(widened(picture, 8).cpu().numpy()) if isinstance(picture, torch.Tensor) else picture


def match_mode(middle: Picture, before: Image.Image, after: Image.Image) -> Image.Image:
    """The RGB middle frame in the pixel format of the frame before it.

    The model only sees colour, so an alpha channel is the mean of the neighbours' alphas; a palette
    image is mapped onto the palette of the frame before; 16- and 32-bit grey keeps its range, and a
    16-bit middle's precision.
    """
    mode = before.mode
    if isinstance(middle, Image.Image) and middle.mode == mode:
        return middle  # matched already: a middle is matched as the next level reads it, then as the writer writes it
    if mode.startswith("I;16") or mode in ("I", "F"):
        grey = _grey(middle)
        if mode == "F":
            return Image.fromarray(grey)
        levels = np.round(grey * 65535.0)
        return Image.fromarray(levels.astype(np.int32 if mode == "I" else np.uint16))
    middle = as_image(middle)
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
    return middle.convert(mode)


def _grey(middle: Picture) -> np.ndarray:
    """The middle's luma in [0, 1], Pillow's "L" (ITU-R 601-2); of 16-bit pixels at 16 bits, where
    their image would round them to 8 first (a 16-bit grey pair's middle kept 8 bits of its 16)."""
    if isinstance(middle, Image.Image) and (middle.mode.startswith("I") or middle.mode == "F"):  # "L" would clip it to 255
        return np.asarray(middle, dtype=np.float32) / np.float32(1.0 if middle.mode == "F" else 65535.0)
    if isinstance(middle, torch.Tensor) and depth_of(middle) == 16:
        return middle.cpu().numpy().astype(np.float32) @ np.float32([0.299, 0.587, 0.114]) / np.float32(65535.0)
    return np.asarray(as_image(middle).convert("L"), dtype=np.float32) / 255.0
