"""VP8 and VP9 video with alpha, as WebM holds it: the colour in the stream, the alpha as a second
picture beside each frame (Matroska's BlockAdditional), the track marked ``ALPHA_MODE`` 1. FFmpeg's
own VP8 and VP9 decoders, which PyAV opens by default, read the colour alone, so a transparent WebM
came out opaque without a word; libvpx's decoders read both, as ``ffmpeg -c:v libvpx-vp9 -i``
does, and give frames of the pixel format with alpha (yuva420p)."""

from __future__ import annotations

import warnings

from .encoding import import_av

DECODERS = {"vp8": "libvpx", "vp9": "libvpx-vp9"}
MATROSKA = {"matroska", "webm"}  # the muxers that write the alpha beside each frame


def marked_alpha(stream) -> bool:
    """Whether a video stream is VP8 or VP9 whose container marks it as carrying alpha."""
    metadata = {str(key).lower(): str(value).strip() for key, value in (stream.metadata or {}).items()}
    return stream.codec_context.name in DECODERS and metadata.get("alpha_mode") == "1"


def with_alpha(pix_fmt: str | None) -> str | None:
    """The pixel format of the same sampling and depth with an alpha plane (yuv420p: yuva420p), None
    where FFmpeg has none."""
    if pix_fmt is None or not pix_fmt.startswith("yuv"):
        return None
    av = import_av()
    name = "yuva" + pix_fmt[3:]
    try:
        av.VideoFormat(name)
    except ValueError:
        return None
    return name


class AlphaDecoder:
    """libvpx's decoder of a stream :func:`marked_alpha`, fed the container's packets of it."""

    def __init__(self, stream):
        av = import_av()
        name = DECODERS[stream.codec_context.name]
        self.pix_fmt = with_alpha(stream.codec_context.pix_fmt)
        self.context = av.codec.CodecContext.create(name, "r") if name in av.codecs_available and self.pix_fmt else None

    @classmethod
    def of(cls, stream, path, decoder: str = "host") -> AlphaDecoder | None:
        """The stream's alpha decoder where it is marked as carrying alpha and the host decodes it;
        where another ``decoder`` reads it (NVDEC, asked for by name), or this PyAV has no libvpx,
        None, said in one warning (the output is then opaque)."""
        if not marked_alpha(stream):
            return None
        alpha = cls(stream) if decoder == "host" else None
        if alpha is None or alpha.context is None:
            why = f"--decoder {decoder} reads its colour alone" if alpha is None else "this PyAV has no libvpx"
            warnings.warn(f"{path}: its {stream.codec_context.name} video carries alpha, which only libvpx's decoder reads, and "
                          f"{why}: the alpha is left out")
            return None
        alpha.context.thread_type = "AUTO"
        return alpha


def has_alpha(pix_fmt: str | None) -> bool:
    av = import_av()
    return pix_fmt is not None and any(c.is_alpha for c in av.VideoFormat(pix_fmt).components)


def settle_output(stream, given: str | None, pix_fmt: str, dst, what: str = "input's") -> None:
    """The output video ``stream``'s alpha, settled once it is made: a VP8 or VP9 stream with alpha
    marked ``alpha_mode`` 1, which Matroska's muxer writes as the track's AlphaMode (what a browser
    needs to show it; FFmpeg's command line marks it so), and one without alpha not marked, whatever
    the input's tags said; where the frames ``given`` have alpha and the output holds none (its
    ``pix_fmt`` has none, or VP8's or VP9's alpha is in a container other than Matroska, the only
    one that carries it), one warning."""
    for key in [key for key in stream.metadata if key.lower() == "alpha_mode"]:
        del stream.metadata[key]
    beside = stream.codec_context.name in DECODERS.values()  # the alpha as a picture beside each frame
    held = has_alpha(pix_fmt) and (not beside or stream.container.format.name in MATROSKA)
    if held and beside:
        stream.metadata["alpha_mode"] = "1"
    if has_alpha(given) and not held:
        holds = "holds none" if not has_alpha(pix_fmt) else "cannot carry its alpha (Matroska and WebM alone do)"
        warnings.warn(f"the {what} alpha is dropped: {str(dst)!r} ({stream.codec_context.name}, {pix_fmt}) {holds}, "
                      "and is written opaque, its colours alone")
