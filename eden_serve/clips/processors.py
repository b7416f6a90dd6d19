"""Processors: what turns a chunk's frames into its middle frames, for the streaming engine
(:mod:`.streaming`): the model in this process (:func:`eden_serve.clips.pipeline.in_process`), the
servers (:meth:`eden_serve.client.Client.processor`), and wrappers around either (the
processing size, :mod:`.resize`; a resumed run's cache, :mod:`.journal`; the web page's watch).

A processor is called ``processor(index, frames, seed)``: ``frames`` are a chunk's K + 1
consecutive frames, ``index`` its first pair, and pair ``index + j`` is seeded ``seed + j``; it
returns :class:`Middles` or the K middle images. A processor that :attr:`~Processor.streams` is also
given ``arrived``, to hand over each middle as soon as it has it (``arrived(j, image)``), and is
told each chunk's place among the run's chunks (:meth:`~Processor.queued`) on the main thread
before a worker runs the chunk, so that it can serve chunks in their order whatever order its
threads ask in.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from ..media.base import Frame
from ..media.frames import Picture
from ..media.resume import Journal
from .workers import Arrivals


@dataclass
class Middles:
    """A processor's result: a chunk's middle frames (RGB images, or 8-bit RGB pixels [H, W, 3] where
    an edge in this process made them), in pair order, and what moving them cost."""

    images: list[Picture]
    sent_bytes: int = 0  # uploaded to servers for this chunk
    received_bytes: int = 0  # downloaded from servers
    payload_bytes: int | None = None  # the cloud -> edge wire payload, where this side sees it
    retries: int = 0  # requests that had to be sent again
    codec: str | None = None  # the wire codec asked for (None: the server's default, or no wire)

    def add(self, other: "Middles") -> None:
        """Counts ``other``'s middles and costs in, after these."""
        self.images += other.images
        self.sent_bytes += other.sent_bytes
        self.received_bytes += other.received_bytes
        self.retries += other.retries
        if other.payload_bytes is not None:
            self.payload_bytes = (self.payload_bytes or 0) + other.payload_bytes



class Processor:
    """A chunk's frames -> its middles (the module's docstring says how it is called)."""

    streams: bool = False

    def __call__(self, index: int, frames: list[Frame], seed: int, arrived: Arrivals | None = None) -> Middles | Sequence[Picture]:
        raise NotImplementedError

    def queued(self, order: int) -> None:
        """Chunk number ``order`` of the run (0, 1, 2, ... as submitted) is queued."""

    def stopped(self) -> None:
        """The run is stopping (its ``cancel`` is set) and waits for the chunks in flight: cut what
        they wait for outside this process (a server's answer), so that they end now."""

    def for_run(self, cancel: threading.Event) -> "Processor":
        """This processor for one run, whose ``cancel`` is set when it stops: itself where it keeps
        nothing of a run's between calls; else one whose state (the requests a stop cuts, the turns
        chunks take, what the output's writer asks for) is the run's alone, so that one processor
        may serve several runs at once (:meth:`eden_serve.client.Client.processor`)."""
        return self


class FunctionProcessor(Processor):
    """A function ``(index, frames, seed)`` as a processor; one that ``streams`` takes ``arrived``
    too, and ``queued`` is told each chunk's place."""

    def __init__(self, function: Callable, *, streams: bool = False, queued: Callable[[int], None] | None = None):
        self.function, self.streams, self._queued = function, streams, queued

    def __call__(self, index: int, frames: list[Frame], seed: int, arrived: Arrivals | None = None) -> Middles | Sequence[Picture]:
        return self.function(index, frames, seed, *(() if arrived is None else (arrived,)))

    def queued(self, order: int) -> None:
        if self._queued is not None:
            self._queued(order)


class Wrapper(Processor):
    """A processor around ``inner``: it streams where ``inner`` does, and passes on the places."""

    def __init__(self, inner: Processor):
        self.inner, self.streams = inner, inner.streams

    def queued(self, order: int) -> None:
        self.inner.queued(order)

    def stopped(self) -> None:
        self.inner.stopped()

    def for_run(self, cancel: threading.Event) -> Processor:
        inner = self.inner.for_run(cancel)
        if inner is self.inner:
            return self
        run = copy.copy(self)
        run.inner = inner
        return run


class Cached(Processor):
    """``inner`` for the pairs of factor level ``level``, through a resumable output's cache of
    middles (:class:`~eden_serve.media.resume.Journal`): a chunk whose middles are all there is
    read back, any other is computed and kept. It streams where ``inner`` does, but announces no
    chunk to it: a chunk read back never reaches ``inner``, which would wait for it forever."""

    def __init__(self, inner: Processor, journal: Journal, level: int):
        self.inner, self.journal, self.level, self.streams = inner, journal, level, inner.streams

    def stopped(self) -> None:
        self.inner.stopped()

    def __call__(self, index: int, frames: list[Frame], seed: int, arrived: Arrivals | None = None) -> Middles | Sequence[Picture]:
        cached = self.journal.cached_middles(self.level, index, len(frames) - 1)
        if cached is not None:
            return cached
        result = self.inner(index, frames, seed, arrived)
        images = getattr(result, "images", result)
        if len(images) == len(frames) - 1:
            self.journal.keep_middles(self.level, index, images)
        return result


def as_processor(processor: Processor | Callable) -> Processor:
    """``processor`` itself, or a plain function ``(index, frames, seed)`` as one."""
    return processor if isinstance(processor, Processor) else FunctionProcessor(processor)


def pairwise(process_pair: Callable[[int, Frame, Frame, int], "Middles | Picture"]) -> Processor:
    """A processor of chunks from one of pairs, ``(i, frame0, frame1, seed) -> image``, called
    for each pair in turn."""

    def process(index: int, frames: list[Frame], seed: int) -> Middles:
        middles = Middles([])
        for j, (before, after) in enumerate(zip(frames, frames[1:])):
            result = process_pair(index + j, before, after, seed + j)
            middles.add(result if isinstance(result, Middles) else Middles([result]))
        return middles

    return FunctionProcessor(process)
