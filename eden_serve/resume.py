"""Resumable outputs (``--resume``): a run that stops keeps its partial output and a journal beside
it, and a later run with the same input and options continues from the journal's last checkpoint.

Beside the destination ``NAME.EXT``:

- ``.NAME.partial-resume.EXT``: the output being built (a file or a directory), renamed onto the
  destination once complete, as :mod:`eden_serve.atomic` does;
- ``….journal``: JSON: what the run is (``identity``: the input's size, time and first bytes, the
  factor, chunk, seed, the model or servers) and how far its output is durable (``checkpoint``);
- ``….middles``: for an output that cannot be continued in place (video: an encoder's state cannot
  be saved), every middle frame computed so far, as PNG. A resumed run writes such an output again
  from the start and computes only the middles it lacks.

Whatever a checkpoint or the cache names is synced to disk first, so a killed process (or a power
cut) loses at most the work since then. The partial output is locked while a run writes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import threading
import warnings
from pathlib import Path
from typing import Callable, Iterator

import torch
from PIL import Image

from .atomic import check_destination, create_partial, remove_partial
from .errors import BadInputError
from .frames import png_bytes

JOURNAL_VERSION = 1
_HEAD_BYTES = 1 << 20  # of an input file, hashed: a changed file of the same size and time still differs
_CACHE_PNG_LEVEL = 1


def write_durably(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole, on disk: written beside it, synced, then renamed onto it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


def sync(*paths: Path) -> None:
    """fsync files and directories."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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


def model_identity(*models) -> dict:
    """What the middles of models with ``weights`` (a cloud and an edge) depend on: the weights
    themselves, their device and precision, and the arithmetic of this torch build and CPU."""
    digest = hashlib.blake2b(digest_size=16)
    for model in models:
        for name, tensor in model.weights.state_dict().items():
            digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\n".encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    edge = models[-1]
    return {"weights": digest.hexdigest(), "device": str(edge.device), "precision": getattr(edge, "precision", None),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": torch.backends.cpu.get_cpu_capability()}


def _differences(then, now, where: str = "") -> Iterator[str]:
    if isinstance(then, dict) and isinstance(now, dict):
        for key in sorted(set(then) | set(now)):
            yield from _differences(then.get(key), now.get(key), f"{where}.{key}" if where else key)
    elif then != now:
        yield f"{where or 'identity'} {then!r:.60} then, {now!r:.60} now"


class Journal:
    """The journal of a resumable output ``dst`` for a run described by ``identity`` (JSON data).

    :meth:`output` opens the partial output; ``checkpoint`` is then the last one saved (None: start
    from the beginning), :meth:`save` records a new one, and :meth:`cached_processor` keeps
    middles for an output written again in full.
    """

    def __init__(self, dst: str | Path, identity: dict):
        self.dst = Path(dst)
        self.identity = json.loads(json.dumps(identity))  # as it reads back: tuples become lists
        self.checkpoint: dict | None = None
        self.hits = 0  # middles taken from the cache
        self._hits_lock = threading.Lock()

    def _paths(self, directory: bool) -> None:
        base = f".{self.dst.stem}.partial-resume{'' if directory else self.dst.suffix}"
        self.partial = self.dst.with_name(base)
        self.path = self.dst.with_name(base + ".journal")
        self.cache = self.dst.with_name(base + ".middles")

    def _write(self, checkpoint: dict | None) -> None:
        data = {"version": JOURNAL_VERSION, "identity": self.identity, "checkpoint": checkpoint}
        write_durably(self.path, json.dumps(data).encode())
        sync(self.path.parent)

    def _read(self) -> dict:
        restart = f"delete {self.path.name} and {self.partial.name} to start again"
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise BadInputError(f"cannot resume {self.dst.name}: its journal is unreadable ({exc}); {restart}") from None
        if not isinstance(data, dict) or data.get("version") != JOURNAL_VERSION:
            raise BadInputError(f"cannot resume {self.dst.name}: its journal is not version {JOURNAL_VERSION}; {restart}")
        difference = next(_differences(data.get("identity"), self.identity), None)
        if difference is not None:
            raise BadInputError(f"cannot resume {self.dst.name}: {self.partial.name} was made with {difference}; "
                                f"give the same input and options, or {restart}")
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
        if self.partial.exists():
            self._hold()
            try:
                self.checkpoint = self._read()["checkpoint"]
            except BaseException:
                os.close(self._fd)
                raise
            if self.checkpoint is not None or self._cached_count():
                return
            os.close(self._fd)
            remove_partial(self.partial)  # stopped before its first checkpoint: nothing to keep
        self._remove()  # a journal or cache without its partial output is stale
        self._write(None)
        create_partial(self.partial, directory, self.dst)
        self._hold()

    def _cached_count(self) -> int:
        return sum(1 for p in self.cache.iterdir() if p.suffix == ".png") if self.cache.is_dir() else 0

    def _remove(self) -> None:
        for path in (self.path, self.path.with_name(self.path.name + ".tmp")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        shutil.rmtree(self.cache, ignore_errors=True)

    @contextlib.contextmanager
    def output(self, directory: bool = False) -> Iterator[Path]:
        """The partial output, renamed onto the destination if the block completes. If it stops
        (an error, Ctrl-C, SIGTERM) once the journal on disk names a checkpoint or the cache holds
        a middle, the partial output, the journal and the cache stay, with a warning that says so;
        otherwise all three go."""
        self._open(directory)
        try:
            yield self.partial
        except BaseException:
            self._stopped()
            raise
        else:
            os.replace(self.partial, self.dst)
            self._remove()
        finally:
            os.close(self._fd)

    def _stopped(self) -> None:
        try:  # what a resume would find, whatever this run had got to when it was stopped
            saved = json.loads(self.path.read_text())["checkpoint"]
        except (OSError, ValueError, KeyError, TypeError):
            saved = None
        cached = self._cached_count()
        if saved is None and not cached:
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

    def _middle(self, level: int, pair: int) -> Path:
        return self.cache / f"{level}-{pair:09d}.png"

    def cached_processor(self, processor: Callable, level: int) -> Callable:
        """``processor`` for pairs of factor level ``level``, through the cache: a chunk whose
        middles are all there is read back (PNG: exactly), any other is computed and stored."""

        def process(index: int, frames: list, seed: int, *arrived):
            paths = [self._middle(level, index + j) for j in range(len(frames) - 1)]
            if all(path.exists() for path in paths):
                images = []
                for path in paths:
                    with Image.open(path) as image:
                        image.load()
                        images.append(image)
                with self._hits_lock:
                    self.hits += len(images)
                return images
            result = processor(index, frames, seed, *arrived)
            images = getattr(result, "images", result)
            if len(images) == len(paths):
                self.cache.mkdir(exist_ok=True)
                for path, image in zip(paths, images):
                    write_durably(path, png_bytes(image, _CACHE_PNG_LEVEL))
                sync(self.cache)
            return result

        process.streams = getattr(processor, "streams", False)
        return process
