"""Which of a file's streams is its video (eden_serve/media/containers.main_video): the one a player
shows, as FFmpeg's command line chooses it; files with none that can be decoded are refused in one
line, exit 2, before anything is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eden_serve.commands.cli import main

av = pytest.importorskip("av")


def write(path: Path, streams: list[dict], audio: bool = False) -> Path:
    """A file of video streams, each ``{"codec", "size": (w, h), "frames", "cover"}``, in that order
    of the container's streams, and an optional second of silent MP3 audio."""
    container = av.open(str(path), "w")
    made = []
    for spec in streams:
        stream = container.add_stream(spec["codec"], rate=25)
        stream.width, stream.height = spec["size"]
        stream.pix_fmt = "yuvj420p" if spec["codec"] == "mjpeg" else "yuv420p"
        if spec.get("cover"):
            stream.disposition = av.stream.Disposition.attached_pic
        made.append((stream, spec))
    sound = container.add_stream("libmp3lame", rate=44100) if audio else None
    for stream, spec in made:
        width, height = spec["size"]
        for i in range(spec["frames"]):
            picture = np.full((height, width, 3), (40 * i) % 256, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    if sound is not None:
        for i in range(40):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1152), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 44100, i * 1152
            for packet in sound.encode(frame):
                container.mux(packet)
        for packet in sound.encode():
            container.mux(packet)
    container.close()
    return path


def refused(capsys, src: Path, dst: Path) -> str:
    assert main(["interpolate", str(src), "-o", str(dst), "--config", "tiny"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "synthetic weights" not in line]
    assert len(err) == 1 and "Traceback" not in err[0] and "internal error" not in err[0], err
    assert not dst.exists() and not list(dst.parent.glob(f".{dst.name}*"))
    return err[0]


def test_a_video_whose_codec_ffmpeg_does_not_know_is_refused_in_one_line(tmp_path, capsys):
    """A Matroska track whose codec FFmpeg does not know has no codec context in PyAV: its size was
    read from it, an AttributeError, "internal error"."""
    known = write(tmp_path / "known.mkv", [{"codec": "libx264", "size": (64, 48), "frames": 5}]).read_bytes()
    assert known.count(b"V_MPEG4/ISO/AVC") == 1
    unknown = tmp_path / "unknown.mkv"
    unknown.write_bytes(known.replace(b"V_MPEG4/ISO/AVC", b"V_EDEN/UNKNOWN/"))  # the same length: the file stays whole
    assert "its video cannot be decoded: its codec is unknown" in refused(capsys, unknown, tmp_path / "out.mp4")


def test_an_mp3_with_a_cover_picture_is_no_video(tmp_path, capsys):
    """An MP3's cover picture is a one-frame video stream to FFmpeg: it came out as a one-frame video."""
    song = write(tmp_path / "song.mp3", [{"codec": "mjpeg", "size": (32, 32), "frames": 1, "cover": True}], audio=True)
    assert "has no video stream, only a cover picture" in refused(capsys, song, tmp_path / "out.mp4")


def test_the_video_a_player_shows_is_interpolated_not_the_first_stream(tmp_path):
    """A Matroska file whose first video stream is a small picture of one frame and whose second is
    the video: FFmpeg's command line (and a player) takes the larger; the first was interpolated,
    and the output was one frame."""
    src = write(tmp_path / "two.mkv", [{"codec": "mjpeg", "size": (32, 32), "frames": 1},
                                       {"codec": "libx264", "size": (64, 48), "frames": 5}])
    with av.open(str(src)) as container:
        assert [s.codec_context.name for s in container.streams.video] == ["mjpeg", "h264"]
    out = tmp_path / "out.mp4"
    with pytest.warns(UserWarning, match="video stream 0 is left out"):
        assert main(["interpolate", str(src), "-o", str(out), "--config", "tiny"]) == 0
    with av.open(str(out)) as container:
        (stream,) = container.streams.video
        assert (stream.codec_context.width, stream.codec_context.height) == (64, 48)
        assert sum(1 for _ in container.decode(stream)) == 9
