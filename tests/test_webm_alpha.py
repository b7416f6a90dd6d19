"""eden_serve/media/webm_alpha.py: WebM's VP8 and VP9 alpha, which Matroska carries beside each
frame and FFmpeg's own decoders (PyAV's default) leave out, read with libvpx's decoder and kept:
the originals' alpha as it was, the middles' blended from their neighbours', the track marked so
that a browser shows it; where the output cannot hold it, one warning; never marked without it."""

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
LEVELS = (40, 120, 200)  # each original's even alpha


def blend(index, frame0, frame1, seed):
    """A stand-in model: the mean of the two frames (the model sees their colours alone)."""
    return to_pixels((frame0.tensor + frame1.tensor) / 2, frame0.depth)


def make_webm(path, codec: str, count: int = 3):
    """A WebM whose frames have an even alpha of LEVELS[k], encoded losslessly where the codec can."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=25, options={"lossless": "1"} if codec == "libvpx-vp9" else {"crf": "4", "b": "2M", "auto-alt-ref": "0"})
        stream.height, stream.width = SIZE
        stream.pix_fmt = "yuva420p"
        for k in range(count):
            rgba = np.zeros((*SIZE, 4), np.uint8)
            rgba[..., 0], rgba[..., 1], rgba[..., 3] = 200, 40 * k, LEVELS[k]
            frame = av.VideoFrame.from_ndarray(rgba, format="rgba").reformat(format="yuva420p")
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def alphas_and_tags(path) -> tuple[list[float], dict[str, str]]:
    """Each frame's mean alpha, decoded by libvpx itself (not through the code under test), and the
    video track's tags."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        decoder = av.codec.CodecContext.create({"vp8": "libvpx", "vp9": "libvpx-vp9"}[stream.codec_context.name], "r")
        means = [float(frame.to_ndarray(format="rgba")[..., 3].mean())
                 for packet in container.demux(stream) if packet.size for frame in decoder.decode(packet)]
        means += [float(frame.to_ndarray(format="rgba")[..., 3].mean()) for frame in decoder.decode(None)]
        return means, {key.lower(): value for key, value in stream.metadata.items()}


def run(src, out, **encoding) -> list[str]:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        interpolate_clip(src, out, pairwise(blend), progress=False, encoding=Encoding(**encoding))
    return [str(w.message) for w in said if "alpha" in str(w.message)]


@pytest.mark.parametrize("codec", ["libvpx-vp9", "libvpx"])
@pytest.mark.parametrize("suffix", [".webm", ".mkv"])
def test_a_webms_alpha_is_read_and_kept_with_its_track_marked(tmp_path, codec, suffix):
    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV has no {codec}")
    src = make_webm(tmp_path / "in.webm", codec)
    assert alphas_and_tags(src)[1].get("alpha_mode") == "1"  # FFmpeg's muxer marks the track itself
    out = tmp_path / f"out{suffix}"
    assert run(src, out, vcodec=codec, **({"options": {"lossless": "1"}} if codec == "libvpx-vp9" else {})) == []
    means, tags = alphas_and_tags(out)
    given = alphas_and_tags(src)[0]  # the originals' alpha as encoded (swscale's RGBA to YUVA moves some by a level)
    want = [given[0], (given[0] + given[1]) / 2, given[1], (given[1] + given[2]) / 2, given[2]]
    assert len(means) == len(want) and tags.get("alpha_mode") == "1"
    tolerance = 0.6 if codec == "libvpx-vp9" else 3  # lossless VP9 (the blend rounded); VP8 at a high quality
    assert all(abs(got - w) <= tolerance for got, w in zip(means, want)), means


def test_alpha_an_output_cannot_hold_is_said_and_its_track_not_marked(tmp_path):
    if "libvpx-vp9" not in av.codecs_available:
        pytest.skip("this PyAV has no libvpx-vp9")
    src = make_webm(tmp_path / "in.webm", "libvpx-vp9")
    # VP9 in MP4: the encoder takes yuva420p, but only Matroska carries the alpha beside each frame.
    said = run(src, tmp_path / "out.mp4")
    assert len(said) == 1 and "alpha is dropped" in said[0] and "Matroska" in said[0]
    # An opaque format asked for: said, and the input's AlphaMode tag not copied onto an opaque track.
    out = tmp_path / "opaque.webm"
    said = run(src, out, pix_fmt="yuv420p")
    assert len(said) == 1 and "holds none" in said[0]
    means, tags = alphas_and_tags(out)
    assert "alpha_mode" not in tags and all(m == 255 for m in means)


def test_auto_leaves_a_webm_with_alpha_to_the_host_and_a_named_gpu_decoder_says_it_drops_it(tmp_path, monkeypatch):
    """Beside a GPU, ``--decoder auto`` would time NVDEC against the host on the first frames; NVDEC
    reads VP9's colour alone, so a stream with alpha goes to the host untried; NVDEC asked for by
    name reads it, and the one line says the alpha is left out (stand-ins: test_decoders.StandIn)."""
    import torch
    from test_decoders import StandIn

    from eden_serve.clips import pipeline
    from eden_serve.media import decoders
    from eden_serve.media.decoders import Decoder

    if "libvpx-vp9" not in av.codecs_available:
        pytest.skip("this PyAV has no libvpx-vp9")
    src = make_webm(tmp_path / "in.webm", "libvpx-vp9")
    monkeypatch.setattr(decoders, "candidates", lambda device: [Decoder(), StandIn(False)])
    tried = []
    monkeypatch.setattr(decoders, "choose", lambda *args, **kwargs: tried.append(args) or [Decoder()])
    assert pipeline.decoded_by(src, "auto", torch.device("cpu"), pipeline.ClipOptions()) == src and tried == []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        opened = pipeline.decoded_by(src, "nvdec", torch.device("cpu"), pipeline.ClipOptions())
    opened.close()
    assert opened.alpha is None and any("--decoder nvdec reads its colour alone" in str(w.message) for w in said)


def make_lossless(path, codec: str, pix_fmt: str, count: int = 3):
    """An FFV1 or Ut Video of frames with an even alpha of LEVELS[k], in ``pix_fmt``."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=25)
        stream.height, stream.width = SIZE
        stream.pix_fmt = pix_fmt
        for k in range(count):
            rgba = np.zeros((*SIZE, 4), np.uint8)
            rgba[..., 0], rgba[..., 3] = 200, LEVELS[k]
            frame = av.VideoFrame.from_ndarray(rgba, format="rgba").reformat(format=pix_fmt)
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


@pytest.mark.parametrize("codec, pix_fmt", [("ffv1", "yuva444p"), ("ffv1", "yuva422p"), ("utvideo", "gbrap")])
def test_a_format_with_alpha_that_libvpx_lists_but_refuses_is_written_in_the_nearest_it_opens(tmp_path, codec, pix_fmt):
    """libvpx-vp9 lists yuva444p, yuva422p and gbrap, and refuses to open with any of them: ProRes
    4444's or FFV1's alpha into WebM was refused in one line. Now in yuva420p, said."""
    if not {codec, "libvpx-vp9"} <= set(av.codecs_available):
        pytest.skip("this PyAV lacks an encoder the test needs")
    src = make_lossless(tmp_path / ("in.mkv" if codec == "ffv1" else "in.avi"), codec, pix_fmt)
    out = tmp_path / "out.webm"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        interpolate_clip(src, out, pairwise(blend), progress=False, encoding=Encoding(options={"lossless": "1"}))
    said = [str(w.message) for w in said]
    assert any(f"lists {pix_fmt} but does not open with it" in s and "yuva420p" in s for s in said), said
    means, tags = alphas_and_tags(out)
    want = [LEVELS[0], sum(LEVELS[:2]) / 2, LEVELS[1], sum(LEVELS[1:]) / 2, LEVELS[2]]
    assert tags.get("alpha_mode") == "1" and all(abs(m - w) <= 1 for m, w in zip(means, want)), means
