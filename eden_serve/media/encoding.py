"""A video output's encoder: codec, quality, speed and pixel format (``--vcodec``, ``--crf``,
``--preset``, ``--pix-fmt``, ``--encoder-opt``), with defaults per encoder.

Without ``--vcodec`` the output keeps the input's codec, written with the encoder PyAV has for it
(for AV1: libsvtav1 or libaom-av1, whichever the build holds; PyAV decodes AV1 with libdav1d or
its own decoder, neither of which can encode). A Y4M output is raw video. The pixel format is the
input's where the encoder takes it, else yuv420p, else the encoder's first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import BadInputError

VIDEO_EXTRA = "reading or writing video needs PyAV: pip install 'eden-serve[video]'"


@dataclass(frozen=True)
class Tuning:
    """An encoder's defaults, and the options that ``--crf`` and ``--preset`` set."""

    defaults: dict
    crf: str | None = "crf"
    preset: str | None = "preset"


# Quality near visually lossless at each encoder's usual speed; "b" 0 makes libaom and libvpx
# honour crf as constant quality instead of a cap under a bit rate.
TUNINGS = {
    "libx264": Tuning({"crf": "18"}),
    "libx265": Tuning({"crf": "20", "x265-params": "log-level=error"}),  # else a screenful of notes per run
    "libsvtav1": Tuning({"crf": "30", "preset": "8"}),
    "libaom-av1": Tuning({"crf": "30", "b": "0", "cpu-used": "6", "row-mt": "1"}, preset="cpu-used"),
    "libvpx-vp9": Tuning({"crf": "31", "b": "0", "row-mt": "1"}, preset="cpu-used"),
}
RAW_FORMATS = {"yuv4mpegpipe", "rawvideo"}


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

    @property
    def given(self) -> bool:
        return self != Encoding()

    def identity(self) -> dict:
        return {key: list(map(list, value)) if key == "options" else value for key, value in asdict(self).items()}


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


def _pix_fmt(codec, asked: str | None, source: str | None) -> str:
    formats = [f.name for f in codec.video_formats or ()]
    if asked is not None:
        if formats and asked not in formats:
            raise BadInputError(f"--pix-fmt {asked}: {codec.name} takes {', '.join(formats)}")
        return asked
    for candidate in (source, "yuv420p"):
        if candidate is not None and (not formats or candidate in formats):
            return candidate
    return formats[0]


def configure(stream, encoding: Encoding, source_pix_fmt: str | None) -> None:
    """Set the pixel format and options of a new output ``stream`` and open its encoder, so that a
    bad option is refused before any frame is computed."""
    av = import_av()
    name = stream.codec_context.name
    tuning = TUNINGS.get(name)
    options = dict(tuning.defaults) if tuning else {}
    for flag, value, key in (("--crf", encoding.crf, tuning and tuning.crf),
                             ("--preset", encoding.preset, tuning and tuning.preset)):
        if value is None:
            continue
        if not key:
            raise BadInputError(f"{flag} applies to {', '.join(TUNINGS)}; for {name} give --encoder-opt KEY=VALUE")
        options[key] = value
    options.update(encoding.options)
    stream.pix_fmt = _pix_fmt(stream.codec_context.codec, encoding.pix_fmt, source_pix_fmt)
    stream.options = options
    try:
        stream.codec_context.open()
    except (av.error.FFmpegError, ValueError) as exc:
        settings = " ".join(f"{k}={v}" for k, v in options.items())
        raise BadInputError(f"{name} refuses these settings ({settings}, pix_fmt {stream.pix_fmt}): {exc}") from None
