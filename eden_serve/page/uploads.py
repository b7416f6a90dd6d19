"""Clips the page is given: each written under the page's work directory by a name of our own (a
random one, with the extension its content has: the name the browser sends is only shown), never
past the size limit, and read by the commands' own reader before it is accepted. ``cloud:NAME``
sources are listed from the media root the page is told the cloud serves."""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

import anyio.to_thread

from ..cloud.sources import resolve
from ..errors import EdenError
from .media import CONTAINER_EXTENSIONS, Clip, describe

DEFAULT_MAX_UPLOAD = 2 * 1024**3  # bytes
MAX_SOURCES = 500  # names listed from a media root
MAX_LABEL = 120  # characters of a name shown


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
    ``max_pixels`` (the commands' ``--max-pixels``)."""

    def __init__(self, root: Path, max_bytes: int, max_pixels: int | None):
        self.root, self.max_bytes, self.max_pixels = root, max_bytes, max_pixels
        self.root.mkdir(parents=True, exist_ok=True)
        self.items: dict[str, Upload] = {}

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
            try:
                clip = await anyio.to_thread.run_sync(describe, partial, self.max_pixels)
            except EdenError as exc:  # told by the clip's name, not by ours
                raise type(exc)(str(exc).replace(repr(str(partial)), repr(label(name)))) from None
            path = self.root / f"{key}{clip.extension}"
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        upload = Upload(key, label(name), path, clip)
        self.items[key] = upload
        return upload

    def get(self, key: str) -> Upload | None:
        return self.items.get(key) if isinstance(key, str) else None


def list_sources(root: Path | None) -> list[str]:
    """The videos under the cloud's media ``root`` (as the page sees it), by their names there."""
    if root is None:
        return []
    names = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if Path(name).suffix.lower() in set(CONTAINER_EXTENSIONS.values()) | {".webm", ".mov", ".m4v"}:
                names.append(Path(folder, name).relative_to(root).as_posix())
                if len(names) == MAX_SOURCES:
                    return names
    return names


def source_path(root: Path | None, name: str) -> Path:
    """The file of the source ``name``, checked as the cloud checks it (never out of the root)."""
    return resolve(root, name)
