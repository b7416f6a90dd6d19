"""A clip's reading and writing on threads of their own, so that decoding and encoding run beside
the model instead of taking turns with it (docs/video.md, "Encoder speed"): :class:`Prefetch` decodes a few
frames ahead, :class:`ThreadedWriter` encodes behind. Both keep the order, hold a bounded number of
frames, and hand an error over to the caller's thread where it would have been raised without them.
PyAV releases the interpreter while it decodes, converts and encodes, so the threads overlap."""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator

from .base import ClipWriter

_END = object()


class Prefetch:
    """The items of ``make()`` (an iterator, run on a thread of its own), at most ``depth`` ahead of
    the caller. :meth:`stop` ends the thread and waits for it: before the source it reads is closed.
    ``started=False``: the thread starts at :meth:`start`, for an owner that holds it first: a
    signal's exception raised as the thread starts (``Thread.start`` waits for it) would otherwise
    leave a thread that no one stops, reading a source closed under it (a crash of the process)."""

    def __init__(self, make: Callable[[], Iterator], depth: int, name: str = "eden-read", started: bool = True):
        self._queue: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._began, self._beginning = False, threading.Lock()
        self._thread = threading.Thread(target=self._produce, args=(make,), name=name, daemon=True)
        if started:
            self.start()

    def start(self) -> "Prefetch":
        self._thread.start()
        return self

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, make: Callable[[], Iterator]) -> None:
        with self._beginning:  # stopped before it began (its start interrupted): nothing is read
            if self._stop.is_set():
                return
            self._began = True
        try:
            for item in make():
                if not self._put((item, None)):
                    return
        except BaseException as exc:  # raised again in the caller's thread, after the items before it
            self._put((_END, exc))
            return
        self._put((_END, None))

    def __iter__(self) -> Iterator:
        while True:
            item, error = self._queue.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item

    def stop(self) -> None:
        with self._beginning:
            self._stop.set()
            began = self._began
        if began:  # else it never reads: a thread whose start was interrupted cannot be joined yet
            self._thread.join()


class ThreadedWriter(ClipWriter):
    """``writer`` run on a thread of its own: ``add``, ``add_middle`` and ``place`` are queued (at
    most ``depth`` waiting) and return at once; ``checkpoint`` and ``finish`` wait for what is
    queued before them and return their result. An error of the writer is raised by the next call
    (and by ``finish``), after which nothing more is written. ``busy``: the seconds the writer's
    thread spent writing (converting and encoding), which ``-v`` reports against the run's."""

    def __init__(self, writer: ClipWriter, depth: int = 16):
        self.writer = writer
        self.continues = writer.continues
        self._queue: queue.Queue = queue.Queue(depth)
        self._error: BaseException | None = None
        self._finished = self._closing = False
        self.busy = 0.0
        self._waited = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="eden-write", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            method, args, done = job
            if self._error is None and not self._closing:
                started = time.perf_counter()
                try:
                    result = getattr(self.writer, method)(*args)
                    if done is not None:
                        done.append(result)
                except BaseException as exc:
                    self._error = exc
                self.busy += time.perf_counter() - started
            if done is not None:
                with self._waited:
                    self._waited.notify_all()
            del job, args

    def _call(self, method: str, *args, wait: bool = False):
        self._raise()
        done: list | None = [] if wait else None
        self._queue.put((method, args, done))
        if not wait:
            return None
        with self._waited:
            self._waited.wait_for(lambda: done or self._error is not None or not self._thread.is_alive())
        self._raise()
        return done[0]

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def add(self, frame):
        self._call("add", frame)

    def add_middle(self, middle, before, after, position=None):
        self._call("add_middle", middle, before, after, *(() if position is None else (position,)))

    def place(self, picture, before, after, position):
        self._call("place", picture, before, after, position)

    @property
    def planes(self):
        """The planes the writer takes as they are (a video writer's :class:`~.planes.PlaneFormat`), where it does."""
        return getattr(self.writer, "planes", None)

    @property
    def encoder(self) -> str | None:
        """What encodes the output (a video writer's encoder and its instances), where the writer says."""
        return getattr(self.writer, "encoder", None)

    def checkpoint(self):
        return self._call("checkpoint", wait=True)

    def finish(self):
        self._call("finish", wait=True)
        self._finished = True

    def close(self):
        """Stop the thread and close the writer, whatever happened; unfinished, what is still queued
        is dropped (the output will not appear)."""
        self._closing = not self._finished
        self._queue.put(None)
        self._thread.join()
        self.writer.close()
