"""``torch.compile`` beside the serving: the stages of a key compiled on a thread of their own while
the caller's forwards run uncompiled, then swapped in (docs/gpu.md, "Compiled in the background").

Inductor takes about a minute per shape for the whole forward on an H100, and the first middle must
not wait for it. So a key (a stage, a batch, a frame size) runs eagerly (from its CUDA graph, where
graphs are on) until its compiled form is ready: :class:`Background` compiles it on zeros of the
key's shapes (compilation needs shapes and dtypes, not values), then hands it to the caller's
``swap``, which replaces the key's graph by one of the compiled function in one step. A compilation
that fails logs one line, and the forward stays uncompiled. Inductor's artefacts are kept on disk
(:func:`persistent_cache`), so the second run of the same shapes skips inductor and only traces.
Work that only prepares compilations (extracting prepared artefacts, asking for their keys) can be
held (:meth:`Background.hold`) until the caller releases it: a clip's first middle must not share
the interpreter with the compiler (docs/gpu.md, "Compiled ahead").
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from typing import Callable, Hashable, Iterator

import torch

from ..config import cache_home
from .streams import indexed, role_stream

logger = logging.getLogger(__name__)

# Compilations per compiled function before dynamo gives up and runs it uncompiled: each block
# function is compiled once per shape (the batches of a few frame sizes, two precisions).
RECOMPILE_LIMIT = 64
_CALL = object()  # the key of a job that is a call (Background.hold), not a compilation


def persistent_cache() -> str:
    """Inductor's cache directory: ``TORCHINDUCTOR_CACHE_DIR`` where set, else under the user's cache
    directory (:func:`~eden_serve.config.cache_home`), ``eden-serve/inductor``, where it outlives the
    process and the machine's temporary files (inductor's own default is under /tmp). Where the user
    has no home (HOME unset, and no entry in the password database: a container's arbitrary user),
    or it cannot be written (a read-only home), a private temporary directory of this process's,
    said in one warning; not a path under /tmp that another user could make first, as inductor
    loads the code it finds there."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        try:
            directory = cache_home() / "eden-serve" / "inductor"
            directory.mkdir(parents=True, exist_ok=True)
            if not os.access(directory, os.W_OK | os.X_OK):  # a read-only file system refuses root too
                raise PermissionError(f"{directory} cannot be written")
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
        except (RuntimeError, OSError) as exc:  # Path.home(): no home; or none that can be written
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="eden-serve-inductor-")
            atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
            why = "no home directory" if isinstance(exc, RuntimeError) else f"no cache directory that can be written ({exc})"
            logger.warning("%s to keep compiled artefacts in (set XDG_CACHE_HOME): compiling into %s for this run", why,
                           os.environ["TORCHINDUCTOR_CACHE_DIR"])
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def settle_device_guards() -> None:
    """Make the process's CUDA device guard what tracing will make it, before any thread traces.

    Where PyTorch is built with CUDA but sees no GPU (a CPU machine with the default wheel, or the
    tests, which hide the GPUs), entering a fake tensor mode, as dynamo does to trace, first swaps
    the CUDA device guard for a no-op one. PyTorch 2.11 does that unsynchronised: tracing on the
    compiling thread beside eager forwards on another crashed the process (a segmentation fault,
    every run of ``tests/test_compiling.py`` there; 2.13 does not). Done once here, before the
    compiling thread starts, tracing finds it done."""
    ensure = getattr(torch._C, "_ensureCUDADeviceGuardSet", None)
    if ensure is not None and not torch.cuda.is_available():
        ensure()


def allow_recompiles() -> None:
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))


def zeros_like(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Inputs of the same shapes, dtypes and strides, made on the current stream."""
    return tuple(torch.zeros_like(t) for t in tensors)


class Background:
    """One thread that compiles keys in the order they are asked for, each once.

    ``work(key, job)`` runs on the thread with the device current, under inference mode, on the
    device's compiler stream (:func:`.streams.role_stream`): its kernels run beside the caller's, and
    it waits for them itself. A
    failure is logged once, and every key asked after it is left uncompiled."""

    def __init__(self, work: Callable[[Hashable, object], None], device: torch.device):
        self.work = work
        self.device = device
        self.asked: set[Hashable] = set()
        self.done: set[Hashable] = set()
        self.seconds: dict[Hashable, float] = {}  # each key's compilation, swap included (the GPU check reports them)
        self.failed: str | None = None
        self.closed = False
        self.held: list[Callable[[], None]] = []  # run on the thread once released
        self._calls = 0  # released calls not yet run: a wait waits for them and the keys they ask
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None

    def ask(self, key: Hashable, job: object) -> None:
        """Compile ``key`` (once; nothing after a failure)."""
        with self._idle:
            if key in self.asked or self.failed or self.closed:
                return
            self.asked.add(key)
            self._start()
        self._jobs.put((key, job))

    def hold(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the thread, in turn with the keys, once :meth:`release` is called; until
        then the thread is not even started."""
        with self._idle:
            if not self.closed:
                self.held.append(call)

    def release(self) -> None:
        """Start the calls held so far (each once)."""
        with self._idle:
            held, self.held = self.held, []
            if not held or self.closed:
                return
            self._calls += len(held)
            self._start()
        for call in held:
            self._jobs.put((_CALL, call))

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="eden-compile", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            key, job = item
            try:
                if not self.closed and not self.failed:
                    self._compile(key, job)
            finally:
                with self._idle:
                    if key is _CALL:
                        self._calls -= 1
                    else:
                        self.done.add(key)
                    self._idle.notify_all()
            del item, key, job  # an idle thread must not keep a job's inputs (and its model) alive

    def _compile(self, key: Hashable, job) -> None:
        started = time.monotonic()
        try:
            with torch.inference_mode(), _on(self.device):
                job() if key is _CALL else self.work(key, job)
            if key is not _CALL:
                self.seconds[key] = time.monotonic() - started
        except Exception as exc:  # a compiler's failure costs its speed-up, never the forward
            self.failed = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            logger.warning("compiling the edge's forward failed (%s); it runs uncompiled", self.failed)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every key asked so far, and every call released, is done (or given up); False on
        the timeout. Calls still held are not waited for."""
        with self._idle:
            return self._idle.wait_for(lambda: self.done >= self.asked and not self._calls, timeout)

    def close(self) -> None:
        """Compile nothing more (a compilation under way finishes, and its result is dropped; calls
        held are dropped), and let the thread end."""
        with self._idle:
            self.closed = True
            self.held = []
            if self._thread is not None:
                self._jobs.put(None)


@contextlib.contextmanager
def _on(device: torch.device) -> Iterator[None]:
    """The device current and the compiler's stream, waited for before leaving."""
    if device.type != "cuda":
        yield
        return
    stream = role_stream(device, "compile")
    torch.cuda.set_device(indexed(device))
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        stream.synchronize()
