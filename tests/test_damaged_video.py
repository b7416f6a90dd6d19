"""A damaged video is read on, as FFmpeg's command line reads one (eden_serve/media/damage.py): the
frames that decode are interpolated at their own times, what was lost is said in one warning (how
many frames, where in seconds), and a file of which no frame decodes is refused in one line."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.errors import BadInputError
from harness.videos import damaged, make_clip, remux

av = pytest.importorskip("av")

COUNT, SIZE = 20, (48, 64)  # frames at 25 a second


def average(index, frame0, frame1, seed):
    mean = (np.asarray(frame0.image, np.float32) + np.asarray(frame1.image, np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))


def shown(path) -> list[float]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [float(frame.pts * stream.time_base) for frame in container.decode(stream)]


def interpolated(src, dst) -> list[str]:
    """The run on ``src``, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, dst, pairwise(average), progress=False)
    return [str(w.message) for w in caught]


def middled(times: list[float]) -> list[float]:
    """``times`` with a middle halfway between each two."""
    return sorted([*times, *((a + b) / 2 for a, b in zip(times, times[1:]))])


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("damaged")
    return {"ffv1": make_clip(folder / "ffv1.mkv", "ffv1", {}, SIZE, COUNT, synthetic=True),
            "h264": make_clip(folder / "h264.mkv", "libx264", {"g": "10", "bframes": "0"}, SIZE, COUNT, synthetic=True)}


def test_a_packet_the_decoder_refuses_is_left_behind_and_said(clips, tmp_path):
    # Before, the whole run was refused ("cannot decode the video ... avcodec_send_packet()").
    src = damaged(clips["ffv1"], tmp_path / "in.mkv", 7)
    said = interpolated(src, tmp_path / "out.mkv")
    # The frames after it in its GOP (FFV1's: 12 frames) are made of the picture the decoder left
    # half made, not the same twice (eden_serve/media/steady.py): lost with it, to the key frame at 12.
    assert len(said) == 1 and f"5 of its video's {COUNT} frames were lost, at 0.28-0.44 s of the input" in said[0], said
    # The middle across the gap is made between frames 6 and 12, at its time; no frame moves.
    originals = [k / 25 for k in range(COUNT) if not 7 <= k < 12]
    assert shown(tmp_path / "out.mkv") == pytest.approx(middled(originals), abs=1e-3)


def test_a_stream_cut_between_key_frames_says_the_frames_before_its_first_key_frame(clips, tmp_path):
    # Before, the 7 frames before the key frame at 0.40 s went without a word.
    src = remux(clips["h264"], tmp_path / "in.mkv", lambda index, packet: index >= 3)
    said = interpolated(src, tmp_path / "out.mkv")
    assert len(said) == 1 and f"7 of its video's {COUNT - 3} frames were lost, at 0.12-0.36 s of the input" in said[0], said
    times = shown(tmp_path / "out.mkv")
    expected = middled([k / 25 for k in range(10, COUNT)])
    assert [t - times[0] for t in times] == pytest.approx([t - expected[0] for t in expected], abs=1e-3)


def test_a_file_cut_short_is_said_against_the_end_its_header_states(clips, tmp_path):
    src = damaged(clips["ffv1"], tmp_path / "in.mkv", 12, cut=True)
    said = interpolated(src, tmp_path / "out.mkv")
    assert len(said) == 1 and "its packets end at 0.48 s, before the 0.80 s its header states (cut short?)" in said[0], said
    assert shown(tmp_path / "out.mkv") == pytest.approx(middled([k / 25 for k in range(12)]), abs=1e-3)


@pytest.mark.parametrize("suffix, codec, said", [
    (".mp4", "libx264", "its header states 20 frames, and the file holds 13 (cut short?)"),  # moov first: +faststart; the 13th cut
    (".avi", "mjpeg", "its packets end at 0.52 s, before the 0.80 s its header states (cut short?)")])
def test_an_mp4_or_avi_cut_short_is_said_against_its_header(tmp_path, suffix, codec, said):
    src = tmp_path / f"clean{suffix}"
    with av.open(str(src), "w", options={"movflags": "+faststart"} if suffix == ".mp4" else {}) as container:
        stream = container.add_stream(codec, rate=25, options={"bframes": "0"} if codec == "libx264" else {})
        stream.height, stream.width = SIZE
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        for k in range(COUNT):
            picture = av.VideoFrame.from_ndarray(np.full((*SIZE, 3), 10 * k, np.uint8), format="rgb24").reformat(format=stream.pix_fmt)
            picture.pts = k
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    cut = damaged(src, tmp_path / f"in{suffix}", 12, cut=True)
    assert not [w for w in interpolated(src, tmp_path / f"whole{suffix}") if "damaged" in w]  # the whole file: nothing said
    given = [w for w in interpolated(cut, tmp_path / f"out{suffix}") if "damaged" in w]
    assert len(given) == 1 and said in given[0], given


def test_an_mp4_cut_before_its_index_is_refused_in_one_line_as_damaged(tmp_path):
    # Before: "is not a clip: neither an image, an animation nor a video FFmpeg recognises".
    src = make_clip(tmp_path / "clean.mp4", "libx264", {}, SIZE, COUNT, synthetic=True)  # its moov at its end
    cut = damaged(src, tmp_path / "in.mp4", 12, cut=True)
    with pytest.raises(BadInputError, match="its first bytes say MP4 or MOV, which FFmpeg cannot read .*: the file is damaged "
                                            "or cut short .an MP4 or MOV holds its index, the moov box, at its end") as info:
        interpolate_clip(cut, tmp_path / "out.mp4", pairwise(average), progress=False)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clean.mp4", "in.mp4"]


def test_packets_a_demuxer_skips_are_counted_by_the_gap_in_a_constant_rate(clips, tmp_path):
    # Before, a Matroska block header damaged lost the frames to the next cluster without a word.
    with av.open(str(clips["ffv1"])) as container:
        pos = [p.pos for p in container.demux(video=0) if p.size][8]
    data = bytearray(clips["ffv1"].read_bytes())
    data[pos - 6 : pos] = bytes(b ^ 0xFF for b in data[pos - 6 : pos])  # its block header
    src = tmp_path / "in.mkv"
    src.write_bytes(bytes(data))
    with av.open(str(src)) as container:  # as FFmpeg's demuxer reads it: from 0.32 s on, skipped to the next cluster
        read = sorted(float(p.pts * p.time_base) for p in container.demux(video=0) if p.size)
    assert len(read) < COUNT and read[:8] == pytest.approx([k / 25 for k in range(8)])
    said = interpolated(src, tmp_path / "out.mkv")
    assert len(said) == 1 and f"of its video's {COUNT} frames were lost, at 0.32-" in said[0], said
    assert f"{COUNT - len(read)} of them in packets that could not be read" in said[0]
    assert shown(tmp_path / "out.mkv") == pytest.approx(middled(read), abs=1e-3)


def test_frames_decoded_out_of_order_are_left_out_not_moved(clips, tmp_path):
    # Before, the run was refused ("frame 4 is not timed after frame 3").
    order = [0, 1, 2, 6, 4, 5, *range(7, COUNT)]

    def retimed(index, packet):
        step = round(1 / (25 * packet.time_base))
        if index < len(order):
            packet.pts, packet.dts = order[index] * step, index * step
        return index < len(order)

    src = remux(clips["ffv1"], tmp_path / "in.mkv", retimed)
    said = interpolated(src, tmp_path / "out.mkv")
    assert len(said) == 1, said
    # Frame 3's time, which no packet has, is a gap in the rate: counted too.
    assert (f"3 of its video's {COUNT} frames were lost, at 0.12-0.20 s of the input, 2 of them decoded out of order and left "
            "out, 1 of them in packets that could not be read") in said[0], said[0]
    assert shown(tmp_path / "out.mkv") == pytest.approx(middled([k / 25 for k in [0, 1, 2, 6, *range(7, COUNT)]]), abs=1e-3)


def test_a_stream_of_which_no_frame_decodes_is_refused_in_one_line(clips, tmp_path):
    # Before: "holds no frames", which blamed an empty file.
    src = remux(clips["h264"], tmp_path / "in.mkv", lambda index, packet: 1 <= index < 10)
    with pytest.raises(BadInputError, match="none of its video's frames could be decoded: the file is damaged") as info:
        interpolate_clip(src, tmp_path / "out.mkv", pairwise(average), progress=False)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mkv"]


def run(*args):
    """The command in a fresh process, as a user runs it: what it writes to its standard error is all it says."""
    return subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", *map(str, args)], capture_output=True, text=True, timeout=300)


def test_the_command_line_goes_on_past_damage_with_one_warning_and_refuses_the_undecodable(clips, tmp_path):
    src = damaged(clips["ffv1"], tmp_path / "in.mkv", 7)
    result = run("interpolate", src, "-o", tmp_path / "out.mkv", "--config", "tiny")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "synthetic weights" not in line]
    assert len(said) == 1 and said[0].startswith("eden-serve: warning: ") and "lost, at 0.28-0.44 s" in said[0], result.stderr
    bad = remux(clips["h264"], tmp_path / "bad.mkv", lambda index, packet: 1 <= index < 10)
    result = run("interpolate", bad, "-o", tmp_path / "bad-out.mkv", "--config", "tiny")
    said = [line for line in result.stderr.splitlines() if "synthetic weights" not in line]
    assert result.returncode == 2 and len(said) == 1 and said[0].startswith("eden-serve: error: "), result.stderr
    assert "could be decoded: the file is damaged" in said[0]
    assert not (tmp_path / "bad-out.mkv").exists()


class FailingDemuxer:
    """A container whose demuxer fails after ``good`` packets, as FFmpeg's does on a file it cannot
    read further (the rest as PyAV's own)."""

    def __init__(self, path, good):
        self.inner, self.good = av.open(str(path)), good

    def demux(self, *args, **kwargs):
        for index, packet in enumerate(self.inner.demux(*args, **kwargs)):
            if index == self.good:
                raise av.error.InvalidDataError(1094995529, "Invalid data found when processing input")
            yield packet

    def decode(self, stream):
        for packet in self.demux(stream):
            yield from packet.decode()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_demuxer_that_fails_ends_the_stream_there_with_one_warning(clips):
    # Before, the run was refused ("cannot decode the video (... Invalid data found ...)").
    from eden_serve.media.video import VideoClip

    clip = VideoClip(clips["ffv1"], container=FailingDemuxer(clips["ffv1"], 12))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frames = list(clip)
    finally:
        clip.close()
    assert [float(frame.time) for frame in frames] == pytest.approx([k / 25 for k in range(12)])
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "reading stopped at 0.48 s: [Errno 1094995529] Invalid data found when processing input" in said[0], said


def decoded_on(path, threads: int) -> list[tuple]:
    """Each frame a local run reads of ``path`` on ``threads`` decoder threads: its time and pixels."""
    from eden_serve.media.video import VideoClip

    clip = VideoClip(path)
    clip.stream.thread_count = threads
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [(frame.time, np.asarray(frame.image).tobytes()) for frame in clip]
    finally:
        clip.close()


@pytest.mark.parametrize("codec, options, index", [
    # A P-frame concealed: before, 1 or 2 threads gave one picture and its GOP, 3 or more another.
    ("libx264", {"g": "10", "bframes": "0"}, 5),
    # A B-frame concealed in an open GOP (x264's B-pyramid): before, its picture differed by the threads.
    ("libx264", {"x264-params": "keyint=10:min-keyint=10:open-gop=1:bframes=3:scenecut=0"}, 17),
    # A frame refused: before, the GOP after it differed from run to run, and FFmpeg's FFV1 on frame
    # threads could change the frames decoded beside it, before it (those before frame 5 on 8 threads).
    ("ffv1", {"g": "12", "slices": "4"}, 5)])
def test_a_damaged_video_decodes_the_same_whatever_the_threads_and_run(tmp_path, codec, options, index):
    src = damaged(make_clip(tmp_path / "clean.mkv", codec, options, (96, 128), COUNT, synthetic=True), tmp_path / "in.mkv", index)
    runs = {threads: [decoded_on(src, threads) for _ in range(4)] for threads in (1, 2, 3, 8)}
    first = runs[1][0]
    assert len(first) >= COUNT - 7
    for threads, decoded in runs.items():
        for run in decoded:
            assert [t for t, _ in run] == [t for t, _ in first], threads
            assert [k for k, ((_, a), (_, b)) in enumerate(zip(run, first)) if a != b] == [], threads


def test_damage_the_decoder_conceals_is_said(tmp_path):
    # Before, an H.264 P-frame with bytes flipped, which FFmpeg's decoder patches from the pictures
    # around it and marks corrupt, went without a word.
    src = damaged(make_clip(tmp_path / "clean.mkv", "libx264", {"g": "10", "bframes": "0"}, (96, 128), COUNT, synthetic=True),
                  tmp_path / "in.mkv", 5)
    said = interpolated(src, tmp_path / "out.mkv")
    assert said == [f"{src}: damaged: 1 frame was decoded with damage its decoder concealed, at 0.20 s of the input; the output "
                    "keeps what was decoded"]
    assert shown(tmp_path / "out.mkv") == pytest.approx(middled([k / 25 for k in range(COUNT)]), abs=1e-3)


@pytest.mark.parametrize("options", [{}, {"mpegts_m2ts_mode": "1"}])  # TS's 188-byte packets, M2TS's 192
def test_an_mpeg_ts_cut_short_is_said_by_its_last_packet(tmp_path, options):
    # Before, nothing said it was cut: MPEG-TS states no length.
    src = tmp_path / "clean.ts"
    with av.open(str(make_clip(tmp_path / "made.ts", "libx264", {"bframes": "0"}, SIZE, COUNT, synthetic=True))) as given, \
            av.open(str(src), "w", format="mpegts", options=options) as made:
        stream = made.add_stream_from_template(given.streams.video[0])
        for packet in (p for p in given.demux(video=0) if p.size):
            packet.stream = stream
            made.mux(packet)
    assert not [w for w in interpolated(src, tmp_path / "whole.mkv") if "damaged" in w]  # the whole file: nothing said
    cut = damaged(src, tmp_path / "in.ts", 12, cut=True)
    packet = 192 if options else 188
    said = [w for w in interpolated(cut, tmp_path / "out.mkv") if "damaged" in w]
    assert len(said) == 1 and f"its last {packet}-byte MPEG-TS packet holds {cut.stat().st_size % packet} bytes (cut short?)" in said[0], said
