"""eden_serve/media/output_alpha.py: a video output's originals carry their input's own alpha, bit
for bit, in every lossless output with alpha at the input's depth (swscale's conversion of RGBA to
YUVA moved about half of the 8-bit samples by one level, so a lossless output did not give back
its input's alpha)."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.media.encoding import Encoding
from eden_serve.media.frames import to_pixels

av = pytest.importorskip("av")

SIZE = (32, 64)  # height, width
COUNT = 3


def blend(index, frame0, frame1, seed):
    return to_pixels((frame0.tensor + frame1.tensor) / 2, frame0.depth)


def rgba_of(k: int, deep: bool) -> np.ndarray:
    """Frame ``k``'s RGBA pixels: noise, alpha included, so that every level of it is met."""
    top = 65536 if deep else 256
    return np.random.default_rng(k).integers(0, top, (*SIZE, 4)).astype(np.uint16 if deep else np.uint8)


def make_input(path, codec: str, pix_fmt: str, deep: bool = False):
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=25)
        stream.height, stream.width = SIZE
        stream.pix_fmt = pix_fmt
        for k in range(COUNT):
            frame = av.VideoFrame.from_ndarray(rgba_of(k, deep), format="rgba64le" if deep else "rgba").reformat(format=pix_fmt)
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def alpha_samples(frame) -> np.ndarray:
    """A decoded picture's alpha as stored, [H, W]: its own plane read as it is, or a packed RGB
    format's alpha bytes (rgba, argb: unpacking them moves no sample), never through a conversion to YUV."""
    format = frame.format
    alpha = next(c for c in format.components if c.is_alpha)
    if format.is_rgb and sum(c.plane == alpha.plane for c in format.components) > 1:
        return frame.to_ndarray(format="rgba64le" if alpha.bits > 8 else "rgba")[..., 3]
    plane = frame.planes[alpha.plane]
    dtype = np.dtype(">u2" if format.name.endswith("be") else "<u2") if alpha.bits > 8 else np.uint8
    return np.frombuffer(plane, dtype).reshape(plane.height, -1)[:, :plane.width].astype(np.uint16)


def decoded_alphas(path) -> tuple[str, list[np.ndarray]]:
    """The video's pixel format and each frame's alpha samples; VP9 decoded by libvpx, which reads its alpha."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.codec_context.name == "vp9":
            context = av.CodecContext.create("libvpx-vp9", "r")
            frames = [f for packet in container.demux(stream) if packet.size for f in context.decode(packet)]
            frames += list(context.decode(None))
        else:
            frames = list(container.decode(stream))
        return frames[0].format.name, [alpha_samples(f) for f in frames]


@pytest.mark.parametrize("source, out, encoding, written", [
    (("png", "rgba"), "out.mkv", {"vcodec": "ffv1"}, "yuva420p"),
    (("png", "rgba"), "out.mkv", {"vcodec": "ffv1", "pix_fmt": "yuva444p"}, "yuva444p"),
    (("png", "rgba"), "out.webm", {"options": {"lossless": "1"}}, "yuva420p"),
    (("png", "rgba"), "out.mov", {"vcodec": "qtrle"}, "argb"),
    (("png", "rgba"), "out.apng", {}, "rgba"),
    (("qtrle", "argb"), "out.mkv", {"vcodec": "ffv1"}, "yuva420p"),
    (("ffv1", "yuva444p"), "out.mkv", {"vcodec": "ffv1", "pix_fmt": "yuva420p"}, "yuva420p"),
    (("png", "rgba64be"), "out.mkv", {"vcodec": "ffv1"}, None),
])
def test_an_originals_alpha_is_its_inputs_own_in_a_lossless_output(tmp_path, source, out, encoding, written):
    codec, pix_fmt = source
    vcodec = encoding.get("vcodec", "libvpx-vp9" if out.endswith(".webm") else None)
    if codec not in av.codecs_available or (vcodec and vcodec not in av.codecs_available):
        pytest.skip("this PyAV lacks an encoder the test needs")
    src = make_input(tmp_path / ("in.mov" if codec != "ffv1" else "in.mkv"), codec, pix_fmt, deep=pix_fmt.startswith("rgba64"))
    interpolate_clip(src, tmp_path / out, pairwise(blend), progress=False, encoding=Encoding(**encoding))
    _, given = decoded_alphas(src)
    got_format, got = decoded_alphas(tmp_path / out)
    assert written is None or got_format == written
    assert len(got) == 2 * COUNT - 1
    moved = [int((got[2 * k] != given[k]).sum()) for k in range(COUNT)]
    assert moved == [0] * COUNT, f"{got_format}: samples of each original's alpha moved: {moved}"
    # A middle's alpha is its neighbours', blended halfway (rounded), as before.
    for k in range(1, 2 * COUNT - 1, 2):
        want = np.round((got[k - 1].astype(np.float64) + got[k + 1]) / 2)
        assert np.array_equal(got[k], want), k


PALETTE_ALPHA = (0, 255, 255, 128)  # index 0 transparent, 3 half; the rest of the 256 opaque


def make_paletted(path, transparent: bool = True):
    """PNG in MOV of ``pal8`` frames (as FFmpeg decodes a PNG with a palette), whose palette's alpha
    is PALETTE_ALPHA where ``transparent`` (PNG's tRNS), else opaque."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("png", rate=25)
        stream.height, stream.width = SIZE
        stream.pix_fmt = "pal8"
        for k in range(COUNT):
            frame = av.VideoFrame(SIZE[1], SIZE[0], "pal8")
            indices = np.zeros((SIZE[0], frame.planes[0].line_size), np.uint8)
            indices[:, 10 * k:10 * k + 30] = 1 + k
            frame.planes[0].update(indices.tobytes())
            palette = np.full((256, 4), 255, np.uint8)  # B, G, R, A: FFmpeg's 32-bit ARGB, little-endian
            palette[:4, :3] = [[0, 0, 0], [0, 0, 255], [0, 255, 0], [255, 0, 0]]
            palette[:4, 3] = PALETTE_ALPHA if transparent else 255
            frame.planes[1].update(palette.tobytes())
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


@pytest.mark.parametrize("out, encoding, written", [
    ("out.apng", {}, "rgba"), ("out.mkv", {"vcodec": "ffv1"}, "yuva420p"), ("out.mov", {"vcodec": "qtrle"}, "argb"),
    ("out.gif", {}, None),
])
def test_a_palettes_alpha_is_kept(tmp_path, out, encoding, written):
    """FFmpeg lists no alpha of ``pal8``, so a palette's transparency (PNG's tRNS) was dropped
    without a word, and into APNG, which lists pal8, the middles (RGB) could not be encoded at all.
    Now the originals' alpha is their palette's, exactly, in an output with alpha; GIF's pixels are
    transparent or opaque: those under half opaque transparent."""
    src = make_paletted(tmp_path / "in.mov")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        interpolate_clip(src, tmp_path / out, pairwise(blend), progress=False, encoding=Encoding(**encoding))
    assert not [str(w.message) for w in said if "alpha is dropped" in str(w.message)]
    with av.open(str(src)) as container:
        given = [f.to_ndarray(format="rgba")[..., 3] for f in container.decode(video=0)]  # the palette's, by index
    got_format, got = decoded_alphas(tmp_path / out) if written else ("bgra", None)
    if written is None:  # GIF: read as FFmpeg's decoder gives it, bgra
        with av.open(str(tmp_path / out)) as container:
            got = [f.to_ndarray(format="rgba")[..., 3] for f in container.decode(video=0)]
        given = [np.where(a < 128, 0, 255) for a in given]
    assert got_format == (written or "bgra") and len(got) == 2 * COUNT - 1
    assert all(np.array_equal(got[2 * k], given[k]) for k in range(COUNT))


def test_an_opaque_palette_into_apng_is_written(tmp_path):
    """APNG lists pal8, which was chosen for a paletted input: the middles, made of RGB, could not be
    encoded in it ("Operation not permitted"). Now RGB, without alpha."""
    src = make_paletted(tmp_path / "in.mov", transparent=False)
    interpolate_clip(src, tmp_path / "out.apng", pairwise(blend), progress=False, encoding=Encoding())
    with av.open(str(tmp_path / "out.apng")) as container:
        assert container.streams.video[0].codec_context.pix_fmt == "rgb24"
        assert len(list(container.decode(video=0))) == 2 * COUNT - 1
