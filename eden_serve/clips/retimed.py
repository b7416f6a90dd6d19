"""The frames of a retimed output (:mod:`eden_serve.clips.schedule`): only the middles its frames show, and their
ancestors in the 2x tree, are computed.

The source intervals are read in windows of ``chunk`` (the run's :class:`~.dispatch.Chunking`). In
a window, depth d's middles wait for depth d - 1's; its pairs are numbered as in a full 2x pass at
that depth (pair g of depth d is interval g >> (d - 1), seeded ``seed + g``), and consecutive pairs
go to the run's :class:`~.dispatch.Chunks` together, cut where g is a multiple of ``chunk``, so that
each middle is the one a factor 2^d run computes and the cut does not depend on where a run starts.
Windows overlap: while one waits on its next depth, the next window's pairs are in flight, at most
``inflight`` chunks in all, and windows are written strictly in order to the :class:`Placer`.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from fractions import Fraction
from typing import Iterable, Protocol

from ..media.base import Frame, matched
from ..media.frames import Picture
from .dispatch import Chunking, Chunks
from .schedule import Schedule, Target, ancestors


class Placer(Protocol):
    """Where a retimed output's frames go, each at its ``position`` between originals ``before`` and ``after``."""

    def place(self, picture: Frame | Picture, before: Frame, after: Frame | None, position: Fraction) -> None: ...


def _runs(pairs: list[int], chunk: int) -> list[list[int]]:
    """Consecutive pair numbers, at most ``chunk`` together, a new run at each multiple of ``chunk``."""
    runs: list[list[int]] = []
    for g in pairs:
        if runs and runs[-1][-1] == g - 1 and g % chunk and len(runs[-1]) < chunk:
            runs[-1].append(g)
        else:
            runs.append([g])
    return runs


class _Window:
    """Source intervals ``first`` ... of ``frames`` (one more than ``targets``), with the middles
    their targets need, computed depth by depth."""

    def __init__(self, first: int, frames: list[Frame], targets: list[list[Target]], chunk: int):
        self.first, self.frames, self.targets = first, frames, targets
        needed: dict[int, set[int]] = {}
        for k, due in enumerate(targets):
            for node in set().union(*(ancestors(t.shown) for t in due)):
                depth = node.denominator.bit_length() - 1
                needed.setdefault(depth, set()).add(((first + k) << (depth - 1)) + node.numerator // 2)
        self.jobs = {depth: _runs(sorted(pairs), chunk) for depth, pairs in needed.items()}
        self.depth, self.last = 0, max(needed, default=0)
        self.ready: deque = deque()
        self.waiting = 0
        self.nodes: dict[tuple[int, Fraction], Frame] = {}
        self.images: dict[tuple[int, Fraction], Picture] = {}

    def node(self, interval: int, position: Fraction) -> Frame:
        if position.denominator == 1:
            return self.frames[interval - self.first + position.numerator]
        return self.nodes[interval, position]

    def _pair(self, depth: int, g: int) -> tuple[int, Fraction, Fraction]:
        """Pair g of depth d: its interval, and its left and right ends there."""
        interval, j = g >> (depth - 1), g & ((1 << (depth - 1)) - 1)
        return interval, Fraction(j, 1 << (depth - 1)), Fraction(j + 1, 1 << (depth - 1))

    def frames_of(self, depth: int, run: list[int]) -> list[Frame]:
        ends = [self._pair(depth, g) for g in run]
        return [self.node(i, left) for i, left, _ in ends] + [self.node(ends[-1][0], ends[-1][2])]

    def advance(self) -> None:
        """Once a depth is done, the next depth's chunks become ready."""
        while not self.ready and not self.waiting and self.depth < self.last:
            self.depth += 1
            self.ready.extend((self.depth, run) for run in self.jobs.get(self.depth, ()))

    def fill(self, depth: int, run: list[int], images: list[Picture]) -> None:
        """The middles of pairs ``run`` of depth ``depth`` have come."""
        for g, image in zip(run, images):
            interval, left, right = self._pair(depth, g)
            before, after = self.node(interval, left), self.node(interval, right)
            position = (left + right) / 2
            self.images[interval, position] = image
            # The next depth reads it as a 2x pass would have written it: in its neighbours' format.
            self.nodes[interval, position] = Frame(before.index, f"{before.name}+{position}", image=matched(image, before, after))
        self.waiting -= 1
        self.advance()

    @property
    def done(self) -> bool:
        return self.depth == self.last and not self.ready and not self.waiting

    def shown(self, k: int, target: Target) -> Frame | Picture:
        if target.shown.denominator == 1:
            return self.frames[k + target.shown.numerator]
        return self.images[self.first + k, target.shown]


def retime(frames: Iterable[Frame], schedule: Schedule, chunking: Chunking, chunks: Chunks, output: Placer) -> int:
    """Write the retimed output of ``frames`` to ``output``, its middles computed by ``chunks`` cut as
    ``chunking`` says; returns the number of source frames read. The schedule's clock is seconds
    under ``--fps`` (a video's frames are timed), else frame indices."""
    retiming = _Retiming(frames, schedule, chunking, chunks, output)
    while True:
        retiming.read()
        retiming.submit()
        retiming.write()
        if retiming.exhausted and not retiming.windows:
            break
        retiming.collect()
    retiming.tail()
    return retiming.frames_read


class _Retiming:
    """:func:`retime` under way: the source read window by window, the windows in flight, and the
    chunks outstanding (at most ``chunking.inflight``)."""

    def __init__(self, frames: Iterable[Frame], schedule: Schedule, chunking: Chunking, chunks: Chunks, output: Placer):
        self.source, self.schedule = iter(frames), schedule
        self.chunking, self.chunks, self.output = chunking, chunks, output
        self.timed = schedule.retiming.fps is not None
        self.windows: deque[_Window] = deque()
        self.outstanding: dict = {}  # future -> (window, depth, pairs, frames)
        self.previous: Frame | None = None
        self.frames_read, self.exhausted = 0, False

    def clock(self, frame: Frame) -> Fraction:
        return frame.time if self.timed else Fraction(frame.index)

    def _window(self) -> _Window | None:
        """The next window of source intervals, sharing its first frame with the last one's end."""
        batch = [self.previous] if self.previous is not None else []
        for frame in self.source:
            self.frames_read += 1
            batch.append(frame)
            if len(batch) == self.chunking.chunk + 1:
                break
        if batch:
            self.previous = batch[-1]
        if len(batch) < 2:
            return None
        targets = [self.schedule.interval(self.clock(a), self.clock(b)) for a, b in zip(batch, batch[1:])]
        window = _Window(batch[0].index, batch, targets, self.chunking.chunk)
        window.advance()
        return window

    def read(self) -> None:
        """Windows read ahead while the ones in flight wait on their chunks."""
        while not self.exhausted and len(self.windows) <= self.chunking.inflight:
            window = self._window()
            if window is None:
                self.exhausted = True
            else:
                self.windows.append(window)

    def submit(self) -> None:
        for window in self.windows:
            while window.ready and len(self.outstanding) < self.chunking.inflight:
                depth, pairs = window.ready.popleft()
                chunk = window.frames_of(depth, pairs)
                self.outstanding[self.chunks.submit(depth, pairs[0], chunk)] = (window, depth, pairs, chunk)
                window.waiting += 1

    def write(self) -> None:
        """The windows done, in order."""
        while self.windows and self.windows[0].done:
            window = self.windows.popleft()
            for k, due in enumerate(window.targets):
                for target in due:
                    self.output.place(window.shown(k, target), window.frames[k], window.frames[k + 1], target.position)

    def collect(self) -> None:
        """The chunks that finish next, each handed to its window."""
        if not self.outstanding:
            return
        finished, _ = wait(list(self.outstanding), return_when=FIRST_COMPLETED)
        for future in sorted(finished, key=list(self.outstanding).index):
            window, depth, pairs, chunk = self.outstanding.pop(future)
            # Whole: collect tallies the chunk once its last middle has been taken.
            window.fill(depth, pairs, list(self.chunks.collect(future, pairs[0], chunk)))

    def tail(self) -> None:
        """The frames due from the last original on."""
        if self.previous is not None:
            end = self.previous.end if self.timed else None
            for target in self.schedule.tail(self.clock(self.previous), end):
                self.output.place(self.previous, self.previous, None, target.position)
