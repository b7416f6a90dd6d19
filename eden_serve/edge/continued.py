"""A stream's decoder kept between its chunks, where the edge decodes in its own process (a payload
its cloud signed, or the cloud in the same process): each bitstream payload starts at the key frame
at or before its chunk, so chunk c of a long GOP would decode every packet of chunks 0 to c again.
Kept, the decoder of chunk c goes on with the packets of chunk c + 1 that it has not decoded.

A payload goes on from a kept decoder only where the packets that decoder was fed are, one by one
(their bytes and times), the payload's first packets, and the frames the chunk needs are still to
come from it (chunks ask for frames forward). Otherwise it is decoded from its key frame. The
cloud ends a chunk's packets a few past its last frame (the stream's
reordering, :attr:`~eden_serve.media.packets.PacketReader.reorder`), so that the decoder gives all
of the chunk's frames without being told the packets ended, which would end it. A chunk's frames
are those its payload's time stamps name (:func:`~eden_serve.sandbox.decoder.first_shown`), and
every frame is still checked against the cloud's digest of it (409 where one differs).

Requests for one stream take turns on its decoder, the earliest chunk first
(:class:`~eden_serve.sandbox.kept.Turns`). The sandbox keeps a stream's decoder likewise, in a
kept child (:mod:`eden_serve.media.sandboxed`), through the same :mod:`eden_serve.sandbox.kept`.
"""

from __future__ import annotations

import numpy as np

from ..sandbox.decoder import Stream, decode, first_shown, pixel_dtype
from ..sandbox.kept import Going, Kept, Turns, mark, pixels_of, stream_key

KEPT_STREAMS = 4  # decoders kept, the least recently used let go: each holds its reference frames
WAIT_S = 30.0  # the longest a request waits for another on the same stream before decoding on its own


class Continuations:
    """The decoders kept in this process, by stream (its parameters and its key frame's packet)."""

    def __init__(self, most: int = KEPT_STREAMS, wait_s: float = WAIT_S):
        self.turns = Turns(most, wait_s)
        self.continued = 0  # payloads that went on from a kept decoder
        self.decoded = 0  # packets decoded (or left out as unreferenced), over every payload

    def decode(self, parameters, packets: list, skip: int, count: int, max_pixels: int | None = None) -> np.ndarray:
        """What :func:`~eden_serve.sandbox.decoder.decode` gives for these arguments, from a kept
        decoder where one can go on to it."""
        first = first_shown(packets, skip)
        if first is None:  # the frames are then counted, not named by time: nothing to go on from
            return decode(parameters, packets, skip, count, max_pixels)
        marks = [mark(p) for p in packets]
        key = stream_key(parameters, marks)
        turn, kept = self.turns.take(key, first)
        try:
            if kept is None or not kept.continues(marks, first):
                kept = Kept(Going(Stream(parameters, packets, max_pixels)))
            else:
                self.continued += 1
            going: Going = kept.decoder
            fed = going.stream.fed
            taken = going.take(packets, first, count)
            self.decoded += going.stream.fed - fed
            kept.marks, kept.since = marks[: going.stream.fed], going.since
            # The chunk's last frame is the next chunk's first, held for it: converted while this
            # request has the turn. PyAV converts a frame through a converter kept on the frame, and
            # two threads converting one frame at once hang in swscale's slice threads for ever.
            pixels = np.empty((count, parameters.height, parameters.width, 3), pixel_dtype(parameters.pix_fmt))
            pixels_of(taken[count - 1:], parameters, pixels[count - 1:])
        except BaseException:
            kept = None
            raise
        finally:
            if turn:
                self.turns.give(key, None if kept is None or kept.decoder.stream.drained else kept)
        pixels_of(taken[: count - 1], parameters, pixels[: count - 1])
        return pixels
