"""Where a source's name leads under the cloud's media root, and opening it there (docs/cloud-sources.md).

A name is a relative path under the root. :func:`resolve` refuses, before anything is opened, a
root that is off and a name that leaves the root (``..``, an absolute path, a symbolic link whose
target is outside: 403 ``source_forbidden``), and a name with nothing behind it (no such file, a
dangling link: 404 ``source_not_found``). :func:`open_beneath` then opens what it resolved one name
at a time from the root's own descriptor, following no link, so a directory swapped for a link
between the two leads nowhere outside.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path, PurePosixPath

from ..errors import BadInputError, SourceForbiddenError, SourceNotFoundError

MAX_NAME = 1024  # characters of a source's name


def resolve(root: Path | None, name: str) -> Path:
    """The file that ``name`` (a relative path under ``root``) names, with every link resolved."""
    if root is None:
        raise SourceForbiddenError("this cloud holds no server-side sources (its handler.media_root is off); upload the frames")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or "\0" in name or "\\" in name:
        raise BadInputError(f"source must be a relative path of 1 to {MAX_NAME} characters under the media root, "
                            f"without backslashes, got {str(name)!r:.60}")
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise SourceForbiddenError(f"source {name!r} leaves the media root: give a relative path without '..'")
    try:
        base = os.path.realpath(root)
        path = os.path.realpath(os.path.join(base, *relative.parts))
    except OSError as exc:  # a link on the way renamed or removed between its lstat and its readlink
        raise SourceNotFoundError(f"source {name!r} changed while it was looked up ({exc.strerror})") from None
    if os.path.commonpath([base, path]) != base:
        raise SourceForbiddenError(f"source {name!r} is a link that leads out of the media root")
    if not os.path.exists(path):
        dangling = os.path.lexists(os.path.join(base, *relative.parts)) or any(
            os.path.islink(os.path.join(base, *relative.parts[:i])) for i in range(1, len(relative.parts)))
        raise SourceNotFoundError(f"source {name!r} is {'a dangling link' if dangling else 'not under the media root'}")
    if not os.path.isfile(path):
        raise BadInputError(f"source {name!r} is not a file")
    return Path(path)


def open_beneath(base: str, path: str, name: str) -> int:
    """A descriptor of ``path`` (resolved under ``base`` by :func:`resolve`: no link left in it),
    opened one name at a time from ``base``'s own descriptor, following no link. A directory swapped
    for a link after the check then fails here rather than leading the open out of the root: the
    open of a name, even one refused after it (a device, a FIFO), may itself do something."""
    parts = os.path.relpath(path, base).split(os.sep)
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise SourceNotFoundError(f"the media root cannot be opened ({exc.strerror})") from None
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a name that was checked is now a link
            raise SourceForbiddenError(f"source {name!r} was changed into a link while it was opened") from None
        raise SourceNotFoundError(f"source {name!r} cannot be opened ({exc.strerror})") from None
    finally:
        os.close(fd)
