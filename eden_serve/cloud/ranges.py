"""A source's range decoded by time stamp, from the key frame at or before it, or on from where the
same file's range before left its decoder (:class:`Cursor`): a client asks a clip's ranges in
order, and each would otherwise decode again every frame from its key frame. A cursor goes on
only where that decodes no more than a seek would (its frames stand at or after the range's key
frame) and the range's frames are still to come from it (ranges go forward); otherwise the range
seeks, as it always did. A worker keeps the cursors of its :data:`CURSORS_KEPT` latest files, by
the file's identity (device, inode, size and modification time).

Pictures shown before the range that no other picture references (H.264's, HEVC's) are left
undecoded, as the edge leaves them (:data:`~eden_serve.sandbox.decoder.SKIPS_UNREFERENCED`): the
range's pictures are the same without them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Iterator

from ..media.containers import main_video
from ..media.encoding import import_av
from ..media.steady import SteadyDecoder
from ..sandbox.decoder import SKIPS_UNREFERENCED

CURSORS_KEPT = 2  # files whose decoder a cloud worker keeps open: each holds its reference frames and threads


class Cursor:
    """A file's container and decoder, where its last range ended."""

    def __init__(self, container, seek: int | None):
        """Decoding from the key frame the demuxer seeks to at or before ``seek`` (None: the start)."""
        self.container = container
        self.error = import_av().error.FFmpegError
        self.stream = main_video(container, "")
        self.stream.thread_type = "AUTO"
        if seek is not None:
            container.seek(seek, stream=self.stream, backward=True)
        self.packets = container.demux(self.stream)
        self.decoder = SteadyDecoder(self.stream.codec_context)  # a damaged GOP's frames as a local run's reading gives them
        self.since: int | None = None  # the last range's last time stamp: no frame before it can come any more
        self.held: list = []  # frames given at or after ``since``, in display order
        self.ended = False  # the demuxer ran out, and the decoder was drained: it can give no more
        self.decoded = 0  # pictures the decoder gave for the last range, up to its last

    def reaches(self, seek: int | None, first: int) -> bool:
        """Whether a range from time stamp ``first``, whose key frame is at ``seek`` (None: the
        file's start), can go on from here at no more cost than from its key frame."""
        return self.since is not None and not self.ended and first >= self.since and (seek is None or seek <= self.since)

    def read(self, wanted: list[int], counted: Callable[[], None]) -> dict:
        """The frames of the time stamps ``wanted`` (ascending) that come, by time stamp, as the
        decoder goes on; ``counted()`` once for each packet read that is shown up to the last."""
        given = {frame.pts: frame for frame in self.held if frame.pts in wanted}
        # Frames held past the range: the decoder gave every frame of it before them (several at
        # once where it holds some back, media/steady.py), so none is to come.
        later = [frame for frame in self.held if frame.pts is not None and frame.pts > wanted[-1]]
        self.decoded = 0
        for frames in [] if later else self._frames(wanted, counted):
            for frame in frames:
                if frame.pts is not None and frame.pts > wanted[-1]:
                    later.append(frame)  # the next range's: every frame of the packet is kept
                    continue
                self.decoded += 1
                if frame.pts in wanted:
                    given.setdefault(frame.pts, frame)
            if later:
                break
        self.since = wanted[-1]
        self.held = ([given[wanted[-1]]] if wanted[-1] in given else []) + later
        return given

    def _frames(self, wanted: list[int], counted: Callable[[], None]) -> Iterator[list]:
        """The frames the decoder gives for each packet read, as a list (a packet may give none, or
        several), the unreferenced pictures shown before ``wanted[0]`` left out."""
        context = self.stream.codec_context
        skips = context.name in SKIPS_UNREFERENCED
        while True:
            try:
                packet = next(self.packets)
            except StopIteration:
                break
            except self.error:  # a demuxer that fails ends the stream there, as a local run's reading ends it: drained
                packet = None
            if packet is None or not packet.size:  # the demuxer's empty packet at the end drains the decoder
                self.ended = True
            else:
                if packet.pts is None or packet.pts <= wanted[-1]:
                    counted()
                if skips:  # frame threads take the context's skip_frame with each packet submitted
                    context.skip_frame = "NONREF" if packet.pts is not None and packet.pts < wanted[0] else "DEFAULT"
            # A damaged packet left behind, as a local run's reading leaves it (media/damage.py).
            yield self.decoder.decode(packet, shown=not skips or packet is None or packet.pts is None or packet.pts >= wanted[0])
            if packet is None:
                break
        self.ended = True

    def close(self) -> None:
        self.container.close()


class Cursors:
    """The cursors a worker keeps, by file, the least recently used closed first."""

    def __init__(self, most: int = CURSORS_KEPT):
        self.most = most
        self._kept: OrderedDict[tuple, Cursor] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: tuple, seek: int | None, first: int) -> Cursor | None:
        """The file's cursor, where it :meth:`~Cursor.reaches` the range (one that does not is closed)."""
        with self._lock:
            cursor = self._kept.pop(key, None)
        if cursor is not None and not cursor.reaches(seek, first):
            cursor.close()
            return None
        return cursor

    def give(self, key: tuple, cursor: Cursor) -> None:
        with self._lock:
            self._kept[key] = cursor
            evicted = [self._kept.popitem(last=False)[1] for _ in range(len(self._kept) - self.most)]
        for old in evicted:
            old.close()

    def clear(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
        for cursor in kept:
            cursor.close()


CURSORS = Cursors()
