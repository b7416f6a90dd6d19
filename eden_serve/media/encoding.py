"""A video output's encoder: codec, quality, speed and pixel format (``--vcodec``, ``--crf``,
``--preset``, ``--pix-fmt``, ``--encoder-opt``), with defaults per encoder, the input's colour
(:mod:`.colour`), and its own log kept to errors unless ``-v``.

Without ``--vcodec`` the output keeps the input's codec, written with the encoder PyAV has for it
(for AV1: libsvtav1 or libaom-av1, whichever the build holds; PyAV decodes AV1 with libdav1d or
its own decoder, neither of which can encode), or the output container's default where that
container cannot hold the input's codec or PyAV cannot write it (:func:`output_encoder`). A Y4M output is raw video. The pixel format is the
input's where the encoder takes it, else yuv420p10le for an input deeper than 8 bits where the
encoder takes that, else yuv420p, else the encoder's first; a change of depth is said in one line.

Where the edge computes on a GPU (``Encoding.gpu``), the encoder must keep its pace: an H100 makes
1080p middles at 50-100 a second, and x264 at its default preset medium encodes 51 frames a second
on 16 cores there, 141 at veryfast (docs/video.md, "Encoder speed"). There the GPU's own encoder
(NVENC) is used where it opens and no encoder was named, else x264 at preset veryfast unless
``--preset`` says otherwise. x264 runs its frame threads (PyAV's default, slice threads, is slower).

Every encoder opens through :func:`open_encoder`, which keeps the process's threads under the
scheduling policy they had: SVT-AV1 run as root moves the thread that opens it, and its own, to
SCHED_FIFO at priority 99 (docs/video.md, "Encoder speed").
"""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction

from ..errors import BadInputError
from .colour import FULL, Colour, merged

VIDEO_EXTRA = "reading or writing video needs PyAV: pip install 'eden-serve[video]'"


@dataclass(frozen=True)
class Tuning:
    """An encoder's defaults, the options that ``--crf`` and ``--preset`` set, its defaults where the
    edge is a GPU (``gpu``), and FFmpeg's threading for it (None: PyAV's)."""

    defaults: dict
    crf: str | None = "crf"
    preset: str | None = "preset"
    gpu: dict = field(default_factory=dict)
    thread_type: str | None = None


# Quality near visually lossless at each encoder's usual speed; "b" 0 makes libaom and libvpx
# honour crf as constant quality instead of a cap under a bit rate.
TUNINGS = {
    # AUTO: x264's frame threads, as FFmpeg's command line runs it (PyAV's SLICE makes x264 slice its frames).
    "libx264": Tuning({"crf": "18"}, gpu={"preset": "veryfast"}, thread_type="AUTO"),
    "libx265": Tuning({"crf": "20"}),
    "libsvtav1": Tuning({"crf": "30", "preset": "8"}),
    "libaom-av1": Tuning({"crf": "30", "b": "0", "cpu-used": "6", "row-mt": "1"}, preset="cpu-used"),
    "libvpx-vp9": Tuning({"crf": "31", "b": "0", "row-mt": "1"}, preset="cpu-used"),
    # NVENC's constant quality: cq about x264's crf for the same look; p4 the middle of its presets.
    "h264_nvenc": Tuning({"preset": "p4", "rc": "vbr", "cq": "19", "b": "0"}, crf="cq"),
    "hevc_nvenc": Tuning({"preset": "p4", "rc": "vbr", "cq": "21", "b": "0"}, crf="cq"),
    # FFmpeg's MPEG-family and JPEG encoders run at 200 kb/s whatever the frame's size unless told
    # otherwise: 31 dB at 720p where x264 at crf 18 gives 41 (docs/video.md, "The output's encoder").
    # A fixed quantizer instead, the finest usual one (qmin, 2: FFmpeg's -q:v 2, 41 dB there);
    # --encoder-opt qmin=N for a coarser one.
    **{name: Tuning({"flags": "+qscale"}, crf=None, preset=None) for name in (
        "mpeg1video", "mpeg2video", "mpeg4", "msmpeg4v2", "msmpeg4", "wmv1", "wmv2", "h261", "h263", "h263p", "flv", "mjpeg")},
}
# DNxHD's own profile holds a few fixed bit rates, each for some sizes and frame rates only, which a
# changed frame rate leaves (its encoder does not open); its successor DNxHR takes any size from
# 256x120 at any rate: the profile of each pixel format the encoder takes, at DNxHD's usual quality.
DNXHR_PROFILES = {"yuv422p": "dnxhr_hq", "yuv422p10le": "dnxhr_hqx", "yuv444p10le": "dnxhr_444", "gbrp10le": "dnxhr_444"}
# The GPU's encoder for a software one, used where the edge is a GPU and it opens there.
HARDWARE = {"libx264": "h264_nvenc", "libx265": "hevc_nvenc"}
# The inputs' pixel formats that NVENC writes as the software encoder would (None: not known yet,
# a pipe's): 8-bit 4:2:0. NVENC's H.264 has no deeper profile, and its formats are semi-planar or
# 4:4:4: a 10-bit, 4:2:2 or 4:4:4 input beside a GPU keeps x264 or x265, its depth and its chroma,
# rather than be rounded for speed by default.
NVENC_KEEPS = (None, "yuv420p", "yuvj420p")
# Whether each hardware encoder opened in this process, by frame size: NVENC's H.264 takes at most
# 4096 a side, so one that opened for a 1080p clip may refuse the page's next, a 5K one.
_OPENS: dict[tuple[str, int, int], bool] = {}
RAW_FORMATS = {"yuv4mpegpipe", "rawvideo"}
# The pixel formats Y4M holds (FFmpeg's muxer refuses others as it writes the header: RGB, palettes).
Y4M_PIX_FMTS = ("yuv420p", "yuv422p", "yuv444p", "yuv411p", "yuva444p", "yuvj420p", "yuvj422p", "yuvj444p",
                *(f"yuv{sampling}p{depth}le" for sampling in (420, 422, 444) for depth in (9, 10, 12, 14, 16)),
                "gray", *(f"gray{depth}le" for depth in (9, 10, 12, 16)))


def _threads() -> set[int]:
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:  # not Linux
        return set()


def open_encoder(context) -> None:
    """Open an encoder's ``context``; the calling thread, and the threads the encoder starts, stay
    under the caller's scheduling policy. Run as root, SVT-AV1 moves the thread that opens it to
    SCHED_FIFO at priority 99, and with it every thread started after (the encoder's own, then the
    writer's and the model's): on a 2-core host two chunk workers then spun on both cores while a
    thread they waited on, of the same priority, never ran again, and the command never ended
    (docs/video.md, "Encoder speed")."""
    if not hasattr(os, "sched_getscheduler"):
        context.open()
        return
    policy, param, before = os.sched_getscheduler(0), os.sched_getparam(0), _threads()
    try:
        context.open()
    finally:
        for tid in (0, *(_threads() - before)):  # 0: this thread
            try:
                if (os.sched_getscheduler(tid), os.sched_getparam(tid)) != (policy, param):
                    os.sched_setscheduler(tid, policy, param)
            except OSError:
                continue  # ended meanwhile


def import_av():
    try:
        import av
    except ImportError:
        raise BadInputError(VIDEO_EXTRA) from None
    return av


@dataclass(frozen=True)
class Encoding:
    """What the command line asked of the encoder; None: the default."""

    vcodec: str | None = None
    crf: str | None = None
    preset: str | None = None
    pix_fmt: str | None = None
    options: tuple[tuple[str, str], ...] = ()  # --encoder-opt, in order, passed to the encoder as they are
    gpu: bool = False  # the edge computes on a GPU: the encoder's defaults keep its pace (the module's note)
    verbose: bool = False  # -v: the encoder's own log (x265's and SVT-AV1's banners and statistics) on stderr
    instances: int | None = None  # x264 instances on segments (:mod:`.segments`); None: one

    @property
    def given(self) -> bool:
        """Whether the command line asked anything of the encoder."""
        return replace(self, gpu=False, verbose=False) != Encoding()

    def identity(self) -> dict:
        fields = {key: list(map(list, value)) if key == "options" else value for key, value in asdict(self).items()}
        del fields["verbose"]  # the output does not depend on it
        if not self.gpu:
            del fields["gpu"]  # as journals read before there was a GPU default
        if self.instances is None:
            del fields["instances"]  # likewise
        return fields

    def instances_for(self, name: str) -> int:
        """How many instances of encoder ``name`` encode the video: x264's as asked, else one, beside
        a GPU too: one x264 with all the cores was faster than several on segments with their shares
        wherever measured (docs/video.md, "Encoder speed"); any other encoder one."""
        if name != "libx264" or self.instances is None:
            return 1
        return self.instances


def parse_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise BadInputError(f"--encoder-opt takes KEY=VALUE, such as tune=film, got {text!r}")
    return key, value


def encoder(name: str, what: str) -> str:
    """The name of PyAV's video encoder for a codec or encoder ``name``; ``what`` says whose it is."""
    av = import_av()
    try:
        codec = av.codec.Codec(name, "w")
    except ValueError:
        hint = " (libsvtav1 or libaom-av1)" if name == "av1" else ""
        raise BadInputError(f"{what} is {name}, and this PyAV build has no {name} encoder{hint}; "
                            f"give --vcodec with one it has, such as libx264") from None
    if codec.type != "video":
        raise BadInputError(f"{what} {name} is a {codec.type} codec, not a video one")
    return codec.name


def output_encoder(container, encoding: Encoding, source, dst, pix_fmt: str | None = None) -> str:
    """The encoder of the output ``container``'s video (written to ``dst``), for input frames decoded
    by ``source`` (its codec context) in ``pix_fmt``: raw video in Y4M; ``--vcodec``'s; else the
    input's codec's, or, where the container cannot hold that codec or PyAV has no encoder for it
    (WMV3, Theora here), the container's own default, as FFmpeg's command line chooses (H.264 in
    MP4, MOV and Matroska, VP9 in WebM), said in a warning; beside a GPU, NVENC for H.264 or HEVC
    where it opens, no encoder was named, and the input is 8-bit 4:2:0 (:data:`NVENC_KEEPS`)."""
    if container.format.name in RAW_FORMATS:
        if encoding.vcodec not in (None, "rawvideo"):
            raise BadInputError(f"output {str(dst)!r} is Y4M, raw video: --vcodec does not apply")
        return "rawvideo"
    if encoding.vcodec is not None:
        name = encoder(encoding.vcodec, "--vcodec")
    else:
        codec, default = source.codec.canonical_name, container.default_video_codec
        default = None if default in ("", "none") else default
        try:
            name = encoder(codec, "the input's video codec")
            why = None if holds(container.format.name, name) else f"{str(dst)!r} cannot hold {codec} video"
        except BadInputError as exc:
            if not default:
                raise
            why = str(exc).split(";")[0]
        if why is not None and default:
            name = encoder(default, f"{why}; its container's default codec")
            warnings.warn(f"{why}: the output is written as {default} ({name}), its container's default; --vcodec chooses another")
    if encoding.gpu and encoding.vcodec in (None, "h264", "hevc") and pix_fmt in NVENC_KEEPS:  # no encoder named by the user
        name = hardware(name, source.width, source.height) or name
    return name


def holds(format_name: str, name: str) -> bool:
    """Whether a container of ``format_name`` takes a stream of encoder ``name``: where FFmpeg does
    not know (MPEG-PS, which lists no codecs), it is tried, as the stream would be."""
    with import_av().open(io.BytesIO(), "w", format=format_name) as scratch:
        try:
            scratch.add_stream(name)
        except ValueError:
            return False
    return True


def hardware(name: str, width: int, height: int) -> str | None:
    """The GPU's encoder in place of the software encoder ``name``, where this PyAV has one and it
    opens here for frames of ``width`` x ``height`` (a GPU without NVENC, such as an H100, no
    driver, or a size NVENC refuses: None)."""
    candidate = HARDWARE.get(name)
    av = import_av()
    if candidate is None or candidate not in av.codecs_available:
        return None
    if (candidate, width, height) not in _OPENS:
        _OPENS[candidate, width, height] = _opens(av, candidate, width, height)
    return candidate if _OPENS[candidate, width, height] else None


def _opens(av, name: str, width: int, height: int) -> bool:
    """Whether encoder ``name`` opens here for 8-bit 4:2:0 frames of ``width`` x ``height``."""
    try:
        context = av.CodecContext.create(name, "w")
        context.width, context.height, context.pix_fmt, context.time_base = width, height, "yuv420p", Fraction(1, 25)
        open_encoder(context)
    except (av.error.FFmpegError, ValueError):
        return False
    return True


def encoder_formats(codec) -> list[str]:
    """The pixel formats an encoder lists (none: it takes any)."""
    return [f.name for f in codec.video_formats or ()]


def _pix_fmt(codec, asked: str | None, source: str | None, muxed: tuple[str, ...] | None = None) -> str:
    """The output's pixel format among those the encoder takes, or ``muxed``: the container's, where it
    holds fewer (the raw video encoder takes any)."""
    formats = list(muxed) if muxed else encoder_formats(codec)
    if asked is not None:
        if formats and asked not in formats:
            raise BadInputError(f"--pix-fmt {asked}: {'the container' if muxed else codec.name} takes {', '.join(formats)}")
        return asked
    deep = source is not None and bits(source) > 8
    for candidate in (source, _nearest(formats, source), "yuv420p10le" if deep else None, "yuv420p"):
        if candidate is not None and (not formats or candidate in formats):
            return candidate
    return formats[0]


def _nearest(formats: list[str], source: str | None) -> str | None:
    """Where the encoder lacks the input's YUV format, its YUV format with the same colour sampling
    (4:4:4 stays 4:4:4) and the depth nearest the input's, deeper before shallower, alpha only where
    the input has it (ProRes 4444 decodes to 12 bits with alpha, its encoder takes 10: yuva444p10le
    rather than 4:2:2); None where it has none of that sampling."""
    if source is None or not source.startswith("yuv"):
        return None
    av = import_av()
    (width, height, alpha), depth = _sampling(av, source), bits(source)
    shapes = {f: _sampling(av, f) for f in formats if f.startswith("yuv")}
    same = [f for f, shape in shapes.items() if shape[:2] == (width, height) and shape[2] <= alpha]
    same.sort(key=lambda f: (bits(f) < depth, abs(bits(f) - depth), shapes[f][2] != alpha))
    return same[0] if same else None


def _sampling(av, pix_fmt: str) -> tuple[int, int, bool]:
    """A format's chroma plane size on 16x16 frames, and whether it holds alpha."""
    format = av.VideoFormat(pix_fmt, 16, 16)
    return format.chroma_width(16), format.chroma_height(16), any(c.is_alpha for c in format.components)


def bits(pix_fmt: str) -> int:
    """The most bits a component of ``pix_fmt`` holds."""
    return max(c.bits for c in import_av().VideoFormat(pix_fmt).components)


def _say_conversion(source: str | None, output: str, colour: Colour) -> None:
    """One line where the output's pixel format changes the input's depth or range."""
    if source is None:
        return
    was, now = bits(source), bits(output)
    if was != now:
        how = "rounded to" if now < was else "widened to"
        warnings.warn(f"the output's pixel format {output} holds {now} bits: the input's {was}-bit {source} frames are {how} it")
    if output.startswith("yuvj") and colour.range != FULL:
        warnings.warn(f"the output's pixel format {output} is full range: the input's limited-range frames are converted to it")


def output_range(pix_fmt: str, colour: Colour) -> int:
    """The range the output's frames are converted to and tagged with: full for a yuvj format, else the input's."""
    return FULL if pix_fmt.startswith("yuvj") else colour.range


def _log_level(name: str, verbose: bool) -> dict[str, str]:
    """The encoder's own log at the command line's level. SVT-AV1 reads its level from the
    environment, once, when it first logs (a process's later encoders keep that level)."""
    if name == "libsvtav1":
        os.environ["SVT_LOG"] = "3" if verbose else "1"
    return {"log-level": "info" if verbose else "error"} if name == "libx265" else {}


def configure(stream, encoding: Encoding, source_pix_fmt: str | None, colour: Colour = Colour(),
              muxed: tuple[str, ...] | None = None) -> dict:
    """Set the pixel format, colour and options of a new output ``stream`` and open its encoder, so
    that a bad option is refused before any frame is computed; the options given (the encoder
    consumes them as it opens: more instances of it take them again, :mod:`.segments`)."""
    av = import_av()
    name = stream.codec_context.name
    tuning = TUNINGS.get(name)
    options = {**tuning.defaults, **(tuning.gpu if encoding.gpu else {})} if tuning else {}
    for flag, value, key in (("--crf", encoding.crf, tuning and tuning.crf),
                             ("--preset", encoding.preset, tuning and tuning.preset)):
        if value is None:
            continue
        if not key:
            takers = ", ".join(n for n, t in TUNINGS.items() if (t.crf if flag == "--crf" else t.preset))
            raise BadInputError(f"{flag} applies to {takers}; for {name} give --encoder-opt KEY=VALUE")
        options[key] = value
    options.update(encoding.options)
    options = {**colour.options(), **options}  # the chroma location, unless --encoder-opt names it
    options = merged(options, name, {**_log_level(name, encoding.verbose), **colour.parameters(name)})
    stream.pix_fmt = _pix_fmt(stream.codec_context.codec, encoding.pix_fmt, source_pix_fmt, muxed)
    if name == "dnxhd" and "profile" not in options and stream.pix_fmt in DNXHR_PROFILES:
        options["profile"] = DNXHR_PROFILES[stream.pix_fmt]
    _say_conversion(source_pix_fmt, stream.pix_fmt, colour)
    replace(colour, range=output_range(stream.pix_fmt, colour)).tag(stream.codec_context)
    stream.options = options
    _check_rate(stream, name)
    if tuning and tuning.thread_type:
        stream.codec_context.thread_type = tuning.thread_type
    try:
        open_encoder(stream.codec_context)
    except (av.error.FFmpegError, ValueError) as exc:
        if encoding.pix_fmt is None and _opened_full_range(stream, source_pix_fmt, colour, av):
            return options
        settings = " ".join([*(f"{k}={v}" for k, v in options.items()), f"pix_fmt {stream.pix_fmt}"])
        raise BadInputError(f"{name} refuses these settings ({settings}): {exc}"
                            f"{_odd_size(stream, av)}") from None
    return options


def _check_rate(stream, name: str) -> None:
    """An encoder that writes only the frame rates its standard defines (MPEG-1 and -2) refuses any
    other without a reason (``--fps 23.976`` is 2997/125, not NTSC's 24000/1001): the nearest is
    named instead."""
    listed, rate = stream.codec_context.codec.frame_rates, stream.codec_context.framerate
    rates = [Fraction(r.numerator, r.denominator) for r in listed or ()]
    if rates and rate is not None and rate not in rates:
        nearest = min(rates, key=lambda r: abs(r - rate))
        raise BadInputError(f"{name} writes only the frame rates its standard defines, and {rate} ({float(rate):.3f}) is not "
                            f"one: the nearest is {nearest} ({float(nearest):.3f}); ask --fps {nearest}, or another --vcodec")


def _odd_size(stream, av) -> str:
    """Why an encoder may have refused, where the frame's size is odd along a side whose chroma is
    subsampled (x264 and x265 take no 17x33 yuv420p), with what to ask instead; else nothing."""
    width, height = stream.width, stream.height
    chroma = av.VideoFormat(stream.pix_fmt, width, height).components[1:2]
    if not chroma or (width % 2 == 0 or chroma[0].width == width) and (height % 2 == 0 or chroma[0].height == height):
        return ""
    return f"; its {width}x{height} frames are odd where {stream.pix_fmt} halves the colour: try --pix-fmt yuv444p"


def _opened_full_range(stream, source_pix_fmt: str | None, colour: Colour, av) -> bool:
    """Whether ``stream``'s encoder, which refused its limited-range YUV, opened on the full-range twin
    of that format (yuv420p: yuvj420p), as FFmpeg's command line chooses: JPEG's encoders take
    limited range only where told to break their standard. Else the format stays as it was."""
    refused, twin = stream.pix_fmt, "yuvj" + stream.pix_fmt[3:]
    if not refused.startswith("yuv") or twin not in encoder_formats(stream.codec_context.codec):
        return False
    stream.pix_fmt = twin
    replace(colour, range=FULL).tag(stream.codec_context)
    try:
        open_encoder(stream.codec_context)
    except (av.error.FFmpegError, ValueError):
        stream.pix_fmt = refused
        return False
    _say_conversion(source_pix_fmt, twin, colour)
    return True
