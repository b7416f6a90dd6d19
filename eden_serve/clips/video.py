"""Video clips through PyAV (the optional ``video`` extra)."""

from __future__ import annotations

import warnings
from fractions import Fraction
from pathlib import Path
from typing import Iterator

from ..errors import BadInputError
from ..frames import check_size
from .base import HALF, Clip, ClipWriter, Frame

VIDEO_SUFFIXES = {".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi"}
VIDEO_EXTRA = "reading or writing video needs PyAV: pip install 'eden-serve[video]'"
# Some encoders (MPEG-4 Part 2) refuse a time base over 16 bits; see VideoWriter.
MAX_TIME_BASE_DENOMINATOR = 65535


def import_av():
    try:
        import av
    except ImportError:
        raise BadInputError(VIDEO_EXTRA) from None
    return av


class VideoClip(Clip):
    """The first video stream, decoded frame by frame. Every frame yielded has a time stamp
    (``raw.pts`` in ``time_base``) later than the one before."""

    kind = "video"

    def __init__(self, path: Path, max_pixels: int | None = None):
        super().__init__(path)
        av = import_av()
        self._error = av.error.FFmpegError
        try:
            self.container = av.open(str(path))
        except self._error as exc:
            raise BadInputError(f"{path}: not a readable video ({exc})") from None
        if not self.container.streams.video:
            self.container.close()
            raise BadInputError(f"{path}: has no video stream")
        self.stream = self.container.streams.video[0]
        if max_pixels is not None:
            try:
                check_size(self.stream.width, self.stream.height, max_pixels, str(path))
            except BadInputError:
                self.container.close()
                raise
        self.stream.thread_type = "AUTO"
        self.length = self.stream.frames or None
        self.rate = Fraction(self.stream.average_rate or self.stream.guessed_rate or 25)
        self.time_base = self.stream.time_base or 1 / self.rate

    def __iter__(self) -> Iterator[Frame]:
        previous = None
        try:
            for i, frame in enumerate(self.container.decode(self.stream)):
                if frame.pts is None:  # raw streams leave timing to the player: one frame at the average rate
                    frame.pts = 0 if previous is None else previous + max(1, round(1 / (self.rate * self.time_base)))
                elif previous is not None and frame.pts <= previous:
                    raise BadInputError(f"{self.path}: frame {i} is not timed after frame {i - 1} "
                                        f"(time stamps {previous} then {frame.pts}); the video's timing is broken")
                previous = frame.pts
                yield Frame(i, f"frame {i}", image=frame.to_image(), raw=frame)
        except self._error as exc:
            raise BadInputError(f"{self.path}: cannot decode the video ({exc})") from None

    def writer(self, tmp, dst, factor=2, state=None):
        return VideoWriter(tmp, dst, self, factor)

    def close(self) -> None:
        self.container.close()


class VideoWriter(ClipWriter):
    """The input's codec and pixel format at ``factor`` times its frame rate, with its audio and
    subtitles.

    Timing: each original keeps its time stamp and each middle sits at its position between its
    neighbours (halfway; for a factor 4, at 1/4, 2/4, 3/4), the last frame lasting as in the input,
    so a variable frame rate stays variable and in sync. The time base is the input's divided by
    the factor (every position exact), or by the largest power of two that keeps it within 16 bits,
    where a position rounds to the nearest tick. Originals are re-encoded from their decoded
    pictures (no RGB round trip); H.264/H.265 use CRF 18. An encoder's state cannot be saved, so a
    resumed run encodes the whole video again (``continues`` is False).

    Audio and subtitle streams are copied packet by packet, not re-encoded, from a second reader of
    the input, each muxed once the video has reached its time: memory holds a few packets, never the
    track. Attachments (fonts) are copied too, with each stream's language, title and flags. Audio
    the output container cannot hold is refused; subtitles and attachments it cannot hold are left
    out with a warning; data streams (time codes) are not copied.
    """

    def __init__(self, tmp: Path, dst: Path, clip: VideoClip, factor: int = 2):
        av = import_av()
        self.factor = factor
        self._error = av.error.FFmpegError
        self.dst = dst
        self.copies = None
        try:
            self.container = av.open(str(tmp), "w")  # the container format follows the extension
        except (self._error, ValueError) as exc:
            raise BadInputError(f"output {str(dst)!r}: not a video file name ({exc})") from None
        try:
            self._add_video(clip, av)
            self._add_copies(clip, av)
        except BaseException:
            self.close()
            raise

    def _add_video(self, clip: VideoClip, av) -> None:
        source = clip.stream.codec_context
        try:
            self.stream = self.container.add_stream(source.name, rate=clip.rate * self.factor)
        except (self._error, ValueError) as exc:
            raise BadInputError(f"output {str(self.dst)!r}: cannot encode its {source.name} video ({exc}); "
                                f"the video keeps the input's codec, so choose a container that holds it") from None
        self.stream.width, self.stream.height = source.width, source.height
        self.stream.pix_fmt = source.pix_fmt
        if self.stream.codec_context.name in ("libx264", "libx265"):
            self.stream.options = {"crf": "18"}
        self.scale = self.factor
        while self.scale > 1 and (clip.time_base / self.scale).denominator > MAX_TIME_BASE_DENOMINATOR:
            self.scale //= 2
        self.time_base = clip.time_base / self.scale
        self.stream.codec_context.time_base = self.stream.time_base = self.time_base
        self.default_duration = round(1 / (clip.rate * self.time_base))  # for a last frame without one
        self.pix_fmt = source.pix_fmt
        self.held = None
        self.durations: dict[int, int] = {}  # of the frames inside the encoder, by time stamp
        self._none = av.video.frame.PictureType.NONE
        self._from_image = av.VideoFrame.from_image

    def _add_copies(self, clip: VideoClip, av) -> None:
        outputs = {}
        for stream in clip.container.streams:
            if stream.type not in ("audio", "subtitle", "attachment"):
                continue
            name = f"{stream.codec_context.name} {stream.type}" if stream.codec_context else stream.type
            try:
                copy = self.container.add_stream_from_template(stream)
            except (self._error, ValueError):
                if stream.type == "audio":
                    raise BadInputError(f"output {str(self.dst)!r} cannot hold the input's {name} without "
                                        f"re-encoding it; write a {clip.path.suffix} file instead") from None
                warnings.warn(f"{self.dst.name} cannot hold the input's {name} (stream {stream.index}); it is left out")
                continue
            copy.metadata.update(stream.metadata)  # language, title
            copy.disposition = stream.disposition  # default, forced
            if stream.type != "attachment":  # an attachment (a font) is all header, no packets
                outputs[stream.index] = copy
        if outputs:
            self.copies = av.open(str(clip.path))
            self.packets = self._copied_packets(outputs)
            self.pending = self._next_copy()

    def _copied_packets(self, outputs: dict) -> Iterator:
        for packet in self.copies.demux([self.copies.streams[i] for i in outputs]):
            if packet.size:  # the demuxer ends each stream with an empty packet
                packet.stream = outputs[packet.stream_index]
                yield packet

    def _next_copy(self):
        try:
            return next(self.packets, None)
        except self._error as exc:
            raise BadInputError(f"{self.copies.name}: cannot read its audio or subtitles ({exc})") from None

    def _copy_until(self, time: Fraction | None) -> None:
        """Mux the copied packets up to ``time`` (None: all that are left)."""
        while self.pending is not None:
            stamp = self.pending.dts if self.pending.dts is not None else self.pending.pts
            if time is not None and stamp is not None and stamp * self.pending.time_base > time:
                return
            self.container.mux_one(self.pending)
            self.pending = self._next_copy()

    def _mux(self, packets) -> None:
        for packet in packets:
            # The encoder may drop frame durations, and the muxer needs the last frame's.
            packet.duration = self.durations.pop(packet.pts, packet.duration)
            self.container.mux_one(packet)
            if self.copies is not None and packet.dts is not None:
                self._copy_until(packet.dts * packet.time_base)

    def _encode(self, picture, pts: int, duration: int) -> None:
        picture.pts, picture.duration, picture.time_base = pts, duration, self.time_base
        self.durations[pts] = duration
        picture.pict_type = self._none  # let the encoder place keyframes, not the input's
        try:
            self._mux(self.stream.encode(picture))
        except self._error as exc:
            raise BadInputError(f"cannot write {str(self.dst)!r}: {exc}") from None

    def _hold(self, picture, pts: int) -> None:
        """Encode the picture held before, which lasts until ``pts``, and hold this one."""
        if self.held is not None:
            previous, start = self.held
            if pts <= start:
                raise BadInputError(f"{str(self.dst)!r}: the input's time base is too coarse for {self.factor} frames "
                                    f"between two of its frames (time stamps {start} and {pts}); try a lower factor")
            self._encode(previous, start, pts - start)
        self.held = (picture, pts)

    def add(self, frame):
        self.start = frame.raw.pts * self.scale  # read now: encoding the picture sets its pts to the output's
        self._hold(frame.raw, self.start)

    def add_middle(self, middle, before, after, position=HALF):
        start, stop = self.start, after.raw.pts * self.scale
        picture = self._from_image(middle.convert("RGB")).reformat(format=self.pix_fmt)
        self._hold(picture, round(start + position * (stop - start)))

    def finish(self):
        last, start = self.held  # lasts as long as in the input, so that the video ends where the audio does
        self._encode(last, start, last.duration * self.scale if last.duration else self.default_duration)
        try:
            self._mux(self.stream.encode(None))
            if self.copies is not None:
                self._copy_until(None)
        except self._error as exc:
            raise BadInputError(f"cannot write {str(self.dst)!r}: {exc}") from None

    def close(self):
        self.container.close()
        if self.copies is not None:
            self.copies.close()
