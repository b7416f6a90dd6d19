"""Video clips through PyAV (the optional ``video`` extra): any container FFmpeg recognises by its
content (MP4, Matroska, MPEG-TS, MPEG-PS, Y4M...), a file or ``-`` (standard input and output,
Y4M on the way out)."""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import torch
from PIL import Image

from ..errors import BadInputError
from ..sandbox.decoder import rgb
from .audio import transcoded
from .base import HALF, Clip, ClipWriter, Decoded, Frame
from .colour import FULL, Colour
from .containers import copy_labels, display_matrix, first_frame, main_video, say_interlaced
from .decoders import Decoder, host_pix_fmt
from .encoding import RAW_FORMATS, Y4M_PIX_FMTS, Encoding, configure, import_av, output_encoder, output_range
from .frames import check_size
from .mastering import add_video_stream
from .planes import Planes, picture_of, plane_format
from .segments import open_segments
from .threads import Prefetch
from .timing import Retiming, output_time_base, tick_of

PIPE = "-"
# Encoders whose time base must be a frame rate of their standard's: times are rounded to its frames.
_FRAME_RATE_CODECS = {"mpeg1video", "mpeg2video"}
# Muxers that time each frame by its decoding order (the ISO family), where the last packet decoded
# sets where the video ends.
_DECODE_ORDER_FORMATS = {"mov", "mp4", "ipod", "3gp", "3g2", "psp", "ismv", "f4v"}
Y4M_OPTIONS = {"strict": "-1"}
# Video packets as muxed, at DEBUG, args (packets, "written" or, at the end, "flushed"): what benchmarks/gpu_clip.py times.
WRITTEN = logging.getLogger("eden_serve.written")
# Decoded frames read ahead of the model: about half a second of video at 1080p (6 MB each).
READ_AHEAD = 16


def rgb_pixels(frame) -> torch.Tensor:
    """A decoded frame as the RGB pixels [H, W, 3] that the model and every codec take, 8-bit, or
    16-bit where the video is deeper: :func:`~eden_serve.sandbox.decoder.rgb`'s (swscale, bilinear,
    by the frame's colour matrix and range, which the decoder takes from the bitstream or, where the
    bitstream leaves them out, from its context)."""
    return torch.from_numpy(rgb(frame))


@dataclass(frozen=True)
class RawVideo:
    """A headerless stream of frames: their size (height, width), pixel format and rate."""

    size: tuple[int, int]
    pix_fmt: str = "yuv420p"
    rate: Fraction = Fraction(25)

    def open(self, path: Path):
        av = import_av()
        height, width = self.size
        options = {"video_size": f"{width}x{height}", "pixel_format": self.pix_fmt, "framerate": str(self.rate)}
        try:
            return av.open(sys.stdin.buffer if str(path) == PIPE else str(path), format="rawvideo", options=options)
        except (av.error.FFmpegError, ValueError) as exc:
            raise BadInputError(f"{path}: cannot read it as raw {self.pix_fmt} video of {width}x{height} ({exc})") from None


class VideoClip(Clip):
    """The first video stream, decoded frame by frame. Every frame yielded has a time stamp
    (``raw.pts`` in ``time_base``) later than the one before."""

    kind = "video"
    colour = Colour()  # the stream's (_colour); a server-side source's as the cloud's probe states it (client/remote.py)
    decoded_by = Decoder()  # the host's, or the GPU's (:mod:`.decoders`); a server-side source's: the host's

    def __init__(self, path: Path, max_pixels: int | None = None, container=None, decoder: Decoder | None = None, reopen=None):
        super().__init__(path)
        av = import_av()
        self._error = av.error.FFmpegError
        self.piped = str(path) == PIPE
        self.decoded_by = decoder or self.decoded_by
        # A second opening of the same file, for its first frame's metadata: by its path where the
        # clip opens the path itself, else only as the caller says (a server-side source's ``path``
        # is its name under the media root, no path here, and it reopens by descriptor).
        self._reopen = reopen or (None if container is not None or self.piped else lambda: av.open(str(path)))
        try:
            self.container = container or (decoder.open(path) if decoder else av.open(sys.stdin.buffer if self.piped else str(path)))
        except (self._error, ValueError) as exc:
            raise BadInputError(f"{path}: not a readable video ({exc})") from None
        try:
            self.stream = main_video(self.container, str(path))
        except BadInputError:
            self.container.close()
            raise
        if max_pixels is not None:
            try:
                check_size(self.stream.width, self.stream.height, max_pixels, str(path))
            except BadInputError:
                self.container.close()
                raise
        self.stream.thread_type = "AUTO"
        say_interlaced(self.stream, path)
        self.colour = self._colour()
        self.length = self.stream.frames or None
        self.rate = Fraction(self.stream.average_rate or self.stream.guessed_rate or 25)
        self.time_base = self.stream.time_base or 1 / self.rate

    def _colour(self) -> Colour:
        """The stream's colour; where it may be HDR, with its first frame's metadata from a second opening
        of the file (a pipe's, read once, or a container's handed in without a way to reopen it: tags only)."""
        colour = Colour.of_stream(self.stream.codec_context)
        if not colour.may_hold_metadata or self._reopen is None:
            return colour
        try:
            with self._reopen() as container:
                first = first_frame(container)
        except (self._error, ValueError, OSError, BadInputError):
            return colour  # what cannot be decoded here fails where the clip is read, with its own message
        return colour if first is None else colour.with_side_data(first)

    def __iter__(self) -> Iterator[Frame]:
        """The frames, decoded and converted to RGB on a thread of their own, :data:`READ_AHEAD` ahead."""
        self._stop_reading()
        self._reading = Prefetch(self._decoded, READ_AHEAD)
        yield from self._reading

    def _decoded(self) -> Iterator[Frame]:
        try:
            yield from self.timed(self.container.decode(self.stream))
        except self._error as exc:
            raise BadInputError(f"{self.path}: cannot decode the video ({exc})") from None

    def _stop_reading(self) -> None:
        reading, self._reading = getattr(self, "_reading", None), None
        if reading is not None:
            reading.stop()

    def timed(self, decoded: Iterator, source: str | None = None) -> Iterator[Frame]:
        """The decoded frames as :class:`Frame` objects, each timed after the one before."""
        previous = None
        # AVI stores no presentation times: FFmpeg's guesses label reordered (B-)frames out of order.
        slotted = getattr(getattr(self.container, "format", None), "name", None) == "avi"
        for i, frame in enumerate(decoded):
            if frame.pts is None or (slotted and self.stream.codec_context.has_b_frames):
                # Timed by their order, as raw streams leave it to the player: one frame at the average rate.
                frame.pts = (getattr(self.stream, "start_time", None) or 0) if previous is None \
                    else previous + max(1, round(1 / (self.rate * self.time_base)))
            elif previous is not None and frame.pts <= previous:
                raise BadInputError(f"{self.path}: frame {i} is not timed after frame {i - 1} "
                                    f"(time stamps {previous} then {frame.pts}); the video's timing is broken")
            previous = frame.pts
            time = frame.pts * self.time_base
            duration = frame.duration * self.time_base if frame.duration else 1 / self.rate
            if i == 0:  # kept apart: a frame decoded into a GPU's memory reaches the writer copied without it
                self.display_matrix = display_matrix(frame) or self.display_matrix
            pixels = self.decoded_by.pixels(frame, rgb_pixels)
            yield Frame(i, f"frame {i}", image=pixels, decoded=Decoded(self.decoded_by.raw(frame), time, time + duration, source))

    def writer(self, tmp, dst, retiming, state=None, encoding=None):
        return VideoWriter(tmp, dst, self, retiming, encoding or Encoding())

    def close(self) -> None:
        self._stop_reading()  # the decoding thread must be done with the container first
        self.container.close()


class VideoWriter(ClipWriter):
    """The output video, with the input's audio and subtitles.

    Timing: each frame is due at its time (an original at its own, a middle at its position
    between its neighbours, a retimed frame at its exact time on the output clock) and lasts until
    the next; the last lasts until the input's last frame ends, so the video ends where the audio
    does. Rounding happens only where the time base had to be coarsened (:func:`~.timing.output_time_base`). A
    variable frame rate stays variable and in sync. Originals are re-encoded from their decoded
    pictures (no RGB round trip). The encoder follows :mod:`.encoding`. An encoder's state cannot
    be saved, so a resumed run encodes the whole video again (``continues`` is False).

    Audio and subtitle streams are copied packet by packet, not re-encoded, from a second reader of
    the input, each muxed once the video has reached its time: memory holds a few packets, never the
    track; attachments (fonts) too, with each stream's language, title and flags, and the input's
    title, chapters and tags (:func:`~.containers.copy_labels`). Audio the output cannot hold is
    refused; subtitles and attachments it cannot hold are left out with a warning; data streams
    (time codes) are not copied, nor anything from a piped input."""

    def __init__(self, tmp: Path, dst: Path, clip: VideoClip, retiming: Retiming, encoding: Encoding):
        av = import_av()
        self.retiming = retiming
        self._error = av.error.FFmpegError
        self.dst = dst
        self.copies = None
        try:
            # Y4M's deeper formats (C420p10, C444p12...) are outside its first definition, which FFmpeg's
            # muxer writes only when told to; every tool that reads Y4M of more than 8 bits reads them.
            if str(dst) == PIPE:
                self.container = av.open(sys.stdout.buffer, "w", format="yuv4mpegpipe", container_options=Y4M_OPTIONS)
            else:  # the container format follows the extension
                self.container = av.open(str(tmp), "w", container_options=Y4M_OPTIONS if Path(tmp).suffix == ".y4m" else None)
        except (self._error, ValueError) as exc:
            raise BadInputError(f"output {str(dst)!r}: not a video file name ({exc})") from None
        try:
            self._add_video(clip, encoding, av)
            if clip.container is None:  # a server-side source (client/remote.py): its streams come from the cloud
                self.packets = clip.copied(self.container, self.dst)
                if self.packets is not None:
                    self.copies = clip
                    self.pending = self._next_copy()
            elif clip.piped or self.container.format.name in RAW_FORMATS:
                if any(s.type in ("audio", "subtitle") for s in clip.container.streams):
                    warnings.warn("the piped input's audio and subtitles are not copied (a pipe is read once)" if clip.piped
                                  else "the input's audio and subtitles are not copied (Y4M and raw video hold video alone)")
            else:
                self._add_copies(clip, av)
        except BaseException:
            self.close()
            raise

    def _add_video(self, clip: VideoClip, encoding: Encoding, av) -> None:
        source = clip.stream.codec_context
        raw = self.container.format.name in RAW_FORMATS
        name = output_encoder(self.container, encoding, source, self.dst, host_pix_fmt(source))
        rate = self.retiming.fps if self.retiming.fps is not None else clip.rate * self.retiming.factor
        try:
            self.stream, colour = add_video_stream(self.container, name, rate, clip.colour, (source.width, source.height))
        except (self._error, ValueError) as exc:
            raise BadInputError(f"output {str(self.dst)!r}: cannot hold {name} video ({exc}); choose another "
                                f"container or --vcodec") from None
        self.stream.width, self.stream.height = source.width, source.height
        if source.sample_aspect_ratio:  # anamorphic pixels: without it a player shows the picture squeezed
            self.stream.codec_context.sample_aspect_ratio = source.sample_aspect_ratio
        self.time_base = output_time_base(clip.time_base, self.retiming)
        if name in _FRAME_RATE_CODECS or raw:
            self.time_base = 1 / rate
        self.counted = raw  # Y4M has a frame rate, no times: each frame takes the next slot
        self.shown = 0
        self.stream.codec_context.time_base = self.stream.time_base = self.time_base
        options = configure(self.stream, encoding, host_pix_fmt(source), colour,
                            Y4M_PIX_FMTS if self.container.format.name == "yuv4mpegpipe" else None)
        self.pix_fmt = self.stream.pix_fmt
        # Pictures converted to the output's pixel format go to its matrix and range (untagged: swscale's defaults).
        range_ = output_range(self.pix_fmt, colour)
        self.convert = {"dst_colorspace": colour.matrix if colour.matrix != 2 else None, "dst_color_range": range_ or None}
        # The planes this writer takes as they are (:mod:`.planes`): those it converts RGB to.
        self.planes = plane_format(self.pix_fmt, source.width, source.height, colour.matrix, range_ == FULL)
        frames = self.retiming.frames(clip.length, clip.rate) if clip.length and not clip.piped else None  # unknown: a pipe's
        self.segments = None if raw else open_segments(self.stream, options, encoding.instances_for(name), warnings.warn, frames=frames)
        self._encoded = self.stream.encode if self.segments is None else self.segments.encode  # a picture -> the packets it makes ready
        self.encoder = name if self.segments is None else f"{name} in {self.segments.instances} instances on segments of {self.segments.length} frames"
        self.held = None
        self.end = None  # when the video ends: the last original seen ends there
        self.first = None  # (pts, dts) of the first packet
        self.durations: dict[int, int] = {}  # of the frames inside the encoder, by time stamp
        self._none = av.video.frame.PictureType.NONE
        self._clip = clip  # its display matrix, known once its first frame is decoded
        self._from_image = av.VideoFrame.from_image

    def _add_copies(self, clip: VideoClip, av) -> None:
        copy_labels(clip.container, clip.stream, self.container, self.stream)
        outputs, self.transcoded = {}, {}
        for stream in clip.container.streams:
            if stream.type == "video" and stream.index != clip.stream.index:  # a cover picture, another angle
                warnings.warn(f"the input's video stream {stream.index} is left out: the output holds the interpolated one")
            if stream.type not in ("audio", "subtitle", "attachment"):
                continue
            name = f"{stream.codec_context.name} {stream.type}" if stream.codec_context else stream.type
            try:
                copy = self.container.add_stream_from_template(stream)
            except (self._error, ValueError):
                made = transcoded(self.container, stream, self.dst) if stream.type == "audio" else None  # :mod:`.audio`
                if made is None:
                    warnings.warn(f"{self.dst.name} cannot hold the input's {name} (stream {stream.index}); it is left out")
                    continue
                self.transcoded[stream.index], copy = made, made.output
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
            if packet.stream.index in self.transcoded:  # the demuxer's last, empty packet states stream 0 as its index
                yield from self.transcoded[packet.stream.index].packets(packet)
            elif packet.size:  # the demuxer ends each stream with an empty packet
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

    def _mux(self, packets, event: str = "written") -> None:
        for packet in packets:
            if self.first is None:
                self.first = (packet.pts, packet.dts)
            # The encoder may drop frame durations, and the muxer needs the last frame's.
            packet.duration = self.durations.pop(packet.pts, packet.duration)
            self.container.mux_one(packet)
            if self.copies is not None and packet.dts is not None:
                self._copy_until(packet.dts * packet.time_base)
        if packets and WRITTEN.isEnabledFor(logging.DEBUG):
            WRITTEN.debug("%d packets %s", len(packets), event)

    def _encode(self, picture, pts: int, duration: int) -> None:
        picture.pts, picture.duration, picture.time_base = pts, duration, self.time_base
        self.durations[pts] = duration
        picture.pict_type = self._none  # let the encoder place keyframes, not the input's
        try:
            self._mux(self._encoded(picture))
        except self._error as exc:
            raise BadInputError(f"cannot write {str(self.dst)!r}: {exc}") from None

    def _hold(self, picture, pts: int) -> None:
        """Encode the picture held before, which lasts until ``pts``, and hold this one."""
        if self.held is not None:
            previous, start = self.held
            if pts <= start:
                raise BadInputError(f"{str(self.dst)!r}: the input's time base is too coarse for the frames "
                                    f"between two of its frames (time stamps {start} and {pts}); ask fewer")
            self._encode(previous, start, pts - start)
        self.held = (picture, pts)

    def _show(self, picture, time: Fraction, original: Frame) -> None:
        """Hold ``picture`` due at ``time``; the video ends where ``original``, the latest seen, does."""
        self.end = original.end
        if self.shown == 0:  # the input's display matrix (a rotation, a mirror): the pictures are stored alike
            if (matrix := display_matrix(original.raw) or self._clip.display_matrix) is not None:
                self.stream.set_display_matrix(matrix)
        if isinstance(picture, Frame):
            frame = picture.raw
            if (frame.format.name, frame.width, frame.height) != (self.pix_fmt, self.stream.width, self.stream.height):
                frame = frame.reformat(self.stream.width, self.stream.height, self.pix_fmt, **self.convert)
        elif isinstance(picture, Planes):  # converted by the edge, as this writer converts RGB
            assert picture.format == self.planes, (picture.format, self.planes)
            frame = picture_of(picture.array(), self.pix_fmt)
        elif isinstance(picture, torch.Tensor):  # RGB pixels, 8 or 16 bits; 8 as from_image takes an RGB image's
            rgb_format = "rgb48le" if picture.dtype == torch.uint16 else "rgb24"
            frame = picture_of(picture.numpy(), rgb_format).reformat(format=self.pix_fmt, **self.convert)
        else:
            frame = self._from_image(picture.convert("RGB")).reformat(format=self.pix_fmt, **self.convert)
        self._hold(frame, self.shown if self.counted else tick_of(time, self.time_base))
        self.shown += 1

    def add(self, frame):
        self._show(frame, frame.time, frame)

    def add_middle(self, middle, before, after, position=HALF):
        self._show(middle, before.time + position * (after.time - before.time), after)

    def place(self, picture, before, after, position):
        stop = before.end if after is None else after.time
        self._show(picture, before.time + position * (stop - before.time), after or before)

    def finish(self):
        last, start = self.held
        end = start + 1 if self.counted else max(tick_of(self.end, self.time_base), start + 1)
        self._encode(last, start, end - start)
        try:
            packets = list(self._encoded(None))
            if packets and self.container.format.name in _DECODE_ORDER_FORMATS:
                # These muxers end the video where the last packet decoded ends, counted from the
                # first packet's decoding time: reordered (B-)frames would cut the last one short.
                final = packets[-1]
                first_pts, first_dts = self.first or (final.pts, final.dts)
                self.durations[final.pts] = end - final.dts - (first_pts - first_dts)
            self._mux(packets, "flushed")
            if self.copies is not None:
                self._copy_until(None)
        except self._error as exc:
            raise BadInputError(f"cannot write {str(self.dst)!r}: {exc}") from None

    def close(self):
        if getattr(self, "segments", None) is not None:
            self.segments.close()
        self.container.close()
        if self.copies is not None:
            self.copies.close()
