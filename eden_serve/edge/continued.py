"""A stream's decoder kept between its chunks, where the edge decodes in its own process (a payload
its cloud signed, or the cloud in the same process): each bitstream payload starts at the key frame
at or before its chunk, so chunk c of a long GOP would decode every packet of chunks 0 to c again.
Kept, the decoder of chunk c goes on with the packets of chunk c + 1 that it has not decoded.

A payload goes on from a kept decoder only where the packets that decoder was fed are, one by one
(their bytes and times), the payload's first packets, and the frames the chunk needs are still to
come from it (chunks ask for frames forward). Otherwise it is decoded from its key frame, as the
sandbox always decodes. The cloud ends a chunk's packets a few past its last frame (the stream's
reordering, :attr:`~eden_serve.media.packets.PacketReader.reorder`), so that the decoder gives all
of the chunk's frames without being told the packets ended, which would end it. A chunk's frames
are those its payload's time stamps name (:func:`~eden_serve.sandbox.decoder.first_shown`), and
every frame is still checked against the cloud's digest of it (409 where one differs).

Requests for one stream take turns on its decoder, the earliest chunk first: the served edge opens
the requests in flight at once, and chunk c + 1 waiting for chunk c's few frames costs less than
decoding all of c's again.
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import CodecError
from ..sandbox.decoder import Stream, decode, first_shown, pixel_dtype, rgb

KEPT_STREAMS = 4  # decoders kept, the least recently used let go: each holds its reference frames
WAIT_S = 30.0  # the longest a request waits for another on the same stream before decoding on its own


def mark(packet) -> bytes:
    """A packet's identity: its bytes, times and key flag."""
    digest = hashlib.blake2b(packet.data, digest_size=16)
    digest.update(f"{packet.pts},{packet.dts},{int(packet.key)}".encode())
    return digest.digest()


@dataclass
class Kept:
    """A decoder part-way through a stream, and the frames it gave that a later chunk may need."""

    stream: Stream
    marks: list[bytes] = field(default_factory=list)  # of the packets fed, from the key frame
    held: list = field(default_factory=list)  # frames given at or after ``since``, in display order
    since: int | None = None  # the time stamp before which no frame can be given any more

    def continues(self, marks: list[bytes], first: int) -> bool:
        fed = len(self.marks)
        return fed <= len(marks) and marks[:fed] == self.marks and (self.since is None or first >= self.since)


class Continuations:
    """The decoders kept in this process, by stream (its parameters and its key frame's packet)."""

    def __init__(self, most: int = KEPT_STREAMS, wait_s: float = WAIT_S):
        self.most, self.wait_s = most, wait_s
        self._kept: collections.OrderedDict[tuple, Kept] = collections.OrderedDict()
        self._busy: set[tuple] = set()
        self._waiting: dict[tuple, list[int]] = collections.defaultdict(list)
        self._turns = threading.Condition()
        self.continued = 0  # payloads that went on from a kept decoder
        self.decoded = 0  # packets decoded (or left out as unreferenced), over every payload

    def decode(self, parameters, packets: list, skip: int, count: int, max_pixels: int | None = None) -> np.ndarray:
        """What :func:`~eden_serve.sandbox.decoder.decode` gives for these arguments, from a kept
        decoder where one can go on to it."""
        first = first_shown(packets, skip)
        if first is None:  # the frames are then counted, not named by time: nothing to go on from
            return decode(parameters, packets, skip, count, max_pixels)
        marks = [mark(p) for p in packets]
        key = (repr(parameters), marks[0])
        turn, kept = self._take(key, first)
        try:
            if kept is None or not kept.continues(marks, first):
                kept = Kept(Stream(parameters, packets, max_pixels))
            else:
                self.continued += 1
            fed = kept.stream.fed
            taken = self._frames(kept, packets, marks, first, count)
            self.decoded += kept.stream.fed - fed
        except BaseException:
            kept = None
            raise
        finally:
            if turn:
                self._give(key, kept)
        pixels = np.empty((count, parameters.height, parameters.width, 3), pixel_dtype(parameters.pix_fmt))
        for i, frame in enumerate(taken):
            pixels[i] = rgb(frame)
        return pixels

    @staticmethod
    def _frames(kept: Kept, packets: list, marks: list[bytes], first: int, count: int) -> list:
        """The chunk's ``count`` frames from ``first`` on: those held, then the decoder's as it is fed
        the payload's packets it has not had, one at a time (a packet's frames all kept: the next
        chunk's among them), and told the end only where they run out before the chunk's last."""
        stream = kept.stream
        given = [frame for frame in kept.held if frame.pts >= first]
        while len(given) < count and stream.fed < len(packets):
            given += [frame for frame, _ in stream.frames(packets[: stream.fed + 1], first, drain=False) if frame.pts >= first]
        if len(given) < count:
            given += [frame for frame, _ in stream.frames(packets, first) if frame.pts >= first]
        if len(given) < count:
            raise CodecError(f"malformed payload: its packets show {stream.shown} frames from the key frame on, fewer than "
                             f"the frames skipped and {count} declared")
        kept.marks = marks[: stream.fed]
        kept.held, kept.since = given[count - 1:], given[count - 1].pts  # the next chunk starts at this chunk's last frame
        return given[:count]

    def _take(self, key: tuple, first: int) -> tuple[bool, Kept | None]:
        """Whether this request has the stream's turn (not where it waited :attr:`wait_s` in vain),
        and the stream's kept decoder, taken for the turn."""
        deadline = time.monotonic() + self.wait_s
        with self._turns:
            self._waiting[key].append(first)
            try:
                while key in self._busy or first != min(self._waiting[key]):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._turns.wait(left)
            finally:
                self._waiting[key].remove(first)
                if not self._waiting[key]:
                    del self._waiting[key]
            if key in self._busy:
                return False, None
            self._busy.add(key)
            return True, self._kept.pop(key, None)

    def _give(self, key: tuple, kept: Kept | None) -> None:
        with self._turns:
            self._busy.discard(key)
            if kept is not None and not kept.stream.drained:
                self._kept[key] = kept
                while len(self._kept) > self.most:
                    self._kept.popitem(last=False)
            self._turns.notify_all()
