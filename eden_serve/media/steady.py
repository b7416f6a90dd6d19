"""A video stream's decoder whose frames are the same on every run, whatever its threads.

FFmpeg's frame threads decode an undamaged stream bit for bit as one thread does, at their count's
speed; past damage they do not: what a frame after a refused or concealed picture holds depends on
the threads' count and timing (an H.264 P-frame concealed one way on 1 or 2 threads and another on
3 or more; an FFV1 GOP after a refused frame, differently from run to run). So the decoder holds
the packets from the key frame of the oldest GOP not yet given, and where damage is met (a packet
refused, a frame marked corrupt, a frame left out or given out of order) that GOP is decoded again
from its key frame by a decoder without threads, the frames already given left out. That decoder
goes on to the next key frame, where the threaded one, flushed as for a seek, takes over: it gives
the frames from that key frame on, which a key frame's decoding does not need the pictures before
it for; the pictures shown before it (an open GOP's leading pictures, which reference the damaged
GOP) still come from the decoder without threads. A damaged GOP's frames are then those of one
thread from its key frame, which a cloud's range read from a seek there gives too
(:mod:`eden_serve.cloud.ranges`). After a packet it refuses, the frames of the later packets to
the next key frame are left out (lost): they are made of the picture it left half made.

Undamaged, it costs no decoding: the threaded decoder alone, the packets since the key frame held
(at most :data:`HELD_BYTES`; a longer GOP is read on as before, on frame threads), and a stream
without time stamps, whose frames cannot be told apart by them, is read on as before too."""

from __future__ import annotations

import heapq

from .encoding import import_av

# Decoders whose frame threads may change a frame decoded beside one they refuse, before they tell
# of it (FFV1's, on 3 threads and more: the frame before a refused one, 2 runs in 60; frames before
# it on 8): their frames are given once as many packets after them as there are threads decoded whole.
BESIDE = frozenset({"ffv1"})
HELD_BYTES = 64 << 20  # a GOP's packets kept for decoding it again (about 10 s of 4K HEVC at 50 Mbit/s)
COPIED = ("width", "height", "pix_fmt", "codec_tag", "bits_per_coded_sample", "color_range", "colorspace",
          "color_primaries", "color_trc", "sample_aspect_ratio")


def alone(context):
    """A decoder without threads like ``context``: its codec, extradata and what the container
    tells a decoder (as a cloud source's client makes its decoder, client/remote.py)."""
    av = import_av()
    made = av.CodecContext.create(context.codec, "r")
    made.extradata = context.extradata or None
    for name in COPIED:
        try:
            value = getattr(context, name)
            if value is not None:
                setattr(made, name, value)
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
            continue  # not stated, or not held by this codec's context
    made.thread_type, made.thread_count = "NONE", 1
    return made


class SteadyDecoder:
    """``context`` (opened on frame threads, or to be) made steady: :meth:`decode` as
    ``context.decode``, but a packet refused is not raised: its time stamp is added to
    :attr:`refused`."""

    def __init__(self, context):
        self.context = context
        self.error = import_av().error.FFmpegError
        self.refused: list[int | None] = []  # packets (time stamps) refused by the decoder whose frames are given
        self.steady = not getattr(context, "is_hwaccel", False)  # a GPU's decoder runs on no frame threads
        # Packets from the key frame of the oldest GOP whose frames are not all given, in decode order
        # (None: over HELD_BYTES, or a stream without time stamps): a frame-threaded decoder tells of
        # damage as many packets late as it has threads, after a key frame it may have been given.
        self.gop: list | None = []
        self.held = 0
        self.given: set[int] = set()  # time stamps of the frames given of the GOPs held
        self.last: int | None = None  # the time stamp of the last frame given
        self.ahead: list[int] = []  # time stamps sent to the threaded decoder that no frame given has passed
        self.untimed = False
        self.lone = None  # the decoder without threads, from damage to the next key frame's leading pictures
        self.key: int | None = None  # handing back to the threaded decoder at this key frame's time stamp
        self.waiting: list = []  # the threaded decoder's frames from that key frame on, given after the leading ones
        self.time_base = None
        self.seen: int | None = None  # the time stamp of the threaded decoder's last frame
        # Its frames not yet given: a frame is given once every picture decoded before it has come out
        # whole (a B-frame shown before the P-frame it references, decoded after it, waits for that
        # P-frame's mark), and for :data:`BESIDE`'s decoders once as many frames as threads follow it.
        self.behind: list = []
        self.reach: dict[int, int] = {}  # time stamp -> the latest time stamp of the packets sent up to its own
        self.sent_latest: int | None = None  # the latest time stamp of the packets sent to the threaded decoder
        # After a packet it refused, the decoder without threads gives frames made of the picture it
        # left half made, whose other half is what its memory held (FFV1's: not the same twice in one
        # process): only the frames of the packets sent before it are given, to the next key frame's.
        self.sent: set[int] = set()  # time stamps of the packets sent to it
        self.sound: set[int] | None = None
        self.sound_from: int | None = None

    def decode(self, packet, shown: bool = True) -> list:
        """The frames given for ``packet`` (None, or an empty packet: the end, every decoder drained);
        ``shown`` False: its picture may be left out as asked (``skip_frame``), not as damage."""
        if not self.steady:
            try:
                return self.context.decode(packet)
            except self.error:
                self.refused.append(getattr(packet, "pts", None))
                return []
        if packet is None or not packet.size:
            return self._end(packet)
        self.time_base = packet.time_base or self.time_base
        self.untimed = self.untimed or packet.pts is None
        out: list = []
        if self.key is not None and (packet.is_keyframe or packet.pts is None or packet.pts >= self.key):
            out += self._handed_back()
        if packet.is_keyframe:
            if self.lone is not None:
                out += self._hand_back(packet.pts)
        self._hold(packet)
        if self.key is not None:  # a leading picture of the key frame handed back at, or the key frame itself
            leading = packet.pts is not None and packet.pts < self.key
            out += self._give([f for f in self._alone(packet, counted=leading) if f.pts is not None and f.pts < self.key])
            frames, damaged = self._threaded(packet, shown)
            if damaged is None:
                self.waiting += frames
                return out
            self.waiting = []  # made again, with the frames before the damaged one
            out += self._handed_back()
            return out + self._replay()
        if self.lone is not None:
            return out + self._give(self._alone(packet))
        return out + self._threaded_given(packet, shown)

    def _threaded_given(self, packet, shown: bool = True) -> list:
        """The threaded decoder's frames for ``packet`` up to the first damaged, then the GOP's again without threads."""
        frames, damaged = self._threaded(packet, shown)
        if damaged is None:
            return self._behind(frames)
        if self.gop is None:  # not held: read on as before
            if damaged == len(frames) and packet is not None and packet.size:
                self.refused.append(packet.pts)
            return self._behind(frames)
        return self._replay()  # the frames held behind, and those before the damaged one, given again without threads

    def _behind(self, frames: list) -> list:
        """The threaded decoder's ``frames``, after those held :attr:`behind`, as far as they may be given."""
        self.behind += frames
        depth = max(self.context.thread_count, 1) if self.context.name in BESIDE else 0
        out = 0
        while len(self.behind) - out > depth:
            frame = self.behind[out]
            if frame.pts is not None and self.seen is not None and self.reach.get(frame.pts, frame.pts) > self.seen:
                break
            out += 1
        given, self.behind = self.behind[:out], self.behind[out:]
        if given and given[-1].pts is not None:
            self.reach = {pts: latest for pts, latest in self.reach.items() if pts > given[-1].pts}
        return self._give(given, again=False)

    def _hold(self, packet) -> None:
        if packet.is_keyframe:
            if self.gop is None:
                self.gop, self.held = [], 0
            self._prune()
        if self.gop is None or self.untimed:  # no time stamps to tell the frames given by: read on as before
            self.gop = None
            return
        self.held += packet.size
        self.gop.append(packet)
        if self.held > HELD_BYTES:
            self.gop, self.given = None, set()

    def _prune(self) -> None:
        """The GOPs held whose frames are all given, or passed, let go of."""
        keys = [at for at, packet in enumerate(self.gop) if packet.is_keyframe]
        while len(keys) > 1:
            if self.last is None or any(p.pts > self.last for p in self.gop[:keys[1]] if not p.is_discard):
                break
            for packet in self.gop[:keys[1]]:
                self.held -= packet.size
                self.given.discard(packet.pts)
            self.gop = self.gop[keys[1]:]
            keys = [at - keys[1] for at in keys[1:]]

    def _threaded(self, packet, shown: bool = True) -> tuple[list, int | None]:
        """The threaded decoder's frames for ``packet`` (None: drained), those before a key frame
        handed back at left out, and the place of the first damaged among them (len(frames) where
        the decoder refused it; None: none damaged)."""
        timed = packet is not None and packet.size and packet.pts is not None
        if timed and shown and not packet.is_discard and (self.key is None or packet.pts >= self.key):
            heapq.heappush(self.ahead, packet.pts)
        if timed:
            self.sent_latest = packet.pts if self.sent_latest is None else max(self.sent_latest, packet.pts)
            self.reach[packet.pts] = self.sent_latest
        try:
            frames = self.context.decode(packet)
        except self.error:
            return [], 0
        if self.key is not None:  # its leading pictures, decoded without the pictures before: the other decoder's
            frames = [f for f in frames if f.pts is not None and f.pts >= self.key]
        last = self.seen
        for at, frame in enumerate(frames):
            left_out = False
            if frame.pts is not None and not self.untimed:
                while self.ahead and self.ahead[0] <= frame.pts:
                    left_out = heapq.heappop(self.ahead) < frame.pts or left_out
            if frame.is_corrupt or left_out or (frame.pts is not None and last is not None and frame.pts < last):
                return frames, at
            last = frame.pts if frame.pts is not None else last
        self.seen = last
        return frames, None

    def _alone(self, packet, counted: bool = True) -> list:
        """The decoder without threads' frames for ``packet`` (None: drained); ``counted``: a packet
        it refuses is counted as refused (it gives the frames of it), and the frames of the packets
        from it on are left out to the next key frame's (:attr:`sound`)."""
        try:
            if packet is not None and packet.pts is not None:
                self.sent.add(packet.pts)
                if packet.is_keyframe and self.sound is not None:  # its frames on are sound again; its leading ones not
                    self.sound_from = packet.pts if self.sound_from is None else self.sound_from
            frames = self.lone.decode(packet)
        except self.error:
            if packet is not None and counted:
                self.refused.append(packet.pts)
                self.sound = set(self.sent) - {packet.pts} if self.sound is None else self.sound
            return []
        for frame in frames:
            if frame.time_base is None:  # drained: PyAV times a frame by the packet it was given with
                frame.time_base = self.time_base
        return [f for f in frames if self.sound is None or f.pts in self.sound or (
            self.sound_from is not None and f.pts is not None and f.pts >= self.sound_from)]

    def _replay(self) -> list:
        """The GOP of the first packet whose frame is not given, decoded again from its key frame
        without threads, and the packets held after it, the frames given left out. That packet is
        the same whatever the threads and however late they tell of the damage (a frame is given
        only once the pictures decoded before it have come out whole: :meth:`_behind`), so the
        decoding starts where a cloud's range read from a seek to that key frame starts too."""
        self._prune()
        first = next((at for at, p in enumerate(self.gop) if p.pts is not None and not p.is_discard
                      and (self.last is None or p.pts > self.last)), len(self.gop) - 1)
        start = max((at for at, p in enumerate(self.gop[:first + 1]) if p.is_keyframe), default=0)
        self.lone, self.sent, self.sound, self.sound_from = alone(self.context), set(), None, None
        self._flush()
        out: list = []
        for packet in self.gop[start:]:
            out += self._alone(packet)
        return self._give(out)

    def _flush(self) -> None:
        """The threaded decoder flushed, as for a seek, and what was noted of its frames let go of."""
        self.context.flush_buffers()
        self.ahead, self.behind, self.reach, self.sent_latest, self.seen = [], [], {}, None, None

    def _hand_back(self, key: int | None) -> list:
        """At the key frame timed ``key``: the threaded decoder, flushed, decodes from it on; where
        it has no time to tell its leading pictures by, the decoder without threads is drained here."""
        self._flush()
        if key is not None:
            self.key = key
            return []
        out = self._give(self._alone(None))
        self.lone, self.sound, self.sound_from = None, None, None
        return out

    def _handed_back(self) -> list:
        """The key frame's leading pictures, the decoder without threads drained, then the threaded decoder's frames."""
        out = [f for f in self._alone(None, counted=False) if f.pts is not None and f.pts < self.key]
        waiting, self.lone, self.key, self.waiting = self.waiting, None, None, []
        self.sound = self.sound_from = None
        return self._give(out) + self._behind(waiting)

    def _give(self, frames: list, again: bool = True) -> list:
        """``frames`` given, noted by time stamp; ``again``: from the decoder without threads, which
        decodes frames given already again (the threaded decoder's own, two at one time stamp
        included, go on to be refused: :meth:`~.video.VideoClip.timed`)."""
        out = []
        for frame in frames:
            if again and frame.pts is not None and frame.pts in self.given:
                continue
            if frame.pts is not None:
                self.given.add(frame.pts)
                self.last = frame.pts
            out.append(frame)
        return out

    def _end(self, packet) -> list:
        """Every decoder drained: ``packet`` is the demuxer's empty one, or None."""
        out = self._handed_back() if self.key is not None else []
        if self.lone is None:
            out += self._threaded_given(packet)
        if self.lone is None:
            out += self._give(self.behind, again=False)
            self.behind = []
        if self.lone is not None:
            out += self._give(self._alone(None))
            self.lone = None
        return out
