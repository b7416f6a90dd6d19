"""Clips: frame sequences read lazily and written whole or not at all.

A clip is a directory of frames (natural sort order: ``frame2`` before ``frame10``, here), an
animated GIF, APNG or WebP (:mod:`.animation`), or a video (:mod:`.video`, PyAV, the optional
``video`` extra), recognised by content, not by name. Its output is of the same kind: every original
frame followed by the frame interpolated between it and the next (N frames in, 2N - 1 out), at twice
the frame rate, in the same size and pixel format; or, for a factor F of 4 or 8, F - 1 frames
between each two (F(N - 1) + 1 out) at F times the frame rate; or, retimed (:mod:`.timing`), the
frames of another factor or a frame rate. A directory's output frames are ``%06d.png``; or, to a
video file's name (``out.mp4``), one video of them at ``--input-fps`` times the factor (:mod:`.sequence`).

Memory: frames are read one at a time, so a reader holds only the frames its caller keeps, and
writers stream too. Atomicity: output is built under a hidden name and renamed at the end
(:mod:`eden_serve.media.atomic`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import sys
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import torch
from PIL import Image, UnidentifiedImageError

from .atomic import atomic_output, check_savable, named, remove_partial, save_image
from ..errors import BadInputError
from ..wire.png import PNG_SIGNATURE, with_chunks
from .animation import ANIMATION_FORMATS, AnimationClip
from .base import HALF, PIPE, Clip, ClipWriter, Decoded, Frame, matched
from .containers import self_contained
from .encoding import VIDEO_EXTRA, Encoding
from .frames import png_bytes, png_of
from .icc import LeftOut
from .png_colour import lost_in_copy
from .resume import Journal, Tally, start_afresh, sync
from .colour import Colour
from .sequence import SequenceWriter, makes_video, time_sequence
from .threads import ThreadedWriter
from .timing import Retiming
from .video import RawVideo, VideoClip
from .video_writer import VideoWriter

__all__ = ["Clip", "ClipWriter", "Encoding", "Frame", "PIPE", "RawVideo", "Retiming", "VIDEO_EXTRA", "is_clip", "natural_key",
           "open_clip", "save_middle", "time_sequence", "write_clip"]


def natural_key(name: str) -> tuple:
    """Sort key that orders digit runs by value: frame2 < frame10; ties broken by the exact name."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p.casefold() for i, p in enumerate(parts)), name


class DirectoryClip(Clip):
    """A directory's image files, in natural order; timed (:meth:`timed`) where they are written as a video."""

    kind = "directory"
    rate: Fraction | None = None  # frames a second, once timed
    piped = False

    def __init__(self, path: Path, max_pixels: int | None = None):
        super().__init__(path)
        self.max_pixels = max_pixels
        known = Image.registered_extensions()
        try:
            entries = list(os.scandir(path))
        except OSError as exc:
            raise BadInputError(f"cannot list {str(path)!r}: {exc.strerror}") from None
        images = [e for e in entries if not e.name.startswith(".") and Path(e.name).suffix.lower() in known]
        # A link to nothing among them is a frame missing, which would shift every frame after it: refused as
        # an unreadable frame is, where it was left out without a word (an image sequence reader fails on it too).
        for entry in images:
            if entry.is_symlink() and not os.path.exists(entry.path):
                raise BadInputError(f"{entry.path!r} is a symbolic link to nothing ({os.readlink(entry.path)!r}): a frame is "
                                    "missing; restore its target or remove the link")
        names = [e.name for e in images if e.is_file()]
        if not names:
            raise BadInputError(f"{str(path)!r} holds no image files")
        self.names = sorted(names, key=natural_key)
        self.length = len(self.names)

    def timed(self, rate: Fraction, colour: Colour) -> None:
        """Frame k shown from k / ``rate`` seconds for 1 / ``rate``, its colours as ``colour`` states (:mod:`.sequence`).
        Its tick is 1 / the rate's numerator (1/30000 at 30000/1001, a frame 1001 ticks, as FFmpeg
        times NTSC): a factor's times fall on that tick divided, where 1 / ``rate`` itself would be
        too coarse to divide within 16 bits (:func:`~.timing.output_time_base`)."""
        self.rate, self.time_base, self.colour = rate, Fraction(1, rate.numerator), colour

    def __iter__(self) -> Iterator[Frame]:
        for i, name in enumerate(self.names):
            times = None if self.rate is None else Decoded(None, i / self.rate, (i + 1) / self.rate)
            yield Frame(i, name, path=self.path / name, max_pixels=self.max_pixels, decoded=times)

    def writer(self, tmp, dst, retiming, state=None, encoding=None):
        if self.rate is not None and makes_video(dst):
            return SequenceWriter(tmp, dst, self, retiming, encoding or Encoding())
        if encoding is not None and encoding.given:
            raise BadInputError("--vcodec, --crf, --preset, --pix-fmt and --encoder-opt apply to a video output")
        return DirectoryWriter(tmp, state)


class DirectoryWriter(ClipWriter):
    """Output frame k is ``%06d.png`` (k = 0, 1, ...: the pattern ffmpeg and most tools read): a PNG
    original copied byte for byte, any other decoded and written as PNG (lossless, and in its own
    mode where a PNG holds it, else in RGB or RGBA (CMYK, YCbCr, LAB), or as 16-bit grey (32-bit
    grey: :func:`~.frames.png_ready`)). A 16-bit RGB
    frame (PNG or TIFF) and the middles beside it are 16-bit RGB PNGs. An original written anew
    carries its file's ICC profile, and a middle the colour chunks of the frame before it (its ICC
    profile, gamma, cICP...), so each is shown as its frame is; a profile that does not describe the
    pixels written (a CMYK JPEG's) is left out, said once (:mod:`.icc`)."""

    continues = True

    def __init__(self, tmp: Path, state: dict | None = None):
        self.dir = tmp
        self.count = 0 if state is None else state["count"]
        self.unsynced: list[Path] = []
        self.tally = Tally()
        self.left_out = LeftOut()
        if state is not None:
            self._restore(state)

    def _restore(self, state: dict) -> None:
        """Continue from ``state``: the frames it counts must be there, exactly as written (its
        checksum); those written after it (the last perhaps in part) go."""
        kept: dict[int, Path] = {}
        for path in self.dir.iterdir():
            if (path.stem.isdigit() and int(path.stem) < self.count and path.name == f"{int(path.stem):06d}.png"
                    and path.is_file() and not path.is_symlink()):  # a link's target is no frame of this run's
                kept[int(path.stem)] = path
            else:
                remove_partial(path)
        problem = None
        if len(kept) != self.count:
            problem = f"holds {len(kept)} of the {self.count} frames its journal recorded"
        else:
            for k in range(self.count):
                self.tally.add_file(kept[k])
            if self.tally.digest() != state["digest"]:
                problem = "differs from what its journal recorded"
        if problem:
            raise BadInputError(f"cannot resume: {self.dir.name} {problem}; {start_afresh(self.dir)}")

    def _next(self) -> Path:
        path = self.dir / f"{self.count:06d}.png"
        self.count += 1
        self.unsynced.append(path)
        return path

    def add(self, frame):
        with open(frame.path, "rb") as file:
            png = file.read(len(PNG_SIGNATURE)) == PNG_SIGNATURE
        if png:
            shutil.copyfile(frame.path, self._next())
            return
        if frame.profile_left_out:
            self.left_out.say(f"{frame.path}: its ICC profile is left out of the output: {frame.profile_left_out}")
        png = png_of(frame.pixels.numpy()) if frame.pixels is not None else png_bytes(frame.image)
        self._write(lambda path: path.write_bytes(with_chunks(png, frame.shown_as)))

    def add_middle(self, middle, before, after, position=HALF):
        picture = matched(middle, before, after)
        png = png_of(picture.numpy()) if isinstance(picture, torch.Tensor) else png_bytes(picture)
        self._write(lambda path: path.write_bytes(with_chunks(png, before.shown_as)))  # shown as the frame before it is

    def _write(self, write) -> None:
        """The next frame's file written by ``write(path)``; a full disk's error names it (a write to an open file names none)."""
        path = self._next()
        try:
            write(path)
        except OSError as exc:
            raise named(exc, path)

    def place(self, picture, before, after, position):
        if isinstance(picture, Frame):
            self.add(picture)
        else:
            self.add_middle(picture, before, after or before, position)

    def checkpoint(self):
        sync(*self.unsynced, self.dir)
        for path in self.unsynced:  # read back: the checksum is of what the disk holds
            self.tally.add_file(path)
        self.unsynced = []
        return {"count": self.count, "digest": self.tally.digest()}


def _animated(path: Path) -> Image.Image | None:
    """The opened image if ``path`` is an animation of a format we write, else None; raises
    BadInputError for a still image (Pillow knows it as one frame, so it is no video)."""
    try:
        image = Image.open(path)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return None
    frames = getattr(image, "n_frames", 1)
    if image.format in ANIMATION_FORMATS and frames > 1:
        return image
    image.close()
    decoded = _frames_in_ffmpeg(path)
    if decoded > 1:  # FLI, MPEG, MJPEG: FFmpeg reads it as a video
        return None
    if frames > 1:  # a multi-page TIFF: FFmpeg decodes its first page alone, the rest would be lost without a word
        raise BadInputError(f"{str(path)!r} holds {frames} pictures ({image.format}), which FFmpeg reads as {decoded}: not a clip; "
                            "save them as a directory of frames")
    raise BadInputError(f"{str(path)!r} is a still image, not a clip (a directory of frames, an animated "
                        "GIF/APNG/WebP or a video); give two frames to interpolate a single pair")


def _frames_in_ffmpeg(path: Path) -> int:
    """How many frames, up to 2, FFmpeg decodes of ``path``: a raw MJPEG stream (a camera's JPEGs back
    to back) is one image to Pillow, its first."""
    try:
        import av
    except ImportError:
        return 0
    try:
        with av.open(str(path)) as container:
            return len(list(itertools.islice(container.decode(video=0), 2)))
    except (av.error.FFmpegError, ValueError, IndexError):
        return 0


def _video(path: Path, max_pixels: int | None) -> VideoClip:
    """The video at ``path``, found by its content (any container FFmpeg recognises)."""
    try:
        import av
    except ImportError:
        raise BadInputError(f"{str(path)!r} is not an image; if it is a video, {VIDEO_EXTRA}") from None
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, ValueError) as exc:
        found = unreadable_container(path)
        if found:  # its first bytes name a container: damaged, not another kind of file
            raise BadInputError(f"{str(path)!r}: its first bytes say {found}, which FFmpeg cannot read ({getattr(exc, 'strerror', None) or exc}): "
                                f"the file is damaged or cut short{MOOV if found == 'MP4 or MOV' else ''}") from None
        raise BadInputError(f"{str(path)!r} is not a clip: neither an image, an animation nor a video FFmpeg "
                            "recognises") from None
    return VideoClip(path, max_pixels, container, reopen=lambda: av.open(str(path)))


# An MP4 cut short whose index was to be written at its end: what FFmpeg's "moov atom not found" means.
MOOV = " (an MP4 or MOV holds its index, the moov box, at its end unless written with -movflags +faststart)"


def unreadable_container(path: Path) -> str | None:
    """The container that a file FFmpeg would not open shows by its first bytes, if any."""
    try:
        with open(path, "rb") as file:
            return self_contained(file.read(12))
    except OSError:
        return None


def is_clip(path: str | Path) -> bool:
    """True for a directory, ``-``, a video or a multi-frame GIF/APNG/WebP; False for a still image."""
    try:
        open_clip(path).close()
    except BadInputError:
        return str(path) == PIPE or Path(path).is_dir()
    return True


def open_clip(path: str | Path, max_pixels: int | None = None, raw: RawVideo | None = None) -> Clip:
    """The clip at ``path`` (``-``: a video on standard input; ``raw``: frames without a header);
    frames over ``max_pixels`` (None: no limit) raise FrameTooLargeError."""
    if str(path) == PIPE and sys.stdin is None:
        raise BadInputError("input - is standard input, which is closed")
    if raw is not None:
        return VideoClip(Path(path), max_pixels, raw.open(Path(path)))
    if str(path) == PIPE:
        return VideoClip(Path(PIPE), max_pixels)
    path = Path(path)
    if path.is_dir():
        return DirectoryClip(path, max_pixels)
    if not path.is_file():
        raise BadInputError(f"input {str(path)!r} does not exist")
    image = _animated(path)
    if image is None:
        return _video(path, max_pixels)
    try:
        return AnimationClip(path, image, max_pixels)
    except BadInputError:
        image.close()
        raise


def save_middle(middle, before: Frame, after: Frame, dst: str | Path) -> None:
    """A pair's ``middle`` saved to ``dst`` (:func:`~.atomic.save_image`) as a directory clip writes
    one: in the mode of the frame ``before`` (:func:`~.base.matched`), shown as it is (its colour
    chunks; its ICC profile in a format other than PNG). A profile of its that describes other
    pixels than those written is said to be left out, as a directory clip says it; so are, in a
    format other than PNG, the colour chunks whose loss shows it otherwise (:func:`.png_colour.lost_in_copy`)."""
    if before.profile_left_out:
        warnings.warn(f"{before.path}: its ICC profile is left out of the output: {before.profile_left_out}")
    save_image(matched(middle, before, after), dst, before.shown_as)
    fmt = Image.registered_extensions().get(Path(dst).suffix.lower())
    if fmt != "PNG" and (lost := lost_in_copy(before.shown_as)):
        warnings.warn(f"{before.path}: its colour chunks {lost} are left out of {dst}: {fmt} has no place for them, and a reader shows the middle "
                      "otherwise than the frame before (as sRGB, or by its ICC profile where it has one)")


def check_middle(before: Frame, after: Frame, dst: str | Path) -> None:
    """Refuses, before a pair's middle is computed, an output whose format cannot hold it
    (:func:`~.atomic.check_savable`; a 16-bit grey or float pair's as JPEG): a blank middle of the
    pair's size and depth, put in the mode :func:`save_middle` writes."""
    _, height, width = before.tensor.shape
    blank = torch.zeros((height, width, 3), dtype=torch.uint16 if max(before.depth, after.depth) == 16 else torch.uint8)
    check_savable(matched(blank, before, after), dst)


@contextlib.contextmanager
def write_clip(clip: Clip, dst: str | Path, retiming: Retiming = Retiming(), journal: Journal | None = None,
               encoding: Encoding | None = None) -> Iterator[ClipWriter]:
    """A writer of ``clip`` retimed by ``retiming`` whose output appears at ``dst`` only if the
    block completes; with a ``journal``, a resumable output (:mod:`eden_serve.media.resume`). ``-``
    writes Y4M to standard output as it goes, so a run that stops leaves a cut stream there."""
    if str(dst) == PIPE:
        if clip.kind != "video":
            raise BadInputError(f"-o - writes Y4M video; the input is a {clip.kind}")
        if journal is not None:
            raise BadInputError("--resume needs an output file, not -")
        if sys.stdout is None:
            raise BadInputError("-o - writes to standard output, which is closed")
        output = contextlib.nullcontext(Path(PIPE))
    else:
        dst = Path(dst)
        # realpath: a symlink loop is no error here
        if str(clip.path) != PIPE and os.path.realpath(dst) == os.path.realpath(clip.path):
            raise BadInputError(f"output {str(dst)!r} is the input; choose another path")
        directory = clip.kind == "directory" and not makes_video(dst)
        if clip.kind == "directory" and not directory and clip.rate is None:
            time_sequence(clip, dst, None)  # a caller that did not time it: FFmpeg's default rate, said
        output = atomic_output(dst, directory) if journal is None else journal.output(directory)
    with output as tmp:
        checkpoint = journal.checkpoint if journal is not None else None
        writer = clip.writer(tmp, dst, retiming, checkpoint["writer"] if checkpoint else None, encoding)
        if isinstance(writer, VideoWriter):  # encoding on a thread of its own, beside the model (:mod:`.threads`)
            writer = ThreadedWriter(writer)
        if journal is not None:
            journal.confirm()
        try:
            yield writer
            writer.finish()
        except OSError as exc:
            raise named(exc, tmp)
        finally:
            writer.close()
