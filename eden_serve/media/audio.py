"""Audio that the output's container cannot hold as it is, re-encoded into the container's own
default (AAC into WebM becomes Opus), as FFmpeg's command line does; every other audio stream is
copied packet for packet (:class:`~.video_writer.VideoWriter`).

The input's packets are decoded as the writer's copy reaches them, and their samples encoded at
once (PyAV resamples them to what the encoder takes and cuts them to its frame size), so memory
holds a few frames of sound, never the track. The samples keep their times on the input's clock,
so the sound stays where it was against the video.
"""

from __future__ import annotations

import warnings
from typing import Iterator

from ..errors import BadInputError
from .encoding import holds, import_av


def transcoded(container, stream, dst) -> Transcoded | None:
    """The input's audio ``stream``, which ``container`` cannot hold as it is, re-encoded into the
    container's default audio codec, said in a warning; None where the container holds no audio
    (IVF, raw H.264): the caller leaves it out, as Y4M's writer does."""
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
        given = stream.codec_context
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
        """The output's packets of the input's ``packet``; its empty one (the demuxer's last) flushes
        the decoder and the encoder."""
        for frame in packet.decode():
            yield from self._encoded(frame)
        if not packet.size:
            yield from self._encoded(None)

    def _encoded(self, frame) -> Iterator:
        for out in self.output.encode(frame):
            out.stream = self.output
            yield out
