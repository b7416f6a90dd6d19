"""Clips: frame sequences read lazily and written whole or not at all.

A clip is a directory of frames (natural sort order: ``frame2`` before ``frame10``, here), an
animated GIF, APNG or WebP (:mod:`.animation`), or a video (:mod:`.video`, PyAV, the optional
``video`` extra). Its output is of the same kind: every original frame followed by the frame
interpolated between it and the next (N frames in, 2N - 1 out), at twice the frame rate, in the same
size and pixel format; or, for a factor F of 4 or 8, F - 1 frames between each two (F(N - 1) + 1 out)
at F times the frame rate.

Memory: frames are read one at a time, so a reader holds only the frames its caller keeps, and
writers stream too. Atomicity: output is built under a hidden name and renamed at the end
(:mod:`eden_serve.atomic`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from PIL import Image, UnidentifiedImageError

from ..atomic import atomic_output, remove_partial
from ..errors import BadInputError
from ..frames import PNG_MODES, match_mode
from ..resume import Journal, Tally, start_afresh, sync
from .animation import ANIMATION_FORMATS, AnimationClip
from .base import HALF, Clip, ClipWriter, Frame
from .video import VIDEO_EXTRA, VIDEO_SUFFIXES, VideoClip

__all__ = ["Clip", "ClipWriter", "Frame", "VIDEO_EXTRA", "is_clip", "natural_key", "open_clip", "write_clip"]


def natural_key(name: str) -> tuple:
    """Sort key that orders digit runs by value: frame2 < frame10; ties broken by the exact name."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p.casefold() for i, p in enumerate(parts)), name


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

    def writer(self, tmp, dst, factor=2, state=None):
        return DirectoryWriter(tmp, self.length, factor, state)


class DirectoryWriter(ClipWriter):
    """Output frame k is ``{k:06d}`` plus the original's suffix (copied byte for byte) or, for a
    middle frame, ``.png`` (``.tif`` for modes a PNG cannot hold): names that sort in play order."""

    continues = True

    def __init__(self, tmp: Path, length: int, factor: int = 2, state: dict | None = None):
        self.dir = tmp
        self.width = max(6, len(str(factor * (length - 1))))
        self.count = 0 if state is None else state["count"]
        self.unsynced: list[Path] = []
        self.tally = Tally()
        if state is not None:
            self._restore(state)

    def _restore(self, state: dict) -> None:
        """Continue from ``state``: the frames it counts must be there, exactly as written (its
        checksum); those written after it (the last perhaps in part) go."""
        kept: dict[int, Path] = {}
        for path in self.dir.iterdir():
            if path.stem.isdigit() and int(path.stem) < self.count and len(path.stem) == self.width and path.is_file():
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

    def _next(self, suffix: str) -> Path:
        path = self.dir / f"{self.count:0{self.width}d}{suffix}"
        self.count += 1
        self.unsynced.append(path)
        return path

    def add(self, frame):
        shutil.copyfile(frame.path, self._next(frame.path.suffix))

    def add_middle(self, middle, before, after, position=HALF):
        image = match_mode(middle, before.image, after.image)
        fmt = "PNG" if image.mode in PNG_MODES else "TIFF"
        image.save(self._next(".png" if fmt == "PNG" else ".tif"), format=fmt)

    def checkpoint(self):
        sync(*self.unsynced, self.dir)
        for path in self.unsynced:  # read back: the checksum is of what the disk holds
            self.tally.add_file(path)
        self.unsynced = []
        return {"count": self.count, "digest": self.tally.digest()}


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


@contextlib.contextmanager
def write_clip(clip: Clip, dst: str | Path, factor: int = 2, journal: Journal | None = None) -> Iterator[ClipWriter]:
    """A writer of ``factor`` times ``clip``'s frame rate whose output appears at ``dst`` only if
    the block completes; with a ``journal``, a resumable output (:mod:`eden_serve.resume`)."""
    dst = Path(dst)
    if os.path.realpath(dst) == os.path.realpath(clip.path):  # realpath: a symlink loop is no error here
        raise BadInputError(f"output {str(dst)!r} is the input; choose another path")
    directory = clip.kind == "directory"
    with atomic_output(dst, directory) if journal is None else journal.output(directory) as tmp:
        checkpoint = journal.checkpoint if journal is not None else None
        writer = clip.writer(tmp, dst, factor, checkpoint["writer"] if checkpoint else None)
        if journal is not None:
            journal.confirm()
        try:
            yield writer
            writer.finish()
        finally:
            writer.close()
