"""Audio that the output's container cannot hold as it is, re-encoded into the container's own
default (AAC into WebM becomes Opus), as FFmpeg's command line does; every other audio stream is
copied packet for packet (:class:`~.video_writer.VideoWriter`). A cloud's source (``client/remote.py``)
is re-encoded alike, from the packets the cloud sends, which :class:`PageDecoder` decodes to the
samples and times a local file's decoder gives.

The input's packets are decoded as the writer's copy reaches them, and their samples encoded at
once (PyAV resamples them to what the encoder takes and cuts them to its frame size), so memory
holds a few frames of sound, never the track. The samples keep their times on the input's clock,
so the sound stays where it was against the video.
"""

from __future__ import annotations

import math
import struct
import warnings
from fractions import Fraction
from typing import Iterator

import numpy as np

from ..errors import BadInputError
from .encoding import holds, import_av, side_data


def transcoded(container, stream, dst) -> Transcoded | None:
    """The input's audio ``stream`` (or what stands for one: its ``codec_context`` decodes its
    packets), which ``container`` cannot hold as it is, re-encoded into the container's default
    audio codec, said in a warning; None where the container holds no audio (IVF, raw H.264): the
    caller leaves it out, as Y4M's writer does."""
    default = container.default_audio_codec
    if default in (None, "", "none") or not holds(container.format.name, default):
        return None
    made = Transcoded(container, stream, default, str(dst))
    warnings.warn(f"{dst.name} cannot hold the input's {stream.codec_context.name} audio as it is: it is re-encoded, {made.name}")
    return made


class Transcoded:
    """One input audio ``stream`` re-encoded as ``codec`` in ``container``: at the input's rate
    where the encoder takes it (else 48 kHz, or its highest), with the input's channels where it
    opens with them, else in stereo."""

    def __init__(self, container, stream, codec: str, dst: str):
        av = import_av()
        given = self.decoder = stream.codec_context
        rates = av.codec.Codec(codec, "w").audio_rates
        rate = given.sample_rate if not rates or given.sample_rate in rates else 48000 if 48000 in rates else max(rates)
        self.output = container.add_stream(codec, rate=rate)
        context = self.output.codec_context
        for layout in dict.fromkeys((given.layout.name, "stereo")):
            context.layout = layout
            try:
                context.open()
                break
            except (av.error.FFmpegError, ValueError) as exc:
                failed = exc
        else:
            raise BadInputError(f"output {dst!r}: cannot re-encode the input's {given.name} audio as {codec} ({failed})")
        self.name = f"{given.name} as {context.name}" + (f", {given.layout.name} as {layout}" if layout != given.layout.name else "")

    def packets(self, packet) -> Iterator:
        """The output's packets of the input's ``packet``; an empty one (the demuxer's last)
        flushes the decoder and the encoder."""
        for frame in self.decoder.decode(packet):
            yield from self._encoded(frame)
        if not packet.size:
            yield from self._encoded(None)

    def _encoded(self, frame) -> Iterator:
        for out in self.output.encode(frame):
            out.stream = self.output
            yield out


SKIP_SAMPLES = struct.Struct("<IIBB")  # FFmpeg's skip-samples side data: from the start, from the end, two reasons


def skips(packet) -> tuple[int, int] | None:
    """The samples that the decoder of a demuxed ``packet`` drops from the start and from the end of
    its sound (an MP4's priming, Matroska's CodecDelay and DiscardPadding), or None."""
    if not packet.has_sidedata("skip_samples"):
        return None
    data = bytes(packet.get_sidedata("skip_samples"))
    return SKIP_SAMPLES.unpack_from(data)[:2] if len(data) >= SKIP_SAMPLES.size else None


class PageDecoder:
    """A decoder of an audio stream's packets sent without their container (a cloud's pages, each
    packet with its :func:`skips`), whose frames are the samples and times a local file's decoder
    gives. FFmpeg drops the samples a packet says to skip, but moves the frame's time past them only
    where it knows the packets' time base, which PyAV tells a container's decoders alone: this one
    is told to leave the dropping to the caller (skip_manual), and drops as FFmpeg does."""

    def __init__(self, codec: str, extradata: bytes, rate: int, layout: str):
        av = import_av()
        self.context = av.CodecContext.create(codec, "r")
        self.context.extradata = extradata or None
        self.context.sample_rate, self.context.layout = rate, layout
        self.context.flags2 |= av.codec.context.Flags2.skip_manual
        self.name, self.sample_rate, self.layout = self.context.name, rate, self.context.layout
        self.skip = 0  # samples still to drop from the start, past the frames decoded
        self._kind, self._frame = av.sidedata.sidedata.Type.SKIP_SAMPLES, av.AudioFrame.from_ndarray

    def packet(self, packet, skipped: tuple[int, int] | None):
        """``packet``, given the side data that said ``skipped`` (:func:`skips`) where it came from."""
        if skipped is not None:
            av = import_av()
            side = av.packet.PacketSideData(av.packet.packet_sidedata_type_from_literal("skip_samples"), SKIP_SAMPLES.size)
            side.update(SKIP_SAMPLES.pack(*skipped, 0, 0))
            side.to_packet(packet)
        return packet

    def decode(self, packet) -> Iterator:
        """The frames of ``packet`` (an empty one flushes), less what FFmpeg's side data on each says
        to drop: from the start, whole frames before a part of one; from the end, within the frame."""
        for frame in self.context.decode(packet):
            side = next((bytes(d) for d in side_data(frame) if d.type == self._kind), None)
            start, end = SKIP_SAMPLES.unpack_from(side)[:2] if side and len(side) >= SKIP_SAMPLES.size else (None, 0)
            self.skip = self.skip if start is None else start
            count = frame.samples
            if self.skip >= count and self.skip:
                self.skip -= count
                continue
            first, self.skip = self.skip, 0
            last = count - end if 0 < end <= count - first else count
            if last == first:
                continue
            yield frame if (first, last) == (0, count) else self._cut(frame, first, last)

    def _cut(self, frame, first: int, last: int):
        """Samples ``first`` to ``last`` of ``frame``, timed as FFmpeg times them (rounded to the nearest tick)."""
        channels = 1 if frame.format.is_planar else frame.layout.nb_channels
        cut = self._frame(np.ascontiguousarray(frame.to_ndarray()[:, first * channels:last * channels]),
                          format=frame.format.name, layout=frame.layout.name)
        cut.sample_rate, cut.time_base = frame.sample_rate, frame.time_base
        cut.pts = frame.pts if frame.pts is None else frame.pts + math.floor(
            Fraction(first, frame.sample_rate) / frame.time_base + Fraction(1, 2))
        return cut
