"""Video clips read through PyAV (the optional ``video`` extra): any container FFmpeg recognises by
its content (MP4, Matroska, MPEG-TS, MPEG-PS, Y4M...), a file or ``-`` (standard input); the output
is written by :mod:`.video_writer` (standard output: Y4M)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import torch

from ..errors import BadInputError
from ..sandbox.decoder import rgb
from .base import PIPE, Clip, Decoded, Frame
from .colour import Colour
from .containers import (container_start, display_matrix, dynamic_hdr, first_look, frame_rate, main_video, pixel_aspect,
                         say_interlaced, self_contained, stream_start)
from .damage import Damage
from .decoders import Decoder
from .encoding import Encoding, import_av
from .frames import check_size
from .palette import given_as
from .pixel_formats import MATRIX_NAMES
from .threads import Prefetch
from .timing import MAX_FPS
from .video_writer import VideoWriter
from .webm_alpha import AlphaDecoder

# Decoded frames read ahead of the model: about half a second of video at 1080p (6 MB each).
READ_AHEAD = 16


def rgb_pixels(frame) -> torch.Tensor:
    """A decoded frame as the RGB pixels [H, W, 3] that the model and every codec take, 8-bit, or
    16-bit where the video is deeper: :func:`~eden_serve.sandbox.decoder.rgb`'s (swscale, bilinear,
    by the frame's colour matrix and range, which the decoder takes from the bitstream or, where the
    bitstream leaves them out, from its context)."""
    return torch.from_numpy(rgb(frame))


def check_convertible(pix_fmt: str | None, colour: Colour, path) -> None:
    """Refuses, as the clip opens, a video whose matrix swscale cannot convert to RGB (YCgCo, BT.2020's
    constant-luminance form, ICtCp...: FFmpeg 8's answers 'Operation not supported' at the first
    frame), tried on a blank frame of its pixel format."""
    if pix_fmt is None or colour.matrix in CONVERTIBLE:
        return
    av = import_av()
    try:
        frame = av.VideoFrame(16, 16, pix_fmt)
    except (av.error.FFmpegError, ValueError):
        return  # no blank frame of it (a hardware format): its frames say for themselves
    frame.colorspace = colour.matrix
    try:
        rgb(frame)
    except (av.error.FFmpegError, ValueError):
        name = MATRIX_NAMES.get(colour.matrix, "unknown")
        raise BadInputError(f"{path}: its colour matrix is {name} ({colour.matrix}), which FFmpeg's swscale cannot convert to RGB; "
                            "convert the video to another matrix first") from None


# Matrices swscale converts (RGB, BT.709, unspecified, FCC, BT.470BG, SMPTE 170M and 240M, BT.2020's
# non-constant-luminance form): others are tried first.
CONVERTIBLE = frozenset({0, 1, 2, 4, 5, 6, 7, 9})


@dataclass(frozen=True)
class RawVideo:
    """A headerless stream of frames: their size (height, width), pixel format and rate."""

    size: tuple[int, int]
    pix_fmt: str = "yuv420p"
    rate: Fraction = Fraction(25)

    def __post_init__(self):
        if not 0 < self.rate <= MAX_FPS:
            raise BadInputError(f"--input-fps must be above 0 and at most {MAX_FPS}, got {self.rate}")

    def open(self, path: Path):
        av = import_av()
        height, width = self.size
        if str(path) != PIPE:
            try:
                with open(path, "rb") as file:
                    found = self_contained(file.read(12))
            except OSError as exc:
                raise BadInputError(f"input {str(path)!r} cannot be read ({exc.strerror})") from None
            if found not in (None, "MPEG-TS"):  # a TS's sync byte is as likely as any first byte of raw video
                raise BadInputError(f"{path}: its first bytes say {found}; --input-size and --input-pix-fmt read video "
                                    "without a header: leave them out")
        try:
            av.video.format.VideoFormat(self.pix_fmt)
        except ValueError:
            raise BadInputError(f"--input-pix-fmt {self.pix_fmt!r} is no pixel format FFmpeg knows (yuv420p, nv12, "
                                "yuv422p10le, rgb24...)") from None
        options = {"video_size": f"{width}x{height}", "pixel_format": self.pix_fmt, "framerate": str(self.rate)}
        what = f"raw {self.pix_fmt} video {width} wide and {height} high (--input-size {height}x{width})"
        try:
            container = av.open(sys.stdin.buffer if str(path) == PIPE else str(path), format="rawvideo", options=options)
        except (av.error.FFmpegError, ValueError) as exc:
            raise BadInputError(f"{path}: cannot read it as {what} ({exc})") from None
        if str(path) != PIPE:
            # FFmpeg's raw demuxer states a frame's bytes as the stream's bit rate at its frame rate.
            stream = container.streams.video[0]
            frame = round(stream.bit_rate * stream.time_base / 8) if stream.bit_rate and stream.time_base else 0
            size = os.path.getsize(path)
            if frame and size % frame:
                container.close()
                raise BadInputError(f"{path}: its {size} bytes are not whole frames of {what}, {frame} bytes each; "
                                    "check --input-size and --input-pix-fmt")
        return container


def _whole_frames(packets: Iterator, path) -> Iterator:
    """Headerless raw video's packets, each a frame: one shorter than the first is a stream cut
    inside a frame, which a file's size shows before a frame is read (:meth:`RawVideo.open`) and a
    pipe's only at its end; the size and format given do not fit it, so the run fails there, where
    its decoder's refusal was read on as damage (a frame lost, said in a warning)."""
    whole = None
    for packet in packets:
        if packet.size and whole is None:
            whole = packet.size
        elif packet.size and packet.size != whole:
            raise BadInputError(f"{path}: its last frame is cut short ({packet.size} of {whole} bytes): the stream is not whole "
                                "frames of the --input-size and --input-pix-fmt given")
        yield packet


def slotted(container, stream) -> Iterator:
    """The decoded frames of an AVI with B-frames, each timed by the slot of the packet whose
    decoding gave it out, less the decoder's delay: AVI's frames are shown in its slots' order, and
    a slot left empty (a dropped frame) keeps the picture before on screen, so a later frame is
    shown that much later. Those given out together or at the end follow one a slot. On slice
    threads: frame threads would add a delay of their own, and put such a gap on a later frame."""
    if not stream.codec_context.is_open:
        stream.thread_type = "SLICE"
    first = shift = slot = previous = None
    for packet in container.demux(stream):
        if packet.size and packet.dts is not None:
            first = packet.dts if first is None else first
            slot = packet.dts
        for frame in packet.decode():
            if shift is None:
                shift = (slot if slot is not None else 0) - (first if first is not None else 0)
            time = slot - shift if slot is not None else 0
            frame.pts = time if previous is None or time > previous else previous + 1
            previous = frame.pts
            yield frame


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
        # A WebM's VP8 or VP9 alpha, which only libvpx's decoder reads (the host's decoding alone).
        self.alpha = AlphaDecoder.of(self.stream, path, self.decoded_by.name)
        self.alpha_pix_fmt = self.alpha.pix_fmt if self.alpha is not None else None
        say_interlaced(self.stream, path)
        self.colour = self._colour()
        if self.stream.codec_context.pix_fmt == "pal8":  # a palette's alpha, which FFmpeg's format does not list
            self.alpha_pix_fmt = given_as(self._first)
        try:
            check_convertible(self.stream.codec_context.pix_fmt, self.colour, path)
        except BadInputError:
            self.container.close()
            raise
        self.length = self.stream.frames or None
        self.rate = frame_rate(self.stream)
        self.pixel_aspect = pixel_aspect(self.stream)
        self.time_base = self.stream.time_base or 1 / self.rate

    @property
    def start(self) -> Fraction | None:
        """When the first frame is shown, in seconds, as the container states it (None: not stated)."""
        return stream_start(self.stream)

    @property
    def earliest(self) -> Fraction | None:
        """When the file's first stream starts, in seconds, as the container states it (None: not stated)."""
        return container_start(self.container)

    def _colour(self) -> Colour:
        """The stream's colour; where it may be HDR, with its first frame's metadata, from a second opening
        of the file (a pipe's, read once, or a container's handed in without a way to reopen it: tags
        only). The dynamic HDR metadata that opening's stream and frame carry is named (:attr:`dynamic_hdr`)."""
        colour, first = Colour.of_stream(self.stream.codec_context), None
        self._first = None  # a paletted stream's first frame: its palette's alpha (:func:`~.palette.given_as`)
        if self._reopen is None:
            self.dynamic_hdr = dynamic_hdr(self.stream, None)
            return colour
        try:
            with self._reopen() as container:
                paletted = self.stream.codec_context.pix_fmt == "pal8"
                first, in_band = first_look(container, decode=colour.may_hold_metadata or paletted)
                self._first = first if paletted else None
                self.dynamic_hdr = dynamic_hdr(main_video(container, str(self.path)), first, in_band)
        except (self._error, ValueError, OSError, BadInputError):
            pass  # what cannot be decoded here fails where the clip is read, with its own message
        return colour if first is None else colour.with_side_data(first)

    def __iter__(self) -> Iterator[Frame]:
        """The frames, decoded and converted to RGB on a thread of their own, :data:`READ_AHEAD` ahead."""
        self._stop_reading()
        self._reading = Prefetch(self._decoded, READ_AHEAD, started=False)  # held first: close() stops it however its start ends
        yield from self._reading.start()

    def _decoded(self) -> Iterator[Frame]:
        # Read on past damage, as FFmpeg's command line does; what was lost is said as the reading ends.
        damage = Damage(self.stream, self.path)
        context = self.stream.codec_context if self.alpha is None else self.alpha.context
        given = 0
        try:
            if self.alpha is None and self._slotted and self.stream.codec_context.has_b_frames:
                # Timed by its slots (:func:`slotted`), which reads its packets itself: damage is not counted there.
                yield from self.timed(slotted(self.container, self.stream), by_slot=True)
                return
            raw = getattr(self.container.format, "name", None) == "rawvideo"
            packets = _whole_frames(self.container.demux(self.stream), self.path) if raw else None
            for given, frame in enumerate(self.timed(damage.decoded(self.container, context, packets), damage=damage), 1):
                yield frame
        except self._error as exc:
            raise BadInputError(f"{self.path}: cannot decode the video ({exc})") from None
        damage.report(given)

    def _stop_reading(self) -> None:
        reading, self._reading = getattr(self, "_reading", None), None
        if reading is not None:
            reading.stop()

    @property
    def _slotted(self) -> bool:
        """AVI, which stores no presentation times: FFmpeg's guesses label reordered (B-)frames out of order."""
        return getattr(getattr(self.container, "format", None), "name", None) == "avi"

    def timed(self, decoded: Iterator, source: str | None = None, by_slot: bool = False, damage: Damage | None = None) -> Iterator[Frame]:
        """The decoded frames as :class:`Frame` objects, each timed after the one before (``by_slot``:
        timed already, by :func:`slotted`); with a ``damage``, a frame timed before the one before it
        is left out there and counted."""
        previous = size = None
        by_order = self._slotted and not by_slot
        i = -1
        for frame in decoded:
            if frame.pts is None or (by_order and self.stream.codec_context.has_b_frames):
                if damage is not None:
                    damage.keep(frame.pts, None)
                # Timed by their order, as raw streams leave it to the player: one frame at the average rate.
                frame.pts = (getattr(self.stream, "start_time", None) or 0) if previous is None \
                    else previous + max(1, round(1 / (self.rate * self.time_base)))
            elif previous is not None and (frame.pts == previous or (frame.pts < previous and damage is None)):
                raise BadInputError(f"{self.path}: frame {i + 1} is not timed after frame {i} "
                                    f"(time stamps {previous} then {frame.pts}); the video's timing is broken")
            elif damage is not None and not damage.keep(frame.pts, previous):
                continue
            if size is not None and (frame.width, frame.height) != size:  # pictures that change size midway: the file named, not the chunk's fields
                raise BadInputError(f"{self.path}: frame {i + 1} is {frame.width}x{frame.height}, unlike the frames before it "
                                    f"({size[0]}x{size[1]}): frames differ in size")
            i, previous, size = i + 1, frame.pts, (frame.width, frame.height)
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
