"""A directory of images written as a video (``eden-serve interpolate frames/ -o out.mp4``), as
ffmpeg's ``-framerate 25 -i %04d.png out.mp4`` makes one: the images are read at ``--input-fps``
(default 25, FFmpeg's image2 demuxer's, said in a warning), and the output runs at that rate times
the factor, or at ``--fps``, each frame at its time as a video input's (:mod:`.video_writer`).

There is no stream to keep the codec of: the output's container's default encoder writes it, as
FFmpeg's command line chooses (H.264 in MP4, MOV and Matroska, VP9 in WebM), or ``--vcodec``'s.
Its pixel format is chosen as for an RGB input (:mod:`.pixel_formats`): 8-bit images into
yuv420p, 16-bit ones into yuv420p10le where the encoder takes it (else the rounding is said), RGB
itself where the encoder takes it (libx264rgb, ``--pix-fmt gbrp`` for VP9). The images are taken
as sRGB, which is what a PNG without colour chunks is shown as: the video states BT.709's primaries
and sRGB's transfer, and YUV made of them BT.709's matrix in limited range, where it has a place for
them; else it states none, and YUV is converted by BT.601's matrix, which a reader of it takes
(:func:`stateable`). A PNG's colour chunks say otherwise (:mod:`.png_colour`): a cICP's primaries
and transfer are stated (PQ or HLG in BT.2020: YUV made by BT.2020's matrix, 16-bit images in 10
bits), with HDR10's metadata of its mDCv and cLLi chunks where the encoder or the container has a
place for it (:mod:`.mastering`, :meth:`~.colour.Colour.parameters`; else said); gAMA and cHRM of
other than sRGB's values leave primaries and transfer unstated, said once. Where the output has no
place for primaries and transfer other than sRGB's, one line says they are left out. The first
image decides the video's colour; an image whose chunks say another is said once, by name. An
image's own ICC profile has no place here (FFmpeg's writers take none through PyAV): where one
other than sRGB's is left out, one warning says so, and where the first image has one the output
states no primaries or transfer rather than sRGB's, which its colours are not (:mod:`.icc`); not
where a cICP chunk outranks it, as a reader of the PNG takes that instead.

Images with alpha keep it where the encoder has a format with alpha (chosen as for a video with
alpha: APNG's rgba, VP9's and WebP's yuva420p, ProRes 4444, FFV1, QuickTime RLE's argb), a
middle's made of its neighbours' as a video's is; else it is dropped, said once. Any image's alpha
gives the video alpha, an opaque image among them opaque; and any 16-bit image gives it a depth as
16-bit images do, the 8-bit ones among them widened.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

from ..errors import BadInputError
from .atomic import VIDEO_SUFFIXES
from .base import PIPE, Clip, Frame
from . import icc, png_colour
from .colour import UNSPECIFIED, Colour
from .encoders import output_encoder
from .frames import grey_levels, is_deep, widened
from .pixel_formats import BT601, CONTAINER_HOLDS, STREAM_HOLDS, bits
from .timing import MAX_FPS
from .video_writer import VideoWriter

# Names of a file the frames of a directory are written to as one video: the containers, and the
# animations FFmpeg writes (GIF, APNG, animated WebP).
SEQUENCE_SUFFIXES = VIDEO_SUFFIXES | {".gif", ".apng", ".webp"}
DEFAULT_RATE = Fraction(25)  # FFmpeg's image2 demuxer's, where -framerate is not given
SRGB = png_colour.SRGB  # what images without colour chunks are taken as


def makes_video(dst: str | Path) -> bool:
    """Whether a directory of frames written to ``dst`` becomes one video (a file so named), not a
    directory of frames."""
    return str(dst) != PIPE and Path(dst).suffix.lower() in SEQUENCE_SUFFIXES and not Path(dst).is_dir()


def check_rate(rate: Fraction) -> Fraction:
    if not 0 < rate <= MAX_FPS:
        raise BadInputError(f"--input-fps must be above 0 and at most {MAX_FPS}, got {rate}")
    return rate


def time_sequence(clip: Clip, dst: str | Path, input_fps: Fraction | None) -> None:
    """A directory of images made into a video timed at ``input_fps`` (None: 25, said in one line);
    ``input_fps`` refused where the output is no video of images (a video states its own rate)."""
    refuse_input_fps(clip, dst, input_fps)
    if clip.kind == "directory" and makes_video(dst):
        if input_fps is None:
            warnings.warn(f"--input-fps not given: the images are read at {DEFAULT_RATE} frames a second, as ffmpeg reads "
                          "an image sequence without -framerate")
        clip.timed(check_rate(input_fps or DEFAULT_RATE), SRGB)


def refuse_input_fps(clip: Clip, dst: str | Path, input_fps: Fraction | None) -> None:
    """``input_fps`` refused where ``clip`` written to ``dst`` is no video of images (the command
    asks this before the weights load)."""
    if input_fps is not None and not (clip.kind == "directory" and makes_video(dst)):
        what = "a directory of frames, which has no frame rate" if clip.kind == "directory" else f"a {clip.kind}, which states its own"
        raise BadInputError(f"--input-fps applies to a directory of images written as a video (or to raw video, with --input-size); "
                            f"the output here is {what}: leave it out (--fps sets a video's output rate)")


class SequenceWriter(VideoWriter):
    """A directory's images as a video: a :class:`~.video_writer.VideoWriter` whose stream is made
    like the first image (its size), 16 bits of RGB where any image has them (8-bit images widened),
    with alpha where any image has it, with
    no other stream to copy, whose originals are converted from their pixels as the middles are.
    Like every video output, it is encoded whole again by a resumed run (``continues`` is False; the
    middles come from the cache)."""

    alpha_of = "images'"

    def __init__(self, tmp: Path, dst: Path, clip: Clip, retiming, encoding):
        first = next(iter(clip))
        deep, alpha = _any_deep_or_alpha(clip)
        self._deep = deep
        # RGBA images: a format with alpha where the encoder has one, as a video with alpha (:func:`~.pixel_formats.output_pix_fmt`).
        self._first = SimpleNamespace(codec=None, width=first.size[0], height=first.size[1], sample_aspect_ratio=None,
                                      pix_fmt=("rgba64le" if deep else "rgba") if alpha else "rgb48le" if deep else "rgb24")
        self._shown = png_colour.shown(first.shown_as, first.profile)  # the first image's colour is the video's
        self._unstated = self._shown.by == "iCCP" and self._shown.colour == png_colour.UNSTATED  # the profile's: not claimed
        self.left_out, self.other = icc.LeftOut(), icc.LeftOut()
        if self._shown.said:
            warnings.warn(f"{first.path}: {self._shown.said}")
        super().__init__(tmp, dst, clip, retiming, encoding)
        if not alpha:  # (images with alpha into an output without: said as a video's is, webm_alpha.settle_output)
            self.alpha = None  # opaque images: an alpha plane asked for (--pix-fmt yuva420p) is opaque, as swscale fills it

    def _source(self, clip: Clip):
        return self._first

    def _add_video(self, clip: Clip, encoding, av) -> None:
        name = output_encoder(self.container, encoding, self._first, self.dst)  # the writer's own choice, made again
        colour = replace(self._shown.colour, matrix=clip.colour.matrix, range=clip.colour.range)
        clip.colour = stateable(colour, self.container.format.name, av.Codec(name, "w").canonical_name)
        super()._add_video(clip, encoding, av)

    def _add_streams(self, clip: Clip, av) -> None:
        pass  # images have no audio, subtitles or labels

    def _original(self, original: Frame):
        """An image as the output shows it: its RGB pixels converted as a middle's are, with its alpha
        where the output holds alpha (opaque for an image without)."""
        seen = png_colour.shown(original.shown_as, original.profile)
        if seen.by == "iCCP" and icc.matters(original.profile):
            self.left_out.say(f"{original.path}: its ICC profile is left out of the output: {self.dst.name} carries none here"
                              + ("; it states no primaries or transfer rather than sRGB's, which the images' are not" if self._unstated else ""))
        elif seen.tags() != self._shown.tags():
            self.other.say(f"{original.path}: its colour chunks say it is shown otherwise than the first image ({seen.by or 'none'}: "
                           f"{_named(seen.colour)}, not {_named(self._shown.colour)}): {self.dst.name} states the first image's colour")
        picture = _rgb(original.picture)
        if self.alpha is None:
            return super()._converted(self._at_depth(picture))
        rgba = self._at_depth(_rgba(original, picture))
        frame = super()._converted(rgba)
        if (rgba.dtype == torch.uint16) == (self.alpha_dtype == np.uint16) and bits(self.pix_fmt) in (8, 16):
            # The image's alpha itself: swscale's RGBA to YUVA moves half the samples by one.
            self._samples(frame)[:] = rgba[..., 3].numpy()
        return frame

    def _converted(self, picture):
        # A middle's alpha is made of its neighbours' (:meth:`~.video_writer.VideoWriter._alpha`): its colours alone here.
        if isinstance(picture, torch.Tensor) and picture.shape[-1] == 4:
            picture = picture[..., :3].contiguous()
        return super()._converted(self._at_depth(_rgb(picture)))

    def _at_depth(self, picture):
        """An 8-bit picture (an image, a middle of two) of a 16-bit video widened to 16 bits exactly
        (x 257): converted as 8 bits, swscale's RGB to a 16-bit format moved values by up to a level."""
        if self._deep and isinstance(picture, Image.Image):
            picture = torch.from_numpy(np.array(picture.convert("RGB")))
        if not self._deep or not isinstance(picture, torch.Tensor):  # the edge's planes: made in the output's format
            return picture
        return widened(picture, 16)


def stateable(colour: Colour, container: str, codec: str) -> Colour:
    """The images' colour as far as the output's ``container`` and ``codec`` can state it
    (:data:`~.pixel_formats.CONTAINER_HOLDS`, :data:`~.pixel_formats.STREAM_HOLDS`): sRGB's primaries
    and transfer where they have a place (an APNG's sRGB chunks too), else none (a reader takes
    sRGB's anyway: a GIF, an AVI), so nothing is said; and YUV converted by BT.709's or BT.2020's matrix where the output
    states it, else by BT.601's, which a reader of an output that cannot state one (Y4M, AVI's
    MPEG-4, lossy WebP) converts back by. Other primaries and transfer (a cICP's) are kept for the
    writer, which says in one line where the output has no place for them
    (:func:`~.pixel_formats.say_lost`). (``colour`` without primaries or transfer: images whose
    profile, or gamma and chromaticities, are not sRGB's, which the output does not claim.)"""
    held = {*CONTAINER_HOLDS.get(container, ()), *STREAM_HOLDS.get(codec, ())}
    srgb = (colour.primaries, colour.transfer) == (SRGB.primaries, SRGB.transfer)
    return replace(colour, primaries=colour.primaries if "primaries" in held or not srgb else UNSPECIFIED,
                   transfer=colour.transfer if "transfer" in held or not srgb else UNSPECIFIED,
                   matrix=colour.matrix if "matrix" in held else BT601)


def _named(colour: Colour) -> str:
    return f"primaries {colour.primaries}, transfer {colour.transfer}" + (", HDR10 metadata" if colour.mastering or colour.light else "")


def _rgb(picture):
    """A grey image deeper than 8 bits (Pillow's I;16, I or F) as its 16-bit RGB pixels at the levels
    the model reads (:func:`~.frames.grey_levels`), which the writer converts as it does a 16-bit
    colour image's: Pillow's own conversion to RGB clips it to 8 bits' range (a float's 0 to 1 to black)."""
    if isinstance(picture, Image.Image) and (picture.mode.startswith("I") or picture.mode == "F"):
        grey = np.round(grey_levels(picture) * np.float32(65535.0)).astype(np.uint16)
        return torch.from_numpy(np.repeat(grey[..., None], 3, axis=-1))
    return picture


def _rgba(frame: Frame, rgb) -> torch.Tensor:
    """An image's RGBA pixels [H, W, 4], 8 or 16 bits as its colours (``rgb``: them as :func:`_rgb`
    gives them); an image without alpha among those with it is opaque."""
    if isinstance(rgb, torch.Tensor):
        alpha = frame.alpha if rgb.dtype == torch.uint16 else None
        if alpha is None:
            alpha = torch.full(rgb.shape[:2], 65535 if rgb.dtype == torch.uint16 else 255, dtype=rgb.dtype)
        return torch.cat((rgb, alpha.to(rgb.dtype)[..., None]), dim=-1)
    return torch.from_numpy(np.array(rgb.convert("RGBA")))


def _has_alpha(frame: Frame) -> bool:
    if frame.pixels is not None:
        return frame.alpha is not None
    return frame.image.has_transparency_data  # not a band named "A": LAB's is a colour


def _any_deep_or_alpha(clip: Clip) -> tuple[bool, bool]:
    """Whether any of the images is 16-bit, and whether any has alpha (the first decided both for
    them all: a translucent image after an opaque first was written opaque, a 16-bit one after an
    8-bit first rounded to 8 bits). Each is asked of its header, as Pillow opens it without decoding
    its pixels; one Pillow cannot open is decoded as its frame will be."""
    deep = alpha = False
    for frame in clip:
        try:
            with Image.open(frame.path) as image:
                alpha = alpha or image.has_transparency_data
                deep = deep or image.mode.startswith("I") or image.mode == "F" or is_deep(frame.path, frame.name)
                continue
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, BadInputError):
            pass  # a 16-bit TIFF Pillow has no mode for; a broken or huge file, which its frame's reading refuses
        alpha, deep = alpha or _has_alpha(frame), deep or frame.depth == 16
    return deep, alpha
