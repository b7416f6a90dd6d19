"""Text subtitles that the output's container cannot hold as they are (SRT or ASS in MP4, SRT in
WebM, MP4's mov_text in Matroska), converted to a text format it holds, as FFmpeg's command line
converts them: its own default (ASS in Matroska, WebVTT in WebM; mov_text in MP4 and MOV). Every other
subtitle stream is copied packet for packet (:class:`~.video_writer.VideoWriter`); bitmap subtitles
(PGS, DVD) that it cannot hold are left out, as before.

FFmpeg decodes every text subtitle to ASS dialogue lines, and its text encoders take those: each
input packet is decoded as the writer's copy reaches it and encoded at once, at the packet's own
time and for its duration, so the words keep their place against the video and memory holds one
line. The styling that the target format has no place for (ASS's fonts in mov_text) is lost, as it
is with FFmpeg's command line.
"""

from __future__ import annotations

import warnings
from fractions import Fraction
from typing import Iterator

from .encoding import MP4_FORMATS, added, import_av

# The ISO family's text format, which FFmpeg's muxers do not state as their default, as Matroska
# (ASS) and WebM (WebVTT) do. NUT, which would take ASS, keeps no line's duration: none is made there.
MOV_TEXT_FORMATS = MP4_FORMATS | {"mov"}


def converted(container, stream, dst) -> Converted | None:
    """The input's subtitle ``stream`` (or what stands for one: its ``codec_context`` decodes its
    packets), which ``container`` cannot hold as it is, converted to a text format the container
    holds (its own), said in a warning; None where it is not text, or the container holds no text
    format of its own (MPEG-TS, AVI, NUT): the caller leaves it out."""
    av = import_av()
    decoder = stream.codec_context
    if decoder is None or not decoder.codec.text_sub:
        return None
    try:
        decoder.open(strict=False)  # its ASS header, which the encoders take as theirs
    except (av.error.FFmpegError, ValueError):
        return None
    own = "mov_text" if container.format.name in MOV_TEXT_FORMATS else container.default_subtitle_codec
    if own in (None, "", "none") or container.format.name == "nut":
        return None
    header = decoder.subtitle_header or _default_header(av)
    output = added(container, own, lambda made: _encoding(made, own, header))
    if output is None:
        return None
    warnings.warn(f"{dst.name} cannot hold the input's {decoder.name} subtitle as it is: it is converted, {decoder.name} as {own}")
    return Converted(decoder, output)


def _default_header(av) -> bytes | None:
    """FFmpeg's default ASS header, which its SRT decoder states: for an ASS track whose own is
    missing (a Matroska track without its CodecPrivate), which the encoders refuse to open without."""
    decoder = av.CodecContext.create("subrip", "r")
    decoder.open()
    return decoder.subtitle_header


def _encoding(container, codec: str, header: bytes | None):
    """A stream of ``container`` that encodes ``codec`` from dialogue lines under ``header``."""
    stream = container.add_stream(codec)
    context = stream.codec_context
    context.time_base = Fraction(1, 1000)  # an encoder's: the packets keep the input's times
    context.subtitle_header = header
    context.open()
    return stream


class Converted:
    """One input subtitle stream, whose packets ``decoder`` decodes, encoded anew into ``output``."""

    def __init__(self, decoder, output):
        av = import_av()
        self.decoder, self.output = decoder, output
        self._set = av.subtitles.subtitle.SubtitleSet.create

    def packets(self, packet) -> Iterator:
        """The output's packet of the input's ``packet``: its lines, at its time; none for an empty
        one (an MP4's gap between two lines, the demuxer's last)."""
        if not packet.size:
            return
        lines = [bytes(r.ass) for r in self.decoder.decode2(packet) or () if getattr(r, "ass", None)]
        if not lines:
            return
        # Lines shown together go as one: the first's fields, and every line's text after them (ASS's \N breaks).
        text = b",".join(lines[0].split(b",", 8)[:8] + [b"\\N".join(line.split(b",", 8)[-1] for line in lines)])
        span = round((packet.duration or 0) * packet.time_base * 1000) if packet.time_base else 0
        out = self.output.codec_context.encode_subtitle(self._set(text, 0, span, 0))
        out.pts, out.dts, out.duration, out.time_base = packet.pts, packet.dts, packet.duration, packet.time_base
        out.stream = self.output
        yield out
