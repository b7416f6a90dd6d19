"""Clips the page is given: each written under the page's work directory by a name of our own (a
random one, with the extension its content has: the name the browser sends is only shown), never
past the size limit, and read by the commands' own reader before it is accepted. At most
:data:`UPLOADS_KEPT` are kept, of at most twice the size limit together: the oldest that no run
waits for or reads go first. ``cloud:NAME`` sources are listed from the media root the page is told
the cloud serves, and opened as the cloud opens them (:func:`open_source`)."""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable

import anyio.to_thread

from ..cloud.sources import SourceFile, SourceVideo, Work, resolve
from ..errors import BadInputError, EdenError
from ..media.containers import self_contained
from .media import CONTAINER_EXTENSIONS, Clip, describe

DEFAULT_MAX_UPLOAD = 2 * 1024**3  # bytes
MAX_SOURCES = 500  # names listed from a media root
MAX_LABEL = 120  # characters of a name shown
UPLOADS_KEPT = 8  # clips a page keeps; their bytes together at most twice --max-upload


class UploadTooLargeError(EdenError):
    status = 413
    kind = "upload_too_large"


@dataclass
class Upload:
    id: str
    label: str  # the browser's name for it, for display only
    path: Path
    clip: Clip

    def to_json(self) -> dict:
        return {"id": self.id, "label": self.label, **self.clip.to_json()}


def label(name: str) -> str:
    """A name fit to show and to offer as a download's name: printable, without paths or quotes."""
    name = re.split(r"[\\/]", name)[-1]
    name = re.sub(r"[^\w.\- ]", "_", name).strip(" .") or "clip"
    return name[:MAX_LABEL]


class Uploads:
    """The page's clips under ``root``, each at most ``max_bytes`` and with frames of at most
    ``max_pixels`` (the commands' ``--max-pixels``). ``in_use(path)``: whether a run waits for or
    reads the clip at ``path``; ``removed(path)`` is told of each clip removed."""

    def __init__(self, root: Path, max_bytes: int, max_pixels: int | None, in_use: Callable[[Path], bool] = lambda path: False,
                 removed: Callable[[Path], None] = lambda path: None):
        self.root, self.max_bytes, self.max_pixels = root, max_bytes, max_pixels
        self.in_use, self.removed = in_use, removed
        self.root.mkdir(parents=True, exist_ok=True)
        self.items: dict[str, Upload] = {}  # oldest first

    async def receive(self, body: AsyncIterator[bytes], length: int | None, name: str) -> Upload:
        """The clip in ``body`` (``length``: its declared size, None where not declared)."""
        if length is not None and length > self.max_bytes:
            raise UploadTooLargeError(f"the clip is {length} bytes; this page takes at most {self.max_bytes} "
                                      "(eden-serve page --max-upload)")
        key = secrets.token_hex(16)
        partial = self.root / f".{key}.partial"
        try:
            received = 0
            with open(partial, "xb") as out:
                async for part in body:
                    received += len(part)
                    if received > self.max_bytes:
                        raise UploadTooLargeError(f"the clip is over {self.max_bytes} bytes, the most this page takes "
                                                  "(eden-serve page --max-upload)")
                    out.write(part)
            with open(partial, "rb") as written:
                if self_contained(written.read(12)) is None:
                    raise BadInputError(f"{label(name)!r} is not a clip in a container this page opens (a video in MP4, "
                                        "Matroska, WebM, AVI, MPEG-TS or -PS, Y4M, FLV or Ogg; a GIF, PNG or WebP)")
            try:
                clip = await anyio.to_thread.run_sync(describe, partial, self.max_pixels)
            except EdenError as exc:  # told by the clip's name, never by its path here
                raise type(exc)(str(exc).replace(str(partial), label(name))) from None
            path = self.root / f"{key}{clip.extension}"
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        upload = Upload(key, label(name), path, clip)
        self.items[key] = upload
        self._prune()
        return upload

    def _prune(self) -> None:
        """The oldest clips no run uses, removed while more than :data:`UPLOADS_KEPT` are kept or
        they hold over twice ``max_bytes`` (the newest is always kept)."""
        sizes = {key: item.path.stat().st_size for key, item in self.items.items()}
        for key, item in list(self.items.items())[:-1]:
            if len(self.items) <= UPLOADS_KEPT and sum(sizes.values()) <= 2 * self.max_bytes:
                return
            if self.in_use(item.path):
                continue
            del self.items[key], sizes[key]
            item.path.unlink(missing_ok=True)
            self.removed(item.path)

    def get(self, key: str) -> Upload | None:
        return self.items.get(key) if isinstance(key, str) else None


LISTED_EXTENSIONS = set(CONTAINER_EXTENSIONS.values()) | {".webm", ".mov", ".m4v"}


def list_sources(root: Path | None) -> list[str]:
    """The videos under the cloud's media ``root`` (as the page sees it), by their names there."""
    if root is None:
        return []
    names = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(name for name in dirs if _offered(name))
        for name in sorted(files):
            relative = Path(folder, name).relative_to(root).as_posix()
            if _offered(name) and Path(name).suffix.lower() in LISTED_EXTENSIONS and _opens(root, relative):
                names.append(relative)
                if len(names) == MAX_SOURCES:
                    return names
    return names


def _offered(name: str) -> bool:
    """Whether a file or folder of the root may be offered: not hidden (an output being written
    is, ``.NAME.partial-…``) and UTF-8, as names travel to the cloud: one the file system holds in
    another encoding could not be asked for, and made the whole listing a 500 (UnicodeEncodeError)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return not name.startswith(".")


def _opens(root: Path, name: str) -> bool:
    """Whether the cloud would open ``name`` rather than refuse it as a link out of the root or to nothing."""
    try:
        resolve(root, name)
    except EdenError:
        return False
    return True


def open_source(root: Path | None, name: str, max_pixels: int) -> SourceVideo:
    """The source ``name`` under ``root``, opened as the cloud opens it: checked never to leave the
    root, by descriptor, a regular file in MP4 or Matroska alone, within ``max_pixels`` and the
    cloud's default work limits. Its messages name it by ``name``."""
    return SourceVideo(SourceFile(root, name if isinstance(name, str) else ""), max_pixels, Work())
