"""x264 in several instances, each on a segment of the video that starts with a key frame, their
packets concatenated into one stream (``--encoder-instances``; docs/video.md, "Encoder speed").

An option, not the default: the instances share the host's cores, and each segment pays its own
start (an IDR frame, the lookahead and frame threads filling) and end (draining), so one x264 with
all the cores was faster wherever measured (183 frames a second at 1080p, veryfast, on a 16-core
H200 host, against 99 for four instances on segments of 64 frames). Whether several pay on a host
with more cores than one x264's frame threads keep busy is not measured.

Each segment is a closed group of pictures (x264 starts every encoder with an IDR frame), so the
segments decode alone, and their packets, muxed in the segments' order, are one stream that decodes
to the same frames, in the same order, with the same time stamps, as one instance's. Every instance
is opened with the stream's own settings (size, pixel format, time base, frame rate, options,
flags, sample aspect ratio), so that its parameter sets (SPS and PPS) are the stream's header: an instance whose differ
is refused (:class:`Mismatch`) and the writer encodes with one instance.

Frames of a segment are queued to its instance as they come, so the writer hands a frame over and
returns while the instances encode; at most ``instances`` segments are in flight, and a segment's
packets are handed back once it and every segment before it are done.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from typing import Callable

from .encoding import open_encoder

# Frames queued behind the instances at most, all segments together (decoded 1080p frames are 3 MB
# in 4:2:0): a segment is as long as this allows, within its bounds. Short segments cost quality
# (x264's lookahead and macroblock tree stop at each end): measured against one instance on 240
# frames of bikes.mp4 at crf 18, veryfast, 4 instances: -0.06 dB PSNR at 24 frames a segment,
# -0.055 at 48, -0.02 at 96 (tests/test_segments.py).
QUEUE_BYTES = 768 << 20
SEGMENT_FRAMES = (48, 250)  # shortest and longest segment: a key frame at most every 250 frames, as x264's default
_END = object()


class Mismatch(Exception):
    """An instance's parameter sets are not the stream's header."""


def open_segments(stream, options: dict, instances: int, logger: Callable[[str], None],
                  threads: int | None = None, frames: int | None = None) -> "SegmentedEncoder | None":
    """Instances of ``stream``'s encoder (opened with ``options``, each with ``threads`` threads, by
    default :func:`instance_threads`; 0: x264's own count) on segments, or None where one instance
    will do: one asked, or an instance whose header differs (``logger`` says so). ``frames``: the
    output's frames, where known (:func:`segment_frames`)."""
    if instances <= 1:
        return None
    import av

    template = stream.codec_context
    threads = instance_threads(instances) if threads is None else threads

    def make():
        context = av.CodecContext.create(template.name, "w")
        context.width, context.height, context.pix_fmt = template.width, template.height, template.pix_fmt
        context.time_base, context.framerate, context.flags = template.time_base, template.framerate, template.flags
        for tag in ("color_range", "colorspace", "color_primaries", "color_trc"):  # the stream's colour, where it says one
            setattr(context, tag, getattr(template, tag))
        if template.sample_aspect_ratio:  # in the SPS too: anamorphic pixels
            context.sample_aspect_ratio = template.sample_aspect_ratio
        context.options, context.thread_type, context.thread_count = dict(options), "AUTO", threads
        open_encoder(context)
        return context

    try:
        encoder = SegmentedEncoder(make, template.extradata, instances, segment_frames(instances, template.width, template.height, frames))
        encoder.stream = stream
        return encoder
    except Mismatch as exc:
        logger(f"{exc}; encoding with one instance")
        return None


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def instance_threads(instances: int) -> int:
    """x264's threads in each of ``instances``: its share of the host's cores. x264's own count,
    one and a half per core in every instance, would run several times as many threads as cores."""
    return max(1, host_cores() // instances)


def segment_frames(instances: int, width: int, height: int, frames: int | None = None) -> int:
    """Frames per segment: the queue's bound shared among the instances, within :data:`SEGMENT_FRAMES`;
    where the output's ``frames`` are known and fewer, a share of them each, so that every instance
    gets a segment of a short clip (the H200's 399 frames at 480x854 in four instances made segments
    of 250 and 149: two instances busy, each on a quarter of the cores)."""
    shortest, longest = SEGMENT_FRAMES
    length = QUEUE_BYTES // (instances * max(1, width * height * 3 // 2))
    if frames:
        length = min(length, -(-frames // instances))
    return max(shortest, min(longest, length))


class _Segment:
    """One instance of the encoder on a thread of its own, fed from a queue."""

    def __init__(self, context, index: int):
        self.context, self.packets, self.error = context, [], None
        self.frames = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"eden-x264-{index}", daemon=True)
        self._thread.start()

    def put(self, frame) -> None:
        self.frames += 1
        self._queue.put(frame)

    def close(self) -> None:
        """No more frames: the instance flushes its own (beside the others) and ends."""
        self._queue.put(_END)

    def _run(self) -> None:
        while True:
            frame = self._queue.get()
            try:
                if self.error is None:
                    self.packets.extend(self.context.encode(None if frame is _END else frame))
            except BaseException as exc:  # raised in the writer's thread when the segment is collected
                self.error = exc
            if frame is _END:
                return

    def finish(self) -> list:
        """The segment's packets, once its instance has flushed them (after :meth:`close`)."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.packets

    def stop(self) -> None:
        self.error = self.error or _Stopped()  # the frames still queued are skipped
        self.close()
        self._thread.join()


class _Stopped(Exception):
    pass


class SegmentedEncoder:
    """``encode(frame)`` as a stream's: the packets ready so far (the finished segments', in
    order), and with None the rest. ``make()`` opens a new instance with the stream's settings;
    ``header``: the stream's parameter sets, which every instance must repeat."""

    def __init__(self, make: Callable[[], object], header: bytes | None, instances: int, frames: int):
        self.make, self.header, self.instances, self.length = make, header, instances, frames
        self.stream = None  # the output stream the packets are muxed into, where one is
        self.flight: deque[_Segment] = deque()
        self.opened = 0
        self.last_dts: int | None = None
        self._open()  # the first instance's header checked now, before any frame

    def _open(self) -> None:
        context = self.make()
        if (context.extradata or None) != (self.header or None):
            raise Mismatch("an x264 instance's parameter sets differ from the stream's header")
        self.flight.append(_Segment(context, self.opened))
        self.opened += 1

    def encode(self, frame) -> list:
        if frame is None:
            self.flight[-1].close()
            return self._collect(len(self.flight))
        ready = []
        if self.flight[-1].frames >= self.length:
            self.flight[-1].close()
            if len(self.flight) >= self.instances:
                ready = self._collect(1)
            self._open()
        self.flight[-1].put(frame)
        return ready

    def _collect(self, count: int) -> list:
        packets = []
        for _ in range(count):
            packets.extend(self._monotonic(self.flight.popleft().finish()))
        return packets

    def _monotonic(self, packets: list) -> list:
        """The segment's decoding times after the last segment's: each instance starts its clock
        its reordering delay before its first frame, which under a variable frame rate can reach
        back before the previous segment's last packet. Moved up by as little as needed, never past
        a packet's own presentation time."""
        for packet in packets:
            if self.stream is not None:
                packet.stream = self.stream
            if self.last_dts is not None and packet.dts is not None and packet.dts <= self.last_dts:
                if packet.pts is not None and self.last_dts + 1 > packet.pts:
                    raise Mismatch("a segment's decoding times cannot follow the previous segment's")
                packet.dts = self.last_dts + 1
            if packet.dts is not None:
                self.last_dts = packet.dts
        return packets

    def close(self) -> None:
        """Stop every instance (a run that failed or was stopped: their packets are dropped)."""
        while self.flight:
            self.flight.popleft().stop()
