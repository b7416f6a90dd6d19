"""A middle's subsampled chroma sits where the output states its chroma sits (media/siting.py,
docs/video.md "Depth and colour"): a middle of grey with one red luma column at x = 11, written into
lossless outputs, decoded back. Sited left (H.264's and HEVC's default, stated by an H.264 input),
chroma columns 5 and 6 (at x = 10 and 12) take it alike; sited centre (columns 2k and 2k + 1
averaged, chroma k at x = 2k + ½), chroma column 5 alone. Before, every output got centred chroma.
Alike for the planes the edge makes (edge/yuv.py), within a level of the host's conversion."""

from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image
from test_video import real_video

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.edge.yuv import to_planes
from eden_serve.media import Encoding
from eden_serve.media.chroma import CENTER, LEFT, TOP_LEFT, chroma_location
from eden_serve.media.planes import PlaneFormat, Planes, plane_format, swscale_planes

av = pytest.importorskip("av")

WIDTH, HEIGHT, COLUMN = 64, 32, 11


def striped() -> np.ndarray:
    pixels = np.full((HEIGHT, WIDTH, 3), 128, np.uint8)
    pixels[:, COLUMN] = (255, 0, 0)
    return pixels


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """An H.264 clip (x264 states no chroma location: left, the standard's default)."""
    return real_video(tmp_path_factory.mktemp("siting") / "in.mp4", 4, Fraction(25), size=(WIDTH, HEIGHT), audio=None)


def red_chroma(path) -> list[np.ndarray]:
    """Each middle's V samples along its middle chroma row, less the grey's (its last column's)."""
    rows = []
    with av.open(str(path)) as container:
        for k, frame in enumerate(container.decode(video=0)):
            if k % 2:
                plane = frame.planes[2]
                dtype = np.uint16 if frame.format.name.endswith("le") else np.uint8
                samples = np.frombuffer(plane, dtype).reshape(plane.height, -1)[:, :plane.width].astype(np.int64)
                row = samples[plane.height // 2]
                rows.append(row - row[-1])
    return rows


# (output, encoder, its options, pixel format, where the middles' chroma must sit)
OUTPUTS = [
    ("out.mp4", "libx264", (("crf", "0"),), "yuv420p", LEFT),  # stated left (none in the VUI: its default)
    ("out.mkv", "ffv1", (), "yuv420p", LEFT),  # the input's left, stated as Matroska's ChromaSiting
    ("out.mkv", "ffv1", (("chroma_sample_location", "center"),), "yuv420p", CENTER),
    ("out.mkv", "ffv1", (), "yuv420p10le", LEFT),
    ("out.mkv", "ffv1", (), "yuv422p", LEFT),
    ("out.y4m", "rawvideo", (), "yuv420p", LEFT),  # C420mpeg2
]


@pytest.mark.parametrize("name, vcodec, options, pix_fmt, siting", OUTPUTS,
                         ids=["h264", "ffv1-left", "ffv1-centre", "ffv1-10bit", "ffv1-422", "y4m"])
def test_a_middles_chroma_sits_where_the_output_says(tmp_path, clip, name, vcodec, options, pix_fmt, siting):
    interpolate_clip(clip, tmp_path / name, pairwise(lambda *_: Image.fromarray(striped())), progress=False,
                     encoding=Encoding(vcodec=vcodec, pix_fmt=pix_fmt, options=options))
    rows = red_chroma(tmp_path / name)
    assert len(rows) == 3
    if vcodec == "libx264":  # the output states it: none in its SPS, the standard's default
        with av.open(str(tmp_path / name)) as container:
            assert chroma_location("h264", container.streams.video[0].codec_context.extradata) == LEFT
    for row in rows:
        assert row[5] > 0 and row[4] == 0 and row[7] == 0
        if siting == LEFT:  # x = 11 lies halfway between the samples at x = 10 and 12
            assert abs(row[5] - row[6]) <= 1
        else:  # wholly within the sample at x = 10½
            assert row[6] == 0


@pytest.mark.parametrize("name, options, siting", [("out.mp4", (("crf", "0"),), LEFT),
                                                   ("out.mkv", (("crf", "0"), ("chroma_sample_location", "center")), CENTER)])
def test_planes_made_on_the_edge_sit_alike(tmp_path, clip, name, options, siting):
    """The edge's planes (edge/yuv.py) for the writer's format, which states the siting: the writer
    takes only planes of its own format, and they decode as the host's conversion does, within a level."""
    format = plane_format("yuv420p", WIDTH, HEIGHT, 2, False, siting)
    assert format.left == (siting == LEFT)

    def middle(*_):
        return Planes(to_planes(torch.from_numpy(striped())[None], format)[0], WIDTH, HEIGHT, format)

    interpolate_clip(clip, tmp_path / name, pairwise(middle), progress=False, encoding=Encoding(vcodec="libx264", options=options))
    host = swscale_planes(striped(), format).reshape(HEIGHT * 3 // 2, WIDTH)
    for row in red_chroma(tmp_path / name):
        assert row[5] > 0 and (abs(row[5] - row[6]) <= 1 if siting == LEFT else row[6] == 0)
    with av.open(str(tmp_path / name)) as container:
        middles = [f.to_ndarray(format="yuv420p").astype(int) for k, f in enumerate(container.decode(video=0)) if k % 2]
    assert all(np.abs(m - host).max() <= 1 for m in middles)


@pytest.mark.parametrize("pix_fmt, matrix, full", [("yuv420p", 2, False), ("yuv420p", 1, False), ("yuvj420p", 2, True),
                                                   ("yuv420p", 1, True), ("yuv420p10le", 9, False)])
def test_planes_sited_left_within_one_level_of_swscale(pix_fmt, matrix, full):
    pixels = np.random.default_rng(3).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    format = plane_format(pix_fmt, 96, 64, matrix, full, LEFT)
    made = Planes(to_planes(torch.from_numpy(pixels)[None], format)[0], 96, 64, format).array().reshape(-1)
    difference = np.abs(made.astype(np.int64) - swscale_planes(pixels, format).astype(np.int64)) if format.depth == 8 else None
    if difference is None:  # swscale_planes gives 8-bit answers' planes; 10 bits through the writer's conversion
        from eden_serve.media.siting import Subsampler
        host = Subsampler(pix_fmt, matrix, 0, LEFT)(av.VideoFrame.from_ndarray(pixels, format="rgb24"))
        difference = np.abs(made.astype(np.int64) - host.to_ndarray(format=pix_fmt).reshape(-1).astype(np.int64))
    assert difference.max() <= 1 and (difference > 0).mean() < 0.25


def test_where_readers_take_the_chroma():
    from eden_serve.media.siting import output_siting, stated

    assert output_siting("mp4", "h264", "yuv420p", 0) == LEFT  # none stated: the standard's default
    assert output_siting("mp4", "h264", "yuv420p", TOP_LEFT) == TOP_LEFT
    assert output_siting("matroska", "ffv1", "yuv420p", CENTER) == CENTER
    assert output_siting("mp4", "mpeg4", "yuv420p", CENTER) == LEFT  # nowhere to state it: a reader takes its standard's
    assert output_siting("avi", "mjpeg", "yuvj420p", 0) == CENTER
    assert output_siting("yuv4mpegpipe", "rawvideo", "yuv420p", 0) == CENTER  # C420jpeg
    assert output_siting("yuv4mpegpipe", "rawvideo", "yuv420p", LEFT) == LEFT  # C420mpeg2
    assert output_siting("mp4", "h264", "yuv444p", LEFT) == 0 and output_siting("gif", "gif", "rgb24", 0) == 0
    assert plane_format("yuv420p", 96, 64, 2, False, TOP_LEFT) is None  # the writer sites it on the host
    assert plane_format("yuv420p", 96, 64) == PlaneFormat("yuv420p")
    assert stated({"chroma_sample_location": "left"}) == stated({"chroma_sample_location": "1"}) == LEFT
    assert stated({}) == 0


@pytest.mark.parametrize("location, columns", [(LEFT, (5, 6)), (CENTER, (5,))])
def test_deep_middles_are_sited_alike(location, columns):
    """A middle of 16-bit RGB (a deep input's) into a 10-bit output: the same siting."""
    from eden_serve.media.siting import Subsampler

    pixels = np.full((HEIGHT, WIDTH, 3), 32768, np.uint16)
    pixels[:, COLUMN] = (65535, 0, 0)
    frame = Subsampler("yuv420p10le", 1, 0, location)(av.VideoFrame.from_ndarray(pixels, format="rgb48le"))
    plane = frame.planes[2]
    row = np.frombuffer(plane, np.uint16).reshape(plane.height, -1)[plane.height // 2, :plane.width].astype(np.int64)
    row -= row[-1]
    assert [k for k in range(len(row)) if row[k]] == list(columns) and abs(row[5] - row[columns[-1]]) <= 1


def test_the_host_planes_of_frames_of_several_sizes_and_threads_are_each_their_own():
    """The host's planes (a CPU edge's answer) keep a subsampler per thread and format, whose filter
    graph is made once: a frame of another size, the same size again, and threads converting at once
    each get what a fresh conversion of their own frame gives."""
    import threading

    from eden_serve.media.siting import Subsampler
    format = PlaneFormat("yuv420p", left=True)
    rng = np.random.default_rng(5)
    frames = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((32, 64), (48, 16), (32, 64), (6, 10))]

    def fresh(pixels):
        frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
        return Subsampler("yuv420p", 2, 0, LEFT)(frame).to_ndarray(format="yuv420p").reshape(-1)

    expected = [fresh(f) for f in frames]
    assert all(np.array_equal(swscale_planes(f, format), e) for f, e in zip(frames, expected))
    failures = []

    def convert(k):
        for _ in range(20):
            if not np.array_equal(swscale_planes(frames[k], format), expected[k]):
                failures.append(k)

    threads = [threading.Thread(target=convert, args=(k,)) for k in range(len(frames))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
