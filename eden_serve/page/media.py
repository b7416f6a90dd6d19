"""The page's clips as the browser gets them: what a clip is (kind, size, rate, the extension its
output takes, HDR or not), and a preview the browser's video element can play where the clip itself
is not one (an animation, a frame directory, FFV1, 4:4:4, 10-bit...): H.264 in MP4, each frame at its
own time, so the original and the result stay in step frame for frame. A browser cannot show PQ or
HLG, so an HDR clip's preview is tone-mapped to SDR (:func:`eden_serve.media.colour.tone_mapped`),
which the page says; the download is the result itself. Clips are read by
:func:`eden_serve.media.open_clip`, as the commands read them; ``cloud:`` sources as the cloud reads
them (:mod:`eden_serve.cloud.sources`: by descriptor, as MP4 or Matroska alone, within the pixel and
work limits)."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

from typing import Callable

from PIL import Image

from ..cloud.sources import CONTAINERS, SourceVideo
from ..media import Clip as OpenedClip
from ..media import open_clip
from ..media.atomic import atomic_output
from ..media.colour import HLG, PQ, Colour, tone_mapped
from ..media.encoding import import_av

# Containers PyAV names, and the extension an output of that container takes (the output's
# container follows its extension, docs/video.md).
CONTAINER_EXTENSIONS = {"mov,mp4,m4a,3gp,3g2,mj2": ".mp4", "matroska,webm": ".mkv", "avi": ".avi", "mpegts": ".ts",
                        "mpeg": ".mpg", "yuv4mpegpipe": ".y4m", "flv": ".flv", "ogg": ".ogv"}
ANIMATION_EXTENSIONS = {"GIF": ".gif", "PNG": ".png", "WEBP": ".webp"}
SOURCE_EXTENSIONS = {CONTAINERS["MP4 or MOV"]: ".mp4", CONTAINERS["Matroska or WebM"]: ".mkv"}
# What a page may ask the output's container to be, for a video.
OUTPUT_EXTENSIONS = (".mp4", ".mkv", ".webm", ".mov", ".avi")
# What Chromium, Firefox and Safari all play from an MP4.
PLAYABLE_MP4_CODECS = {"h264", "vp9", "av1"}
PREVIEW_TICK = Fraction(1, 90000)
PREVIEW_OPTIONS = {"crf": "18", "preset": "veryfast"}


@dataclass
class Clip:
    """What the page shows of a clip: ``kind`` (video, animation, directory), frames (None where the
    container does not say), width, height, frames a second (a mean for a variable rate), the
    extension of its format, whether a browser plays the file as it is, and its HDR transfer
    ("PQ", "HLG"; None for SDR), whose previews are tone-mapped by its ``colour`` (kept here, not sent)."""

    kind: str
    frames: int | None
    width: int
    height: int
    rate: float
    extension: str
    playable: bool
    hdr: str | None = None
    colour: Colour = Colour()

    def to_json(self) -> dict:
        shown = asdict(self)
        del shown["colour"]
        return shown


def describe(path: Path, max_pixels: int | None = None) -> Clip:
    """``path`` read as the commands read it: raises their errors (not a clip, frames too large)."""
    with open_clip(path, max_pixels) as clip:
        if clip.kind == "video":
            context = clip.stream.codec_context
            extension = CONTAINER_EXTENSIONS.get(clip.container.format.name, ".mkv")
            hdr = {PQ: "PQ", HLG: "HLG"}.get(clip.colour.transfer)
            playable = (extension == ".mp4" and context.name in PLAYABLE_MP4_CODECS and context.pix_fmt == "yuv420p" and not hdr)
            return Clip("video", clip.length, clip.stream.width, clip.stream.height, float(clip.rate), extension, playable, hdr,
                        clip.colour)
        if clip.kind == "animation":
            durations = [frame.duration or 0 for frame in clip]
            mean = sum(durations) / len(durations) if durations else 0
            width, height = clip.size
            return Clip("animation", clip.length, width, height, 1000 / mean if mean else 10.0,
                        ANIMATION_EXTENSIONS.get(clip.format, ".gif"), False)
        first = next(iter(clip))
        width, height = first.image.size
        return Clip(clip.kind, clip.length, width, height, 25.0, "", False)


def describe_source(video: SourceVideo) -> Clip:
    """A ``cloud:`` source as the cloud's own probe tells it."""
    probe = video.probe()
    hdr = {PQ: "PQ", HLG: "HLG"}.get(video.scan.colour.transfer)
    extension = SOURCE_EXTENSIONS[video.source.format]
    playable = extension == ".mp4" and probe["codec"] in PLAYABLE_MP4_CODECS and probe["pix_fmt"] == "yuv420p" and not hdr
    return Clip("video", probe["frames"], probe["width"], probe["height"], float(Fraction(probe["rate"])), extension, playable, hdr,
                video.scan.colour)


_locks: dict[Path, threading.Lock] = {}
_locks_lock = threading.Lock()


def preview(src: Path | Callable[[], OpenedClip], dst: Path, rate: float = 25.0) -> Path:
    """``dst``, an H.264 MP4 of the clip ``src`` (a path, or what opens it) with each frame at its
    time (a directory's at ``rate``), made once; several callers wait for the one making it."""
    with _locks_lock:
        lock = _locks.setdefault(dst, threading.Lock())
    with lock:
        if not dst.exists():
            with atomic_output(dst) as tmp:
                _encode(src, tmp, rate)
    return dst


def _encode(src: Path | Callable[[], OpenedClip], dst: Path, rate: float) -> None:
    av = import_av()
    with (src() if callable(src) else open_clip(src)) as clip, av.open(str(dst), "w", format="mp4") as container:
        stream = None
        elapsed = Fraction(0)
        hdr = clip.kind == "video" and clip.colour.hdr
        for frame in clip:
            image = Image.fromarray(tone_mapped(frame.pixels.numpy(), clip.colour)) if hdr else frame.image.convert("RGB")
            if stream is None:
                stream = container.add_stream("libx264", rate=round(rate) or 25, options=PREVIEW_OPTIONS)
                # 4:2:0 wants even sides: a preview one pixel larger where the clip's side is odd.
                stream.width, stream.height = (image.width + 1) // 2 * 2, (image.height + 1) // 2 * 2
                stream.pix_fmt = "yuv420p"
                stream.codec_context.time_base = PREVIEW_TICK
            time = frame.time if frame.time is not None else elapsed
            elapsed = time + (Fraction(frame.duration) / 1000 if frame.duration else 1 / Fraction(rate).limit_denominator(1001))
            picture = av.VideoFrame.from_image(image).reformat(stream.width, stream.height, "yuv420p")
            picture.pts, picture.time_base = round(time / PREVIEW_TICK), PREVIEW_TICK
            container.mux(stream.encode(picture))
        if stream is not None:
            container.mux(stream.encode(None))
