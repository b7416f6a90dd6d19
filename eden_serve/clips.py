"""Clips: frame sequences read lazily and written whole or not at all.

A clip is a directory of frames (natural sort order: ``frame2`` before ``frame10``), an animated GIF,
APNG or WebP, or a video (PyAV, the optional ``video`` extra). Its output is of the same kind: every
original frame followed by the frame interpolated between it and the next (N frames in, 2N - 1 out),
at twice the frame rate, in the same size and pixel format.

Memory. Frames are read one at a time, so a reader holds only the frames its caller keeps. Writers
stream too: a directory gets one file per frame, a video is muxed as it goes, and the three
animation formats are written chunk by chunk here (Pillow's own multi-frame writers keep every frame
until the end). The price is that every animation frame is stored whole: no cropping to the changed
region, one palette per GIF frame, and lossless WebP so that the original frames stay exact.

Atomicity. Output is built under a hidden name beside the destination (``.NAME.partial-XXXX``) and
renamed onto it when complete, so an interrupted run leaves the destination untouched; only a killed
process can leave that hidden ``.partial`` file or directory behind. A directory output is built the
same way and must not exist yet (or be empty): a non-empty directory cannot be replaced atomically.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import secrets
import shutil
import struct
import threading
import zlib
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from PIL import GifImagePlugin, Image, ImageChops, UnidentifiedImageError

from .errors import BadInputError
from .frames import check_size, image_to_tensor, open_image

VIDEO_SUFFIXES = {".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi"}
ANIMATION_FORMATS = {"GIF", "PNG", "WEBP"}
# Modes a PNG can hold; a middle frame of any other mode (CMYK, YCbCr, LAB, F...) is written as TIFF.
PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}
# Compression level of the PNGs sent to a server: speed matters more than bytes on the way out.
UPLOAD_PNG_LEVEL = 1
VIDEO_EXTRA = "reading or writing video needs PyAV: pip install 'eden-serve[video]'"


def natural_key(name: str) -> tuple:
    """Sort key that orders digit runs by value: frame2 < frame10; ties broken by the exact name."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p.casefold() for i, p in enumerate(parts)), name


def import_av():
    try:
        import av
    except ImportError:
        raise BadInputError(VIDEO_EXTRA) from None
    return av


class Frame:
    """One frame of a clip.

    ``image`` is the decoded frame in the clip's working mode; for a directory it is decoded on first
    use, by whichever thread needs it first (a lock per frame: different frames decode in parallel).
    ``tensor`` is what the model takes, ``encoded`` what a server is sent: the file's own bytes for a
    directory (the server then decodes exactly what we would), a PNG otherwise.
    """

    def __init__(self, index: int, name: str, *, image: Image.Image | None = None, path: Path | None = None,
                 duration: float | None = None, raw=None, max_pixels: int | None = None):
        self.index = index
        self.name = name
        self.path = path
        self.max_pixels = max_pixels  # checked from the file's header, before decoding
        self.duration = duration  # milliseconds on screen, for animations
        self.raw = raw  # the decoded video frame, re-encoded as it is so that no RGB round trip alters it
        self._image = image
        self._cache: dict[str, object] = {}
        self._lock = threading.RLock()  # tensor and encoded compute image under it

    def _lazy(self, key: str, make):
        with self._lock:
            if key not in self._cache:
                self._cache[key] = make()
            return self._cache[key]

    @property
    def image(self) -> Image.Image:
        return self._image if self._image is not None else self._lazy("image", self._load)

    @property
    def tensor(self) -> torch.Tensor:
        return self._lazy("tensor", lambda: image_to_tensor(self.image))

    @property
    def encoded(self) -> bytes:
        if self.path is not None:
            return self._lazy("encoded", self.path.read_bytes)
        return self._lazy("encoded", lambda: to_png_bytes(self.image, UPLOAD_PNG_LEVEL))

    def _load(self) -> Image.Image:
        # Oriented as image_to_tensor orients it, so alpha and mode matching see the frame the model sees.
        return open_image(self.path, self.name, self.max_pixels)


def to_png_bytes(image: Image.Image, compress_level: int = 6) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def match_mode(middle: Image.Image, before: Image.Image, after: Image.Image) -> Image.Image:
    """The RGB middle frame in the pixel format of the frame before it.

    The model only sees colour, so an alpha channel is the mean of the neighbours' alphas; a palette
    image is mapped onto the palette of the frame before; 16- and 32-bit grey keeps its range.
    """
    mode = before.mode
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


# --- atomic output ---------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_output(dst: str | Path, directory: bool = False) -> Iterator[Path]:
    """A hidden temporary path beside ``dst``, renamed onto ``dst`` if the block completes.

    On any exception, KeyboardInterrupt included, the temporary file or directory is removed and
    ``dst`` is left as it was. Files are created with O_EXCL under a random name (the umask applies).
    """
    dst = Path(dst)
    if directory and dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise BadInputError(f"output {str(dst)!r} exists and is not an empty directory; choose a new path")
    if not directory and dst.is_dir():
        raise BadInputError(f"output {str(dst)!r} is a directory; give a file name")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"cannot create the directory of output {str(dst)!r}: {exc.strerror}") from None
    tmp = dst.with_name(f".{dst.stem}.partial-{secrets.token_hex(4)}{'' if directory else dst.suffix}")
    try:
        if directory:
            tmp.mkdir()
        else:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as exc:
        raise BadInputError(f"cannot write output {str(dst)!r}: {exc.strerror}") from None
    try:
        yield tmp
        os.replace(tmp, dst)
    except BaseException:
        if directory:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise


def save_image(image: Image.Image, dst: str | Path) -> None:
    """Save atomically; the format follows the extension of ``dst``."""
    dst = Path(dst)
    fmt = Image.registered_extensions().get(dst.suffix.lower())
    if fmt is None:
        raise BadInputError(f"output {str(dst)!r}: unknown image extension; use e.g. .png")
    with atomic_output(dst) as tmp:
        try:
            image.save(tmp, format=fmt)
        except (OSError, ValueError, KeyError) as exc:
            raise BadInputError(f"cannot save a {image.mode} image as {fmt} ({exc})") from None


# --- reading ---------------------------------------------------------------------------------


class Clip:
    """A clip being read: iterate it for :class:`Frame` objects, in order, one at a time."""

    kind: str  # "directory", "animation" or "video"
    length: int | None  # number of frames, where known before reading them

    def __init__(self, path: Path):
        self.path = path

    def __iter__(self) -> Iterator[Frame]:
        raise NotImplementedError

    def writer(self, tmp: Path, dst: Path) -> "ClipWriter":
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DirectoryClip(Clip):
    kind = "directory"

    def __init__(self, path: Path, max_pixels: int | None = None):
        super().__init__(path)
        self.max_pixels = max_pixels
        known = Image.registered_extensions()
        try:
            entries = list(os.scandir(path))
        except OSError as exc:
            raise BadInputError(f"cannot list {str(path)!r}: {exc.strerror}") from None
        names = [e.name for e in entries
                 if e.is_file() and not e.name.startswith(".") and Path(e.name).suffix.lower() in known]
        if not names:
            raise BadInputError(f"{str(path)!r} holds no image files")
        self.names = sorted(names, key=natural_key)
        self.length = len(self.names)

    def __iter__(self) -> Iterator[Frame]:
        for i, name in enumerate(self.names):
            yield Frame(i, name, path=self.path / name, max_pixels=self.max_pixels)

    def writer(self, tmp, dst):
        return DirectoryWriter(tmp, self.length)


class AnimationClip(Clip):
    kind = "animation"

    def __init__(self, path: Path, image: Image.Image, max_pixels: int | None = None):
        super().__init__(path)
        self._image = image
        self.format = image.format
        self.length = image.n_frames
        self.size = image.size
        if max_pixels is not None:
            check_size(*self.size, max_pixels, str(path))
        self.loop = image.info.get("loop")
        self.background = image.info.get("background")
        # The working mode of every frame: colour or grey (APNG only), with alpha if any.
        transparent = "transparency" in image.info or image.mode in ("RGBA", "LA", "PA")
        if self.format == "PNG" and image.mode in ("L", "LA"):
            self.mode = "LA" if transparent else "L"
        else:
            self.mode = "RGBA" if transparent else "RGB"

    def __iter__(self) -> Iterator[Frame]:
        image = self._image
        for i in range(self.length):
            try:
                image.seek(i)
                image.load()  # WebP sets the frame's duration on load
                frame = image.convert(self.mode)
            except (OSError, ValueError, EOFError, SyntaxError) as exc:
                raise BadInputError(f"{self.path}: frame {i} is not readable ({type(exc).__name__})") from None
            yield Frame(i, f"frame {i}", image=frame, duration=float(image.info.get("duration") or 0))

    def writer(self, tmp, dst):
        if Image.registered_extensions().get(dst.suffix.lower()) != self.format:
            extension = {"GIF": ".gif", "PNG": ".png", "WEBP": ".webp"}[self.format]
            raise BadInputError(
                f"output {str(dst)!r}: the input is an animated {self.format}, so is the output; name it *{extension}"
            )
        writer = {"GIF": GifWriter, "PNG": ApngWriter, "WEBP": WebpWriter}[self.format]
        return writer(tmp, self)

    def close(self) -> None:
        self._image.close()


class VideoClip(Clip):
    kind = "video"

    def __init__(self, path: Path, max_pixels: int | None = None):
        super().__init__(path)
        av = import_av()
        self._error = av.error.FFmpegError
        try:
            self.container = av.open(str(path))
        except self._error as exc:
            raise BadInputError(f"{path}: not a readable video ({exc})") from None
        if not self.container.streams.video:
            self.container.close()
            raise BadInputError(f"{path}: has no video stream")
        self.stream = self.container.streams.video[0]
        if max_pixels is not None:
            try:
                check_size(self.stream.width, self.stream.height, max_pixels, str(path))
            except BadInputError:
                self.container.close()
                raise
        self.stream.thread_type = "AUTO"
        self.length = self.stream.frames or None
        self.rate = Fraction(self.stream.average_rate or self.stream.guessed_rate or 25)

    def __iter__(self) -> Iterator[Frame]:
        try:
            for i, frame in enumerate(self.container.decode(self.stream)):
                yield Frame(i, f"frame {i}", image=frame.to_image(), raw=frame)
        except self._error as exc:
            raise BadInputError(f"{self.path}: cannot decode the video ({exc})") from None

    def writer(self, tmp, dst):
        return VideoWriter(tmp, dst, self)

    def close(self) -> None:
        self.container.close()


def _animated(path: Path) -> Image.Image | None:
    """The opened image if ``path`` is an animation of a format we write, else None."""
    try:
        image = Image.open(path)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return None
    if image.format in ANIMATION_FORMATS and getattr(image, "n_frames", 1) > 1:
        return image
    image.close()
    return None


def is_clip(path: str | Path) -> bool:
    """True for a directory, a video file or a multi-frame GIF/APNG/WebP; False for a still image."""
    path = Path(path)
    if path.is_dir() or path.suffix.lower() in VIDEO_SUFFIXES:
        return True
    image = _animated(path) if path.is_file() else None
    if image is None:
        return False
    image.close()
    return True


def open_clip(path: str | Path, max_pixels: int | None = None) -> Clip:
    """The clip at ``path``; frames over ``max_pixels`` (None: no limit) raise FrameTooLargeError."""
    path = Path(path)
    if path.is_dir():
        return DirectoryClip(path, max_pixels)
    if not path.is_file():
        raise BadInputError(f"input {str(path)!r} does not exist")
    if path.suffix.lower() in VIDEO_SUFFIXES:
        return VideoClip(path, max_pixels)
    image = _animated(path)
    if image is None:
        raise BadInputError(
            f"{str(path)!r} is not a clip (a directory of frames, an animated GIF/APNG/WebP or a video); "
            "give two frames to interpolate a single pair"
        )
    try:
        return AnimationClip(path, image, max_pixels)
    except BadInputError:
        image.close()
        raise


# --- writing ---------------------------------------------------------------------------------


class ClipWriter:
    """Receives the output frames in order: ``add`` an original, ``add_middle`` the frame after it."""

    def add(self, frame: Frame) -> None:
        raise NotImplementedError

    def add_middle(self, middle: Image.Image, before: Frame, after: Frame) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Complete the container; called only when every frame has been added."""

    def close(self) -> None:
        """Release files; called in every case, after ``finish`` or instead of it."""


@contextlib.contextmanager
def write_clip(clip: Clip, dst: str | Path) -> Iterator[ClipWriter]:
    """A writer for ``clip``'s kind whose output appears at ``dst`` only if the block completes."""
    dst = Path(dst)
    if dst.resolve() == clip.path.resolve():
        raise BadInputError(f"output {str(dst)!r} is the input; choose another path")
    with atomic_output(dst, directory=clip.kind == "directory") as tmp:
        writer = clip.writer(tmp, dst)
        try:
            yield writer
            writer.finish()
        finally:
            writer.close()


class DirectoryWriter(ClipWriter):
    """Output frame k is ``{k:06d}`` plus the original's suffix (copied byte for byte) or, for a
    middle frame, ``.png`` (``.tif`` for modes a PNG cannot hold): names that sort in play order."""

    def __init__(self, tmp: Path, length: int):
        self.dir = tmp
        self.width = max(6, len(str(2 * length - 2)))
        self.count = 0

    def _next(self, suffix: str) -> Path:
        path = self.dir / f"{self.count:0{self.width}d}{suffix}"
        self.count += 1
        return path

    def add(self, frame):
        shutil.copyfile(frame.path, self._next(frame.path.suffix))

    def add_middle(self, middle, before, after):
        image = match_mode(middle, before.image, after.image)
        fmt = "PNG" if image.mode in PNG_MODES else "TIFF"
        image.save(self._next(".png" if fmt == "PNG" else ".tif"), format=fmt)


class _AnimationWriter(ClipWriter):
    """Twice the frame rate: a frame's delay is split between it and the middle frame after it, in
    the format's whole ticks (``unit`` milliseconds), so that the pair keeps the original total."""

    unit: float

    def __init__(self, tmp: Path, clip: AnimationClip):
        self.clip = clip
        self.file = open(tmp, "wb")
        self.owed = 0  # ticks left of the last original frame's delay, for its middle frame

    def add(self, frame):
        ticks = round(frame.duration / self.unit)
        self.owed = ticks // 2
        self._frame(frame.image, ticks - self.owed)

    def add_middle(self, middle, before, after):
        self._frame(match_mode(middle, before.image, after.image), self.owed)

    def _frame(self, image: Image.Image, ticks: int) -> None:
        raise NotImplementedError

    def close(self):
        self.file.close()


class GifWriter(_AnimationWriter):
    """GIF89a written frame by frame: each frame whole, with its own palette (exact for frames of
    at most 256 colours, as decoded GIF frames are). Delays are in centiseconds."""

    unit = 10

    def __init__(self, tmp, clip):
        super().__init__(tmp, clip)
        width, height = clip.size
        self.file.write(b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0))
        if clip.loop is not None:
            self.file.write(b"!\xff\x0bNETSCAPE2.0\x03\x01" + struct.pack("<H", clip.loop) + b"\x00")

    def _frame(self, image, ticks):
        params = {"duration": ticks * 10, "include_color_table": True}
        if image.mode == "RGBA":
            # Every frame is whole and clears the last (disposal 2), so transparency stays exact.
            params["disposal"] = 2
            indexed = image.convert("RGB").quantize(255, dither=Image.Dither.NONE)
            hidden = image.getchannel("A").point(lambda a: 255 if a < 128 else 0, mode="1")
            if hidden.getbbox():
                palette = indexed.getpalette()
                index = len(palette) // 3
                indexed.putpalette(palette + [0, 0, 0])
                indexed.paste(index, mask=hidden)
                params["transparency"] = index
        else:
            indexed = image.quantize(256, dither=Image.Dither.NONE)
        for chunk in GifImagePlugin.getdata(indexed, (0, 0), **params):
            self.file.write(chunk)

    def finish(self):
        self.file.write(b";")


def _png_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    offset = 8  # the signature
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        yield data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        offset += 12 + length


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


class ApngWriter(_AnimationWriter):
    """APNG written frame by frame: each frame is a PNG encoded by Pillow whose image data moves
    into the animation (IDAT for the first frame, fdAT after), every frame whole and replacing the
    last. The header holds the frame count, taken from the input: 2N - 1. Delays are counted in
    half milliseconds (a fraction over 2000), so halving is exact."""

    unit = 0.5

    def __init__(self, tmp, clip):
        super().__init__(tmp, clip)
        self.frames = 2 * clip.length - 1
        self.sequence = 0

    def _frame(self, image, ticks):
        encoded = to_png_bytes(image)
        first = self.sequence == 0
        if first:
            header = dict(_png_chunks(encoded))[b"IHDR"]
            self.file.write(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header))
            loop = self.clip.loop if self.clip.loop is not None else 0
            self.file.write(_png_chunk(b"acTL", struct.pack(">II", self.frames, loop)))
        numerator, denominator = ticks, 2000
        if numerator > 0xFFFF:  # over 32 s: count centiseconds instead
            numerator, denominator = min(round(ticks / 20), 0xFFFF), 100
        width, height = image.size
        control = struct.pack(">IIIIIHHBB", self.sequence, width, height, 0, 0, numerator, denominator, 0, 0)
        self.file.write(_png_chunk(b"fcTL", control))
        self.sequence += 1
        for kind, body in _png_chunks(encoded):
            if kind == b"IDAT" and first:
                self.file.write(_png_chunk(b"IDAT", body))
            elif kind == b"IDAT":
                self.file.write(_png_chunk(b"fdAT", struct.pack(">I", self.sequence) + body))
                self.sequence += 1

    def finish(self):
        self.file.write(_png_chunk(b"IEND", b""))


def _riff_chunk(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("<I", len(body)) + body + b"\x00" * (len(body) % 2)


def _riff_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    offset = 12  # "RIFF", size, "WEBP"
    while offset + 8 <= len(data):
        kind, (length,) = data[offset : offset + 4], struct.unpack("<I", data[offset + 4 : offset + 8])
        yield kind, data[offset + 8 : offset + 8 + length]
        offset += 8 + length + length % 2


def _u24(value: int) -> bytes:
    return struct.pack("<I", value)[:3]


class WebpWriter(_AnimationWriter):
    """Animated WebP written frame by frame: each frame is a lossless still WebP encoded by Pillow
    whose bitstream goes into an ANMF chunk; the RIFF size is filled in at the end. Delays are in
    milliseconds."""

    unit = 1

    def __init__(self, tmp, clip):
        super().__init__(tmp, clip)
        width, height = clip.size
        flags = 0x02 | (0x10 if clip.mode == "RGBA" else 0)  # animation, alpha
        self.file.write(b"RIFF\x00\x00\x00\x00WEBP")
        self.file.write(_riff_chunk(b"VP8X", bytes([flags, 0, 0, 0]) + _u24(width - 1) + _u24(height - 1)))
        # Pillow reads a WebP background as RGBA; a GIF's is a palette index, meaningless here.
        background = clip.background if isinstance(clip.background, tuple) and len(clip.background) == 4 else (0,) * 4
        red, green, blue, opacity = background
        loop = clip.loop if clip.loop is not None else 0
        self.file.write(_riff_chunk(b"ANIM", bytes([blue, green, red, opacity]) + struct.pack("<H", loop)))

    def _frame(self, image, ticks):
        buffer = io.BytesIO()
        image.save(buffer, format="WEBP", lossless=True, exact=True)
        chunks = _riff_chunks(buffer.getvalue())
        bitstream = b"".join(_riff_chunk(kind, body) for kind, body in chunks if kind in (b"ALPH", b"VP8 ", b"VP8L"))
        width, height = image.size
        # At (0, 0), the whole canvas, the delay; flags: do not blend, do not dispose (frames are whole).
        head = _u24(0) + _u24(0) + _u24(width - 1) + _u24(height - 1) + _u24(min(ticks, 0xFFFFFF)) + b"\x02"
        self.file.write(_riff_chunk(b"ANMF", head + bitstream))

    def finish(self):
        size = self.file.tell()
        self.file.seek(4)
        self.file.write(struct.pack("<I", size - 8))


class VideoWriter(ClipWriter):
    """The input's codec and pixel format at twice its average frame rate, muxed as frames arrive.
    Original frames are re-encoded from their decoded pictures (no RGB round trip); H.264/H.265 use
    CRF 18. Frames get consecutive timestamps, so variable frame rate becomes constant; audio and
    other streams are not copied."""

    def __init__(self, tmp: Path, dst: Path, clip: VideoClip):
        av = import_av()
        self._error = av.error.FFmpegError
        try:
            self.container = av.open(str(tmp), "w")  # the container format follows the extension
        except (self._error, ValueError) as exc:
            raise BadInputError(f"output {str(dst)!r}: not a video file name ({exc})") from None
        source = clip.stream.codec_context
        try:
            self.stream = self.container.add_stream(source.name, rate=clip.rate * 2)
        except (self._error, ValueError) as exc:
            self.container.close()
            raise BadInputError(f"cannot encode {source.name} video with this PyAV build ({exc})") from None
        self.stream.width, self.stream.height = source.width, source.height
        self.stream.pix_fmt = source.pix_fmt
        if self.stream.codec_context.name in ("libx264", "libx265"):
            self.stream.options = {"crf": "18"}
        self.time_base = 1 / (clip.rate * 2)
        self.pix_fmt = source.pix_fmt
        self.count = 0
        self._none = av.video.frame.PictureType.NONE
        self._from_image = av.VideoFrame.from_image

    def _encode(self, picture) -> None:
        picture.pts, picture.time_base = self.count, self.time_base
        picture.pict_type = self._none  # let the encoder place keyframes, not the input's
        self.count += 1
        self.container.mux(self.stream.encode(picture))

    def add(self, frame):
        self._encode(frame.raw)

    def add_middle(self, middle, before, after):
        self._encode(self._from_image(middle.convert("RGB")).reformat(format=self.pix_fmt))

    def finish(self):
        self.container.mux(self.stream.encode(None))

    def close(self):
        self.container.close()
