"""A video output's alpha, written by :class:`~.video_writer.VideoWriter` into each picture it
encodes: an original's is the input's own, copied; a middle's, which the model (seeing colour
alone) cannot make, is its neighbours', blended by its position.

An original's alpha is copied from its decoded picture, not taken from its conversion to the
output's format: swscale's conversion of RGBA (PNG's, QuickTime RLE's) to YUVA (VP9's, FFV1's
``yuva420p``) moves about half of the 8-bit samples by one level, so a lossless output did not give
its input's alpha back. Where the two formats hold alpha at different depths (ProRes 4444's 12 bits
decoded, 10 written), the conversion's alpha is kept: there is no copy to make."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np

from .base import Frame
from .encoding import import_av
from .palette import palette_alpha
from .pixel_formats import bits


@dataclass(frozen=True)
class AlphaPlace:
    """Where a pixel format holds its alpha: its plane, its depth and the type of one sample (its
    byte order), and where it packs the alpha beside the colours in one plane (rgba, argb, APNG's
    rgba64be) the alpha's byte offset in a pixel and the pixel's bytes (None: a plane of alpha alone)."""

    plane: int
    bits: int
    dtype: np.dtype
    packed: tuple[int, int] | None

    @staticmethod
    @cache
    def of(pix_fmt: str) -> AlphaPlace | None:
        """``pix_fmt``'s place of alpha; None where it has none."""
        av = import_av()
        format = av.VideoFormat(pix_fmt)
        alpha = next((c for c in format.components if c.is_alpha), None)
        if alpha is None:
            return None
        width = 2 if alpha.bits > 8 else 1
        dtype = np.dtype(">u2" if pix_fmt.endswith("be") else "<u2") if width == 2 else np.dtype(np.uint8)
        sharing = sum(c.plane == alpha.plane for c in format.components)
        if sharing == 1:
            return AlphaPlace(alpha.plane, alpha.bits, dtype, None)
        # Found by converting one opaque black pixel: the alpha's bytes are the only ones all set.
        probe = av.VideoFrame.from_ndarray(np.array([[[0, 0, 0, 65535]]], np.uint16), format="rgba64le").reformat(format=pix_fmt)
        size = width * sharing
        first = bytes(probe.planes[alpha.plane])[:size]
        offset = next(i for i in range(0, size, width) if first[i:i + width] == b"\xff" * width)
        return AlphaPlace(alpha.plane, alpha.bits, dtype, (offset, size))

    def samples(self, frame) -> np.ndarray:
        """A picture's alpha samples [H, W], in place (writing them writes the picture's)."""
        plane = frame.planes[self.plane]
        if self.packed is None:
            return np.frombuffer(plane, self.dtype).reshape(plane.height, -1)[:, :plane.width]
        offset, size = self.packed
        pixels = np.frombuffer(plane, np.uint8).reshape(plane.height, -1)[:, :frame.width * size].reshape(frame.height, frame.width, size)
        return pixels[..., offset:offset + self.dtype.itemsize].view(self.dtype)[..., 0]


def copy_alpha(source, frame, place: AlphaPlace) -> bool:
    """``source``'s alpha written into ``frame`` (in the format of ``place``) where both hold it at
    one depth and size: whether it was."""
    if (source.width, source.height) != (frame.width, frame.height):
        return False
    if source.format.name == "pal8" and place.bits == 8:  # its alpha is its palette's, by index
        indices = np.frombuffer(source.planes[0], np.uint8).reshape(source.height, -1)[:, :source.width]
        place.samples(frame)[:] = palette_alpha(source)[indices].astype(np.uint8)
        return True
    given = AlphaPlace.of(source.format.name)
    if given is None or given.bits != place.bits:
        return False
    place.samples(frame)[:] = given.samples(source)
    return True


class AlphaWriting:
    """What a video writer does with the output's alpha (its ``pix_fmt`` set, and its
    ``_original``: an original in the output's format)."""

    pix_fmt: str

    def _hold_alpha(self) -> None:
        """The plane of the output's alpha, where it has one: a middle's is its neighbours' (:meth:`_alpha`)."""
        self.alpha_place = AlphaPlace.of(self.pix_fmt)
        self.alpha = self.alpha_place.plane if self.alpha_place is not None else None
        self.alpha_dtype = np.uint16 if bits(self.pix_fmt) > 8 else np.uint8
        self._alphas: list[tuple[Frame, np.ndarray]] = []  # (original, its alpha): the two latest

    def _own_alpha(self, raw, frame):
        """``frame``, ``raw`` converted to the output's format, with ``raw``'s own alpha where the
        output holds it at its depth (the conversion's moved some samples)."""
        if self.alpha is not None and frame is not raw:
            copy_alpha(raw, frame, self.alpha_place)
        return frame

    def _alpha(self, frame, before: Frame, after: Frame, position: Fraction) -> None:
        """The model sees colour alone: a middle's alpha is its neighbours', blended by its position,
        as an image's middle takes the mean of its neighbours' (made of RGB, it was opaque)."""
        ends = [self._alpha_of(f) for f in (before, after)]
        blended = ends[0] + (ends[1].astype(np.float64) - ends[0]) * float(position)
        self._samples(frame)[:] = np.round(blended).astype(self.alpha_dtype)

    def _samples(self, frame) -> np.ndarray:
        """A picture's alpha samples [H, W], in place: its alpha plane, or in a packed format (rgba,
        argb, APNG's rgba64be) every pixel's alpha bytes, where the colours' are beside them."""
        return self.alpha_place.samples(frame)

    def _plane(self, frame) -> np.ndarray:
        """The alpha of a picture in the output's format, [H, W], a copy of it (the picture goes to the encoder)."""
        return self._samples(frame).astype(self.alpha_dtype)

    def _alpha_of(self, original: Frame) -> np.ndarray:
        """An original's alpha as the output holds it: converted once, and kept while a middle may
        border it. A middle's next original comes after it, so only the two latest are kept."""
        kept = next((plane for frame, plane in self._alphas if frame is original), None)
        return kept if kept is not None else self._keep_alpha(original, self._original(original))

    def _keep_alpha(self, original: Frame, frame) -> np.ndarray:
        """``original``'s alpha plane, taken from ``frame`` (it in the output's format) where it is not kept yet."""
        for kept, plane in self._alphas:
            if kept is original:
                return plane
        plane = self._plane(frame)
        self._alphas = [*self._alphas[-1:], (original, plane)]
        return plane
