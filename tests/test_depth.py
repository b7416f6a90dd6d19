"""Frames at their depth: a source deeper than 8 bits is read as 16-bit RGB, its middles are made and
written at 16 bits, and every path keeps them so: the clip engine with a linear-blend stand-in for the
model, the bitstream codec's 10-bit HEVC, AV1 and VP9 packets (in the sandbox too), the frames codec,
directories of 16-bit PNG and TIFF frames, Y4M pipes, the tiny model in process, ``--process-size``
(scaled at 16 bits), and the page's tone-mapped previews. Clips are made here with the installed
PyAV's encoders."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from eden_serve import wire
from eden_serve.clips.processors import pairwise
from eden_serve.clips.resize import resized
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.config import PRESETS
from eden_serve.media import sandboxed as sandbox
from eden_serve.media.base import Frame
from eden_serve.media.colour import LIMITED, Colour, tone_mapped
from eden_serve.media.frames import from_pixels, open_deep, to_pixels
from eden_serve.media.packets import PacketReader, decode
from eden_serve.page.media import describe, preview
from eden_serve.clips.pipeline import in_process, interpolate_chunk
from eden_serve.wire.png import png_header, rgb16_png
from harness.videos import gradient, local_frames, make_graded_clip

av = pytest.importorskip("av")


def blend(index, frame0, frame1, seed):
    """A stand-in model: the mean of the two frames, at their depth."""
    return to_pixels((frame0.tensor + frame1.tensor) / 2, frame0.depth)


def colours(path, index: int) -> int:
    """The distinct colours of frame ``index`` of a video, decoded at its own depth."""
    with av.open(str(path)) as container:
        frame = list(container.decode(video=0))[index]
        deep = frame.format.components[0].bits > 8
        pixels = frame.to_ndarray(format="rgb48le" if deep else "rgb24")
    return len(np.unique(pixels.reshape(-1, 3), axis=0))


def test_a_10_bit_ramps_middle_holds_4x_the_distinct_values_of_the_8_bit_path(tmp_path):
    """The same gentle gradient in 10 and in 8 bits, its middles by a linear blend: 8 bits band it."""
    size = (128, 256)
    for bits, pix_fmt in ((10, "yuv444p10le"), (8, "yuv444p")):
        make_graded_clip(tmp_path / f"in{bits}.mkv", "ffv1", pix_fmt, size, 3)
        interpolate_clip(tmp_path / f"in{bits}.mkv", tmp_path / f"out{bits}.mkv", pairwise(blend), progress=False)
    deep, shallow = colours(tmp_path / "out10.mkv", 1), colours(tmp_path / "out8.mkv", 1)
    assert deep >= 4 * shallow, (deep, shallow)


PACKETS = {"hevc.mkv": ("libx265", {"x265-params": "keyint=4:bframes=2:log-level=error"}),
           "av1.mkv": ("libsvtav1", {"g": "4", "preset": "12"}),
           "vp9.webm": ("libvpx-vp9", {"g": "4", "lag-in-frames": "8"})}  # 10-bit 4:2:0: profile 2


@pytest.mark.parametrize("name", list(PACKETS))
def test_10_bit_packets_decode_at_their_depth_here_and_in_the_sandbox(tmp_path, name):
    codec, options = PACKETS[name]
    if codec not in av.codecs_available or "yuv420p10le" not in [f.name for f in av.codec.Codec(codec, "w").video_formats]:
        pytest.skip(f"this PyAV has no {codec} that encodes 10 bits (its libvpx is built for 8), so no clip to decode")
    path = make_graded_clip(tmp_path / name, codec, "yuv420p10le", (64, 96), 10, Colour(9, 16, 9, LIMITED), options)
    reader, expected = PacketReader(path), local_frames(path)
    assert reader.parameters.pix_fmt == "yuv420p10le" and expected[0].dtype == np.uint16
    packets = list(reader)
    box = sandbox.Sandbox()
    try:
        for first in (0, 5):
            span = reader.needed(first, first + 3)
            job = (reader.parameters, packets[span.key : span.end + 1], span.skip, 4)
            here, boxed = decode(*job), box.decode(*job)
            assert here.dtype == boxed.dtype == np.uint16
            assert np.array_equal(here, np.stack(expected[first : first + 4])) and np.array_equal(boxed, here)
    finally:
        box.close()


def test_the_frames_codec_carries_16_bit_frames_losslessly():
    frames = [torch.from_numpy(gradient(k, (40, 56))) for k in range(3)]
    tensors = [f.permute(2, 0, 1).float() / 65535 for f in frames]
    cloud_chunk = wire.FRAMES.make(_cloud(), tensors, seed=2, depth=16)
    assert cloud_chunk.depth == 16 and cloud_chunk.pixels.dtype == np.uint16
    payload = wire.encode(cloud_chunk, PRESETS["tiny"], wire.FRAMES_CODEC)
    opened = wire.decode(payload, PRESETS["tiny"])
    assert opened.depth == 16 and np.array_equal(opened.pixels, np.stack([f.numpy() for f in frames]))
    assert all(torch.equal(from_pixels(p), t) for p, t in zip(opened.pixels, tensors))  # what the cloud computed from


def _cloud():
    from eden_serve.cloud.encoder import CloudEncoder
    from eden_serve.model.weights import CloudWeights

    torch.manual_seed(0)
    return CloudEncoder(CloudWeights(PRESETS["tiny"]), PRESETS["tiny"])


def test_the_tiny_model_in_process_makes_16_bit_middles_the_same_through_every_codec(tiny_models):
    """Conditions re-derived from 16-bit frames (frames codec) are the cloud's own (fp32, or handed
    over in one process): the same middles, at 16 bits, rounded from the edge's floats."""
    cloud, edge = tiny_models
    clip = [Frame(k, f"frame {k}", image=torch.from_numpy(gradient(k, (48, 64)))) for k in range(4)]
    made = {codec: in_process(cloud, edge, codec)(0, clip, 3).images for codec in ("frames", "fp32", wire.NO_WIRE)}
    floats, _ = interpolate_chunk(cloud, edge, [frame.tensor for frame in clip], seed=3, codec="fp32")
    for middles in made.values():
        assert all(m.dtype == torch.uint16 for m in middles)
        assert all(torch.equal(m, to_pixels(f, 16)) for m, f in zip(middles, floats))


def test_a_directory_of_16_bit_png_and_tiff_frames_keeps_16_bits(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    size = (32, 48)
    (src / "f0.png").write_bytes(rgb16_png(gradient(0, size)))
    context = av.CodecContext.create("tiff", "w")
    context.width, context.height, context.pix_fmt = size[1], size[0], "rgb48le"
    context.open()
    (src / "f1.tif").write_bytes(bytes(context.encode(av.VideoFrame.from_ndarray(gradient(1, size), format="rgb48le"))[0]))
    interpolate_clip(src, tmp_path / "out", pairwise(blend), progress=False)
    out = [open_deep(path).numpy() for path in sorted((tmp_path / "out").iterdir())]
    assert (tmp_path / "out" / "000000.png").read_bytes() == (src / "f0.png").read_bytes()
    assert np.array_equal(out[2], gradient(1, size))
    halves = (gradient(0, size).astype(np.float32) / 65535 + gradient(1, size).astype(np.float32) / 65535) / 2
    assert np.array_equal(out[1], np.round(halves * 65535).astype(np.uint16))


def test_a_10_bit_y4m_pipe_goes_through_the_command_at_10_bits(tmp_path):
    src = make_graded_clip(tmp_path / "in.y4m", "rawvideo", "yuv420p10le", (48, 64), 3)
    done = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "interpolate", "-", "-o", "-", "--config", "tiny"],
                          input=src.read_bytes(), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.startswith(b"YUV4MPEG2 W64 H48 F50:1") and b" C420p10 " in done.stdout.split(b"\n")[0]
    (tmp_path / "out.y4m").write_bytes(done.stdout)
    with av.open(str(tmp_path / "out.y4m")) as container:
        frames = [f.to_ndarray(format="rgb48le") for f in container.decode(video=0)]
    assert len(frames) == 5 and np.array_equal(frames[::2], local_frames(src))


def test_the_page_previews_an_hdr_clip_tone_mapped(tmp_path):
    colour = Colour(9, 16, 9, LIMITED)
    hdr = make_graded_clip(tmp_path / "pq.mkv", "ffv1", "yuv420p10le", (48, 64), 3, colour)
    sdr = make_graded_clip(tmp_path / "sdr.mkv", "ffv1", "yuv420p10le", (48, 64), 3, Colour(1, 1, 1, LIMITED))
    assert describe(hdr).hdr == "PQ" and not describe(hdr).playable and describe(sdr).hdr is None
    with av.open(str(preview(hdr, tmp_path / "preview.mp4"))) as container:
        shown = next(container.decode(video=0)).to_ndarray(format="rgb24").astype(int)
    pixels = local_frames(hdr)[0]
    mapped, as_coded = tone_mapped(pixels, colour).astype(int), np.round(pixels / 257).astype(int)
    assert np.abs(shown - mapped).mean() < 3  # the tone-mapped frame, through H.264 at crf 18
    assert np.abs(shown - as_coded).mean() > 20  # not PQ's code values shown as SDR ones


def test_process_size_keeps_16_bit_frames_at_16_bits(tmp_path):
    """The model sees the scaled frames at 16 bits, and the middles come back scaled at 16 bits: a
    10-bit gradient's middle holds 4x the distinct colours of the 8-bit gradient's, with nothing said."""
    seen = []

    def recording(index, frame0, frame1, seed):
        seen.append((frame0.depth, frame0.size))
        return blend(index, frame0, frame1, seed)

    for bits, pix_fmt in ((10, "yuv444p10le"), (8, "yuv444p")):
        make_graded_clip(tmp_path / f"in{bits}.mkv", "ffv1", pix_fmt, (128, 256), 3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            interpolate_clip(tmp_path / f"in{bits}.mkv", tmp_path / f"out{bits}.mkv", pairwise(recording), progress=False,
                             process_size=(64, 128))
    assert seen == [(16, (128, 64))] * 2 + [(8, (128, 64))] * 2
    deep, shallow = colours(tmp_path / "out10.mkv", 1), colours(tmp_path / "out8.mkv", 1)
    assert deep >= 4 * shallow, (deep, shallow)


@pytest.mark.parametrize("size, resample", [((40, 23), Image.Resampling.LANCZOS), ((150, 90), Image.Resampling.BICUBIC),
                                            ((50, 90), Image.Resampling.BICUBIC)])
def test_16_bit_scaling_is_the_8_bit_scaling_without_its_roundings(size, resample):
    """On 8-bit values widened to 16 bits, noise that makes every kernel overshoot: within the two
    roundings to 8 bits that Pillow's 8-bit passes make (at most 1.1 levels, over 1 on under 0.1%)."""
    pixels = np.random.default_rng(0).integers(0, 256, (61, 97, 3), dtype=np.uint8)
    shallow = np.asarray(Image.fromarray(pixels).resize(size, resample)).astype(np.float64)
    deep = resized(torch.from_numpy(pixels.astype(np.uint16) * 257), size, resample).numpy() / 257
    difference = np.abs(deep - shallow)
    assert difference.max() <= 1.1 and (difference > 1).mean() < 0.001, (difference.max(), (difference > 1).mean())


def rgba16_png(pixels: np.ndarray, pix_fmt: str = "rgba64be") -> bytes:
    """[H, W, 4] uint16 as a 16-bit RGBA PNG (``ya16be``: grey and alpha), by FFmpeg's PNG encoder."""
    context = av.CodecContext.create("png", "w")
    context.height, context.width = pixels.shape[:2]
    context.pix_fmt = pix_fmt
    context.open()
    picture = av.VideoFrame.from_ndarray(pixels, format="rgba64le").reformat(format=pix_fmt)
    return bytes(context.encode(picture)[0])


def rgba_of(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgba64le")


def with_alpha(index: int, size: tuple[int, int]) -> np.ndarray:
    """:func:`gradient` with an alpha channel that falls across the height, by other 16-bit steps each frame."""
    alpha = np.linspace(65535, 1000 * (index + 1), size[0])[:, None].repeat(size[1], 1)
    return np.concatenate([gradient(index, size), np.round(alpha).astype(np.uint16)[..., None]], axis=-1)


@pytest.mark.parametrize("pix_fmt", ["rgba64be", "ya16be"])
@pytest.mark.parametrize("factor", [2, 4])
def test_a_directory_of_16_bit_rgba_pngs_keeps_16_bits_and_its_alpha(tmp_path, factor, pix_fmt):
    """Their colours go to the model at 16 bits, as 16-bit RGB's do, and each middle is a 16-bit RGBA
    PNG whose alpha is the mean of its neighbours' (was: read at 8 bits, middles written at 8); 16-bit
    grey and alpha alike (Pillow reads it as 8-bit RGBA), its grey in each of the middle's colours."""
    src, size = tmp_path / "in", (32, 48)
    src.mkdir()
    for k in range(2):
        (src / f"f{k}.png").write_bytes(rgba16_png(with_alpha(k, size), pix_fmt))
    frames = [rgba_of(src / f"f{k}.png") for k in range(2)]
    interpolate_clip(src, tmp_path / "out", pairwise(blend), progress=False, factor=factor)
    written = sorted((tmp_path / "out").iterdir())
    assert len(written) == factor + 1 and written[0].read_bytes() == (src / "f0.png").read_bytes()
    middle = written[factor // 2]
    assert png_header(middle.read_bytes())[2:] == (16, 6)
    got = rgba_of(middle)
    halves = (frames[0][..., :3].astype(np.float32) / 65535 + frames[1][..., :3].astype(np.float32) / 65535) / 2
    assert np.array_equal(got[..., :3], np.round(halves * 65535).astype(np.uint16))
    assert np.array_equal(got[..., 3], (frames[0][..., 3].astype(np.int64) + frames[1][..., 3]) // 2)


def test_a_16_bit_rgba_pairs_middle_is_a_16_bit_rgba_png(tmp_path):
    size = (32, 48)
    frames = [with_alpha(k, size) for k in range(2)]
    for k, pixels in enumerate(frames):
        (tmp_path / f"f{k}.png").write_bytes(rgba16_png(pixels))
    done = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "interpolate", str(tmp_path / "f0.png"),
                           str(tmp_path / "f1.png"), "-o", str(tmp_path / "mid.png"), "--config", "tiny"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert png_header((tmp_path / "mid.png").read_bytes())[2:] == (16, 6)
    with av.open(str(tmp_path / "mid.png")) as container:
        got = next(container.decode(video=0)).to_ndarray(format="rgba64le")
    assert np.array_equal(got[..., 3], (frames[0][..., 3].astype(np.int64) + frames[1][..., 3]) // 2)


@pytest.mark.parametrize("codec", [wire.NO_WIRE, "fp32", "frames"])
@pytest.mark.parametrize("cut", [False, True], ids=["gradient", "scene-cut"])
def test_a_16_bit_pairs_middle_is_the_one_a_directory_clip_writes_of_it(tmp_path, codec, cut):
    """A pair of 16-bit frames in process, through each codec that crosses no server: the middle the
    same pair as a directory clip gets (docs/clips-and-video.md, "Clips"), at 16 bits; across a scene
    cut, the frame before at its 16 bits. Before, the pair's cut copy was rounded to 8 bits, and the
    frames codec refused 16-bit frames of a pair."""
    from eden_serve.commands.cli import main

    size = (32, 48)
    noise = np.random.default_rng(5).integers(0, 65536, (2, *size, 3), dtype=np.uint16)
    frames = list(noise) if cut else [gradient(k, size) for k in range(2)]
    (tmp_path / "in").mkdir()
    for k, pixels in enumerate(frames):
        (tmp_path / "in" / f"f{k}.png").write_bytes(rgb16_png(pixels))
    pair = [str(tmp_path / "in" / f"f{k}.png") for k in range(2)]
    assert main(["interpolate", *pair, "-o", str(tmp_path / "mid.png"), "--config", "tiny", "--wire-codec", codec]) == 0
    assert main(["interpolate", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--config", "tiny", "--wire-codec", codec]) == 0
    middle = open_deep(tmp_path / "mid.png").numpy()
    assert middle.dtype == np.uint16
    assert np.array_equal(middle, open_deep(tmp_path / "out" / "000001.png").numpy())
    if cut:
        assert np.array_equal(middle, frames[0])
