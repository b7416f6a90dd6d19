"""The frames of a clip's output, level by level: for a factor F = 2^L, level l is a 2x pass over
the frames of level l - 1 (the originals at level 1), and the last level's frames go to the writer.

A level cuts its input stream into chunks as its :class:`~.dispatch.Chunking` says: ``chunk`` pairs
(K + 1 frames, neighbours sharing the boundary frame), or where ``ramp`` is set first chunks of 1,
1, 2, 4, ... pairs up to K (:func:`chunk_end`); it submits each to its :class:`~.dispatch.Chunks`
with at most ``inflight`` outstanding, takes their middles in order from them (as they arrive,
where the processor streams them), and passes on its output stream to its :class:`Sink`: each
frame, then the middle after it. A middle sent on to the next level is a
:class:`Frame` of its image in its neighbours' pixel format, what a 2x pass would write and the next
pass read back, so that factor 4 computes exactly what two 2x passes compute.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction
from typing import Protocol

from ..media.base import Frame, matched
from ..media.frames import Picture
from .dispatch import Chunking, Chunks


def chunk_end(first: int, chunk: int, ramp: bool) -> int:
    """The pair after the chunk that starts at pair ``first``. Ramped, the chunks before pair K end
    at the powers of two (1, 2, 4, ...), so the first middle waits for one pair's payload, not K;
    from pair K on every chunk ends at a multiple of K, as unramped, so a resumed run (which starts
    at such a multiple) cuts the same chunks and the ramp costs a few frames sent twice per clip."""
    if ramp and first < chunk:
        return min(chunk, 1 << first.bit_length())
    return (first // chunk + 1) * chunk


class Item:
    """A frame of one level's stream: an original (``after`` None), or the middle ``image`` at
    ``position`` between the originals ``before`` and ``after``; ``frame`` is what the next level
    is sent (None at the last level)."""

    __slots__ = ("frame", "image", "before", "after", "position")

    def __init__(self, frame: Frame | None, image: Picture | None = None, before: Frame | None = None,
                 after: Frame | None = None, position: Fraction = Fraction(0)):
        self.frame, self.image, self.after, self.position = frame, image, after, position
        self.before = frame if before is None else before

    def between(self, other: "Item", middle: Picture, last: bool) -> "Item":
        """The middle of this item and the next, ``other``: in this item's pixel format, as a 2x
        pass would write it and the next pass read it back."""
        end = Fraction(1) if other.after is None else other.position
        position = (self.position + end) / 2
        image = matched(middle, self.frame, other.frame)
        frame = None if last else Frame(self.before.index, f"{self.before.name}+{position}", image=image)
        return Item(frame, image, self.before, other.before if other.after is None else other.after, position)


class Sink(Protocol):
    """Where a level's output stream goes: the next level, or the output."""

    def push(self, item: Item) -> None: ...

    def close(self) -> None: ...


class Level:
    """Level ``depth``: one 2x pass over the items pushed to it, its pairs counted from ``first``
    and cut as ``chunking`` says, sent to ``chunks``; its output stream handed on to ``sink``."""

    def __init__(self, depth: int, first: int, sink: Sink, chunking: Chunking, chunks: Chunks):
        self.depth, self.next_pair, self.sink, self.chunking, self.chunks = depth, first, sink, chunking, chunks
        self.last = not isinstance(sink, Level)
        self.items: list[Item] = []
        self.pending: deque = deque()
        self.end = chunk_end(first, chunking.chunk, chunking.ramp)

    def push(self, item: Item) -> None:
        self.items.append(item)
        if len(self.items) == self.end - self.next_pair + 1:
            self._submit()

    def _submit(self) -> None:
        if len(self.pending) == self.chunking.inflight:
            self._write_oldest()
        frames = [item.frame for item in self.items]
        self.pending.append((self.next_pair, self.items, self.chunks.submit(self.depth, self.next_pair, frames)))
        self.next_pair += len(self.items) - 1
        self.end = chunk_end(self.next_pair, self.chunking.chunk, self.chunking.ramp)
        self.items = self.items[-1:]

    def _write_oldest(self) -> None:
        index, items, future = self.pending.popleft()
        # Driven by the middles, so that the collector runs to its end (its checks and counts).
        for j, image in enumerate(self.chunks.collect(future, index, [item.frame for item in items])):
            self.sink.push(items[j])
            self.sink.push(items[j].between(items[j + 1], image, self.last))

    def close(self) -> None:
        if len(self.items) > 1:
            self._submit()
        while self.pending:
            self._write_oldest()
        self.sink.push(self.items[-1])
        self.sink.close()
