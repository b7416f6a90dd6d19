"""A clip's output clock (:class:`Retiming`): ``--factor`` times the source frames, or ``--fps``
frames a second; where its frames fall and which middle each shows is the client's
(:mod:`eden_serve.clips.schedule`), the writers only need the clock.

``levels`` tells a factor of 2, 4 or 8 (every middle of one to three full 2x passes) from the others.

A frame rate written as a decimal that rounds an NTSC rate, k*1000/1001, to its digits (23.976,
29.97, 59.94, 119.88) means that rate, as HandBrake reads them: FFmpeg reads 59.94 as 2997/50
exactly, whose frames drift from NTSC's 60000/1001 by a frame every 4.6 hours, and which
MPEG-1 and -2 cannot write (:func:`parse_rate`).

A container's muxer may time the frames on a clock of its own, whatever time base they are given
in (:func:`output_clock`): Matroska, WebM, FLV and ASF on 1 ms, AVI on 1/600 s for any tick finer
than 1 ms, GIF on 1/100 s. AVI keeps a frame's own tick (1001/60000 s for 59.94 frames a second),
which its frames are then given, as FFmpeg's command line writes an AVI: on 1/600 s they were
rounded unevenly and the ticks between padded with empty frames. Two frames within one tick would
share a time stamp (a file players stumble on, or the muxer's "Invalid argument" at the end): such
an output is refused.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from ..errors import BadInputError
from .encoding import import_av, open_encoder

MAX_DEPTH = 10  # of the 2x tree a retimed output reaches into
DEFAULT_TIME_ERROR = Fraction(1, 4)  # of an output frame
MAX_FACTOR = 64
MAX_FPS = 1000
# Some encoders (MPEG-4 Part 2, whose vop_time_increment_resolution has 16 bits) refuse a time base over 16 bits.
MAX_TIME_BASE_DENOMINATOR = 65535
_SIXTEEN_BIT_ENCODERS = {"mpeg4"}
# Containers that keep the finest of time bases, named where another's clock is too coarse.
FINE_CLOCKS = ".mp4, .mov or .nut"
# NTSC's rates are k*1000/1001 frames a second (24000/1001, 30000/1001, 60000/1001...).
NTSC = Fraction(1000, 1001)
_DECIMAL = re.compile(r"[+-]?\d*\.(\d+)")


def parse_fraction(text: str, what: str) -> Fraction:
    """``N``, ``N/D`` or a decimal such as 2.5, as an exact fraction."""
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise BadInputError(f"{what} takes N, N/D or a decimal such as 60, 24000/1001 or 59.94, got {text!r}") from None


def parse_rate(text: str, what: str = "--fps") -> Fraction:
    """A frame rate: ``N`` or ``N/D`` exactly; a decimal as written, unless it is not whole and is an
    NTSC rate k*1000/1001 rounded to its digits (23.976, 29.97, 59.94, 119.88; the module's note),
    which it then means. 25.5 and 12.5 stay exact (k 26 and 13 round to 25.974 and 12.987)."""
    value = parse_fraction(text, what)
    decimal = _DECIMAL.fullmatch(text.strip())
    if decimal is None or value.denominator == 1:
        return value
    ntsc = round(value / NTSC) * NTSC
    return ntsc if round(ntsc, len(decimal.group(1))) == value else value


@dataclass(frozen=True)
class Retiming:
    """The output clock: ``factor`` times the source frames, or ``fps`` frames a second; each frame
    within ``time_error`` of an output frame's interval of its time."""

    factor: Fraction = Fraction(2)
    fps: Fraction | None = None
    time_error: Fraction = DEFAULT_TIME_ERROR

    def __post_init__(self):
        if self.fps is not None and not 0 < self.fps <= MAX_FPS:
            raise BadInputError(f"--fps must be above 0 and at most {MAX_FPS}, got {self.fps}")
        if self.fps is None and not 1 < self.factor <= MAX_FACTOR:
            raise BadInputError(f"--factor must be above 1 and at most {MAX_FACTOR}, got {self.factor}")
        if not 0 < self.time_error <= Fraction(1, 2):
            raise BadInputError(f"--time-error must be above 0 and at most 1/2 (of an output frame), got {self.time_error}")

    @property
    def levels(self) -> int | None:
        """L for a factor 2^L (every middle of L full 2x passes is shown), else None."""
        if self.fps is None and self.factor.denominator == 1 and self.factor.numerator & (self.factor.numerator - 1) == 0:
            return self.factor.numerator.bit_length() - 1
        return None

    def frames(self, length: int, rate: Fraction) -> int:
        """The output's frames from ``length`` source frames at ``rate``: F(N - 1) + 1 for a factor
        F of 2, 4 or 8, else about the factor or ``fps`` times the source's, rounded up (they set
        the x264 segments' lengths, :func:`.segments.segment_frames`, where a few frames left over
        would make a segment of their own)."""
        if self.levels is not None:
            return int(self.factor) * (length - 1) + 1
        return math.ceil(length * (self.factor if self.fps is None else self.fps / rate))

    def describe(self) -> str:
        return f"--fps {self.fps}" if self.fps is not None else f"--factor {self.factor}"


def tick_of(time: Fraction, time_base: Fraction) -> int:
    """The tick of ``time_base`` nearest ``time``, halves up: evenly spaced frames keep their spacing
    wherever the ticks start (an MPEG-PS video starts at 0.5417 s, half a tick of 1/60 s off the
    grid, and Python's round, halves to even, put two frames of 60 a second on one tick)."""
    return math.floor(time / time_base + Fraction(1, 2))


def output_time_base(source: Fraction, retiming: Retiming) -> Fraction:
    """A tick that every output time falls on: under a factor a/b the source's divided by a (times
    fall on 1/a of an interval), under ``--fps`` the largest dividing both the source's tick and a
    frame's time; where that exceeds 16 bits, a coarser one and times rounded to it."""
    if retiming.fps is not None:
        step = 1 / retiming.fps
        common = Fraction(math.gcd(source.numerator * step.denominator, step.numerator * source.denominator),
                          source.denominator * step.denominator)
        return common if common.denominator <= MAX_TIME_BASE_DENOMINATOR else step
    scale = retiming.factor.numerator
    while scale > 1 and (source / scale).denominator > MAX_TIME_BASE_DENOMINATOR:
        scale //= 2
    return source / scale


def encoder_clock(name: str, time_base: Fraction, rate: Fraction, dst: Path) -> Fraction:
    """The time base encoder ``name`` takes for frames on ``time_base`` at about ``rate`` a second:
    ``time_base``, unless the encoder holds none over 16 bits (MPEG-4 Part 2) and it is finer (an
    MPEG-TS input's 1/90000 s): then the finest within 16 bits that a frame of ``rate`` falls on
    (1/65500 s for 50 frames a second), the times rounded to it. BadInputError, before any pair is
    computed, where not even 1/``rate`` fits (119.88 frames a second: 1001/120000 s); the encoder
    refused such a time base without a reason, in a line that named the options it was given."""
    if name not in _SIXTEEN_BIT_ENCODERS or time_base.denominator <= MAX_TIME_BASE_DENOMINATOR:
        return time_base
    frame = 1 / rate
    if frame.denominator <= MAX_TIME_BASE_DENOMINATOR:
        return frame / (MAX_TIME_BASE_DENOMINATOR // frame.denominator)
    raise BadInputError(f"output {str(dst)!r}: {name} (MPEG-4 Part 2) counts time in at most {MAX_TIME_BASE_DENOMINATOR} ticks a "
                        f"second, and {rate} ({float(rate):.3f}) frames a second need {frame.denominator} of them: choose another "
                        f"--vcodec (libx264, for one) or a rate whose clock fits, such as --fps {max(1, round(rate))}")


def muxer_clock(container, stream) -> Fraction:
    """The tick on which ``container``'s muxer times the frames of ``stream``, given in its time
    base: learned on a scratch muxer of its format, from the stream's copy, else from a small stream
    of the format's own default codec (Matroska writes H.264 only with the parameter sets that its
    encoder makes as it opens); the stream's own where neither writes a header."""
    av = import_av()
    for made in ("copy", container.default_video_codec):
        scratch = av.open(io.BytesIO(), "w", format=container.format.name)
        try:
            if made == "copy":
                copy = scratch.add_stream_from_template(stream)
            else:
                copy = scratch.add_stream(made, rate=1 / stream.time_base)
                copy.width = copy.height = 16
                copy.pix_fmt = next((f.name for f in copy.codec_context.codec.video_formats or ()), copy.pix_fmt)
            copy.time_base = copy.codec_context.time_base = stream.time_base
            if made != "copy":
                open_encoder(copy.codec_context)
            scratch.start_encoding()
            return Fraction(copy.time_base)
        except (av.error.FFmpegError, ValueError):
            continue
        finally:
            try:
                scratch.close()
            except av.error.FFmpegError:  # a trailer of no frames: GIF's muxer refuses it
                pass
    return Fraction(stream.time_base)


def finer(container) -> str:
    """The outputs to name beside ``container`` where its clock is too coarse: for an animation, the
    animations whose clocks are finer first."""
    return f".apng, .webp, {FINE_CLOCKS}" if container.format.name == "gif" else FINE_CLOCKS


def _tick(clock: Fraction) -> str:
    return f"1/{clock.denominator} s" if clock.numerator == 1 else f"{clock} s"


def output_clock(container, stream, rate: Fraction, dst: Path) -> tuple[Fraction, Fraction]:
    """The time base to give the frames of ``container``'s video ``stream`` (its own, set), and the
    tick it is written on: the time base where the muxer keeps it; else a frame's own, 1/``rate``,
    where the muxer keeps that (AVI, whose clock for any tick finer than 1 ms is 1/600 s, which
    59.94 frames a second do not fall on: it rounded them and padded the ticks between with empty
    frames); else the muxer's coarser clock (Matroska's 1 ms). BadInputError where that is coarser
    than a frame of ``rate``: some would share a time stamp, decided before a frame is written."""
    given = Fraction(stream.time_base)
    tick = max(muxer_clock(container, stream), given)
    if tick == given:
        return given, tick
    own = tick  # not tried: an encoder that refuses a time base over 16 bits
    if (1 / rate).denominator <= MAX_TIME_BASE_DENOMINATOR or stream.codec_context.name not in _SIXTEEN_BIT_ENCODERS:
        stream.time_base = stream.codec_context.time_base = 1 / rate
        if (own := muxer_clock(container, stream)) == 1 / rate:
            return own, own
    stream.time_base = stream.codec_context.time_base = given
    if tick <= 1 / rate:
        return given, tick
    raise BadInputError(f"output {str(dst)!r}: its container ({container.format.name}) times frames on a clock of "
                        f"{_tick(min(tick, max(own, 1 / rate)))}, too coarse for {float(rate):g} frames a second (frames would share a time "
                        f"stamp); write {finer(container)}, whose clocks are finer, or ask fewer frames (--fps)")


def too_close(dst: Path, container, times: tuple[Fraction, Fraction], tick: Fraction, encoder: str = "") -> BadInputError:
    """The refusal of two frames at ``times`` less than one ``tick`` of ``container``'s clock apart
    (a variable rate's frames closer than the output's average frame), or of ``encoder``'s, where it
    took a coarser clock than the input's (MPEG-1/2's frame rate; :func:`encoder_clock`)."""
    if encoder:
        return BadInputError(f"output {str(dst)!r}: two of its frames, at {float(times[0]):.6f} s and {float(times[1]):.6f} s, "
                             f"are closer than a tick of {encoder}'s clock ({_tick(tick)}) and would share a time stamp; "
                             "choose another --vcodec, or ask fewer frames (--fps)")
    return BadInputError(f"output {str(dst)!r}: two of its frames, at {float(times[0]):.6f} s and {float(times[1]):.6f} s, "
                         f"are closer than a tick of its container's clock ({container.format.name}: {_tick(tick)}) and "
                         f"would share a time stamp; write {finer(container)}, whose clocks are finer, or ask fewer frames (--fps)")
