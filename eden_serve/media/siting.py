"""Where a middle's subsampled chroma is made to sit (docs/video.md, "Depth and colour"): where a
reader of the output takes the output's chroma to sit, so a middle's chroma lines up with its
neighbours', the originals, whose own chroma the encoder takes as decoded.

swscale, as PyAV's ``reformat`` calls it, subsamples RGB centred between the luma samples both ways
(a chroma sample averages columns 2k and 2k + 1), and PyAV 18 cannot tell it a siting. FFmpeg's
``scale`` filter can (``out_chroma_loc``), and PyAV runs it in a filter graph. With
``full_chroma_inp`` swscale filters the full-resolution chroma by the bilinear kernel placed at the
stated location (left: columns 2k - 1, 2k, 2k + 1 weighted 1, 2, 1), where without it swscale
first averages column pairs and then shifts them by the kernel: measured, a single coloured column
at x = 11 then weighed 3:1 on chroma columns 5 and 6 (its centre at x = 10.5) instead of 1:1.
Rows are weighted 1, 3, 3, 1 for a vertically centred location, as ``reformat`` weighs them. A
centred location keeps ``reformat``'s conversion: the same samples as before.
"""

from __future__ import annotations

from fractions import Fraction

from .chroma import CENTER, FIXED, LEFT, TOP_LEFT, UNKNOWN
from .encoding import import_av

FULL = 2  # AVCOL_RANGE_JPEG
# AVChromaLocation -> the scale filter's name of it.
NAMES = {1: "left", 2: "center", 3: "topleft", 4: "top", 5: "bottomleft", 6: "bottom"}
# The outputs whose container or codec's stream states a 4:2:0 chroma location (pixel_formats.CHROMA_HOLDERS).
HOLDERS = {"matroska", "webm", "yuv4mpegpipe", "h264", "hevc", "av1"}
# Y4M's 8-bit 4:2:0 tags: C420mpeg2 (left), C420paldv (top left), else C420jpeg (centre, its default).
Y4M_420 = {"yuv420p", "yuvj420p"}
# swscale's names of the matrices it converts by (AVColorSpace values; others: BT.601, its default).
_MATRICES = {1: "bt709", 4: "fcc", 5: "bt470", 6: "smpte170m", 7: "smpte240m", 9: "bt2020", 10: "bt2020"}


def stated(options: dict[str, str]) -> int:
    """The AVChromaLocation an encoder's options state (``chroma_sample_location``: a number or its
    name, as FFmpeg takes it), 0 where none."""
    value = str(options.get("chroma_sample_location", "0")).strip().lower()
    names = {name: number for number, name in NAMES.items()} | {"topleft": TOP_LEFT, "centre": CENTER}
    if value.isdigit():
        return int(value) if int(value) in NAMES else UNKNOWN
    return names.get(value, UNKNOWN)


def subsampled(pix_fmt: str) -> bool:
    """Whether a pixel format's chroma has fewer samples than its luma (4:2:0, 4:2:2, 4:1:1...)."""
    av = import_av()
    format = av.VideoFormat(pix_fmt, 16, 16)
    return (not format.is_rgb and len(format.components) >= 3
            and (format.chroma_width(16), format.chroma_height(16)) != (16, 16))


def output_siting(container: str, codec: str, pix_fmt: str, location: int) -> int:
    """Where a reader of the output takes its chroma to sit, as an AVChromaLocation (0 where its
    chroma is not subsampled): ``location``, the one its encoder is told, where the container or
    the codec's stream holds it; Y4M's tag for 8-bit 4:2:0; the siting a codec's standard fixes
    (MPEG-1, H.263 and JPEG: centre); else left, which readers (and FFmpeg) take where none is stated."""
    if not subsampled(pix_fmt):
        return UNKNOWN
    if container == "yuv4mpegpipe" and pix_fmt in Y4M_420:
        return location if location in (LEFT, TOP_LEFT) else CENTER
    if location and HOLDERS & {container, codec} and container != "yuv4mpegpipe":
        return location
    return FIXED.get(codec, LEFT)


class Subsampler:
    """RGB pictures -> ``pix_fmt`` by ``matrix`` and ``range`` (FFmpeg's values; 2 and 0: unstated,
    swscale's defaults, BT.601 and limited), the chroma sited at ``location`` (:func:`output_siting`): ``reformat`` where centred, else
    a ``scale`` filter graph, made again where a picture's size or format changes."""

    def __init__(self, pix_fmt: str, matrix: int, range: int, location: int):
        self.pix_fmt, self.matrix, self.full, self.location = pix_fmt, matrix, range == FULL, location
        self.convert = {"dst_colorspace": matrix if matrix != 2 else None, "dst_color_range": range or None}
        self.centred = location in (UNKNOWN, CENTER)
        self._graph = self._shape = None

    def __call__(self, frame):
        if self.centred:
            return frame.reformat(format=self.pix_fmt, **self.convert)
        shape = (frame.width, frame.height, frame.format.name)
        if shape != self._shape:
            self._graph, self._source, self._sink = self._made(*shape)
            self._shape = shape
        frame.pts = None  # the graph keeps no time: the writer times the picture it gives back
        self._source.push(frame)
        return self._sink.pull()

    def _made(self, width: int, height: int, format: str):
        av = import_av()
        graph = av.filter.Graph()
        source = graph.add_buffer(width=width, height=height, format=format, time_base=Fraction(1, 1))
        scale = graph.add("scale", f"flags=bilinear+full_chroma_inp:out_chroma_loc={NAMES[self.location]}"
                                   f":out_color_matrix={_MATRICES.get(self.matrix, 'bt601')}:out_range={'pc' if self.full else 'tv'}")
        to_format = graph.add("format", self.pix_fmt)
        sink = graph.add("buffersink")
        source.link_to(scale)
        scale.link_to(to_format)
        to_format.link_to(sink)
        graph.configure()
        return graph, source, sink
