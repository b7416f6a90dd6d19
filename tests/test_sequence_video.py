"""A directory of images into one video (eden_serve/media/sequence.py): ``eden-serve interpolate
frames/ -o out.mp4``, as ffmpeg's ``-framerate RATE -i %04d.png out.mp4``."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction as F

import av
import numpy as np
import pytest
from PIL import Image, ImageSequence

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.commands.cli import main
from eden_serve.errors import BadInputError
from eden_serve.media import Encoding
from eden_serve.model.synthetic import clip as synthetic_clip, write_clip
from eden_serve.media.frames import png_of

TINY = ("--config", "tiny", "--wire-codec", "fp32")
# x264 in RGB at quantizer 0: lossless, so the originals decode back to the images exactly.
LOSSLESS = ("--vcodec", "libx264rgb", "--encoder-opt", "qp=0")


def run(*args):
    """The command in a fresh process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def one_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if "warning: no checkpoint given" not in line]
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("eden-serve: error: "), result.stderr
    return lines[0]


def warnings_of(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if "warning:" in line and "no checkpoint given" not in line]


def decoded(path, rgb: str = "rgb24"):
    """The video's stream, and its frames as (time in seconds, RGB pixels)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [(F(f.pts) * f.time_base, f.to_ndarray(format=rgb)) for f in container.decode(stream)]
        context = stream.codec_context
        info = {"codec": context.name, "pix_fmt": context.pix_fmt, "rate": stream.average_rate,
                "tags": (int(context.color_primaries), int(context.color_trc), int(context.colorspace), int(context.color_range))}
    return info, frames


def images(folder):
    return [np.asarray(Image.open(p).convert("RGB")) for p in sorted(folder.iterdir(), key=lambda p: int(p.stem[5:]))]


@pytest.mark.parametrize("factor", [2, 4])
def test_images_become_a_video_at_their_rate_times_the_factor_originals_exact(tmp_path, factor):
    """N images at --input-fps 30000/1001 give F(N - 1) + 1 frames, frame k at k / (F rate) (within
    a tick), and, losslessly encoded, the originals decode back to the images exactly."""
    src = write_clip(tmp_path / "in", 4, 32, 48)
    out = tmp_path / "out.mkv"
    assert main(["interpolate", str(src), "-o", str(out), "--input-fps", "30000/1001", "--factor", str(factor),
                 *TINY, *LOSSLESS]) == 0
    info, frames = decoded(out)
    assert len(frames) == factor * 3 + 1
    step = F(1001, 30000 * factor)
    for k, (time, _) in enumerate(frames):
        assert abs(time - k * step) <= F(1, 1000), (k, time)  # Matroska's tick is a millisecond
    originals = images(src)
    for i, picture in enumerate(originals):
        assert np.array_equal(frames[i * factor][1], picture), i
    assert info["pix_fmt"] in ("gbrp", "rgb24", "bgr0", "bgr24")


def test_without_input_fps_25_is_said_once_and_the_mp4_states_srgb_in_bt709(tmp_path):
    """The default rate is ffmpeg's, 25, said in one warning; an MP4's default encoder (x264) writes
    8-bit images as yuv420p, tagged BT.709 primaries and matrix, the sRGB transfer, limited range;
    the originals come back within x264's loss."""
    src = write_clip(tmp_path / "in", 3, 64, 96)
    out = tmp_path / "out.mp4"
    result = run("interpolate", src, "-o", out, *TINY)
    assert result.returncode == 0, result.stderr
    said = warnings_of(result)
    assert len(said) == 1 and "--input-fps not given" in said[0] and "25 frames a second" in said[0]
    info, frames = decoded(out)
    assert info["codec"] == "h264" and info["pix_fmt"] == "yuv420p"
    assert info["tags"] == (1, 13, 1, 1)
    assert [time for time, _ in frames] == [F(k, 50) for k in range(5)]
    for i, picture in enumerate(images(src)):
        assert np.abs(frames[2 * i][1].astype(int) - picture).mean() < 4, i
    with av.open(str(out)) as container:  # converted by the matrix it states: BT.601's would be further off
        first = next(container.decode(video=0))
        as_601 = first.reformat(format="rgb24", src_colorspace="itu601").to_ndarray().astype(int)
    assert np.abs(as_601 - images(src)[0]).mean() > np.abs(frames[0][1].astype(int) - images(src)[0]).mean() + 1


def test_sixteen_bit_images_become_ten_bit_video(tmp_path):
    """16-bit PNGs go to x264's 10-bit 4:2:0 (the rounding of 16 to 10 bits said), not 8 bits."""
    src = tmp_path / "in"
    src.mkdir()
    rng = np.random.default_rng(0)
    base = (np.linspace(0, 65535, 32 * 48 * 3).reshape(32, 48, 3)).astype(np.uint16)
    for i in range(3):
        (src / f"frame{i}.png").write_bytes(png_of(np.clip(base.astype(int) + rng.integers(0, 256, base.shape), 0, 65535)
                                                   .astype(np.uint16)))
    out = tmp_path / "out.mkv"
    result = run("interpolate", src, "-o", out, "--input-fps", "24", *TINY)
    assert result.returncode == 0, result.stderr
    info, frames = decoded(out, "rgb48le")
    assert info["pix_fmt"] == "yuv420p10le" and len(frames) == 5
    assert any("16-bit" in line and "yuv420p10le" in line for line in warnings_of(result))


def test_alpha_is_dropped_in_one_warning(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for i in range(3):
        image = Image.new("RGBA", (48, 32), (40 * i, 100, 200, 128))
        image.save(src / f"frame{i}.png")
    result = run("interpolate", src, "-o", tmp_path / "out.mp4", "--input-fps", "25", *TINY)
    assert result.returncode == 0, result.stderr
    said = warnings_of(result)
    assert len(said) == 1 and "alpha is dropped" in said[0]
    assert len(decoded(tmp_path / "out.mp4")[1]) == 5


def test_a_gif_of_images_runs_at_twice_their_rate(tmp_path):
    """An animation's name makes one too: a GIF of 2N - 1 frames at twice --input-fps."""
    src = write_clip(tmp_path / "in", 3, 32, 48)
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out.gif"), "--input-fps", "10", *TINY]) == 0
    _, frames = decoded(tmp_path / "out.gif")
    assert [time for time, _ in frames] == [F(k, 20) for k in range(5)]


def _average(index, frame0, frame1, seed):
    mean = (np.asarray(frame0.image.convert("RGB"), np.float32) + np.asarray(frame1.image.convert("RGB"), np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))


def _stop_at(at):
    def process(index, frame0, frame1, seed):
        if index == at:
            raise KeyboardInterrupt
        return _average(index, frame0, frame1, seed)
    return pairwise(process)


def test_a_stopped_run_resumes_at_its_rate_and_refuses_another(tmp_path):
    """A stopped run keeps its middles; resumed at another --input-fps it is refused in one line,
    at the same one it gives the video an uninterrupted run gives."""
    src = write_clip(tmp_path / "in", 6, 32, 48)
    dst = tmp_path / "out.mkv"
    options = dict(chunk=1, fingerprint={"processor": "average"}, progress=False, encoding=Encoding("libx264rgb", options=(("qp", "0"),)))
    with pytest.warns(UserWarning, match="stopped"), pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, dst, _stop_at(3), resume=True, input_fps=F(24), **options)
    with pytest.raises(BadInputError, match=r"input_fps '24' then, '30' now"):
        interpolate_clip(src, dst, pairwise(_average), resume=True, input_fps=F(30), **options)
    summary = interpolate_clip(src, dst, pairwise(_average), resume=True, input_fps=F(24), **options)
    assert 3 <= summary.resumed < 5  # pairs 0-2 at least, and any in flight as pair 3 stopped the run
    interpolate_clip(src, tmp_path / "whole.mkv", pairwise(_average), input_fps=F(24), **options)
    got, want = decoded(dst)[1], decoded(tmp_path / "whole.mkv")[1]
    assert len(got) == 11 and [t for t, _ in got] == [t for t, _ in want]
    assert all(abs(t - F(k, 48)) <= F(1, 1000) for k, (t, _) in enumerate(got))  # Matroska's tick: a millisecond
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(got, want))


def test_resume_makes_the_same_video(tmp_path):
    """--resume, as for a video input: the video is encoded whole; the run with it gives the same frames."""
    src = write_clip(tmp_path / "in", 3, 32, 48)
    assert main(["interpolate", str(src), "-o", str(tmp_path / "a.mkv"), "--input-fps", "25", *TINY, *LOSSLESS]) == 0
    assert main(["interpolate", str(src), "-o", str(tmp_path / "b.mkv"), "--input-fps", "25", "--resume", *TINY, *LOSSLESS]) == 0
    a, b = decoded(tmp_path / "a.mkv")[1], decoded(tmp_path / "b.mkv")[1]
    assert len(a) == len(b) == 5 and all(np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mkv", "b.mkv", "in"]


@pytest.mark.parametrize("rate, said", [("0", "--input-fps must be above 0 and at most 1000, got 0"),
                                        ("1001", "--input-fps must be above 0 and at most 1000"),
                                        ("fast", "--input-fps takes N, N/D or a decimal")])
def test_a_bad_input_fps_is_refused_in_one_line_and_leaves_nothing(tmp_path, rate, said):
    src = write_clip(tmp_path / "in", 3, 32, 48)
    assert said in one_error(run("interpolate", src, "-o", tmp_path / "out.mp4", "--input-fps", rate, "--config", "tiny"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_input_fps_is_refused_where_the_input_states_its_rate_or_the_output_has_none(tmp_path):
    """A video states its own rate, and a directory of frames has none: --input-fps is refused there."""
    src = write_clip(tmp_path / "in", 3, 32, 48)
    assert main(["interpolate", str(src), "-o", str(tmp_path / "v.mkv"), "--input-fps", "25", *TINY, *LOSSLESS]) == 0
    error = one_error(run("interpolate", tmp_path / "v.mkv", "-o", tmp_path / "w.mkv", "--input-fps", "30", "--config", "tiny"))
    assert "--input-fps applies to a directory of images written as a video" in error and "a video, which states its own" in error
    error = one_error(run("interpolate", src, "-o", tmp_path / "frames", "--input-fps", "30", "--config", "tiny"))
    assert "a directory of frames, which has no frame rate" in error
    # Before the weights load: a checkpoint that is not there is not reached.
    error = one_error(run("interpolate", src, "-o", tmp_path / "frames", "--input-fps", "30", "--checkpoint", tmp_path / "none.pt"))
    assert "--input-fps applies to" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "v.mkv"]


def test_an_image_name_is_still_refused_and_a_directory_name_still_gives_frames(tmp_path):
    src = write_clip(tmp_path / "in", 3, 32, 48)
    assert "names an image" in one_error(run("interpolate", src, "-o", tmp_path / "out.png", "--config", "tiny"))
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out"), *TINY]) == 0
    assert len(list((tmp_path / "out").iterdir())) == 5


def test_a_webp_of_images_is_converted_by_webps_own_matrix(tmp_path):
    """Lossy WebP is VP8's BT.601 YUV whatever a stream would state: the images come back from it,
    read by libwebp (Pillow), without the colour cast BT.709's matrix would give them."""
    src = write_clip(tmp_path / "in", 3, 64, 96)
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out.webp"), "--input-fps", "25", *TINY]) == 0
    with Image.open(tmp_path / "out.webp") as animation:
        frames = [np.asarray(frame.convert("RGB")).astype(int) for frame in ImageSequence.Iterator(animation)]
    assert len(frames) == 5
    for i, picture in enumerate(images(src)):
        error = frames[2 * i] - picture
        assert np.abs(error).mean() < 4 and np.abs(error.mean(axis=(0, 1))).max() < 1.5, (i, error.mean(axis=(0, 1)))


def test_a_bt709_video_into_webp_is_converted_by_webps_own_matrix(tmp_path):
    """A video's BT.709 frames written as lossy WebP are converted to BT.601's YUV, which libwebp's
    readers apply (the stream states nothing): before, they were converted by BT.709's and read
    back with a colour cast."""
    pictures = [np.asarray(image) for image in synthetic_clip(3, 64, 96)]
    src = tmp_path / "in.mkv"
    with av.open(str(src), "w") as container:
        stream = container.add_stream("ffv1", rate=25)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv444p"
        stream.codec_context.colorspace, stream.codec_context.color_range = 1, 1  # BT.709, limited
        for k, picture in enumerate(pictures):
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24").reformat(format="yuv444p", dst_colorspace="itu709",
                                                                               dst_color_range=1)
            frame.pts, frame.colorspace, frame.color_range = k, 1, 1
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out.webp"), *TINY]) == 0
    with Image.open(tmp_path / "out.webp") as animation:
        frames = [np.asarray(frame.convert("RGB")).astype(int) for frame in ImageSequence.Iterator(animation)]
    assert len(frames) == 5
    # Converted twice (the video's YUV, then WebP's): a red bias of 1.5 here; by BT.709's matrix, 3.5.
    for i, picture in enumerate(pictures):
        error = frames[2 * i] - picture
        assert np.abs(error).mean() < 4 and np.abs(error.mean(axis=(0, 1))).max() < 2.5, (i, error.mean(axis=(0, 1)))


def test_sixteen_bit_grey_images_keep_their_range(tmp_path):
    """16-bit grey PNGs (Pillow's I;16) are written from their 16 bits: Pillow's conversion to RGB
    would have clipped them to 255 of 65535, white."""
    src = tmp_path / "in"
    src.mkdir()
    greys = [(np.linspace(0, 65535, 32 * 48).reshape(32, 48) * (0.5 + 0.2 * i)).clip(0, 65535).astype(np.uint16) for i in range(3)]
    for i, grey in enumerate(greys):
        Image.fromarray(grey.astype(np.int32)).convert("I;16").save(src / f"frame{i}.png")
    out = tmp_path / "out.mkv"
    assert main(["interpolate", str(src), "-o", str(out), "--input-fps", "25", "--vcodec", "ffv1", "--pix-fmt", "yuv444p16le",
                 *TINY]) == 0
    _, frames = decoded(out, "rgb48le")
    for i, grey in enumerate(greys):
        assert np.abs(frames[2 * i][1][..., 1].astype(int) - grey).max() <= 257, i  # within one 8-bit level



def test_float_grey_tiffs_keep_their_range_and_lab_ones_have_no_alpha(tmp_path):
    """Float TIFFs (0 black, 1 white) are written from their levels as the model reads them: Pillow's
    conversion to RGB clipped them to 0 and 1 of 255, a black video. LAB TIFFs' `A` band is a
    colour, not alpha: their video has none (it was yuva420p, opaque)."""
    floats = tmp_path / "floats"
    floats.mkdir()
    greys = [np.linspace(0, 1, 32 * 48, dtype=np.float32).reshape(32, 48) * (0.5 + 0.2 * i) for i in range(3)]
    for i, grey in enumerate(greys):
        Image.fromarray(grey).save(floats / f"frame{i}.tif")
    out = tmp_path / "floats.mkv"
    assert main(["interpolate", str(floats), "-o", str(out), "--input-fps", "25", "--vcodec", "ffv1", "--pix-fmt", "yuv444p16le",
                 *TINY]) == 0
    _, frames = decoded(out, "rgb48le")
    for i, grey in enumerate(greys):
        assert np.abs(frames[2 * i][1][..., 1].astype(int) - grey * 65535).max() <= 257, i  # within one 8-bit level
    lab = tmp_path / "lab"
    lab.mkdir()
    for i in range(3):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (32, 48, 3), dtype=np.uint8)).convert("LAB").save(lab / f"frame{i}.tif")
    out = tmp_path / "lab.mkv"
    assert main(["interpolate", str(lab), "-o", str(out), "--input-fps", "25", "--vcodec", "ffv1", *TINY]) == 0
    assert decoded(out)[0]["pix_fmt"] == "yuv420p"


def test_fps_retimes_images_written_as_a_video(tmp_path):
    """--fps applies to images written as a video, timed by --input-fps: 4 at 24 give ceil(4 * 60 / 24)
    frames at 60 a second, as a video of them would; to a directory of frames it stays refused."""
    src = write_clip(tmp_path / "in", 4, 32, 48)
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out.mkv"), "--input-fps", "24", "--fps", "60", *TINY]) == 0
    _, frames = decoded(tmp_path / "out.mkv")
    assert len(frames) == 10 and all(abs(t - F(k, 60)) <= F(1, 1000) for k, (t, _) in enumerate(frames))
    assert "--fps needs a video" in one_error(run("interpolate", src, "-o", tmp_path / "frames", "--fps", "60", "--config", "tiny"))


@pytest.mark.parametrize("name", ["out.y4m", "out.avi"])
def test_an_output_that_cannot_state_a_matrix_is_converted_by_the_one_readers_take(tmp_path, name):
    """Y4M and AVI's MPEG-4 state no matrix, so a reader converts their YUV back by BT.601's: the
    images are converted by it, and nothing is said lost (images have no tags of their own). By
    BT.709's the originals came back with a mean error of 4.4 levels, 2.7 by the right one."""
    src = write_clip(tmp_path / "in", 3, 64, 96)
    result = run("interpolate", src, "-o", tmp_path / name, "--input-fps", "24", *TINY)
    assert result.returncode == 0 and warnings_of(result) == [], result.stderr
    info, frames = decoded(tmp_path / name)
    assert info["tags"][:3] == (2, 2, 2) and len(frames) == 5
    for i, picture in enumerate(images(src)):
        assert np.abs(frames[2 * i][1].astype(int) - picture).mean() < 3.5, i


def alpha_images(folder, mode: str, count: int = 3, size=(32, 48)):
    """``count`` images with varying alpha: 8-bit RGBA or grey+alpha (Pillow), or 16-bit RGBA or grey+alpha
    (FFmpeg's PNG encoder); [H, W, 4] RGBA of each, as written (grey in each colour)."""
    folder.mkdir()
    rng = np.random.default_rng(1)
    written = []
    for i in range(count):
        deep = mode.endswith("16")
        pixels = rng.integers(0, 65536 if deep else 256, (*size, 4)).astype(np.uint16 if deep else np.uint8)
        if mode.startswith("LA"):
            pixels[..., 1] = pixels[..., 2] = pixels[..., 0]
        if deep:
            with av.open(str(folder / f"frame{i}.png"), "w", format="image2") as container:
                stream = container.add_stream("png")
                stream.height, stream.width = size
                stream.pix_fmt = "ya16be" if mode.startswith("LA") else "rgba64be"
                container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgba64le").reformat(format=stream.pix_fmt)))
                container.mux(stream.encode(None))
        else:
            image = Image.fromarray(pixels, "RGBA")
            (image.convert("LA") if mode == "LA" else image).save(folder / f"frame{i}.png")
        written.append(pixels)
    return written


def rgba_frames(path, deep: bool, decoder: str | None = None):
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if decoder is not None:  # VP9's alpha is read by libvpx alone (FFmpeg's own VP9 decoder drops it)
            context = av.CodecContext.create(decoder, "r")
            context.extradata = stream.codec_context.extradata
            frames = [f for packet in container.demux(stream) for f in context.decode(packet)]
        else:
            frames = list(container.decode(stream))
        return stream.codec_context.pix_fmt, [f.to_ndarray(format="rgba64le" if deep else "rgba") for f in frames]


@pytest.mark.parametrize("mode, name, vcodec, pix_fmt", [
    ("RGBA", "out.apng", None, "rgba"), ("RGBA16", "out.apng", None, "rgba64be"), ("LA", "out.apng", None, "rgba"),
    ("RGBA", "out.mkv", "ffv1", "yuva420p"), ("RGBA16", "out.mkv", "ffv1", "gbrap16le"), ("LA16", "out.mkv", "ffv1", "gbrap16le"),
    ("RGBA", "out.mov", "qtrle", "argb"), ("RGBA", "out.mov", "png", "rgba"), ("RGBA16", "out.mov", "prores_ks", "yuva444p12le")])
def test_images_with_alpha_keep_it_where_the_codec_holds_it(tmp_path, mode, name, vcodec, pix_fmt):
    """RGBA and grey+alpha images into a codec with alpha keep it, in the format a video with alpha
    is given (as the decoder reads it back: FFV1's rgba64le as gbrap16le, ProRes' 10 bits as 12): the
    originals' alpha as it was (lossless codecs), a middle's the blend of its neighbours', as the
    video writer makes it (was: dropped, one warning, every frame opaque)."""
    originals = alpha_images(tmp_path / "in", mode)
    out = tmp_path / name
    result = run("interpolate", tmp_path / "in", "-o", out, "--input-fps", "10", *TINY, *(("--vcodec", vcodec) if vcodec else ()))
    assert result.returncode == 0, result.stderr
    assert not any("alpha" in line for line in warnings_of(result)), result.stderr
    deep = mode.endswith("16")
    written, frames = rgba_frames(out, deep)
    assert written == pix_fmt and len(frames) == 5
    alphas = [frame[..., 3].astype(np.int64) for frame in frames]
    if vcodec == "prores_ks":  # 16-bit alpha in ProRes' 10-bit format, read back at 12: within two of its steps
        want = [o[..., 3].astype(np.int64) for o in originals]
        assert all(np.abs(alphas[2 * i] - w).max() <= 2 * 65535 / 1023 for i, w in enumerate(want))
    else:
        assert all(np.array_equal(alphas[2 * i], o[..., 3]) for i, o in enumerate(originals))
    step = 2 * 65535 / 1023 if vcodec == "prores_ks" else 0  # ProRes: blended at 10 bits, read back at 12
    for k in (1, 3):  # each middle's alpha: its neighbours' as written, blended halfway, as a video's middle's
        assert np.abs(alphas[k] - np.round(alphas[k - 1] + (alphas[k + 1] - alphas[k - 1]) * 0.5)).max() <= step, k
    assert len({a.tobytes() for a in alphas}) == 5  # translucent, and not all alike


@pytest.mark.parametrize("name", ["out.webm", "out.webp"])
def test_images_with_alpha_into_webm_and_webp_keep_it(tmp_path, name):
    """VP9 and WebP hold alpha in yuva420p: kept, within their loss (was: dropped)."""
    originals = alpha_images(tmp_path / "in", "RGBA")
    out = tmp_path / name
    result = run("interpolate", tmp_path / "in", "-o", out, "--input-fps", "10", *TINY)
    assert result.returncode == 0, result.stderr
    assert not any("alpha" in line for line in warnings_of(result)), result.stderr
    if name.endswith(".webm"):
        _, frames = rgba_frames(out, False, "libvpx-vp9")
    else:  # FFmpeg reads no animated WebP; Pillow does
        frames = [np.asarray(f.convert("RGBA")) for f in ImageSequence.Iterator(Image.open(out))]
    assert len(frames) == 5
    for i, original in enumerate(originals):
        assert np.abs(frames[2 * i][..., 3].astype(int) - original[..., 3]).mean() < 24, i
        assert frames[2 * i][..., 3].std() > 30  # not opaque


@pytest.mark.parametrize("name, vcodec, pix_fmt", [("out.apng", None, "rgba"), ("out.mkv", "ffv1", "yuva420p")])
def test_any_image_with_alpha_gives_the_video_alpha_the_opaque_ones_opaque(tmp_path, name, vcodec, pix_fmt):
    """The first image decided whether the video had alpha: an opaque one first, and the translucent
    image after it was written opaque, without a word. Any image's alpha gives the video alpha now,
    the opaque images' 255; images without any give a video without."""
    src, opaque = tmp_path / "in", tmp_path / "opaque"
    src.mkdir()
    opaque.mkdir()
    rng = np.random.default_rng(2)
    translucent = rng.integers(0, 256, (32, 48, 4)).astype(np.uint8)
    Image.new("RGB", (48, 32), (200, 40, 10)).save(src / "frame0.png")
    Image.fromarray(translucent, "RGBA").save(src / "frame1.png")
    Image.new("L", (48, 32), 90).save(src / "frame2.png")
    for i in range(3):
        Image.new("RGB", (48, 32), (60 * i, 40, 10)).save(opaque / f"frame{i}.png")
    codec = ("--vcodec", vcodec) if vcodec else ()
    result = run("interpolate", src, "-o", tmp_path / name, "--input-fps", "10", *TINY, *codec)
    assert result.returncode == 0, result.stderr
    assert not any("alpha" in line for line in warnings_of(result)), result.stderr
    written, frames = rgba_frames(tmp_path / name, False)
    assert written == pix_fmt and len(frames) == 5
    alphas = [frame[..., 3] for frame in frames]
    assert (alphas[0] == 255).all() and (alphas[4] == 255).all()
    assert np.array_equal(alphas[2], translucent[..., 3])
    assert np.array_equal(alphas[1], np.round((255 + translucent[..., 3].astype(np.float64)) / 2).astype(np.uint8))
    out = tmp_path / f"opaque{tmp_path.joinpath(name).suffix}"
    result = run("interpolate", opaque, "-o", out, "--input-fps", "10", *TINY, *codec)
    assert result.returncode == 0, result.stderr
    with av.open(str(out)) as container:
        held = av.VideoFormat(container.streams.video[0].codec_context.pix_fmt)
    assert not any(c.is_alpha for c in held.components), held.name


def test_any_sixteen_bit_image_gives_the_video_its_depth_the_eight_bit_ones_widened(tmp_path):
    """The first image decided the depth: an 8-bit one first, and the 16-bit image after it was
    rounded to 8 bits without a word. Now any 16-bit image makes the video 16-bit (FFV1's 16-bit
    RGB here, lossless): that image's pixels exactly, the 8-bit ones widened (x 257)."""
    src = tmp_path / "in"
    src.mkdir()
    rng = np.random.default_rng(3)
    low = [rng.integers(0, 256, (32, 48, 3)).astype(np.uint8) for _ in range(2)]
    deep = rng.integers(0, 65536, (32, 48, 3)).astype(np.uint16)
    Image.fromarray(low[0], "RGB").save(src / "frame0.png")
    (src / "frame1.png").write_bytes(png_of(deep))
    Image.fromarray(low[1], "RGB").save(src / "frame2.png")
    out = tmp_path / "out.mkv"
    result = run("interpolate", src, "-o", out, "--input-fps", "10", "--vcodec", "ffv1", *TINY)
    assert result.returncode == 0, result.stderr
    info, frames = decoded(out, "rgb48le")
    held = av.VideoFormat(info["pix_fmt"])
    assert held.is_rgb and max(c.bits for c in held.components) == 16 and len(frames) == 5
    assert np.array_equal(frames[2][1], deep)
    assert np.array_equal(frames[0][1], low[0].astype(np.uint16) * 257) and np.array_equal(frames[4][1], low[1].astype(np.uint16) * 257)
