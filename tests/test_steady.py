"""The steady decoder (eden_serve/media/steady.py) on undamaged video: the frames of the stream's own
decoder on frame threads, bit for bit and in order, and no picture decoded again."""

import hashlib

import pytest

from eden_serve.media import steady
from harness.videos import make_clip

av = pytest.importorskip("av")

CLIPS = {
    "h264, B-frames": ("libx264", {"g": "12"}),
    "h264, open GOPs": ("libx264", {"x264-params": "keyint=10:min-keyint=10:open-gop=1:bframes=3:scenecut=0"}),
    "hevc, open GOPs": ("libx265", {"x265-params": "keyint=10:min-keyint=10:open-gop=1:bframes=3:scenecut=0:log-level=error"}),
    "ffv1": ("ffv1", {"g": "8", "slices": "4"}),
    "mpeg2": ("mpeg2video", {"g": "10", "bf": "2"}),
    "vp9": ("libvpx-vp9", {"g": "10"}),
}


def frames(path, wrap) -> list[tuple]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type, stream.thread_count = "AUTO", 3
        decoder = wrap(stream.codec_context)
        got = []
        for packet in container.demux(stream):
            got += [(f.pts, hashlib.blake2b(f.to_ndarray(format="rgb24").tobytes()).hexdigest()) for f in decoder.decode(packet)]
        return got


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_an_undamaged_video_decodes_as_on_frame_threads_alone(tmp_path, name, monkeypatch):
    codec, options = CLIPS[name]
    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV has no {codec}")
    path = make_clip(tmp_path / "clip.mkv", codec, options, (96, 128), 32, synthetic=True)

    def refused(context):
        raise AssertionError("an undamaged video decoded again without threads")

    monkeypatch.setattr(steady, "alone", refused)
    given = frames(path, steady.SteadyDecoder)
    assert len(given) == 32 and given == frames(path, lambda context: context)
