"""Which encoder writes a video output, and with which options: defaults per encoder (quality, speed),
``--crf`` and ``--preset`` mapped to each encoder's own options, the input's colour
(:mod:`.colour`), and the encoder's own log kept to errors unless ``-v``.

Without ``--vcodec`` the output keeps the input's codec, written with the encoder PyAV has for it
(for AV1: libsvtav1 or libaom-av1, whichever the build holds; PyAV decodes AV1 with libdav1d or
its own decoder, neither of which can encode), or the output container's default where that
container cannot hold the input's codec or PyAV cannot write it (:func:`output_encoder`). A Y4M
output is raw video. The pixel format follows :mod:`.pixel_formats`.

Where the edge computes on a GPU (``Encoding.gpu``), the encoder must keep its pace: an H100 makes
1080p middles at 50-100 a second, and x264 at its default preset medium encodes 51 frames a second
on 16 cores there, 141 at veryfast (docs/video.md, "Encoder speed"). There the GPU's own encoder
(NVENC, :mod:`.nvenc`) is used where it opens and no encoder was named, else x264 at preset
veryfast unless ``--preset`` says otherwise. x264 runs its frame threads (PyAV's default, slice
threads, is slower).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import BadInputError
from .colour import UNSPECIFIED, Colour, merged
from .encoding import Encoding, FFmpegErrors, holds, import_av, open_encoder
from .nvenc import NVENC_KEEPS, hardware, on_gpu
from .pixel_formats import encoder_formats, output_colour, output_pix_fmt, sampling_name, say_conversion


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
    # otherwise: 31 dB at 720p where x264 at crf 18 gives 41 (docs/video.md, "Video encoder").
    # A fixed quantizer instead, the finest usual one (qmin, 2: FFmpeg's -q:v 2, 41 dB there);
    # --encoder-opt qmin=N for a coarser one.
    **{name: Tuning({"flags": "+qscale"}, crf=None, preset=None) for name in (
        "mpeg1video", "mpeg2video", "mpeg4", "msmpeg4v2", "msmpeg4", "wmv1", "wmv2", "h261", "h263", "h263p", "flv", "mjpeg")},
}
# DNxHD's own profile holds a few fixed bit rates, each for some sizes and frame rates only, which a
# changed frame rate leaves (its encoder does not open); its successor DNxHR takes any size from
# 256x120 at any rate: the profile of each pixel format the encoder takes, at DNxHD's usual quality.
DNXHR_PROFILES = {"yuv422p": "dnxhr_hq", "yuv422p10le": "dnxhr_hqx", "yuv444p10le": "dnxhr_444", "gbrp10le": "dnxhr_444"}
RAW_FORMATS = {"yuv4mpegpipe", "rawvideo"}
# The sizes H.263 writes (its source formats, sub-QCIF to 16CIF); H.263+ writes others, multiples of 4.
H263_SIZES = {(128, 96), (176, 144), (352, 288), (704, 576), (1408, 1152)}
# Uncompressed video codecs (Y4M's, a headerless input's, 10-bit professional ones): an output in
# the container's default codec is what anyone expects of them, not worth a warning.
UNCOMPRESSED = {"rawvideo", "v210", "v410", "r210", "yuv4"}


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
    elif source.codec is None:  # images (:mod:`.sequence`): no codec to keep, the container's default, as FFmpeg's
        default = container.default_video_codec
        if default in ("", "none"):
            raise BadInputError(f"output {str(dst)!r}: its container has no default video codec; give --vcodec")
        name = encoder(default, f"{str(dst)!r}'s default video codec")
    else:
        codec, default = source.codec.canonical_name, container.default_video_codec
        default = None if default in ("", "none") else default
        try:
            name = encoder(codec, "the input's video codec")
            if name == "h263" and (source.width, source.height) not in H263_SIZES:
                name = "h263p"  # H.263+ (FFmpeg decodes it as H.263), whose sizes H.263's own encoder refuses
            why = None if holds(container.format.name, name) else f"{str(dst)!r} cannot hold {codec} video"
        except BadInputError as exc:
            if not default:
                raise
            why = str(exc).split(";")[0]
        if why is not None and default:
            name = encoder(default, f"{why}; its container's default codec")
            if codec not in UNCOMPRESSED:  # nobody keeps those as they are: no warning for the expected
                warnings.warn(f"{why}: the output is written as {default} ({name}), its container's default; --vcodec chooses another")
    if encoding.gpu and encoding.vcodec in (None, "h264", "hevc") and pix_fmt in NVENC_KEEPS:  # no encoder named by the user
        name = hardware(name, source.width, source.height, encoding.gpu_index) or name
    return name


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
    options.update(on_gpu(name, encoding.gpu_index) if encoding.gpu else {})
    for flag, value, key in (("--crf", encoding.crf, tuning and tuning.crf),
                             ("--preset", encoding.preset, tuning and tuning.preset)):
        if value is None:
            continue
        if not key:
            takers = ", ".join(n for n, t in TUNINGS.items() if (t.crf if flag == "--crf" else t.preset))
            raise BadInputError(f"{flag} applies to {takers}; for {name} give --encoder-opt KEY=VALUE")
        options[key] = value
    options.update(encoding.options)
    if name == "libvpx-vp9" and str(options.get("lossless")) == "1" and encoding.crf is None:
        options.pop("crf", None)  # the default quality beside lossless: libvpx refuses the two together
    options = {**colour.options(), **options}  # the chroma location, unless --encoder-opt names it
    options = merged(options, name, {**_log_level(name, encoding.verbose), **colour.parameters(name)})
    base = options
    stream.pix_fmt = output_pix_fmt(stream.codec_context.codec, encoding.pix_fmt, source_pix_fmt, muxed)
    options = _for_format(name, stream.pix_fmt, base)
    output_colour(name, stream.pix_fmt, colour).tag(stream.codec_context)
    stream.options = options
    _check_rate(stream, name)
    if tuning and tuning.thread_type:
        stream.codec_context.thread_type = tuning.thread_type
    try:
        open_encoder(stream.codec_context)
    except (av.error.FFmpegError, ValueError) as exc:
        if encoding.pix_fmt is None and _opened_full_range(stream, source_pix_fmt, colour, av):
            return options
        opened = _opened_other(stream, base, source_pix_fmt, colour, muxed) if encoding.pix_fmt is None else None
        if opened is not None:
            return opened
        settings = " ".join([*(f"{k}={v}" for k, v in options.items()), f"pix_fmt {stream.pix_fmt}"])
        reason = _reason(stream.codec_context, options, av)
        if reason:  # FFmpeg's own: the frames' size (H.261, H.263, DNxHR), their rate... not the options listed
            raise BadInputError(f"{name} does not open on {stream.width}x{stream.height} frames: {reason} "
                                f"(its settings: {settings})") from None
        raise BadInputError(f"{name} refuses these settings ({settings}): {exc}"
                            f"{_odd_size(stream, av)}") from None
    say_conversion(source_pix_fmt, stream.pix_fmt, colour, name)  # once, of the format it opened on
    return options


def _for_format(name: str, pix_fmt: str, options: dict) -> dict:
    """``options`` with what ``name`` needs for ``pix_fmt``."""
    options = dict(options)
    if name == "libvpx" and pix_fmt == "yuva420p":
        options.setdefault("auto-alt-ref", "0")  # libvpx encodes VP8's alpha only without alternate reference frames
    if name == "dnxhd" and "profile" not in options and pix_fmt in DNXHR_PROFILES:
        options["profile"] = DNXHR_PROFILES[pix_fmt]
    return options


# The most other formats tried where an encoder refused the one chosen: the choices of
# :func:`~.pixel_formats.output_pix_fmt` are at most six, the first of them refused.
_OTHERS = 5


def _opened_other(stream, base: dict, source_pix_fmt: str | None, colour: Colour, muxed) -> dict | None:
    """The options ``stream``'s encoder opened with on the next format chosen without those it
    refuses in themselves though it lists them (:func:`_refuses`; libvpx-vp9: ``yuva444p``,
    ``yuva422p``, ``gbrap``; libx265 built without alpha: ``yuva420p``), said in one line; None,
    the format as it was, where the refusal was for another reason (an odd size, an option) or no
    other opens: the first refusal is the one said."""
    av, context = import_av(), stream.codec_context
    first, listed, refused = stream.pix_fmt, set(muxed or encoder_formats(context.codec)), {stream.pix_fmt}
    if not _refuses(context, first, av):
        return None
    while len(refused) <= _OTHERS:
        chosen = output_pix_fmt(context.codec, None, source_pix_fmt, muxed, frozenset(refused))
        if chosen in refused or (listed and chosen not in listed):
            break
        if _refuses(context, chosen, av):
            refused.add(chosen)
            continue
        options = _for_format(context.name, chosen, base)
        stream.pix_fmt, stream.options = chosen, options
        _retag(context, chosen, colour)
        try:
            open_encoder(context)
        except (av.error.FFmpegError, ValueError):
            break
        was = f" (the input's {sampling_name(source_pix_fmt)} {source_pix_fmt})" if source_pix_fmt else ""
        warnings.warn(f"{context.name} lists {first} but does not open with it: the output's pixel format is {chosen}, "
                      f"{sampling_name(chosen)}{was}")
        say_conversion(source_pix_fmt, chosen, colour, context.name)
        return options
    stream.pix_fmt, stream.options = first, _for_format(context.name, first, base)
    _retag(context, first, colour)
    return None


def _refuses(template, pix_fmt: str, av) -> bool:
    """Whether ``template``'s encoder refuses to open on ``pix_fmt`` in itself: without the options
    asked, at its size made even, its own rate."""
    context = av.CodecContext.create(template.name, "w")
    context.width, context.height = template.width + template.width % 2, template.height + template.height % 2
    context.time_base, context.framerate, context.pix_fmt = template.time_base, template.framerate, pix_fmt
    context.options = _for_format(template.name, pix_fmt, merged({}, template.name, _log_level(template.name, False)))  # x265: no banner
    try:
        open_encoder(context)
    except (av.error.FFmpegError, ValueError):
        return True
    return False


def _retag(context, pix_fmt: str, colour: Colour) -> None:
    """``context`` tagged anew for ``pix_fmt``: the RGB matrix an RGB format states is not a YUV one's."""
    context.color_primaries = context.color_trc = context.colorspace = UNSPECIFIED
    context.color_range = 0
    output_colour(context.name, pix_fmt, colour).tag(context)


DV_RATES = (Fraction(25), Fraction(30000, 1001))  # PAL's and NTSC's: a raw DV file's muxer writes no other


def _check_rate(stream, name: str) -> None:
    """An encoder that writes only the frame rates its standard defines (MPEG-1 and -2) refuses any
    other without a reason (``--fps 2997/125``, 23.976 exactly, not NTSC's 24000/1001): the nearest is
    named instead."""
    listed, rate = stream.codec_context.codec.frame_rates, stream.codec_context.framerate
    rates = [Fraction(r.numerator, r.denominator) for r in listed or ()]
    if stream.container.format.name == "dv" and rate not in DV_RATES:  # its muxer times the frames by their system's rate
        raise BadInputError(f"a raw DV file plays at 25 or 30000/1001 frames a second, whatever its frames' times: at {rate} "
                            "it would play slower than the input; write .mov, .avi or .mkv (--vcodec dvvideo keeps DV)")
    if rates and rate is not None and rate not in rates:
        nearest = min(rates, key=lambda r: abs(r - rate))
        raise BadInputError(f"{name} writes only the frame rates its standard defines, and {rate} ({float(rate):.3f}) is not "
                            f"one: the nearest is {nearest} ({float(nearest):.3f}); ask --fps {nearest}, or another --vcodec")


def _reason(template, options: dict, av) -> str:
    """Why FFmpeg's encoder of ``template`` did not open with ``options``, in its own words, or "":
    PyAV's error leaves them out while FFmpeg's log is off (PyAV's default), and said only "returned
    22" after the options it was given, as if they were the cause (an H.261 or H.263 frame of a size
    their standards do not list; DNxHR's under 256x120). A scratch encoder like it is opened again,
    its log captured (:class:`~.encoding.FFmpegErrors`). Not for an outside library's (x264,
    libvpx...), which says why on stderr itself, and would say it twice."""
    if template.name.startswith("lib"):
        return ""
    context = av.CodecContext.create(template.name, "w")
    context.width, context.height, context.pix_fmt = template.width, template.height, template.pix_fmt
    context.time_base, context.framerate = template.time_base, template.framerate
    context.options = dict(options)
    with FFmpegErrors() as errors:
        try:
            open_encoder(context)
        except (av.error.FFmpegError, ValueError):
            return errors.line
    return ""  # it opens here: the refusal was of something else


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
    output_colour(stream.codec_context.name, twin, colour).tag(stream.codec_context)
    try:
        open_encoder(stream.codec_context)
    except (av.error.FFmpegError, ValueError):
        stream.pix_fmt = refused
        return False
    say_conversion(source_pix_fmt, twin, colour, stream.codec_context.name)
    return True
