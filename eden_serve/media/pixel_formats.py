"""The output video's pixel format: the input's where the encoder takes it, else the encoder's of
the same colour sampling nearest the input's depth, else, for an input with alpha, the encoder's
format with alpha nearest its depth (:func:`_with_alpha`), else yuv420p10le for an input deeper than 8 bits
where the encoder takes that, else yuv420p, else a palette a frame where the encoder has no 8-bit
colour (GIF: :mod:`.palette`), else the encoder's first; and the matrix and range its
frames are converted to (:func:`output_colour`). A change of depth, matrix or range is said in one line."""

from __future__ import annotations

import warnings
from dataclasses import replace

from ..errors import BadInputError
from .chroma import CENTER, FIXED
from .colour import BT2020, FULL, LIMITED, Colour
from .encoding import import_av
from .palette import takes_palettes
from .planes import SWSCALE_MATRICES

RGB, BT709, BT601, BT2020_NCL = 0, 1, 5, 9  # AVCOL_SPC_RGB, _BT709, _BT470BG, _BT2020_NCL
# The matrix an encoder's stream states whatever its context is told, as FFmpeg's decoder of it
# reads it back: JPEG's, VP8's and lossy WebP's (VP8 inside) are BT.601 (JPEG's range is full: its
# yuvj formats say so).
IMPOSED = {"mjpeg": BT601, "libvpx": BT601, "libwebp": BT601, "libwebp_anim": BT601}
MATRIX_NAMES = {0: "RGB", 1: "BT.709", 4: "FCC", 7: "SMPTE 240M", 8: "YCgCo", 9: "BT.2020", 10: "BT.2020 CL", 14: "ICtCp"}
# Encoders whose pixels are full-range RGB and whose stream states the range they are told (FFmpeg's
# PNG writers put it in the cICP chunk they write for primaries and transfer other than sRGB's).
RGB_FULL = {"png", "apng"}
# Encoders whose stream has no flag for full range (MPEG-1 and -2 video, ProRes, VP8): read as limited.
LIMITED_ONLY = {"mpeg1video", "mpeg2video", "prores", "prores_ks", "prores_aw", "libvpx", "libwebp", "libwebp_anim"}

# The pixel formats Y4M holds (FFmpeg's muxer refuses others as it writes the header: RGB, palettes).
Y4M_PIX_FMTS = ("yuv420p", "yuv422p", "yuv444p", "yuv411p", "yuva444p", "yuvj420p", "yuvj422p", "yuvj444p",
                *(f"yuv{sampling}p{depth}le" for sampling in (420, 422, 444) for depth in (9, 10, 12, 14, 16)),
                "gray", *(f"gray{depth}le" for depth in (9, 10, 12, 16)))


def encoder_formats(codec) -> list[str]:
    """The pixel formats an encoder lists (none: it takes any)."""
    return [f.name for f in codec.video_formats or ()]


def output_pix_fmt(codec, asked: str | None, source: str | None, muxed: tuple[str, ...] | None = None,
                   refused: frozenset[str] = frozenset()) -> str:
    """The output's pixel format among those the encoder takes, or ``muxed``: the container's, where it
    holds fewer (the raw video encoder takes any), less those it was ``refused`` on: listed, they
    did not open (:func:`~.encoders.configure`)."""
    formats = [f for f in (list(muxed) if muxed else encoder_formats(codec)) if f not in refused]
    if asked is not None:
        if formats and asked not in formats:
            raise BadInputError(f"--pix-fmt {asked}: {'the container' if muxed else codec.name} takes {', '.join(formats)}")
        return asked
    deep = source is not None and bits(source) > 8
    # An input's alpha is kept where the encoder has any format with alpha, before one of its sampling without.
    for candidate in (source, _nearest(formats, source, True), _with_alpha(formats, source), _nearest(formats, source),
                      "yuv420p10le" if deep else None, "yuv420p"):
        if candidate is not None and (not formats or candidate in formats):
            return candidate
    return "pal8" if takes_palettes(formats) else formats[0]


def _nearest(formats: list[str], source: str | None, alike: bool = False) -> str | None:
    """Where the encoder lacks the input's YUV format, its YUV format with the same colour sampling
    (4:4:4 stays 4:4:4) and the depth nearest the input's, deeper before shallower, alpha only where
    the input has it (ProRes 4444 decodes to 12 bits with alpha, its encoder takes 10: yuva444p10le
    rather than 4:2:2), only with it where ``alike``; None where it has none of that sampling."""
    if source is None or not source.startswith("yuv"):
        return None
    av = import_av()
    (width, height, alpha), depth = _sampling(av, source), bits(source)
    shapes = {f: _sampling(av, f) for f in formats if f.startswith("yuv")}
    same = [f for f, shape in shapes.items() if shape[:2] == (width, height) and shape[2] <= alpha and (not alike or shape[2] == alpha)]
    same.sort(key=lambda f: (bits(f) < depth, abs(bits(f) - depth), shapes[f][2] != alpha))
    return same[0] if same else None


def _with_alpha(formats: list[str], source: str | None) -> str | None:
    """Where the input has alpha and the encoder lacks its format and one of its sampling (RGBA
    images into VP9, ProRes, FFV1, QuickTime RLE), the encoder's format with alpha and colour (no
    grey) nearest the input's depth, deeper before shallower, 4:2:0 first, as RGB goes to yuv420p;
    None where it has none: the output is opaque (the caller says so)."""
    if source is None or not formats or not _sampling(import_av(), source)[2]:
        return None
    av, depth = import_av(), bits(source)
    held = [f for f in formats if len(av.VideoFormat(f).components) >= 4 and _sampling(av, f)[2]]
    held.sort(key=lambda f: (bits(f) < depth, abs(bits(f) - depth), _sampling(av, f)[:2] != (8, 8)))
    return held[0] if held else None


def _sampling(av, pix_fmt: str) -> tuple[int, int, bool]:
    """A format's chroma plane size on 16x16 frames, and whether it holds alpha."""
    format = av.VideoFormat(pix_fmt, 16, 16)
    return format.chroma_width(16), format.chroma_height(16), any(c.is_alpha for c in format.components)


def sampling_name(pix_fmt: str) -> str:
    """A format's colour sampling as it is named (4:2:0), RGB's as 4:4:4."""
    width, height, _ = _sampling(import_av(), pix_fmt)
    return {(16, 16): "4:4:4", (8, 16): "4:2:2", (8, 8): "4:2:0", (16, 8): "4:4:0", (4, 16): "4:1:1",
            (4, 4): "4:1:0"}.get((width, height), f"{width}x{height} chroma of 16x16")


def bits(pix_fmt: str) -> int:
    """The most bits a component of ``pix_fmt`` holds."""
    return max(c.bits for c in import_av().VideoFormat(pix_fmt).components)


def say_conversion(source: str | None, output: str, colour: Colour, encoder: str = "") -> None:
    """One line where the output's pixel format changes the input's depth or range, and one where
    ``encoder``'s stream states another matrix or range than the input's (:func:`output_colour`)."""
    if source is None:
        return
    was, now = bits(source), bits(output)
    if was != now:
        how = "rounded to" if now < was else "widened to"
        warnings.warn(f"the output's pixel format {output} holds {now} bits: the input's {was}-bit {source} frames are {how} it")
    written = output_colour(encoder, output, colour)
    if output.startswith("yuvj") and colour.range != FULL:
        warnings.warn(f"the output's pixel format {output} is full range: the input's limited-range frames are converted to it")
    elif written.range != colour.range and colour.range == FULL:
        warnings.warn(f"{encoder} states limited range only: the input's full-range frames are converted to it")
    if encoder in IMPOSED and colour.matrix != RGB and not same_matrix(written.matrix, colour.matrix):
        matrix = MATRIX_NAMES.get(colour.matrix, f"matrix {colour.matrix}")
        warnings.warn(f"{encoder} states the BT.601 matrix whatever it is told: the input's {matrix} frames are converted to it")


def yuv_matrix(colour: Colour) -> int:
    """The matrix YUV made of RGB pixels of ``colour`` is converted by: BT.2020's (non-constant
    luminance) for BT.2020 primaries, else BT.709's (sRGB's primaries are BT.709's). The RGB
    matrix, stated of YUV, is read as another matrix (FFmpeg: BT.601), or refused (VP9, AV1 outside 4:4:4)."""
    return BT2020_NCL if colour.primaries == BT2020 else BT709


def same_matrix(a: int, b: int) -> bool:
    """Whether two matrices (FFmpeg's values) convert alike: unspecified, BT.470BG and SMPTE 170M are all BT.601."""
    return SWSCALE_MATRICES.get(a, a) == SWSCALE_MATRICES.get(b, b)


def output_colour(encoder: str, pix_fmt: str, colour: Colour) -> Colour:
    """The colour the output's frames are converted to and tagged with: the input's, but in the
    matrix and range ``encoder``'s stream states whatever it is told (:data:`IMPOSED`,
    :data:`LIMITED_ONLY`: a frame converted by the input's would be shown in other colours), and
    full range for a yuvj format; RGB pixels state the RGB matrix, and YUV ones converted from RGB a
    YUV matrix (:func:`yuv_matrix`); RGB pixels and a PNG's, full range (:data:`RGB_FULL`): RGB has no
    limited range, and libx264rgb, x265's and FFV1's RGB in Matroska or MP4 stated a limited-range
    input's "tv", which a reader may take to stretch their levels."""
    matrix = IMPOSED.get(encoder, colour.matrix)
    rgb = import_av().VideoFormat(pix_fmt).is_rgb
    if rgb:
        matrix = RGB
    elif matrix == RGB:
        matrix = yuv_matrix(colour)
    range_ = LIMITED if encoder in LIMITED_ONLY and colour.range == FULL else colour.range
    if encoder in RGB_FULL or rgb:
        range_ = FULL
    return replace(colour, matrix=colour.matrix if same_matrix(matrix, colour.matrix) else matrix,
                   range=FULL if pix_fmt.startswith("yuvj") else range_)


# Where the colour tags are held: by the container (Matroska's Colour, MP4's and MOV's colr, which
# in MOV has no range, Y4M's XCOLORRANGE), and by the codec's own stream (H.264's and HEVC's VUI,
# AV1's sequence header, VP9's and VP8's colour space and range, MPEG-2's sequence display
# extension, ProRes' frame header, JPEG's by its definition, PNG's and APNG's sRGB, gAMA, cHRM and
# cICP chunks, which FFmpeg writes); AVI, NUT, FLV and MPEG-TS hold none.
TAGS = ("primaries", "transfer", "matrix", "range")
CONTAINER_HOLDS = {"matroska": TAGS, "webm": TAGS, "mp4": TAGS, "mov": TAGS[:3], "yuv4mpegpipe": ("range",)}
STREAM_HOLDS = {"h264": TAGS, "hevc": TAGS, "av1": TAGS, "vp9": TAGS[2:], "vp8": TAGS[2:], "mjpeg": TAGS[2:],
                "mpeg2video": TAGS[:3], "prores": TAGS[:3], "png": (*TAGS[:2], "range"), "apng": (*TAGS[:2], "range")}
# The chroma location of 4:2:0 (:mod:`.chroma`) is held by Matroska's ChromaSiting, Y4M's 8-bit
# C420 tags, and H.264's and HEVC's VUI and AV1's sequence header; MP4, MOV, MPEG-TS, AVI, NUT and
# the streams of VP9, FFV1, MPEG-2 and the others hold none.
CHROMA_HOLDERS = {"matroska", "webm", "yuv4mpegpipe", "h264", "hevc", "av1"}
LEFT = 1  # AVCHROMA_LOC_LEFT: the 4:2:0 siting a reader takes where none is stated (swscale's too)


def say_lost(container: str, codec: str, colour: Colour, subsampled: bool = False) -> None:
    """One line where the output's ``container`` and its ``codec``'s stream have no place for a tag
    ``colour`` (the output's) states that a reader would not take by default: primaries and transfer
    stated, a matrix other than BT.601's, full range of YUV; and, for a 4:2:0 output (``subsampled``), a
    chroma location other than left."""
    held = {*CONTAINER_HOLDS.get(container, ()), *STREAM_HOLDS.get(codec, ())}
    if CHROMA_HOLDERS & {container, codec}:
        held.add("chroma location")
    # RGB pixels (the RGB matrix, :func:`output_colour`) have no YUV range to keep: full range is theirs.
    yuv = colour.matrix != RGB
    # Where the codec's standard fixes the chroma location (MPEG-1, H.263 and JPEG centre; MPEG-4
    # Part 2 left), a reader takes that one: an H.263 input's centre, written as H.263, loses nothing.
    sited = FIXED.get(codec, LEFT)
    stated = {"primaries": colour.primaries != 2, "transfer": colour.transfer != 2,
              "matrix": not same_matrix(colour.matrix, 2) and yuv, "range": colour.range == FULL and yuv,
              "chroma location": subsampled and colour.chroma not in (0, sited)}
    lost = sorted(name for name, said in stated.items() if said and name not in held)
    if lost:
        # What a reader takes instead, of what is lost alone (an RGB output's range was never the question).
        default = {"primaries": "no primaries", "transfer": "no transfer", "matrix": "BT.601's matrix",
                   "range": "limited range", "chroma location": f"chroma sited {'centre' if sited == CENTER else 'left'}"}
        taken = [default[name] for name in default if name in lost]
        if "no primaries" in taken and "no transfer" in taken:
            taken[taken.index("no primaries"):taken.index("no transfer") + 1] = ["no primaries or transfer"]
        warnings.warn(f"the output ({container}, {codec}) has no place for the input's {' and '.join(lost)}: they are left out, "
                      f"and a reader takes its defaults ({', '.join(taken)})")
