"""The streaming engine's threads: a fixed set of workers for a clip's chunks, and the middles a
streaming processor hands over before its chunk is done (:mod:`eden_serve.clips.streaming`)."""

from __future__ import annotations

import functools
import queue
import threading
import warnings
from concurrent.futures import Future
from typing import Callable

from PIL import Image


class Workers:
    """A fixed set of threads, joined when the run leaves its block, however it leaves: a run that
    stops sets ``cancel`` (chunks not started are dropped, a client's retries and turns give up),
    tells its processor (``stopped``: a client cuts its requests in flight) and waits for the
    chunks in flight to end, so that none of them still computes, or writes a resumable run's
    cached middles (:class:`~.processors.Cached`), once the run has settled its output and
    returned. They are daemons all the same: a second Ctrl-C during that wait leaves without them
    (the command then exits at once, :func:`eden_serve.commands.cli.main`)."""

    def __init__(self, count: int, cancel: threading.Event, stopped: Callable[[], None] = lambda: None):
        self.cancel, self.stopped = cancel, stopped
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._run, name=f"eden-pair-{i}", daemon=True) for i in range(count)]
        for thread in self.threads:
            thread.start()

    def submit(self, function: Callable, *args) -> Future:
        future: Future = Future()
        self.jobs.put((future, function, args))
        return future

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self._do(*job)
            del job  # an idle worker must not keep its last pair's frames alive

    def _do(self, future: Future, function: Callable, args: tuple) -> None:
        if self.cancel.is_set() or not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(function(*args))
        except BaseException as exc:  # handed to the main thread, KeyboardInterrupt included
            future.set_exception(exc)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest) -> None:
        stopping = exc_type is not None
        if stopping:
            self.cancel.set()
            self.stopped()  # the processor cuts its requests in flight: a server that does not answer is not waited for
        for _ in self.threads:
            self.jobs.put(None)
        said = False
        for thread in self.threads:
            while thread.is_alive():
                thread.join(0.5)
                if stopping:  # a request begun as the run stopped, after the cut, is cut too
                    self.stopped()
                if stopping and not said and thread.is_alive():  # a forward in process ends only when done
                    said = True
                    warnings.warn("stopping: waiting for the chunks under way to end (interrupt again to leave at once)")


class Arrivals:
    """The middles of one chunk that a streaming processor has handed over so far; called as
    ``arrivals(j, image)`` by the processor. ``order`` is the chunk's place among the run's chunks
    (0, 1, 2, ... as submitted), for a processor that serves them in that order."""

    def __init__(self, pairs: int, order: int | None = None):
        self.images: list[Image.Image | None] = [None] * pairs
        self.order = order
        self._changed = threading.Condition()

    def watch(self, future: Future) -> None:
        self.future = future
        future.add_done_callback(functools.partial(_wake, self._changed))

    def put(self, j: int, image: Image.Image) -> None:
        with self._changed:
            if self.images[j] is None:  # a retried request may hand over a middle again
                self.images[j] = image
                self._changed.notify_all()

    __call__ = put

    def wait(self, j: int) -> Image.Image | None:
        """Middle ``j`` once it has arrived; None if the processor finished without handing it over."""
        with self._changed:
            while self.images[j] is None and not self.future.done():
                self._changed.wait(0.5)
            return self.images[j]


def _wake(changed: threading.Condition, _future: Future) -> None:
    """Wake the chunk's waiters. A function of the condition alone, not a method: the future keeps
    its callbacks, and one holding the arrivals, which hold the future, would make a cycle that
    kept the chunk's middles (its arrivals' and its result's) until a full collection of the cyclic
    collector, many chunks later in a long run (benchmarks/soak.py)."""
    with changed:
        changed.notify_all()
