"""A video output written through PyAV: the interpolated video, each frame at its time, encoded as
:mod:`.encoders` chooses, with the input's audio, subtitles, attachments and labels copied."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import torch

from ..errors import BadInputError
from .audio import transcoded
from .base import HALF, PIPE, Clip, ClipWriter, Frame
from .colour import FULL
from .containers import copy_labels, display_matrix, lead, shaped_as, show_as, tag_for_players
from .decoders import host_pix_fmt
from .encoders import RAW_FORMATS, configure, output_encoder
from .encoding import Encoding, close_unwritten, copy_of, header_refused, import_av
from .mastering import add_video_stream
from .output_alpha import AlphaWriting
from .palette import Palettes
from .pixel_formats import Y4M_PIX_FMTS, output_colour, same_matrix, say_lost
from .planes import Planes, picture_of, plane_format
from .segments import open_segments
from .siting import Subsampler, output_siting, stated
from .subtitles import converted
from .timing import Retiming, encoder_clock, output_clock, output_time_base, tick_of, too_close
from .webm_alpha import has_alpha, settle_output

# Encoders whose time base must be a frame rate of their standard's: times are rounded to its frames.
_FRAME_RATE_CODECS = {"mpeg1video", "mpeg2video"}
# Muxers that time each frame by its decoding order (the ISO family; AVI, whose frames are slots in
# that order), where the last packet decoded sets where the video ends.
_DECODE_ORDER_FORMATS = {"mov", "mp4", "ipod", "3gp", "3g2", "psp", "ismv", "f4v", "avi"}
Y4M_OPTIONS = {"strict": "-1"}
# FFmpeg's muxers of one image a file (.png, .jpg, .bmp, .tif...), which write a video's frames only
# to a numbered name pattern, refusing a plain name at its second frame.
IMAGE_MUXERS = {"image2", "image2pipe"}
# Video packets as muxed, at DEBUG, args (packets, "written" or, at the end, "flushed"): what benchmarks/gpu_clip.py times.
WRITTEN = logging.getLogger("eden_serve.written")


class VideoWriter(AlphaWriting, ClipWriter):
    """The output video, with the input's audio and subtitles.

    Timing: each frame is due at its time (an original at its own, a middle at its position
    between its neighbours, a retimed frame at its exact time on the output clock) and lasts until
    the next; the last lasts until the input's last frame ends, so the video ends where the audio
    does. Rounding happens only where the time base had to be coarsened (:func:`~.timing.output_time_base`). A
    variable frame rate stays variable and in sync. Originals are re-encoded from their decoded
    pictures (no RGB round trip). The encoder follows :mod:`.encoders`. An encoder's state cannot
    be saved, so a resumed run encodes the whole video again (``continues`` is False).

    Audio and subtitle streams are copied packet by packet, not re-encoded, from a second reader of
    the input, each muxed once the video has reached its time: memory holds a few packets, never the
    track; attachments (fonts) too, with each stream's language, title and flags, and the input's
    title, chapters and tags (:func:`~.containers.copy_labels`). Audio the output cannot hold is
    re-encoded in its container's default codec (:mod:`.audio`), or left out where it holds no audio;
    text subtitles converted to its own text format (:mod:`.subtitles`); other subtitles and
    attachments it cannot hold are left out with a warning; data streams (time codes) are not
    copied, nor anything from a piped input."""

    alpha_of = "input's"  # whose alpha a warning says is dropped, where the output holds none

    def __init__(self, tmp: Path, dst: Path, clip: Clip, retiming: Retiming, encoding: Encoding):
        av = import_av()
        self.retiming = retiming
        self._error = av.error.FFmpegError
        self.dst = dst
        self.copies = None
        self.lead = lead(clip)  # Y4M and raw video have no times to move
        try:
            # Y4M's deeper formats (C420p10, C444p12...) are outside its first definition, which FFmpeg's
            # muxer writes only when told to; every tool that reads Y4M of more than 8 bits reads them.
            if str(dst) == PIPE:
                self.container = av.open(sys.stdout.buffer, "w", format="yuv4mpegpipe", container_options=Y4M_OPTIONS)
            else:  # the container format follows the extension
                options = Y4M_OPTIONS if Path(tmp).suffix == ".y4m" else {"output_ts_offset": f"{float(self.lead):.6f}"} if self.lead else None
                self.container = av.open(str(tmp), "w", container_options=options)
        except (self._error, ValueError) as exc:
            raise BadInputError(f"output {str(dst)!r}: not a video file name ({exc})") from None
        if self.container.format.name in IMAGE_MUXERS:
            self.close()
            raise BadInputError(f"output {str(dst)!r} names one image, and a video has many frames: write a video file "
                                "(.mp4, .mkv, .webm, an animated .gif or .webp)")
        try:
            self._add_video(clip, encoding, av)
            self._add_streams(clip, av)
            settle_output(self.stream, self._given, self.pix_fmt, dst, self.alpha_of)
        except BaseException:
            self.close()
            raise

    def _add_streams(self, clip: Clip, av) -> None:
        """The input's other streams (audio, subtitles, attachments) and labels, copied where they can be."""
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

    def _source(self, clip: Clip):
        """What the output's stream is made like: the input's video stream's codec context (its
        codec, size, pixel format and pixel aspect)."""
        return clip.stream.codec_context

    def _add_video(self, clip: Clip, encoding: Encoding, av) -> None:
        source = self._source(clip)
        raw = self.container.format.name in RAW_FORMATS
        self._given = given = getattr(clip, "alpha_pix_fmt", None) or host_pix_fmt(source)  # alpha included (webm_alpha.py)
        name = output_encoder(self.container, encoding, source, self.dst, given)
        rate = self.retiming.fps if self.retiming.fps is not None else clip.rate * self.retiming.factor
        try:
            self.stream, colour = add_video_stream(self.container, name, rate, clip.colour, (source.width, source.height))
        except (self._error, ValueError) as exc:
            raise BadInputError(f"output {str(self.dst)!r}: cannot hold {name} video ({exc}); choose another "
                                f"container or --vcodec") from None
        self.stream.width, self.stream.height = source.width, source.height
        tag_for_players(self.container, self.stream)
        # Anamorphic pixels, without which a player shows the picture squeezed: a video's stream's (its container's too).
        shaped_as(self.container, self.stream, getattr(clip, "pixel_aspect", None) or source.sample_aspect_ratio)
        self._clock(clip, name, rate, raw)
        options = configure(self.stream, encoding, given, colour,
                            Y4M_PIX_FMTS if self.container.format.name == "yuv4mpegpipe" else None)
        self.pix_fmt = self.stream.pix_fmt
        # Paletted output (GIF): pictures are converted to RGB (RGBA: a GIF's transparency), then given a palette each as encoded.
        self.palettes = Palettes(has_alpha(given)) if self.pix_fmt == "pal8" else None
        if self.palettes is not None:
            self.pix_fmt = self.palettes.format
        # Pictures converted to the output's pixel format go to the matrix and range it states (untagged:
        # swscale's defaults); the originals too where those are not the input's, else they keep their own.
        written = output_colour(name, self.pix_fmt, colour)
        chroma = av.VideoFormat(self.pix_fmt, 16, 16)
        say_lost(self.container.format.name, self.stream.codec_context.codec.canonical_name, written,
                 (chroma.chroma_width(16), chroma.chroma_height(16)) == (8, 8) and not chroma.is_rgb)
        if clip.dynamic_hdr:  # made for the input's pictures, it would be wrong for the middles, which have none
            warnings.warn(f"the input's {' and '.join(clip.dynamic_hdr)} dynamic HDR metadata (tone mapping scene by scene) is left "
                          "out: the middles have none, so the output keeps the static HDR10 metadata and the tags alone")
        self.convert = {"dst_colorspace": written.matrix if written.matrix != 2 else None, "dst_color_range": written.range or None}
        # A middle's chroma is subsampled where a reader of the output takes its originals' to sit (:mod:`.siting`).
        self.siting = output_siting(self.container.format.name, self.stream.codec_context.codec.canonical_name, self.pix_fmt, stated(options))
        self._subsampled = Subsampler(self.pix_fmt, written.matrix, written.range, self.siting)
        self.recolour = not same_matrix(written.matrix, colour.matrix) or (written.range == FULL) != (colour.range == FULL)
        # Every picture states the output's tags: an encoder that writes each frame's own (ProRes) would
        # state none for a middle made of RGB.
        self.tags = {"color_primaries": written.primaries, "color_trc": written.transfer, "colorspace": written.matrix,
                     "color_range": written.range}
        self._hold_alpha()
        # The planes this writer takes as they are (:mod:`.planes`): those it converts RGB to.
        self.planes = plane_format(self.pix_fmt, source.width, source.height, written.matrix, written.range == FULL, self.siting)
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

    def _clock(self, clip: Clip, name: str, rate: Fraction, raw: bool) -> None:
        """The video's time base, and the tick of its muxer's clock (:func:`~.timing.output_clock`),
        which frames must be at least apart (Matroska: 1 ms)."""
        fine = output_time_base(clip.time_base, self.retiming)
        # MPEG-1/2 on their frame rate; MPEG-4 Part 2 on a clock of 16 bits (:func:`~.timing.encoder_clock`).
        self.time_base = 1 / rate if name in _FRAME_RATE_CODECS or raw else encoder_clock(name, fine, rate, self.dst)
        self.counted, self.shown = raw, 0  # Y4M has a frame rate, no times: each frame takes the next slot
        self.stream.codec_context.time_base = self.stream.time_base = self.time_base
        given = self.time_base
        self.time_base, self.tick = (self.time_base,) * 2 if raw else output_clock(self.container, self.stream, rate, self.dst)
        # Put on a frame's own tick (AVI): a variable rate's frames are moved to the nearest, said once (:meth:`_on_tick`).
        self.constant = self.time_base != given and self.time_base == 1 / rate
        # The encoder's clock where it is coarser than the input's, and the frames are on it: they are refused there by its name.
        self.coarse = name if given != fine and self.time_base == given and not raw else ""
        self.fixed = self.coarse in _FRAME_RATE_CODECS  # a variable rate's frames moved to its ticks, as into AVI
        self.origin, self.moved, self.times = None, False, (None, None)  # times: of the last two frames shown

    def _add_copies(self, clip: Clip, av) -> None:
        copy_labels(clip.container, clip.stream, self.container, self.stream, self.lead)
        outputs, self.transcoded = {}, {}
        for stream in clip.container.streams:
            if stream.type == "video" and stream.index != clip.stream.index:  # a cover picture, another angle
                warnings.warn(f"the input's video stream {stream.index} is left out: the output holds the interpolated one")
            if stream.type not in ("audio", "subtitle", "attachment"):
                continue
            name = f"{stream.codec_context.name} {stream.type}" if stream.codec_context else stream.type
            if (copy := copy_of(self.container, stream)) is None:  # FLAC into MOV, PCM into MP4 or MPEG-TS
                made = transcoded(self.container, stream, self.dst) if stream.type == "audio" else converted(
                    self.container, stream, self.dst) if stream.type == "subtitle" else None  # :mod:`.audio`, :mod:`.subtitles`
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
            # The encoder may drop frame durations, and the muxer needs the last frame's.
            packet.duration = self.durations.pop(packet.pts, packet.duration)
            if self.first is None:
                self.first = (packet.pts, packet.dts)
                self._header(packet)
            else:
                self.container.mux_one(packet)
            if self.copies is not None and packet.dts is not None:
                self._copy_until(packet.dts * packet.time_base)
        if packets and WRITTEN.isEnabledFor(logging.DEBUG):
            WRITTEN.debug("%d packets %s", len(packets), event)

    def _header(self, packet) -> None:
        """Mux the first packet, with which the muxer writes its header: where it refuses the video
        there (raw RGB in Matroska, MPEG-4 Part 2 in MXF), FFmpeg's reason, not "Invalid argument"
        or "Operation not permitted" naming the hidden partial file; another failure as it was."""
        try:
            self.container.mux_one(packet)
        except self._error:
            said = header_refused(self.container, self.stream)
            close_unwritten(self.container)
            if not said:
                raise
            raise BadInputError(f"output {str(self.dst)!r}: its container ({self.container.format.name}) does not take this "
                                f"{self.stream.codec_context.name} video in {self.pix_fmt} ({said}); choose another "
                                "container, --vcodec or --pix-fmt") from None

    def _encode(self, picture, pts: int, duration: int) -> None:
        if self.palettes is not None:
            picture = self.palettes(picture)
        picture.pts, picture.duration, picture.time_base = pts, duration, self.time_base
        for name, value in self.tags.items():
            setattr(picture, name, value)
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
            if pts <= start and (self.constant or self.coarse):  # a variable rate's frames, moved to one tick of a coarser clock
                raise too_close(self.dst, self.container, self.times, self.time_base if self.coarse else self.tick, self.coarse)
            if pts <= start:
                raise BadInputError(f"{str(self.dst)!r}: the input's time base is too coarse for the frames "
                                    f"between two of its frames (time stamps {start} and {pts}); ask fewer")
            if (pts - start) * self.time_base < self.tick:  # rounded to one of the muxer's ticks (frames 1 ms apart into Matroska)
                raise too_close(self.dst, self.container, (start * self.time_base, pts * self.time_base), self.tick)
            self._encode(previous, start, pts - start)
        self.held = (picture, pts)

    def _show(self, picture, time: Fraction, original: Frame, between: tuple | None = None) -> None:
        """Hold ``picture`` due at ``time``; the video ends where ``original``, the latest seen, does.
        A middle is ``between`` (before, after, position) two originals, whose alpha it takes."""
        self.end = original.end
        if self.shown == 0:  # the input's display matrix (a rotation, a mirror): the pictures are stored alike
            show_as(self.container, self.stream, display_matrix(original.raw) or self._clip.display_matrix)
        if isinstance(picture, Frame):
            frame = self._original(picture)
            if self.alpha is not None:  # kept for the middles it borders (:meth:`_alpha`), not made again for each
                self._keep_alpha(picture, frame)
        else:
            frame = self._converted(picture)
            if self.alpha is not None and between is not None:
                self._alpha(frame, *between)
        self._hold(frame, self.shown if self.counted else self._on_tick(time))
        self.shown += 1

    def _on_tick(self, time: Fraction) -> int:
        """The tick of the output's clock nearest ``time``; where the container holds a constant rate
        alone (:func:`~.timing.output_clock`), a variable rate's frame moved there is said once."""
        self.times = (self.times[1], time)
        if (self.constant or self.fixed) and not self.moved:
            self.origin = time if self.origin is None else self.origin
            if ((time - self.origin) / self.time_base).denominator != 1:
                self.moved = True
                whose = f"{self.coarse} writes" if self.fixed else f"its container ({self.container.format.name}) holds"
                warnings.warn(f"{self.dst.name}: {whose} a constant frame rate alone; the input's variable-rate frames are "
                              f"each moved to the nearest tick of {float(1 / self.time_base):g} frames a second")
        return tick_of(time, self.time_base)

    def _original(self, original: Frame):
        """An original as the output shows it: its decoded picture in the output's format (:meth:`_as_output`),
        its own alpha (:mod:`.output_alpha`)."""
        return self._own_alpha(original.raw, self._as_output(original.raw))

    def _converted(self, picture):
        """A middle (or an image) in the output's pixel format, from the edge's planes or from RGB."""
        if isinstance(picture, Planes):  # converted by the edge, as this writer converts RGB
            assert picture.format == self.planes, (picture.format, self.planes)
            return picture_of(picture.array(), self.pix_fmt)
        if isinstance(picture, torch.Tensor):  # RGB (or RGBA) pixels, 8 or 16 bits; 8 as from_image takes an RGB image's
            deep = picture.dtype == torch.uint16
            rgb_format = ("rgba64le" if deep else "rgba") if picture.shape[-1] == 4 else "rgb48le" if deep else "rgb24"
            return self._subsampled(picture_of(picture.numpy(), rgb_format))
        return self._subsampled(self._from_image(picture.convert("RGB")))

    def _as_output(self, raw):
        """A decoded picture in the output's pixel format, size, matrix and range (itself where it is in them)."""
        if self.recolour or (raw.format.name, raw.width, raw.height) != (self.pix_fmt, self.stream.width, self.stream.height):
            return raw.reformat(self.stream.width, self.stream.height, self.pix_fmt, **self.convert)
        return raw

    def add(self, frame):
        self._show(frame, frame.time, frame)

    def add_middle(self, middle, before, after, position=HALF):
        self._show(middle, before.time + position * (after.time - before.time), after, (before, after, position))

    def place(self, picture, before, after, position):
        stop = before.end if after is None else after.time
        self._show(picture, before.time + position * (stop - before.time), after or before, (before, after or before, position))

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
                first_pts, first_dts = self.first or (packets[0].pts, packets[0].dts)  # all held until now: a short clip
                self.durations[final.pts] = end - final.dts - (first_pts - first_dts)
            self._mux(packets, "flushed")
            if self.copies is not None:
                self._copy_until(None)
        except self._error as exc:
            raise BadInputError(f"cannot write {str(self.dst)!r}: {exc}") from None

    def close(self):
        """Each closed whatever closing the one before raised: a full disk fails the output's trailer,
        and the input opened for its audio was left open until the cyclic collector found it."""
        with contextlib.ExitStack() as closing:  # last in, first closed
            if self.copies is not None:
                closing.callback(self.copies.close)
            closing.callback(self.container.close)
            if getattr(self, "segments", None) is not None:
                closing.callback(self.segments.close)
