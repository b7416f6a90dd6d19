"""Video output keeps the input's timing, audio and subtitles: clips generated here with PyAV."""

from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from eden_serve.errors import BadInputError
from eden_serve.streaming import interpolate_clip, pairwise

av = pytest.importorskip("av")

WIDTH, HEIGHT = 64, 48
SAMPLE_RATE = 48000


def average(index, frame0, frame1, seed):
    """A stand-in model: the mean of the two frames."""
    mean = (np.asarray(frame0.image, np.float32) + np.asarray(frame1.image, np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))


def picture(i):
    ramp = np.linspace(0, 255, WIDTH, dtype=np.float32)[None, :, None]
    return av.VideoFrame.from_ndarray(np.broadcast_to((ramp + 25 * i) % 256, (HEIGHT, WIDTH, 3)).astype(np.uint8),
                                      format="rgb24")


def make_video(path, times, time_base, *, video="libx264", audio="aac", subtitles=(), subtitle_codec=None, font=None):
    """A clip whose frame k is shown at ``times[k] * time_base`` (the last for as long as the one
    before it), with a 440 Hz sine as long as the video, ``subtitles`` (start_ms, end_ms, text) in
    French, and ``font`` bytes attached."""
    end = times[-1] + (times[-1] - times[-2])
    with av.open(str(path), "w") as container:
        stream = container.add_stream(video, rate=round(1 / (time_base * (end - times[0]) / len(times))))
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.codec_context.time_base = time_base
        if video == "libx264":
            stream.options = {"crf": "10", "bframes": "0"}
        sound = container.add_stream(audio, rate=SAMPLE_RATE) if audio else None
        text = container.add_mux_stream(subtitle_codec) if subtitle_codec else None
        if text is not None:
            text.time_base = Fraction(1, 1000)
            text.metadata["language"] = "fra"
        if font is not None:
            container.add_attachment("subtitles.ttf", "font/ttf", font)
        durations = {pts: following - pts for pts, following in zip(times, [*times[1:], end])}

        def mux(packets):  # with durations: the encoder leaves them out, and the last one matters
            for packet in packets:
                packet.duration = durations[packet.pts]
                container.mux(packet)

        for i, pts in enumerate(times):
            frame = picture(i)
            frame.pts, frame.time_base = pts, time_base
            mux(stream.encode(frame))
        mux(stream.encode(None))
        if sound is not None:
            samples = round(SAMPLE_RATE * (end - times[0]) * time_base)
            wave = (0.3 * np.sin(2 * np.pi * 440 * np.arange(samples) / SAMPLE_RATE)).astype(np.float32)
            for start in range(0, samples, 1024):
                chunk = av.AudioFrame.from_ndarray(wave[None, start:start + 1024], format="flt", layout="mono")
                chunk.sample_rate, chunk.pts = SAMPLE_RATE, start
                chunk.time_base = Fraction(1, SAMPLE_RATE)
                container.mux(sound.encode(chunk))
            container.mux(sound.encode(None))
        for start, stop, words in subtitles:
            data = words.encode()
            if subtitle_codec == "mov_text":  # a 16-bit length, then the text
                data = len(data).to_bytes(2, "big") + data
            packet = av.Packet(data)
            packet.pts = packet.dts = start
            packet.duration, packet.time_base, packet.stream = stop - start, Fraction(1, 1000), text
            container.mux(packet)
    return path


def packets(path, kind):
    """(time in seconds, duration in seconds, bytes) of every packet of the first ``kind`` stream."""
    with av.open(str(path)) as container:
        stream = getattr(container.streams, kind)[0]
        return [(p.pts * p.time_base, p.duration * p.time_base, bytes(p))
                for p in container.demux(stream) if p.size]


def cues(path):
    """The subtitle packets that hold text (an MP4 muxer fills gaps with empty ones of its own)."""
    return [packet for packet in packets(path, "subtitles") if packet[2].strip(b"\0")]


def frame_times(path):
    with av.open(str(path)) as container:
        return [frame.pts * frame.time_base for frame in container.decode(video=0)]


def audio_end(path):
    return max(time + duration for time, duration, _ in packets(path, "audio"))


def video_end(path):
    """When the last frame stops showing (packet durations in decode order say nothing of that)."""
    with av.open(str(path)) as container:
        *_, last = container.decode(video=0)
        return (last.pts + last.duration) * last.time_base


CFR_12 = [1024 * k for k in range(12)], Fraction(1, 12288)  # 12 fps, as an MP4 muxer times it


@pytest.mark.parametrize("suffix", [".mp4", ".mov", ".mkv"])
def test_audio_is_copied_packet_for_packet_and_ends_with_the_video(tmp_path, suffix):
    src = make_video(tmp_path / f"in{suffix}", *CFR_12)
    dst = tmp_path / f"out{suffix}"
    summary = interpolate_clip(src, dst, pairwise(average), progress=False)
    assert summary.frames == 23
    assert packets(dst, "audio") == packets(src, "audio")  # bytes and times: copied, not re-encoded
    with av.open(str(src)) as a, av.open(str(dst)) as b:
        sa, sb = a.streams.audio[0], b.streams.audio[0]
        assert (sb.codec_context.name, sb.sample_rate, sb.layout.name, sb.codec_context.extradata) == \
               (sa.codec_context.name, sa.sample_rate, sa.layout.name, sa.codec_context.extradata)
        frame = 1 / (2 * Fraction(a.streams.video[0].average_rate))
    assert abs(audio_end(dst) - video_end(dst)) <= frame
    times = frame_times(dst)
    assert times[::2] == frame_times(src)  # the originals keep their time: in sync with the audio


@pytest.mark.parametrize("suffix, codec", [(".mp4", "mov_text"), (".mkv", "subrip"), (".mkv", "ass")])
def test_subtitles_are_copied_where_the_container_holds_them(tmp_path, suffix, codec):
    lines = [(200, 500, "hello"), (600, 900, "world")]
    if codec == "ass":
        lines = [(200, 500, "0,0,Default,,0,0,0,,hello"), (600, 900, "1,0,Default,,0,0,0,,world")]
    font = bytes(range(256)) if suffix == ".mkv" else None  # only Matroska holds attachments
    src = make_video(tmp_path / f"in{suffix}", *CFR_12, subtitles=lines, subtitle_codec=codec, font=font)
    dst = tmp_path / f"out{suffix}"
    interpolate_clip(src, dst, pairwise(average), progress=False)
    copied = cues(dst)
    assert copied == cues(src) and len(copied) == 2
    with av.open(str(dst)) as container:
        assert container.streams.subtitles[0].metadata["language"] == "fra"
        assert [s.data for s in container.streams if s.type == "attachment"] == ([font] if font else [])
    assert packets(dst, "audio") == packets(src, "audio")


def test_subtitles_the_container_cannot_hold_are_left_out_with_a_warning(tmp_path):
    src = make_video(tmp_path / "in.mkv", *CFR_12, subtitles=[(200, 500, "hello")], subtitle_codec="subrip")
    dst = tmp_path / "out.mp4"
    with pytest.warns(UserWarning, match="cannot hold the input's srt subtitle .*left out"):
        interpolate_clip(src, dst, pairwise(average), progress=False)
    with av.open(str(dst)) as container:
        assert [s.type for s in container.streams] == ["video", "audio"]
    assert [data for _, _, data in packets(dst, "audio")] == [data for _, _, data in packets(src, "audio")]


def test_audio_the_container_cannot_hold_is_refused_before_any_work(tmp_path):
    src = make_video(tmp_path / "in.mkv", *CFR_12, video="libvpx-vp9")
    calls = []

    def counting(*args):
        calls.append(args[0])
        return average(*args)

    with pytest.raises(BadInputError, match="cannot hold the input's aac audio") as info:
        interpolate_clip(src, tmp_path / "out.webm", pairwise(counting), progress=False)
    assert "\n" not in str(info.value) and calls == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mkv"]


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_variable_frame_rate_keeps_each_time_and_puts_middles_halfway(tmp_path, suffix):
    times = [0, 40, 80, 200, 240, 250, 290, 500, 540, 580]  # milliseconds: gaps of 10 to 210 ms
    src = make_video(tmp_path / f"in{suffix}", times, Fraction(1, 1000))
    dst = tmp_path / f"out{suffix}"
    interpolate_clip(src, dst, pairwise(average), progress=False)
    seconds = [Fraction(t, 1000) for t in times]
    expected = [t for pair in zip(seconds, seconds[1:]) for t in (pair[0], sum(pair) / 2)] + seconds[-1:]
    got = frame_times(dst)
    assert len(got) == len(expected)
    with av.open(str(dst)) as container:
        tick = container.streams.video[0].time_base  # a midpoint rounds to the container's time base
    assert all(abs(g - e) <= tick / 2 for g, e in zip(got, expected)), (got, expected)
    assert got[::2] == frame_times(src)
    assert abs(audio_end(dst) - video_end(dst)) <= Fraction(20, 1000)  # half the last 40 ms gap


def test_frames_not_timed_in_order_are_refused(tmp_path):
    encoded = tmp_path / "encoded.mkv"
    make_video(encoded, list(range(6)), Fraction(1, 12), audio=None)
    src = tmp_path / "in.mkv"
    with av.open(str(encoded)) as a, av.open(str(src), "w") as b:
        stream = b.add_stream_from_template(a.streams.video[0])
        for i, packet in enumerate(p for p in a.demux(video=0) if p.size):
            packet.pts = packet.dts = [0, 1, 2, 2, 3, 4][i]  # frames 2 and 3 at the same time
            packet.stream = stream
            b.mux(packet)
    with pytest.raises(BadInputError, match="frame 3 is not timed after frame 2") as info:
        interpolate_clip(src, tmp_path / "out.mkv", pairwise(average), progress=False)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoded.mkv", "in.mkv"]
