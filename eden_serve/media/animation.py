"""Animated GIF, APNG and WebP: read frame by frame with Pillow, written frame by frame here.

Pillow's own multi-frame writers keep every frame until the end, so the three formats are written
chunk by chunk here. The price is that every frame is stored whole: no cropping to the changed
region, one palette per GIF frame, and lossless WebP so that the original frames stay exact.
"""

from __future__ import annotations

import io
import math
import os
import struct
import zlib
from fractions import Fraction
from pathlib import Path
from typing import Iterator

from PIL import GifImagePlugin, Image

from ..errors import BadInputError
from ..wire.png import colour_chunks
from .base import HALF, Clip, ClipWriter, Frame
from .frames import check_size, match_mode, png_bytes
from .resume import Tally, start_afresh

ANIMATION_FORMATS = {"GIF", "PNG", "WEBP"}


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
        # How its colours are shown, which the output states too: an APNG's colour chunks, a WebP's ICC profile.
        self.icc = image.info.get("icc_profile")
        try:
            with open(path, "rb") as file:
                self.colour_chunks = colour_chunks(file)
        except OSError as exc:
            raise BadInputError(f"cannot read {str(path)!r}: {exc.strerror}") from None
        # The working mode of every frame: colour or grey (APNG only, 16-bit grey kept: its conversion
        # to RGB clipped every level above 255 of 65535 to white), with alpha if any.
        transparent = "transparency" in image.info or image.mode in ("RGBA", "LA", "PA")
        if self.format == "PNG" and image.mode == "I;16" and not transparent:
            self.mode = "I;16"
        elif self.format == "PNG" and image.mode in ("L", "LA"):
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

    def writer(self, tmp, dst, retiming, state=None, encoding=None):
        if retiming.levels is None:
            raise BadInputError(f"an animated {self.format} takes --factor 2, 4 or 8, not {retiming.describe()}")
        if encoding is not None and encoding.given:
            raise BadInputError("--vcodec, --crf, --preset, --pix-fmt and --encoder-opt apply to a video output")
        if Image.registered_extensions().get(dst.suffix.lower()) != self.format:
            extension = {"GIF": ".gif", "PNG": ".png", "WEBP": ".webp"}[self.format]
            raise BadInputError(
                f"output {str(dst)!r}: the input is an animated {self.format}, so is the output; name it *{extension}"
            )
        writer = {"GIF": GifWriter, "PNG": ApngWriter, "WEBP": WebpWriter}[self.format]
        return writer(tmp, self, int(retiming.factor), state)

    def close(self) -> None:
        self._image.close()


class _AnimationWriter(ClipWriter):
    """``factor`` times the frame rate: a frame's delay is split between it and the middle frames
    after it, in the format's whole ticks (``unit`` milliseconds), keeping the original total: the
    frame at ``position`` p (0 for the original) lasts ceil(ticks (p + 1/factor)) - ceil(ticks p).

    A checkpoint is the file's length (and for APNG the sequence number): a writer given that state
    cuts the file back to it and goes on appending."""

    unit: float
    continues = True

    def __init__(self, tmp: Path, clip: AnimationClip, factor: int = 2, state: dict | None = None):
        self.clip = clip
        self.factor = factor
        self.ticks = 0  # the delay of the last original frame, shared with the middles after it
        self.tally = Tally()  # of the bytes up to the last checkpoint, ``self.tallied``
        self.tallied = 0
        if state is None:
            self.file = open(tmp, "w+b")
            self._start()
            return
        self.file = open(tmp, "r+b")
        try:
            self._check(tmp, state)
        except BaseException:
            self.file.close()
            raise
        self.file.truncate(state["offset"])
        self.file.seek(state["offset"])
        self._restore(state)

    def _check(self, tmp: Path, state: dict) -> None:
        """The file must hold what the checkpoint recorded: at least its length, and those bytes
        exactly (their checksum)."""
        self.tallied = state["offset"]
        problem = None
        if self.file.seek(0, io.SEEK_END) < self.tallied:
            problem = "is shorter than its journal recorded"
        else:
            self.tally.add_range(self.file, 0, self.tallied)
            if self.tally.digest() != state["digest"]:
                problem = "differs from what its journal recorded"
        if problem:
            raise BadInputError(f"cannot resume: {tmp.name} {problem}; {start_afresh(tmp)}")

    def _start(self) -> None:
        """Write the header of a new file."""

    def _restore(self, state: dict) -> None:
        """Take back what ``checkpoint`` saved beyond the file's length."""

    def _share(self, position: Fraction) -> int:
        end = position + Fraction(1, self.factor)
        return math.ceil(self.ticks * end) - math.ceil(self.ticks * position)

    def add(self, frame):
        self.ticks = round(frame.duration / self.unit)
        self._frame(frame.image, self._share(Fraction(0)))

    def add_middle(self, middle, before, after, position=HALF):
        self._frame(match_mode(middle, before.image, after.image), self._share(position))

    def _frame(self, image: Image.Image, ticks: int) -> None:
        raise NotImplementedError

    def checkpoint(self):
        self.file.flush()
        os.fsync(self.file.fileno())
        offset = self.file.tell()
        self.tally.add_range(self.file, self.tallied, offset)  # read back: the checksum is of what the disk holds
        self.file.seek(offset)
        self.tallied = offset
        return {"offset": offset, "digest": self.tally.digest()}

    def close(self):
        self.file.close()


class GifWriter(_AnimationWriter):
    """GIF89a written frame by frame: each frame whole, with its own palette (exact for frames of
    at most 256 colours, as decoded GIF frames are). Delays are in centiseconds."""

    unit = 10

    def _start(self):
        width, height = self.clip.size
        self.file.write(b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0))
        if self.clip.loop is not None:
            self.file.write(b"!\xff\x0bNETSCAPE2.0\x03\x01" + struct.pack("<H", self.clip.loop) + b"\x00")

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
    last. The header holds the frame count, taken from the input: F(N - 1) + 1. Delays are counted
    in half milliseconds (a fraction over 2000), so halving is exact."""

    unit = 0.5

    def _start(self):
        self.sequence = 0

    def _restore(self, state):
        self.sequence = state["sequence"]

    def _frame(self, image, ticks):
        encoded = png_bytes(image)
        first = self.sequence == 0
        if first:
            header = dict(_png_chunks(encoded))[b"IHDR"]
            self.file.write(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + self.clip.colour_chunks)
            loop = self.clip.loop if self.clip.loop is not None else 0
            frames = self.factor * (self.clip.length - 1) + 1
            self.file.write(_png_chunk(b"acTL", struct.pack(">II", frames, loop)))
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

    def checkpoint(self):
        return {**super().checkpoint(), "sequence": self.sequence}

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

    def _start(self):
        clip = self.clip
        width, height = clip.size
        flags = 0x02 | (0x10 if clip.mode == "RGBA" else 0) | (0x20 if clip.icc else 0)  # animation, alpha, ICC profile
        self.file.write(b"RIFF\x00\x00\x00\x00WEBP")
        self.file.write(_riff_chunk(b"VP8X", bytes([flags, 0, 0, 0]) + _u24(width - 1) + _u24(height - 1)))
        if clip.icc:
            self.file.write(_riff_chunk(b"ICCP", clip.icc))
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
