"""Outputs that appear whole or not at all.

Output is built under a hidden name beside the destination (``.NAME.partial-XXXX``) and renamed onto
it when complete, so an interrupted run leaves the destination untouched; only a killed process can
leave that hidden ``.partial`` file or directory behind. A directory output is built the same way
and must not exist yet (or be empty): a non-empty directory cannot be replaced atomically.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Iterator

import torch
from PIL import Image

from ..errors import BadInputError, PairError, UpstreamError
from ..wire.png import icc_profile, with_chunks
from .frames import Picture, as_image, depth_of, png_bytes, png_of
from .icc import HOLDS_ICC, LeftOut, matters


# Names that say a file: the containers a video is written to, beside every image extension. A
# directory of frames made under one would be taken for that file (a player asked to open out.mp4).
VIDEO_SUFFIXES = {".mp4", ".m4v", ".mkv", ".mov", ".webm", ".avi", ".y4m", ".ts", ".mts", ".m2ts", ".flv", ".nut",
                  ".mpg", ".mpeg", ".ogv", ".wmv", ".3gp", ".mxf"}


# A full, over-quota or read-only disk: an error of writing, not of reading the input.
WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def named(exc: BaseException, path: str | Path) -> BaseException:
    """``exc``, or where it is a disk's refusal to write that names no file (a write to a file
    already open: Pillow's, the animation writers'), the same error naming ``path``, so that the
    one line the command prints says which file the disk refused (commands/shared.failure)."""
    if isinstance(exc, OSError) and exc.filename is None and exc.errno in WRITE_ERRORS:
        return OSError(exc.errno, exc.strerror, str(path))
    return exc


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` refuses the output for good, so that the same command would meet it again
    (frames its container's clock cannot tell apart, a frame of the input that cannot be decoded or
    is of another size): a BadInputError, or a server's refusal of the input (400 ``bad_input``),
    and a chunk's :class:`PairError` raised from either; unless a full or read-only disk lies
    beneath it (FFmpeg's "cannot write", raised from the disk's error), which ends once space is
    made, or a file the system would not let this run open (its permissions), which ends once it
    may: neither changes what a resume checks of the input."""
    if isinstance(exc, PairError):  # raised from the processor's own error, where there was one
        return exc.__cause__ is not None and refused(exc.__cause__)
    beneath = exc.__cause__ or exc.__context__
    of_input = isinstance(exc, BadInputError) or (isinstance(exc, UpstreamError) and exc.kind == BadInputError.kind)
    passes = isinstance(beneath, OSError) and beneath.errno in WRITE_ERRORS | {errno.EACCES, errno.EPERM}
    return of_input and not passes


def check_destination(dst: Path, directory: bool) -> None:
    """Refuse, before any work, a destination the output cannot replace, or a directory output named
    as an image would be (``out.png``: made anew; an empty directory so named is the caller's
    choice; a video's name, ``out.mp4``, makes one video of the frames: :mod:`.sequence`); create
    its parent directory.

    A symbolic link is refused whatever it points to (nothing, itself, an empty directory): the
    output is renamed into place, which would replace the link, not write where it points."""
    if dst.is_symlink():
        raise BadInputError(f"output {str(dst)!r} is a symbolic link; give the path the output should have")
    if directory and dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise BadInputError(f"output {str(dst)!r} exists and is not an empty directory; choose a new path")
    if not directory and dst.is_dir():
        raise BadInputError(f"output {str(dst)!r} is a directory; give a file name")
    if directory and not dst.exists() and dst.suffix.lower() in VIDEO_SUFFIXES | set(Image.registered_extensions()):
        raise BadInputError(f"output {str(dst)!r} names an image, and a directory of frames gives a directory of frames, "
                            f"or one video: give a directory name (such as {dst.stem}-2x), or a video's ({dst.stem}.mp4, "
                            "with --input-fps RATE)")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"cannot create the directory of output {str(dst)!r}: {_why_not_made(dst.parent, exc)}") from None
    if not os.access(dst.parent, os.W_OK | os.X_OK):  # read-only file systems included, even for root
        raise BadInputError(f"cannot write output {str(dst)!r}: its directory is not writable")


def _nearest(folder: Path) -> Path:
    """``folder``, or the nearest of its parents that exists ("." or "/" at the latest): where a file
    stands in the way of making it, that file."""
    return next(p for p in (folder, *folder.parents) if p.exists())


def _why_not_made(folder: Path, exc: OSError) -> str:
    """Why ``folder`` could not be made: mkdir says "File exists" where a file stands in the way
    (there, or as one of its parents), so that file is named instead."""
    nearest = _nearest(folder)
    return exc.strerror if nearest.is_dir() else f"{str(nearest)!r} is not a directory"


def check_output_directory(folder: str | Path, option: str) -> None:
    """Refuse, in one line naming ``option`` and before any work (a checkpoint read first takes a
    while), a folder for a command's files (``--model-store``, ``--out``) that a file stands in the
    way of, or that cannot be written; it is made by whoever writes into it, so a refused run
    leaves none."""
    folder = Path(folder)
    nearest = _nearest(folder)
    if not nearest.is_dir():
        raise BadInputError(f"{option} {str(folder)!r}: {str(nearest)!r} is not a directory")
    if not os.access(nearest, os.W_OK | os.X_OK):  # a read-only file system's too, even for root
        raise BadInputError(f"{option} {str(folder)!r}: {str(nearest)!r} is not writable")


# What the longest name made from a hidden one adds to it: resume's journal (``….journal``), as
# :func:`.resume.write_durably` writes it beside itself (``….journal.XXXXXXXX.tmp``).
LONGEST_ADDED = len(".journal.XXXXXXXX.tmp")


def hidden(dst: Path, tag: str, suffix: str) -> Path:
    """``.STEM.partial-TAG`` + ``suffix`` beside ``dst``, STEM its name less ``suffix`` (a file's
    extension; a directory's whole name). Where that name, or the longest made from it
    (:data:`LONGEST_ADDED`), would pass the file system's limit on a name (255 bytes), the stem is cut
    short and marked with a digest of ``dst``'s name: an output whose own name fits is built under a
    hidden one that fits, the same on every run (resume finds it again), and two outputs whose names
    differ only past the cut never share one."""
    try:
        limit = os.pathconf(dst.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    # a directory's whole name: clip.x2 and clip.x4 are two outputs, not one (were: both .clip.partial-resume)
    stem, mark = dst.name[:len(dst.name) - len(suffix)], ""
    while len(os.fsencode(f".{stem}{mark}.partial-{tag}{suffix}")) + LONGEST_ADDED > limit and stem:
        stem, mark = stem[:-1], "~" + hashlib.sha256(os.fsencode(dst.name)).hexdigest()[:8]
    return dst.with_name(f".{stem}{mark}.partial-{tag}{suffix}")


def place(tmp: Path, dst: Path) -> None:
    """Rename the finished output onto ``dst``; a directory that appeared there meanwhile (another
    run's output) is kept and this run's refused. A file it replaces gives it its permissions, as
    writing over that file would keep them: a private output stays private, whatever the umask."""
    with contextlib.suppress(OSError):
        before = os.lstat(dst)
        if stat.S_ISREG(before.st_mode) and tmp.is_file():
            os.chmod(tmp, stat.S_IMODE(before.st_mode) & 0o777)
    try:
        os.replace(tmp, dst)
    except OSError as exc:
        raise BadInputError(f"output {str(dst)!r} was created by something else while this run wrote it "
                            f"({exc.strerror}); choose a new path") from None


def create_partial(tmp: Path, directory: bool, dst: Path) -> None:
    """A new empty file or directory at ``tmp`` (O_EXCL: never one that exists)."""
    try:
        if directory:
            tmp.mkdir()
        else:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as exc:
        raise BadInputError(f"cannot write output {str(dst)!r}: {exc.strerror}") from None


def remove_partial(tmp: Path) -> None:
    """``tmp`` removed: a directory with what it holds, anything else (a link too: never what it points to) alone."""
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def atomic_output(dst: str | Path, directory: bool = False) -> Iterator[Path]:
    """A hidden temporary path beside ``dst``, renamed onto ``dst`` if the block completes.

    On any exception, KeyboardInterrupt included, the temporary file or directory is removed and
    ``dst`` is left as it was. Files are created with O_EXCL under a random name (the umask applies).
    """
    dst = Path(dst)
    check_destination(dst, directory)
    tmp = hidden(dst, secrets.token_hex(4), "" if directory else dst.suffix)
    made = False
    try:
        # Made inside the try: a signal's handler runs at the first instruction after the system
        # call, which, where another thread holds the interpreter, comes before any line after it.
        create_partial(tmp, directory, dst)
        made = True
        yield tmp
        place(tmp, dst)
    except BaseException as exc:
        if made or not isinstance(exc, BadInputError):  # create_partial's own refusal made nothing
            remove_partial(tmp)
        raise


def _format(dst: Path) -> str:
    """Pillow's format of an image output, by its extension."""
    fmt = Image.registered_extensions().get(dst.suffix.lower())
    if fmt is None:
        raise BadInputError(f"output {str(dst)!r}: unknown image extension; use e.g. .png")
    return fmt


def check_savable(image: Picture, dst: str | Path) -> None:
    """Refuses, before the work, what :func:`save_image` could not save as ``dst``'s format, told by
    one pixel of ``image`` (a stand-in of what will be saved: its mode and depth), saved in memory:
    a 16-bit grey or float middle as JPEG."""
    fmt = _format(Path(dst))
    if isinstance(image, torch.Tensor) and fmt == "PNG" and depth_of(image) == 16:
        return
    image = as_image(image).crop((0, 0, 1, 1))
    try:
        png_bytes(image) if fmt == "PNG" else image.save(io.BytesIO(), format=fmt)
    except (OSError, ValueError, KeyError) as exc:
        raise BadInputError(f"cannot save a {image.mode} image as {fmt} ({exc})") from None


def save_image(image: Picture, dst: str | Path, chunks: bytes = b"") -> None:
    """Save atomically; the format follows the extension of ``dst``. RGB pixels (a tensor) are
    written as a directory clip writes them: a 16-bit PNG where they have 16 bits and the output is
    a PNG (Pillow holds 8 bits of RGB), else as their image. A PNG carries ``chunks`` after its
    header (a middle: the colour chunks of the frame before it, :attr:`~.base.Frame.shown_as`);
    another format their ICC profile, where it has a place for one, else says it is left out."""
    dst = Path(dst)
    fmt = _format(dst)
    if isinstance(image, torch.Tensor) and fmt == "PNG" and depth_of(image) == 16:
        with atomic_output(dst) as tmp:
            tmp.write_bytes(with_chunks(png_of(image.numpy()), chunks))
        return
    image = as_image(image)
    try:
        data = png_bytes(image) if fmt == "PNG" else None
    except (OSError, ValueError, KeyError) as exc:
        raise BadInputError(f"cannot save a {image.mode} image as {fmt} ({exc})") from None
    with atomic_output(dst) as tmp:
        if data is not None:
            tmp.write_bytes(with_chunks(data, chunks))
            return
        profile = icc_profile(chunks)
        if fmt not in HOLDS_ICC and matters(profile):
            LeftOut().say(f"the ICC profile of the frame before is left out of {dst}: {fmt} has no place for it here "
                          "(PNG, JPEG, WebP, TIFF and AVIF have)")
        try:
            image.save(tmp, format=fmt, icc_profile=profile)  # none where there is none: not one the image was read with
        except (OSError, ValueError, KeyError) as exc:
            raise BadInputError(f"cannot save a {image.mode} image as {fmt} ({exc})") from None
