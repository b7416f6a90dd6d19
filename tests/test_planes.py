"""Middles as the output's 4:2:0 planes, made on the edge's device (eden_serve/edge/yuv.py,
media/planes.py): within one level of the conversion FFmpeg's swscale does for the writer (BT.601
and BT.709, limited and full range, 8 and 10 bits); the same file where the encoder sees the same
planes; a clip in process whose middles come back as planes (half the bytes) within one level of
the RGB path, its originals untouched; RGB kept where the middles go anywhere but the writer."""

from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image
from test_video import average, real_video

from eden_serve.clips import pipeline
from eden_serve.commands.cli import main
from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.edge import EdgeModel
from eden_serve.edge.yuv import to_planes
from eden_serve.media import Encoding
from eden_serve.media.planes import PlaneFormat, Planes, picture_of, plane_format, swscale_planes
from eden_serve.media.video_writer import VideoWriter

av = pytest.importorskip("av")

REAL = np.asarray(Image.open("tests/data/scene_cut/05.png").convert("RGB"))[:270, :480]
NOISE = np.random.default_rng(1).integers(0, 256, (64, 96, 3), dtype=np.uint8)
# (pix_fmt, swscale's name of the matrix, full range, depth)
# (pix_fmt, FFmpeg's matrix, full range): BT.601 untagged, BT.709, BT.2020; limited and full range.
COLOURS = [("yuv420p", 2, False), ("yuv420p", 1, False), ("yuv420p", 9, False), ("yuvj420p", 2, True), ("yuv420p", 1, True),
           ("yuv420p10le", 2, False), ("yuv420p10le", 1, False), ("yuv420p10le", 9, False)]


def swscale(pixels: np.ndarray, pix_fmt: str, matrix: int = 2, full: bool = False) -> np.ndarray:
    """The writer's own conversion (VideoWriter.convert)."""
    rgb = av.VideoFrame.from_ndarray(pixels, format="rgb48le" if pixels.dtype == np.uint16 else "rgb24")
    frame = rgb.reformat(format=pix_fmt, dst_colorspace=matrix if matrix != 2 else None, dst_color_range=2 if full else None)
    return frame.to_ndarray(format=pix_fmt)


@pytest.mark.parametrize("pix_fmt, matrix, full", COLOURS)
@pytest.mark.parametrize("name", ["real", "noise"])
def test_planes_within_one_level_of_swscale(name, pix_fmt, matrix, full):
    pixels = {"real": REAL, "noise": NOISE}[name]
    height, width, _ = pixels.shape
    format = plane_format(pix_fmt, width, height, matrix, full)
    made = to_planes(torch.from_numpy(pixels.copy())[None], format)
    assert made.dtype == (torch.uint8 if format.depth == 8 else torch.int16) and made.shape == (1, width * height * 3 // 2)
    got = Planes(made[0], width, height, format).array()
    difference = np.abs(got.astype(np.int32) - swscale(pixels, pix_fmt, matrix, full).astype(np.int32))
    assert difference.max() <= 1
    assert (difference > 0).mean() < 0.25  # most samples equal (measured: 1-3% limited range, about 20% full)


def test_which_outputs_take_planes():
    assert plane_format("yuv420p", 96, 64) == PlaneFormat("yuv420p")
    assert plane_format("yuv420p", 96, 64, 1) == PlaneFormat("yuv420p", "bt709")
    assert plane_format("yuv420p10le", 96, 64, 9) == PlaneFormat("yuv420p10le", "bt2020", depth=10)
    assert plane_format("yuvj420p", 96, 64, 2, True).full
    assert plane_format("yuv420p", 95, 64) is None and plane_format("yuv420p", 96, 63) is None
    assert plane_format("yuv444p", 96, 64) is None and plane_format("rgb24", 96, 64) is None
    assert plane_format("yuv420p", 96, 64, 7) is None  # SMPTE 240M: the writer converts RGB itself


@pytest.mark.parametrize("height", [2, 6, 64, 66])
def test_a_picture_of_planes_holds_them_at_every_even_height(height):
    """PyAV made a 4:2:0 picture on an array's memory 2 rows short where the height is 2 mod 4, its
    chroma read from the wrong samples: a middle of 96x66 came out in other colours."""
    pixels = np.random.default_rng(height).integers(0, 256, (height, 96, 3), dtype=np.uint8)
    planes = swscale(pixels, "yuv420p")
    picture = picture_of(planes, "yuv420p")
    assert (picture.width, picture.height) == (96, height)
    assert np.array_equal(picture.to_ndarray(format="yuv420p"), planes)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return real_video(tmp_path_factory.mktemp("planes") / "in.mp4", 6, Fraction(25), size=(96, 64))


def planes_of_average(index, frame0, frame1, seed):
    """:func:`average`'s middle as the planes swscale makes of it: what the writer's RGB path encodes
    (its chroma sited left, where the H.264 input states it: tests/test_siting.py)."""
    rgb = np.asarray(average(index, frame0, frame1, seed))
    height, width, _ = rgb.shape
    format = PlaneFormat("yuv420p", left=True)
    return Planes(torch.from_numpy(swscale_planes(rgb, format).copy()), width, height, format)


def test_the_encoder_sees_the_same_planes(tmp_path, clip, monkeypatch):
    """Planes that equal swscale's reach the encoder as the RGB path's do: the same samples, in the
    same order and at the same times; so the encoder's output is the same (a lossless one's, decoded)."""
    seen = []
    encode = VideoWriter._encode

    def recorded(self, picture, pts, duration):
        seen[-1].append((pts, duration, picture.format.name, picture.to_ndarray().tobytes()))
        return encode(self, picture, pts, duration)

    monkeypatch.setattr(VideoWriter, "_encode", recorded)
    for name, middle in (("rgb", average), ("planes", planes_of_average)):
        seen.append([])
        interpolate_clip(clip, tmp_path / f"{name}.mkv", pairwise(middle), progress=False, encoding=Encoding(vcodec="ffv1"))
    assert len(seen[0]) == 11 and seen[1] == seen[0]
    assert all(np.array_equal(a, b) for a, b in zip(decoded(tmp_path / "rgb.mkv"), decoded(tmp_path / "planes.mkv")))


def test_planes_reach_the_encoder_on_their_own_memory(tmp_path, clip, monkeypatch):
    """8-bit planes are not copied on the writer's thread: the picture the encoder takes is made on
    the middle's own array (and holds it), where the copy cost 1.5 ms a 1080p middle."""
    made, seen = [], []
    encode = VideoWriter._encode

    def middle(*args):
        planes = planes_of_average(*args)
        made.append(planes)  # kept: no other buffer can take its memory meanwhile
        return planes

    def recorded(self, picture, pts, duration):
        seen.append(picture.planes[0].buffer_ptr)
        return encode(self, picture, pts, duration)

    monkeypatch.setattr(VideoWriter, "_encode", recorded)
    interpolate_clip(clip, tmp_path / "out.mkv", pairwise(middle), progress=False, encoding=Encoding(vcodec="ffv1"))
    assert len(made) == 5 and {planes.data.data_ptr() for planes in made} <= set(seen)


def decoded(path, pix_fmt="yuv420p"):
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format=pix_fmt).astype(np.int32) for frame in container.decode(video=0)]


@pytest.fixture
def copied(monkeypatch):
    """The bytes of each copy back from the edge's device."""
    sizes = []
    real = EdgeModel.to_host

    def to_host(self, tensor):
        sizes.append(tensor.numel() * tensor.element_size())
        return real(self, tensor)

    monkeypatch.setattr(EdgeModel, "to_host", to_host)
    return sizes


@pytest.mark.parametrize("pix_fmt", ["yuv420p", "yuv420p10le"])
def test_a_clip_with_planes_is_within_one_level_of_rgb(tmp_path, clip, copied, pix_fmt):
    """The tiny model in process, lossless output (FFV1): originals the same, middles within one
    level, each chunk's copy back half the bytes of 8-bit RGB (10-bit samples take two bytes each: as many)."""
    outputs = {}
    for way in ("rgb", "planes"):
        copied.clear()
        outputs[way] = tmp_path / f"{way}.mkv"
        assert main(["interpolate", str(clip), "-o", str(outputs[way]), "--config", "tiny", "--vcodec", "ffv1",
                     "--pix-fmt", pix_fmt, "--middles-as", way, "--chunk", "5"]) == 0
        assert copied == [5 * 64 * 96 * (3 if way == "rgb" else 1.5 * (1 if pix_fmt == "yuv420p" else 2))]
    rgb, planes = decoded(outputs["rgb"], pix_fmt), decoded(outputs["planes"], pix_fmt)
    assert len(rgb) == len(planes) == 11
    assert all(np.array_equal(a, b) for a, b in zip(rgb[0::2], planes[0::2]))  # the originals
    assert max(np.abs(a - b).max() for a, b in zip(rgb[1::2], planes[1::2])) <= 1


@pytest.mark.parametrize("extra", [["--factor", "4"], ["--resume"], ["--pix-fmt", "yuv444p"]], ids=["factor4", "resume", "yuv444p"])
def test_rgb_where_the_middles_go_elsewhere(tmp_path, clip, copied, extra):
    """A 4x run's first middles are frames of its second pass; a resumed run keeps middles; a
    format the edge cannot make: RGB comes back."""
    assert main(["interpolate", str(clip), "-o", str(tmp_path / "out.mkv"), "--config", "tiny", "--vcodec", "ffv1",
                 "--middles-as", "planes", "--chunk", "5", *extra]) == 0
    assert copied and all(size % (64 * 96 * 3) == 0 for size in copied)


def test_auto_gives_planes_on_a_gpu_only(tmp_path, clip, copied):
    assert pipeline.InProcess(lambda *a: None, "auto", torch.device("cuda")).converts
    assert not pipeline.InProcess(lambda *a: None, "auto", torch.device("cpu")).converts
    assert not pipeline.InProcess(lambda *a: None, "rgb", torch.device("cuda")).converts
    main(["interpolate", str(clip), "-o", str(tmp_path / "out.mp4"), "--config", "tiny", "--chunk", "5"])
    assert copied == [5 * 64 * 96 * 3]
