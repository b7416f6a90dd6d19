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

from harness.videos import mux_grey_frames  # noqa: E402  (PyAV, which the skip above asks for)


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


def late_ts(path, start: Fraction, audio_before: Fraction, chapters=()):
    """An MPEG-TS of 3 frames at 25 a second from ``start`` seconds on its clock (a broadcast's
    recording, an HLS segment), with silent AAC from ``audio_before`` seconds earlier to its end
    (or another container, by ``path``'s suffix, with ``chapters`` where it holds them)."""
    tick = Fraction(1, 90000)
    with av.open(str(path), "w") as container:
        if chapters:
            container.set_chapters(list(chapters))
        video = container.add_stream("libx264", rate=25)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        video.codec_context.time_base = tick
        sound = container.add_stream("aac", rate=48000)
        for i in range(3):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 60 * i, np.uint8), format="rgb24")
            frame.pts, frame.time_base = int(start / tick) + 3600 * i, tick
            for packet in video.encode(frame):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        first = int((start - audio_before) * 48000)
        for i in range(int((audio_before + Fraction(3, 25)) * 48000) // 1024):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = 48000, first + 1024 * i, Fraction(1, 48000)
            for packet in sound.encode(frame):
                container.mux(packet)
        for packet in sound.encode():
            container.mux(packet)
    return path


@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_a_file_whose_streams_all_start_late_starts_at_zero_and_keeps_their_distance(tmp_path, suffix):
    src = late_ts(tmp_path / "in.ts", Fraction(600), Fraction(1, 10))
    with av.open(str(src)) as container:
        video, audio = (s.start_time * s.time_base for s in (container.streams.video[0], container.streams.audio[0]))
    assert video > 599 and 0 < video - audio < Fraction(1, 5)
    dst = tmp_path / f"out{suffix}"
    interpolated(src, dst)
    with av.open(str(dst)) as container:
        moved = [s.start_time * s.time_base for s in (container.streams.video[0], container.streams.audio[0])]
        assert container.duration < 1_000_000  # it lasted 600 s in Matroska, nothing shown before its end
    assert min(moved) < Fraction(1, 20)  # at 0, but for an audio encoder's priming the muxer keeps
    assert abs((moved[0] - moved[1]) - (video - audio)) <= Fraction(1, 1000)


@pytest.mark.parametrize("suffix", [".mp4", ".mov"])
def test_hevc_in_mp4_or_mov_is_tagged_as_apples_players_play_it(tmp_path, suffix):
    if "libx265" not in av.codecs_available:
        pytest.skip("this PyAV build has no libx265 encoder")
    src = tmp_path / f"in{suffix}"
    with av.open(str(src), "w") as container:  # an iPhone's clip: hvc1, which QuickTime and Safari play (hev1 they refuse)
        stream = container.add_stream("libx265", rate=25, options={"x265-params": "log-level=error"})
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.codec_tag = "hvc1"
        mux_grey_frames(container, stream, 3)
    dst = tmp_path / f"out{suffix}"
    interpolated(src, dst)
    with av.open(str(dst)) as container:
        assert container.streams.video[0].codec_tag == "hvc1"
        assert len(list(container.decode(video=0))) == 5


def test_a_raw_dv_file_at_another_rate_than_its_systems_is_refused_in_one_line(tmp_path, capsys):
    from eden_serve.commands.cli import main

    src = clip(tmp_path / "in.dv", "dvvideo", size=(720, 576))
    dst = tmp_path / "out.dv"  # its muxer would time 50 frames a second at 25: played at half speed
    assert main(["interpolate", str(src), "-o", str(dst), "--config", "tiny"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "synthetic weights" not in line]
    assert len(err) == 1 and "raw DV file plays at 25 or 30000/1001" in err[0], err
    assert not dst.exists() and not list(tmp_path.glob(".out*"))


def test_chapters_move_earlier_with_a_late_file_none_before_zero(tmp_path):
    src = tmp_path / "in.mkv"
    with av.open(str(src), "w") as container:  # its video 10 s into its clock, its chapters from 0
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        container.set_chapters([{"id": 1, "start": 0, "end": 10100, "time_base": Fraction(1, 1000), "metadata": {"title": "one"}},
                                {"id": 2, "start": 10100, "end": 10200, "time_base": Fraction(1, 1000), "metadata": {"title": "two"}}])
        for i in range(5):  # enough for FFmpeg to state the stream's start
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 60 * i, np.uint8), format="rgb24")
            frame.pts, frame.time_base = 250 + i, Fraction(1, 25)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    dst = tmp_path / "out.mkv"
    interpolated(src, dst)  # Matroska's muxer refused the first chapter moved to -10 s
    with av.open(str(dst)) as container:
        assert container.start_time == 0
        chapters = [(c["start"] * c["time_base"], c["end"] * c["time_base"], c["metadata"]["title"]) for c in container.chapters()]
    assert chapters == [(0, Fraction(1, 10), "one"), (Fraction(1, 10), Fraction(1, 5), "two")]
