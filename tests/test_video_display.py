"""How a player is told to show a video, carried from the input to the output or said to be lost:
its pixels' aspect ratio where only the container states it (ProRes in MOV), the display matrix and
aspect ratio where the output has no place for them, and a raw DV file's frame rate."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip

av = pytest.importorskip("av")


def average(index, frame0, frame1, seed):
    """A stand-in model: the mean of the two frames."""
    mean = (np.asarray(frame0.image, np.float32) + np.asarray(frame1.image, np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))


def clip(path, codec="libx264", size=(64, 48), pix_fmt="yuv420p", frames=3, aspect=None, rotation=None):
    """``frames`` frames at 25 a second, their pixels ``aspect`` wide, shown turned by ``rotation`` degrees."""
    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV build has no {codec} encoder")
    width, height = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.codec_context.time_base = Fraction(1, 25)
        if aspect is not None:
            stream.codec_context.sample_aspect_ratio = aspect
        if rotation is not None:
            stream.set_display_rotation(rotation)
        ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
        for i in range(frames):
            picture = np.broadcast_to((ramp + 40 * i) % 256, (height, width, 3)).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 25)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def interpolated(src, dst) -> list[str]:
    """The warnings of a run of ``src`` into ``dst``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, dst, pairwise(average), progress=False)
    return [str(w.message) for w in caught]


def test_a_pixel_aspect_ratio_only_the_container_states_is_kept(tmp_path):
    # ProRes states none in its stream: MOV's pasp does, which the decoder's context leaves out.
    src = clip(tmp_path / "in.mov", "prores_ks", pix_fmt="yuv422p10le", aspect=Fraction(4, 3))
    with av.open(str(src)) as container:
        assert container.streams.video[0].sample_aspect_ratio == Fraction(4, 3)
    interpolated(src, tmp_path / "out.mov")
    with av.open(str(tmp_path / "out.mov")) as container:
        assert container.streams.video[0].sample_aspect_ratio == Fraction(4, 3)


def test_a_raw_dv_file_is_timed_at_its_frame_rate(tmp_path):
    # FFmpeg 8's DV demuxer states its 1/60000 clock as the average frame rate: 60000 frames a second.
    src = clip(tmp_path / "in.dv", "dvvideo", size=(720, 576), aspect=Fraction(16, 15))
    with av.open(str(src)) as container:
        assert container.streams.video[0].guessed_rate == 25
    interpolated(src, tmp_path / "out.mkv")
    with av.open(str(tmp_path / "out.mkv")) as container:
        stream = container.streams.video[0]
        assert stream.average_rate == 50 and stream.sample_aspect_ratio == Fraction(16, 15)
        assert [frame.pts * frame.time_base for frame in container.decode(stream)] == [Fraction(k, 50) for k in range(5)]
    interpolated(src, tmp_path / "out.mov")  # its time code track at 120000 frames a second failed to be written
    with av.open(str(tmp_path / "out.mov")) as container:
        assert container.streams.video[0].codec_context.name == "dvvideo"
        assert len(list(container.decode(video=0))) == 5


@pytest.mark.parametrize("suffix, lost", [(".ts", True), (".avi", True), (".mkv", False), (".mp4", False)])
def test_an_output_with_no_place_for_the_rotation_says_so(tmp_path, suffix, lost):
    src = clip(tmp_path / "in.mp4", rotation=90)
    said = [w for w in interpolated(src, tmp_path / f"out{suffix}") if "display matrix" in w]
    assert len(said) == lost


@pytest.mark.parametrize("suffix, lost", [(".webm", True), (".mkv", False), (".mp4", False)])
def test_an_output_with_no_place_for_the_pixel_aspect_ratio_says_so(tmp_path, suffix, lost):
    src = clip(tmp_path / "in.mp4", aspect=Fraction(4, 3))  # H.264 into WebM becomes VP9, which states none
    said = [w for w in interpolated(src, tmp_path / f"out{suffix}") if "pixel aspect ratio 4:3" in w]
    assert len(said) == lost
    with av.open(str(tmp_path / f"out{suffix}")) as container:
        assert (container.streams.video[0].sample_aspect_ratio != Fraction(4, 3)) == lost
