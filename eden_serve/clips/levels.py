"""The frames of a clip's output, level by level: for a factor F = 2^L, level l is a 2x pass over
the frames of level l - 1 (the originals at level 1), and the last level's frames go to the writer.

A level cuts its input stream into chunks of ``run.chunk`` pairs (K + 1 frames, neighbours sharing
the boundary frame), hands each to ``run.submit`` (which returns a future) with at most
``run.inflight`` outstanding, collects their middles in order with ``run.collect``, and passes on
its output stream: each frame, then the middle after it. A middle sent on to the next level is a
:class:`Frame` of its image in its neighbours' pixel format, what a 2x pass would write and the next
pass read back, so that factor 4 computes exactly what two 2x passes compute.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction

from PIL import Image

from ..frames import match_mode
from .base import Frame


class Item:
    """A frame of one level's stream: an original (``after`` None), or the middle ``image`` at
    ``position`` between the originals ``before`` and ``after``; ``frame`` is what the next level
    is sent (None at the last level)."""

    __slots__ = ("frame", "image", "before", "after", "position")

    def __init__(self, frame: Frame | None, image: Image.Image | None = None, before: Frame | None = None,
                 after: Frame | None = None, position: Fraction = Fraction(0)):
        self.frame, self.image, self.after, self.position = frame, image, after, position
        self.before = frame if before is None else before

    @property
    def picture(self) -> Image.Image:
        return self.frame.image if self.image is None else self.image

    def between(self, other: "Item", middle: Image.Image, last: bool) -> "Item":
        """The middle of this item and the next, ``other``: in this item's pixel format, as a 2x
        pass would write it and the next pass read it back."""
        end = Fraction(1) if other.after is None else other.position
        position = (self.position + end) / 2
        image = match_mode(middle, self.picture, other.picture)
        frame = None if last else Frame(self.before.index, f"{self.before.name}+{position}", image=image)
        return Item(frame, image, self.before, other.before if other.after is None else other.after, position)


class Level:
    """Level ``depth``: one 2x pass over the items pushed to it, handing its output stream on to
    ``sink`` (the next level, or else anything with ``push`` and ``close``). Its pairs are counted
    from ``first``; ``run`` has ``chunk``, ``inflight``, ``submit(depth, index, frames)`` and
    ``collect(future, index, frames)``, which returns the middle images."""

    def __init__(self, depth: int, first: int, sink, run):
        self.depth, self.next_pair, self.sink, self.run = depth, first, sink, run
        self.last = not isinstance(sink, Level)
        self.items: list[Item] = []
        self.pending: deque = deque()

    def push(self, item: Item) -> None:
        self.items.append(item)
        if len(self.items) == self.run.chunk + 1:
            self._submit()

    def _submit(self) -> None:
        if len(self.pending) == self.run.inflight:
            self._write_oldest()
        frames = [item.frame for item in self.items]
        self.pending.append((self.next_pair, self.items, self.run.submit(self.depth, self.next_pair, frames)))
        self.next_pair += len(self.items) - 1
        self.items = self.items[-1:]

    def _write_oldest(self) -> None:
        index, items, future = self.pending.popleft()
        images = self.run.collect(future, index, [item.frame for item in items])
        for item, following, image in zip(items, items[1:], images):
            self.sink.push(item)
            self.sink.push(item.between(following, image, self.last))

    def close(self) -> None:
        if len(self.items) > 1:
            self._submit()
        while self.pending:
            self._write_oldest()
        self.sink.push(self.items[-1])
        self.sink.close()
