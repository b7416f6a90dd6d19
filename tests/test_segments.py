"""x264 in several instances on segments that start with a key frame, joined into one stream
(eden_serve/media/segments.py): the same frames, order, time stamps and audio as one instance, a
key frame at each segment's start, the quality of one instance (PSNR against the lossless output),
a header that differs refused in favour of one instance."""

import re
from fractions import Fraction

import numpy as np
import pytest
from test_video import average, real_video

from eden_serve.commands.cli import main
from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.media import Encoding, segments
from eden_serve.media.segments import Mismatch, SegmentedEncoder

av = pytest.importorskip("av")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return real_video(tmp_path_factory.mktemp("segments") / "in.mp4", 24, Fraction(25), size=(192, 108))


def packets(path):
    with av.open(str(path)) as container:
        return [(p.pts, p.dts, p.is_keyframe) for p in container.demux(video=0) if p.size]


def decoded(path):
    """Each frame's time stamp and its 4:2:0 planes, in the order the file shows them."""
    with av.open(str(path)) as container:
        return [(f.pts, f.time, [np.array(p, copy=True) for p in (f.to_ndarray(format="yuv420p"),)][0])
                for f in container.decode(video=0)]


def audio(path):
    with av.open(str(path)) as container:
        return [(p.pts, bytes(p)) for p in container.demux(audio=0) if p.size]


def encode(clip, path, instances, **options):
    interpolate_clip(clip, path, pairwise(average), encoding=Encoding(instances=instances, **options), progress=False)
    return path


def test_segments_decode_to_the_frames_times_and_audio_of_one_instance(tmp_path, clip, monkeypatch):
    monkeypatch.setattr(segments, "SEGMENT_FRAMES", (8, 8))
    one, three = encode(clip, tmp_path / "one.mp4", 1), encode(clip, tmp_path / "three.mp4", 3)
    frames_one, frames_three = decoded(one), decoded(three)
    assert len(frames_three) == len(frames_one) == 47
    assert [(pts, time) for pts, time, _ in frames_three] == [(pts, time) for pts, time, _ in frames_one]
    assert audio(three) == audio(one)
    # A key frame opens each segment of 8 frames (by presentation time), the decoding times strictly rise.
    shown = sorted(packets(three))
    assert [k for k, (_, _, key) in enumerate(shown) if key] == list(range(0, 47, 8))
    dts = [d for _, d, _ in packets(three)]
    assert dts == sorted(set(dts))
    # The frames themselves: each within x264's loss of one instance's.
    for (_, _, a), (_, _, b) in zip(frames_one, frames_three):
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 2


def psnr(frames, reference) -> float:
    squared = np.mean([np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2) for (_, _, a), (_, _, b) in zip(frames, reference)])
    return float(10 * np.log10(255 ** 2 / squared))


def test_segments_keep_the_quality_of_one_instance(tmp_path, monkeypatch, capsys):
    """Against the lossless output (FFV1 of the same middles), at the same settings (crf 18, preset
    veryfast), 239 frames of real video in segments of the shortest length: the segments' PSNR at
    least one instance's less 0.1 dB (issue 41's bound)."""
    monkeypatch.setattr(segments, "SEGMENT_FRAMES", (segments.SEGMENT_FRAMES[0],) * 2)
    clip = real_video(tmp_path / "bikes.mp4", 120, Fraction(25), source="bikes.mp4", size=(320, 136), audio=None)
    lossless = decoded(encode(clip, tmp_path / "lossless.mkv", 1, vcodec="ffv1", pix_fmt="yuv420p"))
    one = psnr(decoded(encode(clip, tmp_path / "one.mp4", 1, preset="veryfast")), lossless)
    four = psnr(decoded(encode(clip, tmp_path / "four.mp4", 4, preset="veryfast")), lossless)
    with capsys.disabled():
        print(f"\nPSNR against the lossless output: one instance {one:.3f} dB, four on segments of "
              f"{segments.SEGMENT_FRAMES[0]} frames {four:.3f} dB")
    assert four >= one - 0.1


def test_a_variable_frame_rate_keeps_its_times(tmp_path, monkeypatch):
    """Frames of uneven durations: an instance's reordering delay reaches back past the segment
    before; the decoding times still rise and never pass a frame's presentation time."""
    monkeypatch.setattr(segments, "SEGMENT_FRAMES", (5, 5))
    clip = real_video(tmp_path / "vfr.mkv", 16, Fraction(25), size=(96, 64), audio=None)
    vfr = tmp_path / "vfr2.mkv"
    with av.open(str(clip)) as reader, av.open(str(vfr), "w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 100)
        pts = 0
        for k, frame in enumerate(reader.decode(video=0)):
            frame.pts, frame.time_base, frame.pict_type = pts, Fraction(1, 100), av.video.frame.PictureType.NONE
            container.mux(stream.encode(frame))
            pts += (1, 9, 2, 13)[k % 4]
        container.mux(stream.encode(None))
    one, three = encode(vfr, tmp_path / "one.mp4", 1), encode(vfr, tmp_path / "three.mp4", 3)
    assert [(pts, time) for pts, time, _ in decoded(three)] == [(pts, time) for pts, time, _ in decoded(one)]
    got = packets(three)
    assert [d for _, d, _ in got] == sorted({d for _, d, _ in got})
    assert all(d <= p for p, d, _ in got)


class _Context:
    def __init__(self, header):
        self.extradata = header

    def encode(self, frame):
        return []


def test_an_instance_with_another_header_is_refused():
    with pytest.raises(Mismatch):
        SegmentedEncoder(lambda: _Context(b"other"), b"stream's", 2, 8)
    SegmentedEncoder(lambda: _Context(b"same"), b"same", 2, 8).close()


def test_a_refused_header_falls_back_to_one_instance(tmp_path, clip, monkeypatch):
    monkeypatch.setattr(segments, "SegmentedEncoder", lambda *args: (_ for _ in ()).throw(Mismatch("differs")))
    with pytest.warns(UserWarning, match="differs; encoding with one instance"):
        encode(clip, tmp_path / "out.mp4", 3)
    assert [k for k, (_, _, key) in enumerate(sorted(packets(tmp_path / "out.mp4"))) if key] == [0]


@pytest.mark.parametrize("cores", [2, 16, 64])
def test_one_instance_by_default_on_any_host(cores, monkeypatch):
    """Beside a GPU too: on a 16-core H200 host one x264 encoded 1080p at 183 frames a second, four
    on segments 99 (docs/video.md, "Encoder speed"). More instances only when asked."""
    monkeypatch.setattr(segments, "host_cores", lambda: cores)
    assert Encoding().instances_for("libx264") == 1
    assert Encoding(gpu=True).instances_for("libx264") == 1
    assert Encoding(gpu=True, instances=2).instances_for("libx264") == 2
    assert Encoding(gpu=True, instances=3).instances_for("libx265") == 1
    assert "instances" not in Encoding().identity() and Encoding(instances=2).identity()["instances"] == 2


def x264_threads(path) -> list[int]:
    """Each x264 instance's thread count, from the settings it writes into its first packet (SEI)."""
    return [int(n) for n in re.findall(rb" threads=(\d+) ", path.read_bytes())]


@pytest.mark.parametrize("cores, instances, each", [(6, 3, 2), (2, 3, 1)])
def test_each_instance_runs_its_share_of_the_cores(tmp_path, clip, monkeypatch, cores, instances, each):
    """Not x264's own count (one and a half threads a core) in every instance: the instances
    together run as many threads as the host has cores, at least one each."""
    monkeypatch.setattr(segments, "SEGMENT_FRAMES", (8, 8))
    monkeypatch.setattr(segments, "host_cores", lambda: cores)
    assert x264_threads(encode(clip, tmp_path / "out.mp4", instances)) == [each] * 6  # 47 frames in segments of 8


def test_the_command_refuses_no_instances(tmp_path, clip, capsys):
    assert main(["interpolate", str(clip), "-o", str(tmp_path / "o.mp4"), "--config", "tiny", "--encoder-instances", "0"]) == 2
    assert "--encoder-instances must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "o.mp4").exists()


def test_verbose_prints_the_encoders_share(tmp_path, clip, capsys):
    """``-v``: what encoded the output, and its thread's busy seconds against the run's and a chunk's."""
    out = tmp_path / "o.mp4"
    assert main(["interpolate", str(clip), "-o", str(out), "--config", "tiny", "--encoder-instances", "2", "-v", "--chunk", "4"]) == 0
    line = [text for text in capsys.readouterr().out.splitlines() if text.startswith("encoder ")]
    assert len(line) == 1 and f"libx264 in 2 instances on segments of {segments.SEGMENT_FRAMES[0]} frames: busy" in line[0], line
    busy, run = (float(v) for v in re.search(r"busy ([\d.]+) s of ([\d.]+) s", line[0]).groups())
    assert 0 < busy < run
    assert re.search(r"; \d+ ms of a chunk's \d+ ms$", line[0])
    main(["interpolate", str(clip), "-o", str(tmp_path / "quiet.mp4"), "--config", "tiny", "--chunk", "4"])
    assert "encoder " not in capsys.readouterr().out


def keyed(path) -> list[int]:
    """The frames (in presentation order) that open a segment: the key frames."""
    return [k for k, (_, _, key) in enumerate(sorted(packets(path))) if key]


def test_a_short_clip_gives_every_instance_a_segment(tmp_path, clip, monkeypatch):
    """The output's 47 frames known (the source's 24, a factor of 2): three segments of about a
    third each over three instances, not one of the queue's 250 frames at this size, which left the
    other instances idle (the H200's 399 frames at 480x854 ran in two segments of four); the same
    frames, times and audio as one instance."""
    monkeypatch.setattr(segments, "SEGMENT_FRAMES", (8, 250))
    one, three = encode(clip, tmp_path / "one.mp4", 1), encode(clip, tmp_path / "three.mp4", 3)
    assert keyed(three) == [0, 16, 32]
    frames_one, frames_three = decoded(one), decoded(three)
    assert [(pts, time) for pts, time, _ in frames_three] == [(pts, time) for pts, time, _ in frames_one]
    assert audio(three) == audio(one)
    for (_, _, a), (_, _, b) in zip(frames_one, frames_three):
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 2


def test_a_retimed_short_clip_spreads_over_the_instances_too(tmp_path, clip, monkeypatch):
    """``--fps``: the output's frames estimated from the source's (rounded up), so that no few
    frames are left over for a segment of their own."""
    monkeypatch.setattr(segments, "SEGMENT_FRAMES", (8, 250))
    out = tmp_path / "three.mp4"
    interpolate_clip(clip, out, pairwise(average), encoding=Encoding(instances=3), fps=Fraction(60), progress=False)
    starts = keyed(out)
    assert len(starts) == 3 and len(decoded(out)) - starts[-1] <= starts[1]


def test_segments_share_the_frames_only_where_they_are_known():
    """Unknown (a pipe, a container that leaves the count out): the queue's bound, as before; known,
    a share each, within the queue's bound and :data:`~segments.SEGMENT_FRAMES`."""
    queued = segments.segment_frames(4, 1920, 1080)
    assert segments.segment_frames(4, 1920, 1080, None) == queued < segments.SEGMENT_FRAMES[1]
    assert segments.segment_frames(4, 1920, 1080, 8 * queued) == queued
    assert segments.segment_frames(4, 854, 480) == segments.SEGMENT_FRAMES[1]
    assert segments.segment_frames(4, 854, 480, 399) == 100
    assert segments.segment_frames(4, 854, 480, 40) == segments.SEGMENT_FRAMES[0]
