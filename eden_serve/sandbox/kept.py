"""A stream's decoder kept between the payloads of its chunks: in the edge's own process
(:mod:`eden_serve.edge.continued`) and in a kept sandbox child (:mod:`eden_serve.media.sandboxed`).
Each bitstream payload starts at the key frame at or before its chunk, so chunk c of a long GOP
would decode every packet of chunks 0 to c again; kept, the decoder of chunk c goes on with the
packets of chunk c + 1 that it has not had.

A payload goes on from a kept decoder only where the packets that decoder had are, one by one
(:func:`mark`: their bytes, times and key flag), the payload's first packets, and the frames the
chunk needs are still to come from it (:meth:`Kept.continues`). :class:`Turns` holds the kept
decoders by stream, a bounded number, and has the requests for one stream take turns on its
decoder, the earliest chunk first. :data:`decode` is the decoder of a sandbox child, which decodes
one stream over its life. Nothing here imports PyTorch.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import CodecError
from .decoder import Stream, decode as decode_whole, first_shown, pixel_dtype, rgb


def mark(packet) -> bytes:
    """A packet's identity: its bytes, times and key flag."""
    digest = hashlib.blake2b(packet.data, digest_size=16)
    digest.update(f"{packet.pts},{packet.dts},{int(packet.key)}".encode())
    return digest.digest()


def stream_key(parameters, marks: list[bytes]) -> tuple:
    """A stream's identity: its parameters and its key frame's packet."""
    return repr(parameters), marks[0]


class Going:
    """A decoder part-way through a stream, and the frames it gave that a later chunk may need."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self.held: list = []  # frames given at or after ``since``, in display order
        self.since: int | None = None  # the time stamp before which no frame can be given any more

    def take(self, packets: list, first: int, count: int) -> list:
        """The chunk's ``count`` frames from ``first`` on: those held, then the decoder's as it is fed
        the payload's packets it has not had, one at a time (a packet's frames all kept: the next
        chunk's among them), and told the end only where they run out before the chunk's last."""
        stream = self.stream
        if stream.drained or (self.since is not None and first < self.since):
            raise CodecError("malformed payload: it goes on from a decoder that is past its frames")
        given = [frame for frame in self.held if frame.pts >= first]
        while len(given) < count and stream.fed < len(packets):
            given += [frame for frame, _ in stream.frames(packets[: stream.fed + 1], first, drain=False) if frame.pts >= first]
        if len(given) < count:
            given += [frame for frame, _ in stream.frames(packets, first) if frame.pts >= first]
        if len(given) < count:
            raise CodecError(f"malformed payload: its packets show {stream.shown} frames from the key frame on, fewer than "
                             f"the frames skipped and {count} declared")
        self.held, self.since = given[count - 1:], given[count - 1].pts  # the next chunk starts at this chunk's last frame
        return given[:count]


def pixels_of(frames: list, parameters, out: np.ndarray | None = None) -> np.ndarray:
    """``frames`` as RGB [count, H, W, 3] of :func:`~.decoder.pixel_dtype` (into ``out``, where
    given), each let go of once converted: PyAV keeps a converter on each frame converted, with
    swscale's threads, so that the frames of a chunk held at once would pass a sandbox child's
    tasks (confine.MAX_TASKS)."""
    if out is None:
        out = np.empty((len(frames), parameters.height, parameters.width, 3), pixel_dtype(parameters.pix_fmt))
    for i in range(len(frames)):
        out[i], frames[i] = rgb(frames[i]), None
    return out


def last_shown(packets: list, first: int, count: int) -> int | None:
    """The time stamp of a chunk's last frame, ``count`` frames from ``first`` on: where a decoder that
    gave the chunk can go on from (None: the packets show fewer)."""
    shown = sorted(packet.pts for packet in packets if packet.pts >= first)
    return shown[count - 1] if 0 < count <= len(shown) else None


@dataclass(eq=False)
class Kept:
    """A stream's decoder kept between payloads (a :class:`Going` in this process, a child in the
    sandbox), with the packets it had and the first frame it can still give."""

    decoder: object
    marks: list[bytes] = field(default_factory=list)  # of the packets it had, from the key frame
    since: int | None = None
    used: float = field(default_factory=time.monotonic)

    def continues(self, marks: list[bytes], first: int) -> bool:
        had = len(self.marks)
        return had <= len(marks) and marks[:had] == self.marks and (self.since is None or first >= self.since)


class Turns:
    """The decoders kept, by stream, the ``most`` recently used (those let go, and those idle over
    ``idle_s``, are handed to ``end``); requests for one stream take turns on its decoder, the
    earliest chunk first: the served edge opens the requests in flight at once, and chunk c + 1
    waiting for chunk c's few frames costs less than decoding all of c's again. A request waits
    ``wait_s`` at most, then decodes on its own."""

    def __init__(self, most: int, wait_s: float, idle_s: float | None = None, end=None):
        self.most, self.wait_s, self.idle_s, self.end = most, wait_s, idle_s, end
        self.kept: collections.OrderedDict[tuple, Kept] = collections.OrderedDict()
        self._busy: set[tuple] = set()
        self._waiting: dict[tuple, list[int]] = collections.defaultdict(list)
        self._turns = threading.Condition()

    def take(self, key: tuple, first: int) -> tuple[bool, Kept | None]:
        """Whether this request has the stream's turn (not where it waited in vain), and the stream's
        kept decoder, taken for the turn."""
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
            kept = self.kept.pop(key, None)
            gone = self._idle()
        self._end(gone)
        return True, kept

    def give(self, key: tuple, kept: Kept | None) -> None:
        """Ends the turn, keeping ``kept`` (None: nothing to keep) as the stream's decoder."""
        with self._turns:
            self._busy.discard(key)
            if kept is not None:
                kept.used = time.monotonic()
                self.kept[key] = kept
            gone = [self.kept.popitem(last=False)[1] for _ in range(len(self.kept) - self.most)] + self._idle()
            self._turns.notify_all()
        self._end(gone)

    def close(self) -> None:
        """Lets go of every decoder kept."""
        with self._turns:
            gone, self.kept = list(self.kept.values()), collections.OrderedDict()
        self._end(gone)

    def _idle(self) -> list[Kept]:
        if self.idle_s is None:
            return []
        since = time.monotonic() - self.idle_s
        return [self.kept.pop(key) for key in [key for key, kept in self.kept.items() if kept.used < since]]

    def _end(self, gone: list[Kept]) -> None:
        for kept in gone if self.end is not None else ():
            self.end(kept)


class Continued:
    """:func:`~.decoder.decode` for a sandbox child, which decodes one stream over its life: a
    payload whose first packets come without their data (``None``: this process was sent them for
    an earlier payload, :mod:`.zygote`) goes on from the decoder that had them; any other is
    decoded from its key frame by a new decoder."""

    def __init__(self):
        self.going: Going | None = None
        self.packets: list = []  # every packet sent, from the key frame; those decoded without their data

    def __call__(self, parameters, packets: list, skip: int, count: int, max_pixels: int | None = None,
                 out: np.ndarray | None = None) -> np.ndarray:
        had = sum(1 for _ in itertools.takewhile(lambda packet: packet.data is None, packets))
        first = first_shown(packets, skip)
        if not had:
            self.going, self.packets = None, []
            if first is None:  # the frames are then counted, not named by time: nothing to go on from
                return decode_whole(parameters, packets, skip, count, max_pixels, out)
            self.going = Going(Stream(parameters, packets, max_pixels))
        elif self.going is None or first is None or had != len(self.packets):
            raise CodecError("malformed payload: it goes on from packets this decoder was not sent")
        self.packets += packets[had:]
        frames = self.going.take(self.packets, first, count)
        for packet in self.packets[: self.going.stream.fed]:
            packet.data = None  # decoded: their bytes are not needed again
        return pixels_of(frames, parameters, out)


decode = Continued()  # this process's: a sandbox child's one stream
