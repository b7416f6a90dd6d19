"""A damaged video the cloud holds (docs/cloud-sources.md, "Damaged sources") reads as the same file
read locally (eden_serve/media/damage.py): the client reads on past damage with the same one
warning, and refuses a file of which nothing decodes; its frames are named as the cloud numbers
them, by time stamp, and the cloud reads a range on past a packet its decoder refuses."""

import json
import warnings

import numpy as np
import pytest

from eden_serve.client.remote import RemoteVideo, named_fields
from eden_serve.cloud.ranges import CURSORS
from eden_serve.cloud.sources import SourceVideo
from eden_serve.errors import BadInputError
from eden_serve.media import open_clip
from eden_serve.wire.pages import pack
from harness.videos import damaged, make_clip, remux

av = pytest.importorskip("av")

COUNT, SIZE = 20, (48, 64)  # frames at 25 a second


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    # FFV1's GOP is 12 frames. A packet refused within one leaves the frames after it in the GOP to a
    # frame-threaded decoder's timing (locally as on the cloud): the last of a GOP is damaged here.
    return {"ffv1": make_clip(folder / "ffv1.mkv", "ffv1", {}, SIZE, COUNT, synthetic=True),
            "ffv1 gop": make_clip(folder / "gop.mkv", "ffv1", {"g": "10"}, SIZE, COUNT, synthetic=True),  # key frames 0 and 10
            "h264": make_clip(folder / "h264.mkv", "libx264", {"g": "10", "bframes": "0"}, SIZE, COUNT, synthetic=True)}


def remote(path) -> tuple[SourceVideo, RemoteVideo]:
    """``path`` as a cloud serves it, and as a client in this process reads it."""
    video = SourceVideo(path, 10**7)
    return video, RemoteVideo(path.name, json.loads(json.dumps(video.probe())),
                              lambda stream, start, after: pack(video.page(stream, start, after and (after.pts, after.dts, len(after.data)))))


def read(clip) -> tuple[list, list[str]]:
    """The frames of ``clip`` as (time, pixels, frame), and what was said reading them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frames = [(f.time, np.asarray(f.image), f) for f in clip]
    return frames, [str(w.message) for w in caught if "damaged" in str(w.message) or "decoded" in str(w.message)]


def test_a_damaged_cloud_source_reads_on_as_the_local_file_with_its_one_warning(clips, tmp_path):
    # Before, the client's reading ended at the packet its decoder refused: "cannot decode the video".
    src = damaged(clips["ffv1"], tmp_path / "in.mkv", 11)
    with open_clip(src) as clip:
        local, said_here = read(clip)
    video, source = remote(src)
    served, said = read(source)
    assert len(served) == len(local) == COUNT - 1
    assert all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(served, local))
    assert len(said) == 1 and said[0] == said_here[0].replace(str(src), "cloud:in.mkv"), (said, said_here)
    assert "1 of its video's 20 frames were lost, at 0.44 s" in said[0]
    # Each frame is numbered as the cloud numbers it (by time stamp, the lost one counted): a chunk
    # across the lost frame names none (it is sent), one after it names the cloud's frames.
    frames = [f for _, _, f in served]
    assert [f.at for f in frames] == [video.scan.times.index(f.raw.pts) for f in frames] == [*range(11), *range(12, COUNT)]
    assert named_fields(frames[9:12]) is None
    assert named_fields(frames[11:14]) == {"source": "in.mkv", "start": "12", "frames": "3"}


def test_frames_before_a_cloud_sources_first_key_frame_are_lost_and_the_rest_named_by_the_clouds_numbers(clips, tmp_path):
    # Before, the client named its first frame 0, which the cloud could not decode: the run was refused
    # ("frames 0 to 4 do not all decode").
    src = remux(clips["h264"], tmp_path / "in.mkv", lambda index, packet: index >= 3)
    video, source = remote(src)
    served, said = read(source)
    assert len(said) == 1 and f"7 of its video's {COUNT - 3} frames were lost, at 0.12-0.36 s of the input" in said[0], said
    frames = [f for _, _, f in served]
    assert [f.at for f in frames] == list(range(7, COUNT - 3))
    named = named_fields(frames[:3])
    pixels = video.read(int(named["start"]), int(named["frames"]))
    assert all(np.array_equal(p, image) for p, (_, image, _) in zip(pixels, served[:3]))


def test_the_cloud_reads_a_range_on_past_a_packet_its_decoder_refuses(clips, tmp_path):
    # Before: "cannot decode the video (... avcodec_send_packet())", for frames that decode locally.
    src = damaged(clips["ffv1 gop"], tmp_path / "in.mkv", 7)
    CURSORS.clear()
    video = SourceVideo(src, 10**7)
    # From the key frame at 0, across packet 7, to the frames after the key frame at 10: those after
    # packet 7 in its GOP are lost with it, as a local run loses them (eden_serve/media/steady.py).
    pixels = video.read(6, 1) + video.read(10, 2)
    with open_clip(src) as clip:
        local, _ = read(clip)
    assert [float(t) for t, _, _ in local] == pytest.approx([k / 25 for k in range(COUNT) if not 7 <= k < 10])
    assert all(np.array_equal(p, image) for p, (_, image, _) in zip(pixels, local[6:9]))
    with pytest.raises(BadInputError, match="frames 6 to 8 do not all decode"):
        video.read(6, 3)  # the lost frames (a client never names them: the first test)
    CURSORS.clear()


def test_a_cloud_source_of_which_no_frame_decodes_is_refused_in_one_line(clips, tmp_path):
    src = remux(clips["h264"], tmp_path / "in.mkv", lambda index, packet: 1 <= index < 10)
    _, source = remote(src)
    with pytest.raises(BadInputError, match="none of its video's frames could be decoded: the file is damaged") as info:
        list(source)
    assert "\n" not in str(info.value) and str(info.value).startswith("cloud:in.mkv: ")


@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_a_cloud_source_cut_short_is_said_against_the_end_its_header_states(clips, tmp_path, suffix):
    # Before, the client read what the cloud's pages held and said nothing.
    whole = remux(clips["ffv1"], tmp_path / f"whole{suffix}") if suffix == ".mkv" else make_clip(
        tmp_path / "whole.mp4", "libx264", {"g": "5", "bframes": "0"}, SIZE, COUNT, synthetic=True)
    src = damaged(whole, tmp_path / f"in{suffix}", 12, cut=True)
    if suffix == ".mp4":  # cut before its index: refused as the local file is (was: "not a readable video (... '5')")
        with pytest.raises(BadInputError) as here, open_clip(src):
            pass
        with pytest.raises(BadInputError) as there:
            remote(src)
        assert str(there.value) == str(here.value).replace(repr(str(src)), "in.mp4")
        assert "the file is damaged or cut short" in str(there.value)
        return
    with open_clip(src) as clip:
        local, said_here = read(clip)
    served, said = read(remote(src)[1])
    assert len(said) == len(said_here) == 1 and said[0] == said_here[0].replace(str(src), f"cloud:in{suffix}"), (said, said_here)
    assert "before the 0.80 s its header states (cut short?)" in said[0]
    assert len(served) == len(local)


@pytest.mark.parametrize("stated, message", [
    ({"container": "avi"}, "container"), ({"container": "mov", "frames": -1}, "frames"),
    ({"container": "matroska", "duration": "soon"}, "duration"), ([], "container")])
def test_a_probes_stated_end_is_checked(clips, tmp_path, stated, message):
    from eden_serve.errors import CodecError
    video = SourceVideo(clips["ffv1"], 10**7)
    probe = {**json.loads(json.dumps(video.probe())), "stated": stated}
    with pytest.raises(CodecError, match=f"the cloud's probe: stated .*{message}"):
        RemoteVideo("ffv1.mkv", probe, lambda stream, start, after: pack(video.page(stream, start, after and (after.pts, after.dts, len(after.data)))))


class Failing:
    """A source's container whose demuxer fails after ``good`` packets, as FFmpeg's does on a file
    it cannot read further (the rest as PyAV's own)."""

    def __init__(self, inner, good):
        self.inner, self.good = inner, good

    def demux(self, *args, **kwargs):
        for index, packet in enumerate(self.inner.demux(*args, **kwargs)):
            if index == self.good:
                raise av.error.InvalidDataError(1094995529, "Invalid data found when processing input")
            yield packet

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.inner.close()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_cloud_sources_demuxer_that_fails_ends_the_stream_there_said_against_its_stated_end(clips, tmp_path, monkeypatch):
    # Before, the cloud's scan refused the file ("cannot read the video's packets (... Invalid data ...)").
    from eden_serve.cloud import sources

    src = remux(clips["ffv1"], tmp_path / "in.mkv")
    opened = sources.SourceFile.open
    monkeypatch.setattr(sources.SourceFile, "open", lambda self: Failing(opened(self), 12))
    video, source = remote(src)
    served, said = read(source)
    assert video.scan.frames == len(served) == 12
    assert len(said) == 1 and "its packets end at 0.44 s, before the 0.80 s its header states (cut short?)" in said[0], said


def test_a_concealed_gop_reads_the_same_on_the_cloud_and_locally_whatever_the_threads(tmp_path):
    # Before, the frames from a concealed H.264 P-frame to the next key frame were those of the
    # decoder's threads: one picture on 1 or 2, another on 3 or more (the cloud's range and the
    # client's pages on this machine's count, a local run on another's).
    from eden_serve.media.video import VideoClip

    clean = make_clip(tmp_path / "clean.mkv", "libx264", {"g": "10", "bframes": "0"}, (96, 128), COUNT, synthetic=True)
    src = damaged(clean, tmp_path / "in.mkv", 5)
    local = {}
    for threads in (1, 3, 8):
        clip = VideoClip(src)
        clip.stream.thread_count = threads
        try:
            local[threads], _ = read(clip)
        finally:
            clip.close()
    video, source = remote(src)
    served, _ = read(source)
    CURSORS.clear()
    ranges = video.read(0, 4) + video.read(4, 6) + video.read(10, COUNT - 10)
    CURSORS.clear()
    seeked = video.read(6, 3)  # from a seek to the key frame at 0, a new cursor
    CURSORS.clear()
    assert len(served) == COUNT
    for frames in (*local.values(), served):
        assert [np.asarray(image).tobytes() for _, image, _ in frames] == [p.tobytes() for p in ranges]
    assert [p.tobytes() for p in seeked] == [p.tobytes() for p in ranges[6:9]]
