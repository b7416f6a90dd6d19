"""The ordered, windowed streaming engine shared by the HTTP client and the in-process mode.

A clip of N frames is N - 1 pairs. Pair i (frames i and i + 1) is handed to a *processor*, a
callable ``(i, frame0, frame1, seed) -> Middle | PIL.Image`` with ``seed = base_seed + i``, on one of
``inflight`` worker threads. The main thread reads frames lazily, keeps at most ``inflight`` pairs
outstanding and writes the output strictly in order (original i, middle i, original i + 1, ...), so
memory holds at most ``inflight + 2`` input frames and ``inflight`` middles, whatever the clip length.

Failures: a processor raising an :class:`EdenError` (or a :class:`TransientError` it did not retry)
stops the run with a :class:`PairError` naming the pair; anything else (a bug, KeyboardInterrupt)
propagates unchanged. Either way the output does not appear (see :mod:`eden_serve.clips`), pairs not
yet started are dropped and the ``cancel`` event is set so that processors waiting to retry give up.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from PIL import Image
from tqdm import tqdm

from .clips import Frame, open_clip, write_clip
from .errors import BadInputError, EdenError, PairError, TransientError, UnavailableError

DEFAULT_INFLIGHT = 4


@dataclass(frozen=True)
class Retry:
    """Exponential backoff: ``tries`` attempts in all, ``backoff`` seconds before the second, doubling
    up to ``max_backoff``. Only :class:`TransientError` is retried."""

    tries: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0

    def __post_init__(self):
        if self.tries < 1 or self.backoff < 0:
            raise BadInputError(f"retry needs tries >= 1 and backoff >= 0, got {self.tries} and {self.backoff}")

    def call(self, operation: Callable[[], object], cancel: threading.Event | None = None):
        """``operation()``, retried; raises :class:`UnavailableError` once the tries are spent, or as
        soon as ``cancel`` is set while waiting."""
        for attempt in range(self.tries):
            try:
                return operation()
            except TransientError as exc:
                failure = exc
            if attempt + 1 < self.tries:
                delay = min(self.backoff * 2**attempt, self.max_backoff)
                if cancel is not None and cancel.wait(delay):
                    raise UnavailableError(f"{failure} (cancelled)") from failure
                if cancel is None:
                    time.sleep(delay)
        raise UnavailableError(f"{failure} (gave up after {self.tries} tries)") from failure


@dataclass
class Middle:
    """A processor's result: the middle frame (RGB) and what moving it cost."""

    image: Image.Image
    sent_bytes: int = 0  # uploaded to servers for this pair
    received_bytes: int = 0  # downloaded from servers
    payload_bytes: int | None = None  # the cloud -> edge wire payload, where this side sees it
    retries: int = 0  # requests that had to be sent again


def _size(count: float) -> str:
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


@dataclass
class Summary:
    pairs: int
    frames: int  # written
    seconds: float
    sent_bytes: int = 0
    received_bytes: int = 0
    payload_bytes: int | None = None  # total over the pairs, None where the payload is not seen
    retries: int = 0

    @property
    def pairs_per_second(self) -> float:
        return self.pairs / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        line = f"{self.pairs} pairs, {self.frames} frames written in {self.seconds:.2f} s: "
        line += f"{self.pairs_per_second:.2f} pairs/s"
        per_pair = []
        if self.pairs and self.sent_bytes:
            per_pair.append(f"{_size(self.sent_bytes / self.pairs)} sent")
            per_pair.append(f"{_size(self.received_bytes / self.pairs)} received")
        if self.pairs and self.payload_bytes is not None:
            per_pair.append(f"{_size(self.payload_bytes / self.pairs)} wire payload")
        line += f"; per pair: {', '.join(per_pair)}" if per_pair else ""
        return line + (f"; {self.retries} requests retried" if self.retries else "")


Processor = Callable[[int, Frame, Frame, int], "Middle | Image.Image"]


class _Workers:
    """A fixed set of daemon threads: an interrupted run exits at once instead of waiting for the
    pairs in flight to finish (their results are not wanted any more)."""

    def __init__(self, count: int, cancel: threading.Event):
        self.cancel = cancel
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
        if exc_type is not None:
            self.cancel.set()
        for _ in self.threads:
            self.jobs.put(None)


def progress_bar(total: int | None, enabled: bool | None) -> tqdm:
    """pairs/s on stderr; ``enabled=None`` shows it only when stderr is a terminal."""
    disable = not sys.stderr.isatty() if enabled is None else not enabled
    return tqdm(total=total, unit="pair", desc="interpolating", file=sys.stderr, disable=disable, dynamic_ncols=True)


def _middle(future: Future, index: int, before: Frame, after: Frame) -> Middle:
    try:
        result = future.result()
    except (EdenError, TransientError) as exc:
        raise PairError(index, before, after, exc) from exc
    middle = result if isinstance(result, Middle) else Middle(result)
    if middle.image.size != before.image.size:
        cause = BadInputError(f"the middle frame is {middle.image.size}, the input frames {before.image.size}")
        raise PairError(index, before, after, cause)
    return middle


def interpolate_clip(
    src: str | Path,
    dst: str | Path,
    processor: Processor,
    *,
    seed: int = 0,
    inflight: int = DEFAULT_INFLIGHT,
    progress: bool | None = None,
    cancel: threading.Event | None = None,
    max_pixels: int | None = None,
) -> Summary:
    """Interpolate every pair of the clip ``src`` with ``processor`` and write ``dst`` (2N - 1 frames).

    ``progress``: a progress bar on stderr (None: when stderr is a terminal). ``cancel`` is set when
    the run stops early, for processors to notice (the client's retries do). ``max_pixels`` limits
    the frame size (None: no limit here; a server applies its own).
    """
    if inflight < 1:
        raise BadInputError(f"inflight must be at least 1, got {inflight}")
    cancel = cancel if cancel is not None else threading.Event()
    started = time.perf_counter()
    summary = Summary(pairs=0, frames=0, seconds=0.0)
    with open_clip(src, max_pixels) as clip, write_clip(clip, dst) as writer, _Workers(inflight, cancel) as workers:
        total = clip.length - 1 if clip.length else None
        with progress_bar(total, progress) as bar:
            pending: deque = deque()

            def write_oldest() -> None:
                index, before, after, future = pending.popleft()
                middle = _middle(future, index, before, after)
                writer.add(before)
                writer.add_middle(middle.image, before, after)
                summary.pairs += 1
                summary.frames += 2
                summary.sent_bytes += middle.sent_bytes
                summary.received_bytes += middle.received_bytes
                summary.retries += middle.retries
                if middle.payload_bytes is not None:
                    summary.payload_bytes = (summary.payload_bytes or 0) + middle.payload_bytes
                bar.update(1)

            frames = iter(clip)
            previous = next(frames, None)
            if previous is None:
                raise BadInputError(f"{str(src)!r} holds no frames")
            for index, frame in enumerate(frames):
                if len(pending) == inflight:
                    write_oldest()
                future = workers.submit(processor, index, previous, frame, seed + index)
                pending.append((index, previous, frame, future))
                previous = frame
            while pending:
                write_oldest()
            writer.add(previous)
            summary.frames += 1
    summary.seconds = time.perf_counter() - started
    return summary
