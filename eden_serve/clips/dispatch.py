"""What the levels of a 2^L output (:mod:`.levels`) and a retimed output (:mod:`.tree`) ask of a run,
declared: how it cuts its pairs into chunks (:class:`Chunking`), and where the chunks go
(:class:`Chunks`: submitted, then their middles collected in order). :class:`Dispatch` is the run's:
each chunk handed to its level's processor on a worker thread (:mod:`.workers`), its middles
checked against its frames, counted, and shown on the progress bar as they come.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol

from tqdm import tqdm

from ..errors import BadInputError, EdenError, PairError, TransientError
from ..media.atomic import refused
from ..media.base import Frame
from ..media.frames import Picture, picture_size
from .processors import Middles, Processor
from .workers import Arrivals, Workers


@dataclass(frozen=True)
class Chunking:
    """Chunks of ``chunk`` pairs (K + 1 frames, neighbours sharing their boundary frame; ``ramp``:
    a level's first ones 1, 1, 2, 4, ... pairs), at most ``inflight`` outstanding."""

    chunk: int
    ramp: bool
    inflight: int


class Chunks(Protocol):
    """Where a level or the retimed tree sends its chunks."""

    def submit(self, depth: int, index: int, frames: list[Frame]) -> Future:
        """The chunk of ``frames`` whose first pair is ``index`` at level (or tree depth) ``depth``, handed on."""

    def collect(self, future: Future, index: int, frames: list[Frame]) -> Iterator[Picture]:
        """Its middles in order, each as it arrives where the processor streams them."""


def _bad_frame(frames: list[Frame], first: tuple[str, Path, int | None] | None) -> BadInputError | None:
    """Which of a chunk's input files its processor refused, said as the one line to act on: the
    first that cannot be read, or whose size is not that of the run's ``first`` file (its name,
    path and pixel limit), read again here, as is a frame this process had not decoded (a server
    refused it), as the error to tell. None where each reads and fits: the refusal was of something
    else, told as it was."""
    first = None if first is None else Frame(0, first[0], path=first[1], max_pixels=first[2])
    for frame in frames:
        if frame.path is None:  # a video's frame, or a middle: decoded by this process already
            continue
        try:
            size, expected = frame.size, first.size if first is not None else None
        except BadInputError as exc:  # as reading it says, too large (413) or unreadable
            return exc
        if expected is not None and size != expected:
            return BadInputError(f"{frame.name} is {size[0]}x{size[1]}, unlike {first.name} before it ({expected[0]}x{expected[1]})")
    return None


def _middles(future: Future, index: int, frames: list[Frame], first: tuple[str, Path, int | None] | None = None) -> Middles:
    pairs = len(frames) - 1
    try:
        result = future.result()
    except (EdenError, TransientError) as exc:
        # Refused for good (media.atomic.refused): the one line says which file to mend.
        bad = _bad_frame(frames, first) if refused(exc) else None
        raise PairError(index, frames[0], frames[-1], exc if bad is None else bad, pairs) from exc
    middles = result if isinstance(result, Middles) else Middles(list(result))
    problem = None
    if len(middles.images) != pairs:
        problem = f"{len(middles.images)} middle frames came back for {pairs} pairs"
    elif any(picture_size(image) != frames[0].size for image in middles.images):
        sizes = sorted({picture_size(image) for image in middles.images})
        problem = f"the middle frames are {', '.join(map(str, sizes))}, the input frames {frames[0].size}"
    if problem:
        raise PairError(index, frames[0], frames[-1], BadInputError(problem), pairs)
    return middles


class Dispatch:
    """The run's :class:`Chunks`: depth d's chunks to ``processors[d - 1]`` on ``workers``, pair
    ``index + j`` seeded ``seed + index + j``; each chunk's middles, once all are in, handed to
    ``count``, and shown on ``bar`` as they come."""

    def __init__(self, processors: list[Processor], workers: Workers, seed: int, count: Callable[[Middles], None], bar: tqdm):
        self.processors, self.workers, self.seed, self.count, self.bar = processors, workers, seed, count, bar
        self.submitted = 0  # streamed chunks so far: the next one's order
        self.arrivals: dict[Future, Arrivals] = {}  # of the streamed chunks not yet collected
        self.first: tuple[str, Path, int | None] | None = None  # the run's first file: what a refused one is measured against

    def submit(self, depth: int, index: int, frames: list[Frame]) -> Future:
        if self.first is None and frames[0].path is not None:
            self.first = frames[0].name, frames[0].path, frames[0].max_pixels
        processor = self.processors[depth - 1]
        if not processor.streams:
            return self.workers.submit(processor, index, frames, self.seed + index)
        arrivals = Arrivals(len(frames) - 1, self.submitted)
        self.submitted += 1
        processor.queued(arrivals.order)
        future = self.workers.submit(processor, index, frames, self.seed + index, arrivals)
        arrivals.watch(future)
        self.arrivals[future] = arrivals
        return future

    def collect(self, future: Future, index: int, frames: list[Frame]) -> Iterator[Picture]:
        """The chunk's middles in order: each as it arrives where the processor streams them, the
        rest (all, otherwise) once it has finished."""
        given = 0
        arrivals = self.arrivals.pop(future, None)
        while arrivals is not None and given < len(frames) - 1:
            image = arrivals.wait(given)
            if image is None:
                break
            if picture_size(image) != frames[0].size:
                raise PairError(index, frames[0], frames[-1], BadInputError(
                    f"a middle frame is {picture_size(image)}, the input frames {frames[0].size}"), len(frames) - 1)
            given += 1
            self.bar.update(1)
            yield image
        middles = _middles(future, index, frames, self.first)
        self.count(middles)
        self.bar.update(len(middles.images) - given)
        yield from middles.images[given:]
