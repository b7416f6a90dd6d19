"""Resumable outputs (``--resume``): a run that stops keeps its partial output and a journal beside
it, and a later run with the same input and options continues from the journal's last checkpoint.

Beside the destination ``NAME.EXT``:

- ``.NAME.partial-resume.EXT``: the output being built (a file or a directory), renamed onto the
  destination once complete, as :mod:`eden_serve.media.atomic` does;
- ``….journal``: JSON: what the run is (``identity``: the input's size, time and first bytes, the
  factor, chunk, seed, the model or servers), how far its output is durable (``checkpoint``, with
  the writer's :class:`Tally` of what the partial output holds up to there), and a ``seal``: a
  checksum of the rest, so that an edited journal is refused rather than believed;
- ``….middles``: for an output that cannot be continued in place (video: an encoder's state cannot
  be saved), every middle frame computed so far, as PNG named with its own checksum. A resumed run
  writes such an output again from the start and computes only the middles it lacks.

Whatever a checkpoint or the cache names is synced to disk first, so a killed process (or a power
cut) loses at most the work since then. The partial output is locked while a run writes it. A
resumed run trusts nothing it has not checked: a partial output, journal or cached middle that
differs from what was recorded is refused in one line that says how to start afresh.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import fcntl
import hashlib
import io
import json
import os
import re
import stat
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Iterator

import torch
from PIL import Image

from .atomic import check_destination, create_partial, hidden, named, place, refused, remove_partial
from ..errors import BadInputError
from .frames import Picture, as_image, depth_of, is_deep, open_deep, png_bytes, png_of

JOURNAL_VERSION = 2  # 2: sealed, with the partial output's checksum
_HEAD_BYTES = 1 << 20  # of an input file, hashed: a changed file of the same size and time still differs
_CACHE_PNG_LEVEL = 1
_CACHED = re.compile(r"(\d+)-(\d{9})-([0-9a-f]{32})\.png")  # level, pair, checksum of the file
MAX_JOURNAL_BYTES = 1 << 20  # a journal holds a run's identity and one checkpoint: a few KiB
# The writers' checkpoints (media/__init__.DirectoryWriter, media/animation): a journal whose
# checkpoint holds another shape was not written by them, whatever its seal says.
_WRITER_STATES = ({"count", "digest"}, {"offset", "digest"}, {"offset", "digest", "sequence"})


def write_durably(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole, on disk: written beside it, synced, then renamed onto it. The
    file beside it is new, under a name no one could guess (O_EXCL): a link planted in the
    directory is never followed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise named(exc, path)


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path``, a regular file reached through no link, of at most ``limit`` bytes:
    a link, FIFO or device planted under its name (``/dev/zero``, a FIFO no one writes) raises
    OSError rather than being read for ever, and a link is never followed out of the folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = file.read(-1 if limit is None else limit + 1)
    if limit is not None and len(data) > limit:
        raise OSError(errno.EFBIG, f"over {limit} bytes")
    return data


def _a_checkpoint(checkpoint, frames) -> bool:
    """Whether ``checkpoint`` has the shape a run saves (:meth:`Journal.save`): an original's
    position within the input's ``frames`` and a writer's state of counts and a checksum."""
    if checkpoint is None:
        return True
    if not isinstance(checkpoint, dict) or checkpoint.keys() != {"position", "writer"}:
        return False
    position, writer = checkpoint["position"], checkpoint["writer"]
    counted = lambda value: type(value) is int and value >= 0  # noqa: E731 - bool is an int, never a count
    return (counted(position) and position >= 1 and (type(frames) is not int or position < frames)
            and isinstance(writer, dict) and set(writer) in _WRITER_STATES
            and isinstance(writer["digest"], str) and re.fullmatch(r"[0-9a-f]{32}", writer["digest"]) is not None
            and all(counted(value) for key, value in writer.items() if key != "digest"))


def sync(*paths: Path) -> None:
    """fsync files and directories."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def start_afresh(partial: Path) -> str:
    """How to start again when ``partial`` (a resumable output) cannot be continued."""
    return f"delete {partial.name}.journal and {partial.name} to start again"


class Tally:
    """A running checksum of the bytes a partial output holds, in the order they were written: the
    journal records it at each checkpoint, and a resumed run recomputes it from the partial output
    before adding anything (:meth:`ClipWriter.checkpoint <eden_serve.media.ClipWriter.checkpoint>`)."""

    def __init__(self):
        self._hash = hashlib.blake2b(digest_size=16)

    def add(self, data: bytes) -> None:
        self._hash.update(data)

    def add_file(self, path: Path) -> None:
        """A file of a directory output: its name and its bytes."""
        data = path.read_bytes()
        self.add(f"{path.name}\0{len(data)}\0".encode())
        self.add(data)

    def add_range(self, file, start: int, end: int) -> None:
        """Bytes ``start`` to ``end`` of an open file (whose position then is undefined)."""
        file.seek(start)
        while start < end:
            block = file.read(min(end - start, 1 << 20))
            if not block:
                raise EOFError(f"{end - start} bytes short")
            self.add(block)
            start += len(block)

    def digest(self) -> str:
        return self._hash.hexdigest()


def _seal(data: dict) -> str:
    return hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=16).hexdigest()


def input_identity(path: str | Path) -> dict:
    """What tells an input apart cheaply: a file's size, modification time and first MiB; a
    directory's names, sizes and times."""
    path = Path(path)
    if path.is_dir():
        digest = hashlib.blake2b(digest_size=16)
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.is_file() and not entry.name.startswith("."):
                stat = entry.stat()
                digest.update(f"{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        return {"directory": digest.hexdigest()}
    stat = path.stat()
    with open(path, "rb") as file:
        head = hashlib.blake2b(file.read(_HEAD_BYTES), digest_size=16).hexdigest()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "head": head}


def _differences(then, now, where: str = "") -> Iterator[str]:
    if isinstance(then, dict) and isinstance(now, dict):
        for key in sorted(set(then) | set(now)):
            yield from _differences(then.get(key), now.get(key), f"{where}.{key}" if where else key)
    elif then != now:
        yield f"{where or 'identity'} {then!r:.60} then, {now!r:.60} now"


class Journal:
    """The journal of a resumable output ``dst`` for a run described by ``identity`` (JSON data).

    :meth:`output` opens the partial output; ``checkpoint`` is then the last one saved (None: start
    from the beginning), :meth:`save` records a new one, and :meth:`keep_middles` and
    :meth:`cached_middles` keep middles for an output written again in full
    (:class:`eden_serve.clips.processors.Cached`).
    """

    def __init__(self, dst: str | Path, identity: dict):
        self.dst = Path(dst)
        self.identity = json.loads(json.dumps(identity))  # as it reads back: tuples become lists
        self.checkpoint: dict | None = None
        self.hits = 0  # middles taken from the cache
        self._cached: dict[tuple[int, int], Path] = {}  # a stopped run's middles: (level, pair) -> file
        self.verified = False  # whether the partial output was found as the checkpoint says (see confirm)
        # settled once the output block ends: a worker left running (a second Ctrl-C) caches nothing more
        self._lock, self.settled = threading.Lock(), False

    def _paths(self, directory: bool) -> None:
        self.partial = hidden(self.dst, "resume", "" if directory else self.dst.suffix)
        self.path, self.cache = (self.partial.with_name(self.partial.name + end) for end in (".journal", ".middles"))

    def _write(self, checkpoint: dict | None) -> None:
        data = {"version": JOURNAL_VERSION, "identity": self.identity, "checkpoint": checkpoint}
        write_durably(self.path, json.dumps({**data, "seal": _seal(data)}).encode())
        sync(self.path.parent)

    def _read(self) -> dict:
        restart = start_afresh(self.partial)
        try:
            data = json.loads(read_regular(self.path, MAX_JOURNAL_BYTES))
        except (OSError, ValueError, RecursionError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not JSON"
            raise BadInputError(f"cannot resume {self.dst.name}: its journal is unreadable ({reason}); {restart}") from None
        if not isinstance(data, dict) or data.get("version") != JOURNAL_VERSION:
            raise BadInputError(f"cannot resume {self.dst.name}: its journal is not version {JOURNAL_VERSION}; {restart}")
        seal = data.pop("seal", None)
        if seal != _seal(data) or data.keys() != {"version", "identity", "checkpoint"}:
            raise BadInputError(f"cannot resume {self.dst.name}: its journal was changed after this program wrote it; {restart}")
        difference = next(_differences(data.get("identity"), self.identity), None)
        if difference is not None:
            raise BadInputError(f"cannot resume {self.dst.name}: {self.partial.name} was made with {difference}; "
                                f"give the same input and options, or {restart}")
        if not _a_checkpoint(data["checkpoint"], self.identity.get("frames")):
            raise BadInputError(f"cannot resume {self.dst.name}: its journal's checkpoint is not one this program saves; {restart}")
        return data

    def _hold(self) -> None:
        """Lock the partial output for this run (released when the process ends, however it ends)."""
        self._fd = os.open(self.partial, os.O_RDONLY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise BadInputError(f"another run is writing {self.dst.name} ({self.partial.name} is locked)") from None

    def _open(self, directory: bool) -> None:
        check_destination(self.dst, directory)
        self._paths(directory)
        if self.partial.exists() and not self.path.exists():
            raise BadInputError(f"cannot resume {self.dst.name}: {self.partial.name} has no journal; delete it")
        if os.path.lexists(self.partial):
            self._check_kinds(directory)
        if self.partial.exists():
            self._hold()
            try:
                self.checkpoint = self._read()["checkpoint"]
                self._index_cache()
            except BaseException:
                os.close(self._fd)
                raise
            if self.checkpoint is not None or self._cached_count():
                return
            os.close(self._fd)
            remove_partial(self.partial)  # stopped before its first checkpoint: nothing to keep
        self._remove()  # a journal or cache without its partial output is stale
        self.verified = True
        self._write(None)
        create_partial(self.partial, directory, self.dst)
        self._hold()

    def _check_kinds(self, directory: bool) -> None:
        """The partial output, its journal and its cache are what this program makes of them: one
        that is a link (followed, the cache's would write middles out of the folder), a FIFO (which
        an open waits on for ever) or a device is refused, never opened."""
        for path, made in ((self.partial, "a directory" if directory else "a file"), (self.path, "a file"),
                           (self.cache, "a directory")):
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "a file" if stat.S_ISREG(mode) else "neither a file nor a directory")
            if kind != made:
                also = "" if path == self.partial or path == self.path else f"delete {path.name}, or "
                raise BadInputError(f"cannot resume {self.dst.name}: {path.name} is {kind}, not what this output builds; "
                                    f"{also}{start_afresh(self.partial)}")

    def _cached_count(self) -> int:
        return sum(1 for p in self.cache.iterdir() if p.suffix == ".png") if self.cache.is_dir() else 0

    def _remove(self) -> None:
        for path in (self.path, *self.path.parent.glob(f"{glob.escape(self.path.name)}.*.tmp")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        remove_partial(self.cache)  # a link planted there goes, not what it points to

    @contextlib.contextmanager
    def output(self, directory: bool = False) -> Iterator[Path]:
        """The partial output, renamed onto the destination if the block completes. If it stops (an error,
        Ctrl-C, SIGTERM) once the journal on disk names a checkpoint or the cache holds a middle, the partial
        output, the journal and the cache stay, with a warning that says so; otherwise, or where the block
        was refused for good (:func:`.atomic.refused`: so would the same command be), all three go."""
        self._open(directory)
        try:
            yield self.partial
            self._settle()
            place(self.partial, self.dst)
        except BaseException as exc:
            final = refused(exc) and not self.settled  # not place's: the output is whole
            self._settle()
            self._stopped(final)
            raise
        else:
            self._remove()
        finally:
            os.close(self._fd)

    def _settle(self) -> None:  # no middle cached from now on (one being cached is finished first)
        with self._lock:
            self.settled = True

    def confirm(self) -> None:
        """The partial output holds what the checkpoint recorded (its writer checked it): a run
        stopped from now on keeps it for the next. One refused leaves everything as it was."""
        self.verified = True

    def _stopped(self, final: bool) -> None:
        if not self.verified:  # a resume refused: what it found stays as it was
            return
        try:  # what a resume would find, whatever this run had got to when it was stopped
            saved = json.loads(read_regular(self.path, MAX_JOURNAL_BYTES))["checkpoint"]
        except (OSError, ValueError, KeyError, TypeError):
            saved = None
        if final or (saved is None and not (cached := self._cached_count())):  # nothing a resume could continue
            remove_partial(self.partial)
            self._remove()
            return
        done = f"{saved['position']} frames of the input" if saved is not None else f"{cached} middle frames"
        warnings.warn(f"stopped; {self.partial.name} and its journal keep {done}: "
                      f"the same command with --resume continues from there")

    def save(self, checkpoint: dict) -> None:
        """Record ``checkpoint`` (JSON data), once what it names has been synced."""
        self._write(checkpoint)
        self.checkpoint = checkpoint

    def _index_cache(self) -> None:
        """The middles a stopped run cached, each checked against the checksum its name records."""
        for path in self.cache.iterdir() if self.cache.is_dir() else ():
            match = _CACHED.fullmatch(path.name)
            if not match:
                continue
            self._verified(path)
            self._cached[int(match[1]), int(match[2])] = path

    def _verified(self, path: Path) -> bytes:
        """A cached middle's bytes, a regular file (no link) whose checksum is the one its name records."""
        try:
            data = read_regular(path)
        except OSError as exc:
            data, reason = None, f" ({exc.strerror})"
        else:
            reason = ""
        if data is None or hashlib.blake2b(data, digest_size=16).hexdigest() != _CACHED.fullmatch(path.name)[3]:
            raise BadInputError(f"cannot resume {self.dst.name}: the cached middle frame {path.name} is damaged{reason}; "
                                f"{start_afresh(self.partial)}")
        return data

    def _cached_middle(self, path: Path) -> Picture:
        data = self._verified(path)  # read once more, as checked: the file may have been swapped since
        if is_deep(data):
            return open_deep(data, path.name, max_pixels=None)
        with Image.open(io.BytesIO(data), formats=["PNG"]) as image:
            image.load()
            return image

    def cached_middles(self, level: int, index: int, count: int) -> list[Picture] | None:
        """The middles of pairs ``index`` to ``index + count - 1`` of factor level ``level``, where a
        stopped run cached them all (PNG: exactly; each checksum was checked when the run opened)."""
        cached = [self._cached.get((level, index + j)) for j in range(count)]
        if not all(cached):
            return None
        images = [self._cached_middle(path) for path in cached]
        with self._lock:
            self.hits += len(images)
        return images

    def keep_middles(self, level: int, index: int, images: list[Picture]) -> None:
        """Caches the middles of pairs ``index`` ... of level ``level``, on disk before it returns (not once settled)."""
        named = {}  # encoded beside the other workers, written one worker at a time
        for j, image in enumerate(images):
            deep = isinstance(image, torch.Tensor) and depth_of(image) == 16
            data = png_of(image.numpy()) if deep else png_bytes(as_image(image), _CACHE_PNG_LEVEL)
            named[f"{level}-{index + j:09d}-{hashlib.blake2b(data, digest_size=16).hexdigest()}.png"] = data
        with self._lock:
            if self.settled:
                return
            self.cache.mkdir(exist_ok=True)
            if self.cache.is_symlink():  # planted while this run went: its middles would go where it points
                raise BadInputError(f"{self.cache.name} became a symbolic link while this run wrote it; {start_afresh(self.partial)}")
            for name, data in named.items():
                write_durably(self.cache / name, data)
            sync(self.cache)
