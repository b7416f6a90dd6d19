"""What every clip is: a sequence of :class:`Frame` objects read in order, and a :class:`ClipWriter`
that receives the output frames in order."""

from __future__ import annotations

import threading
from fractions import Fraction
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import torch
from PIL import Image

from .encoding import Encoding
from .planes import Planes
from .frames import (TRANSPORT_PNG_LEVEL, Picture, as_image, depth_of, image_to_tensor, is_deep, match_mode, open_deep, open_image,
                     picture_size, pixels_to_tensor, png_bytes, png_of, widened)
from ..wire.png import colour_chunks, icc_chunk
from . import icc
from .resume import input_identity
from .timing import Retiming

HALF = Fraction(1, 2)
# In place of a path: standard input, or standard output.
PIPE = "-"


class Decoded(NamedTuple):
    """A video's frame as its decoder gave it: ``raw``, re-encoded as it is so that no RGB round trip
    alters it, shown from ``time`` until ``end`` (seconds); ``source``: the server-side source that
    holds it (docs/cloud-sources.md), where the cloud has it."""

    raw: object
    time: Fraction | None
    end: Fraction | None
    source: str | None = None


class Frame:
    """One frame of a clip.

    ``image`` is the decoded frame in the clip's working mode; for a directory it is decoded on first
    use, by whichever thread needs it first (a lock per frame: different frames decode in parallel).
    A video's frame (and a middle made in this process) is given its RGB pixels [H, W, 3] as
    ``image`` instead, a tensor, which it keeps as ``pixels``, its image made only where something
    asks for one. The pixels are 8-bit, or 16-bit where the source is deeper (``depth``); a
    directory's 16-bit RGB PNG or TIFF has them too, read on first use, and a 16-bit RGBA PNG its
    colours as them and its ``alpha`` beside (a middle given as RGBA pixels [H, W, 4] alike). ``tensor`` is what the model
    takes, ``encoded`` what a server is sent: the file's own bytes for a directory (the server then
    decodes exactly what we would), a PNG otherwise (16-bit for 16-bit pixels).
    """

    def __init__(self, index: int, name: str, *, image: Picture | None = None, path: Path | None = None,
                 duration: float | None = None, max_pixels: int | None = None, decoded: Decoded | None = None):
        self.index = index
        # Its number where a server-side source's frames are counted (the cloud's: by time stamp,
        # frames lost to damage here counted too), which a chunk names it by (client/remote.py).
        self.at = index
        self.name = name
        self.path = path
        self.max_pixels = max_pixels  # checked from the file's header, before decoding
        self.duration = duration  # milliseconds on screen, for animations
        self.raw, self.time, self.end, self.source = decoded if decoded is not None else Decoded(None, None, None)
        self._pixels = image if isinstance(image, torch.Tensor) else None
        self._image = None if self._pixels is not None else image
        self._cache: dict[str, object] = {}
        if self._pixels is not None and self._pixels.shape[-1] == 4:  # a 16-bit RGBA middle: the model takes its colours
            self._pixels, self._cache["alpha"] = self._pixels[..., :3], self._pixels[..., 3]
        self._lock = threading.RLock()  # tensor and encoded compute image under it

    def _lazy(self, key: str, make):
        with self._lock:
            if key not in self._cache:
                self._cache[key] = make()
            return self._cache[key]

    @property
    def pixels(self) -> torch.Tensor | None:
        """The RGB pixels, where the frame has them (a video's; a 16-bit file's); else None."""
        if self._pixels is not None or self.path is None or self._image is not None:
            return self._pixels
        return self._lazy("pixels", self._load_deep)

    @property
    def alpha(self) -> torch.Tensor | None:
        """The alpha channel [H, W] of a frame with 16-bit pixels and alpha (a 16-bit RGBA PNG), else None."""
        if self.pixels is None:
            return None
        return self._cache.get("alpha")

    @property
    def shown_as(self) -> bytes:
        """How the frame's file says its colours are shown, as the PNG chunks it and a middle written
        after it carry (:func:`~eden_serve.wire.png.with_chunks`): a PNG's colour chunks, another
        image's ICC profile where it describes the pixels written (:func:`.icc.fits`); nothing for a
        frame without a file (a video's, whose colour its stream states)."""
        if self.path is None:
            return b""
        return self._lazy("shown_as", self._shown_as)

    def _shown_as(self) -> bytes:
        try:
            with open(self.path, "rb") as file:
                if chunks := colour_chunks(file):
                    return chunks
        except OSError:
            return b""  # the frame's own reading says what is wrong with it
        profile, mode = self._profile
        return icc_chunk(profile) if icc.fits(profile, mode) else b""

    @property
    def profile(self) -> bytes | None:
        """The ICC profile the frame's file carries (a PNG's iCCP chunk, a JPEG's, WebP's or TIFF's), as
        Pillow reads it from the header; None where it has none, or no file."""
        return self._profile[0]

    @property
    def profile_left_out(self) -> str | None:
        """Why an image output leaves the file's profile out (it describes other pixels than those
        written), or None where it carries it, or there is none."""
        profile, mode = self._profile
        if not profile or icc.fits(profile, mode) or self.shown_as:
            return None
        return f"its colour space ({icc.colour_space(profile)}) is not that of the {icc.written_space(mode)} pixels written"

    @property
    def _profile(self) -> tuple[bytes | None, str]:
        if self.path is None:
            return None, ""
        return self._lazy("profile", self._read_profile)

    def _read_profile(self) -> tuple[bytes | None, str]:
        try:
            with Image.open(self.path) as image:
                return image.info.get("icc_profile") or None, image.mode
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            return None, ""  # the frame's own reading says what is wrong with it

    @property
    def depth(self) -> int:
        """8, or 16 for a frame of more than 8 bits a channel (16-bit grey images too)."""
        if self.pixels is not None:
            return depth_of(self.pixels)
        return 16 if self.image.mode.startswith("I") else 8

    @property
    def image(self) -> Image.Image:
        if self._image is not None:
            return self._image
        return self._lazy("image", self._load if self.pixels is None else lambda: as_image(self.pixels))

    @property
    def picture(self) -> Picture:
        """The pixels where the frame has them, else the image."""
        return self.image if self.pixels is None else self.pixels

    @property
    def size(self) -> tuple[int, int]:
        """(width, height)."""
        return picture_size(self.picture)

    @property
    def mode(self) -> str:
        return "RGB" if self.pixels is not None else self.image.mode

    @property
    def tensor(self) -> torch.Tensor:
        if self.pixels is not None:
            return self._lazy("tensor", lambda: pixels_to_tensor(self.pixels))
        return self._lazy("tensor", lambda: image_to_tensor(self.image))

    @property
    def encoded(self) -> bytes:
        if self.path is not None:
            return self._lazy("encoded", self.path.read_bytes)
        if self.pixels is not None and self.depth == 16:
            return self._lazy("encoded", lambda: png_of(self.pixels.numpy()))
        return self._lazy("encoded", lambda: png_bytes(self.image, TRANSPORT_PNG_LEVEL))

    def _load(self) -> Image.Image:
        # Oriented as image_to_tensor orients it, so alpha and mode matching see the frame the model sees.
        return open_image(self.path, self.name, self.max_pixels)

    def _load_deep(self) -> torch.Tensor | None:
        if not is_deep(self.path, self.name):
            return None
        pixels = open_deep(self.path, self.name, self.max_pixels, alpha=True)
        if pixels.shape[-1] == 4:
            self._cache["alpha"] = pixels[..., 3]
        return pixels[..., :3]


def matched(middle: Picture, before: Frame, after: Frame) -> Picture:
    """:func:`~.frames.match_mode` of a middle and its neighbours: between RGB frames with pixels
    (a video's, a 16-bit file's), the middle as its pixels at the frame before's depth, with no
    image made of anything, and where that frame has alpha (16-bit RGBA) the mean of the
    neighbours' alphas after them, as match_mode gives an 8-bit image's; the output's planes as they are."""
    if isinstance(middle, Planes):
        return middle
    if before.pixels is not None:
        pixels = middle if isinstance(middle, torch.Tensor) else torch.from_numpy(np.array(middle.convert("RGB")))
        pixels = widened(pixels[..., :3], before.depth)
        if before.alpha is None:
            return pixels
        alpha = after.alpha if after.alpha is not None and after.alpha.shape == before.alpha.shape else before.alpha
        mean = before.alpha.to(torch.int32).add(alpha.to(torch.int32)).div_(2, rounding_mode="floor")
        return torch.cat((widened(pixels, 16), mean.to(torch.uint16)[..., None]), dim=-1)
    return match_mode(middle, before.image, after.image)


class Clip:
    """A clip being read: iterate it for :class:`Frame` objects, in order, one at a time."""

    kind: str  # "directory", "animation" or "video"
    length: int | None  # number of frames, where known before reading them
    display_matrix: tuple[int, ...] | None = None  # a video's: its first frame's, or a cloud: source's as probed
    dynamic_hdr: tuple[str, ...] = ()  # a video's dynamic HDR metadata (HDR10+, Dolby Vision), named: no output keeps it

    def __init__(self, path: Path):
        self.path = path

    def __iter__(self) -> Iterator[Frame]:
        raise NotImplementedError

    def writer(self, tmp: Path, dst: Path, retiming: Retiming, state: dict | None = None,
               encoding: Encoding | None = None) -> "ClipWriter":
        """A writer of the frames at the rate of ``retiming``, building ``tmp``; ``state`` (from
        :meth:`ClipWriter.checkpoint`) continues a partial ``tmp`` instead of starting it;
        ``encoding``: a video's encoder options."""
        raise NotImplementedError

    def identity(self) -> dict:
        """What a resumed run checks to know it continues with the same input."""
        return input_identity(self.path)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ClipWriter:
    """Receives the output frames in order: ``add`` an original, then ``add_middle`` for each frame
    between it and the next original ``after``, at ``position`` (1/F, 2/F, ... of the interval, for
    a factor F)."""

    # Whether checkpoint() gives a state to continue from; if not, a resumed run writes it again.
    continues = False

    def add(self, frame: Frame) -> None:
        raise NotImplementedError

    def add_middle(self, middle: Image.Image, before: Frame, after: Frame, position: Fraction = HALF) -> None:
        raise NotImplementedError

    def place(self, picture: "Frame | Image.Image", before: Frame, after: Frame | None, position: Fraction) -> None:
        """A retimed output's next frame (:mod:`eden_serve.clips.retimed`): an original (a :class:`Frame`) or a middle,
        due at exact ``position`` between the originals ``before`` and ``after`` (None: after the
        last original, ``position`` counting in its showing time)."""
        raise NotImplementedError

    def checkpoint(self) -> dict:
        """Make what was added so far durable (flushed and synced) and return the JSON state that
        continues from here; called between two originals, only where ``continues``."""
        raise NotImplementedError

    def finish(self) -> None:
        """Complete the container; called only when every frame has been added."""

    def close(self) -> None:
        """Release files; called in every case, after ``finish`` or instead of it."""
