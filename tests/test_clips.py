"""Reading and writing clips: directories, GIF, APNG, WebP and MP4, whole or not at all."""

import io
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from eden_serve import media
from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.errors import BadInputError
from eden_serve.media import is_clip, natural_key, open_clip
from eden_serve.media.frames import to_pixels

SIZE = (96, 64)  # width, height


def average(index, frame0, frame1, seed):
    """A stand-in model: the mean of the two frames."""
    mean = (np.asarray(frame0.image.convert("RGB"), np.float32) + np.asarray(frame1.image.convert("RGB"), np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))


def random_frames(count, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(count):
        rgba = rng.integers(0, 256, (SIZE[1], SIZE[0], 4), dtype=np.uint8)
        rgba[..., 3] = np.where(rng.random(rgba.shape[:2]) < 0.3, 0, 255)
        frames.append(Image.fromarray(rgba).convert(mode))
    return frames


def read_animation(path):
    """(frames as RGBA arrays, durations, loop) of an animation, read back with Pillow."""
    with Image.open(path) as image:
        frames, durations = [], []
        for i in range(image.n_frames):
            image.seek(i)
            image.load()
            frames.append(np.asarray(image.convert("RGBA")))
            durations.append(image.info.get("duration"))
        return frames, durations, image.info.get("loop"), image.size


def leftovers(directory: Path):
    return [p.name for p in directory.iterdir() if ".partial" in p.name]


def test_natural_sort_orders_digit_runs_by_value():
    names = ["frame10.png", "frame2.png", "Frame1.png", "frame2b.png", "frame02.png", "a.png"]
    assert sorted(names, key=natural_key) == ["a.png", "Frame1.png", "frame02.png", "frame2.png", "frame2b.png", "frame10.png"]


def test_directory_reads_in_natural_order_and_skips_other_files(tmp_path):
    for i in (10, 2, 1):
        random_frames(1, seed=i)[0].save(tmp_path / f"f{i}.png")
    (tmp_path / "notes.txt").write_text("not a frame")
    (tmp_path / ".hidden.png").write_bytes(b"")
    with open_clip(tmp_path) as clip:
        assert clip.kind == "directory" and clip.length == 3
        assert [f.name for f in clip] == ["f1.png", "f2.png", "f10.png"]


def test_a_directory_with_a_link_to_nothing_among_its_frames_is_refused_naming_it(tmp_path):
    """A frame missing: before, the link was left out without a word, and every frame after it was
    shown a frame early. A link to a frame elsewhere is a frame; a dangling one not named as an
    image, or hidden, is none."""
    frames, elsewhere = tmp_path / "frames", tmp_path / "elsewhere"
    frames.mkdir(), elsewhere.mkdir()
    for i, image in enumerate(random_frames(3)):
        image.save((elsewhere if i == 1 else frames) / f"f{i}.png")
    (frames / "f1.png").symlink_to(elsewhere / "f1.png")
    (frames / "notes.txt").symlink_to(tmp_path / "gone.txt")
    (frames / ".f9.png").symlink_to(tmp_path / "gone.png")
    with open_clip(frames) as clip:
        assert [f.name for f in clip] == ["f0.png", "f1.png", "f2.png"]
    (elsewhere / "f1.png").unlink()
    with pytest.raises(BadInputError) as refused:
        open_clip(frames)
    assert str(refused.value).startswith(f"{str(frames / 'f1.png')!r} is a symbolic link to nothing ({str(elsewhere / 'f1.png')!r}): "
                                         "a frame is missing")
    out = tmp_path / "out"
    with pytest.raises(BadInputError, match="symbolic link to nothing"):
        interpolate_clip(frames, out, pairwise(average), progress=False)
    assert not out.exists()



@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "I;16"])
def test_directory_round_trip_keeps_originals_size_and_mode(tmp_path, mode):
    src = tmp_path / "in"
    src.mkdir()
    for i, frame in enumerate(random_frames(4, mode)):
        frame.save(src / f"frame{i}.png")
    summary = interpolate_clip(src, tmp_path / "out", pairwise(average), progress=False)
    assert (summary.pairs, summary.frames) == (3, 7)
    out = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in out] == [f"{k:06d}.png" for k in range(7)]
    for i in range(4):
        assert out[2 * i].read_bytes() == (src / f"frame{i}.png").read_bytes()
    for k in (1, 3, 5):
        with Image.open(out[k]) as middle, Image.open(out[k - 1]) as before:
            assert middle.size == SIZE and middle.mode == before.mode


def test_a_16_bit_grey_directorys_middle_is_the_mean_of_its_neighbours(tmp_path):
    """Its 16 bits kept (was: every middle white, 65535: matched to its neighbours' mode twice, the
    second time read as 8-bit grey, which clipped it)."""
    src = tmp_path / "in"
    src.mkdir()
    levels = [np.full(SIZE[::-1], 20000 + 9001 * i, np.uint16) for i in range(2)]
    for i, grey in enumerate(levels):
        Image.fromarray(grey).save(src / f"{i}.png")

    def blend(index, frame0, frame1, seed):  # at the frames' depth, as the model's middles come
        return to_pixels((frame0.tensor + frame1.tensor) / 2, frame0.depth)

    interpolate_clip(src, tmp_path / "out", pairwise(blend), progress=False)
    with Image.open(tmp_path / "out" / "000001.png") as middle:
        assert middle.mode == "I;16"
        assert np.abs(np.asarray(middle, np.int64) - (20000 + 9001 // 2)).max() <= 1


def test_directory_middle_alpha_is_the_mean_of_its_neighbours(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    frames = random_frames(2, "RGBA")
    for i, frame in enumerate(frames):
        frame.save(src / f"{i}.png")
    interpolate_clip(src, tmp_path / "out", pairwise(average), progress=False)
    with Image.open(tmp_path / "out" / "000001.png") as middle:
        alphas = [np.asarray(f.getchannel("A"), np.int32) for f in frames]
        assert np.array_equal(np.asarray(middle.getchannel("A"), np.int32), (alphas[0] + alphas[1]) // 2)


def test_a_jpeg_directory_gives_only_png_frames_ffmpeg_reads_as_06d(tmp_path):
    """Real frames (tests/data/scene_cut) as JPEG, one as a CMYK JPEG that a PNG cannot hold: every
    output is %06d.png, the originals decoded exactly as the JPEG decodes (re-encoded losslessly)."""
    src = tmp_path / "in"
    src.mkdir()
    real = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))[:3]
    for i, path in enumerate(real):
        with Image.open(path) as frame:
            (frame.convert("CMYK") if i == 1 else frame.convert("RGB")).save(src / f"{i}.jpg", quality=90)
    interpolate_clip(src, tmp_path / "out", pairwise(average), progress=False)
    out = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in out] == [f"{k:06d}.png" for k in range(5)]
    for k, path in enumerate(out):
        with Image.open(path) as frame:
            assert frame.format == "PNG"
            if k % 2 == 0:
                with Image.open(src / f"{k // 2}.jpg") as original:
                    assert np.array_equal(np.asarray(frame), np.asarray(original.convert("RGB")))


def animation(path, frames, **params):
    frames[0].save(path, save_all=True, append_images=frames[1:], **params)
    return path


def same_pixels(a, b):
    """Equal RGBA frames, ignoring the colour of fully transparent pixels."""
    visible = a[..., 3] > 0
    return np.array_equal(a[..., 3], b[..., 3]) and np.array_equal(a[visible], b[visible])


def gif_frames(count, transparent):
    """Palette frames of 50 colours; with ``transparent``, index 0 is see-through."""
    rng = np.random.default_rng(0)
    palette = list(rng.integers(0, 256, 150))
    frames = []
    for _ in range(count):
        frame = Image.fromarray(rng.integers(0, 50, (SIZE[1], SIZE[0]), dtype=np.uint8), "P")
        frame.putpalette(palette)
        if transparent:
            frame.info["transparency"] = 0
        frames.append(frame)
    return frames


@pytest.mark.parametrize(
    "name, frames, params",
    [
        ("clip.gif", lambda: gif_frames(6, False), {"duration": [100, 80, 60, 40, 120, 100], "loop": 0}),
        ("clip.gif", lambda: gif_frames(6, True), {"duration": 100, "loop": 3, "transparency": 0, "disposal": 2}),
        ("clip.png", lambda: random_frames(6), {"duration": [100, 80, 60, 40, 120, 100], "loop": 0}),
        ("clip.png", lambda: random_frames(6, "RGBA"), {"duration": 70, "loop": 2}),
        ("clip.webp", lambda: random_frames(6), {"duration": [100, 80, 60, 40, 120, 100], "loop": 0, "lossless": True}),
        ("clip.webp", lambda: random_frames(6, "RGBA"), {"duration": 70, "loop": 2, "lossless": True, "exact": True}),
    ],
    ids=["gif", "gif-transparent", "apng", "apng-rgba", "webp", "webp-rgba"],
)
def test_animation_round_trip_doubles_the_frame_rate(tmp_path, name, frames, params):
    src = animation(tmp_path / name, frames(), **params)
    assert is_clip(src)
    dst = tmp_path / f"out-{name}"
    summary = interpolate_clip(src, dst, pairwise(average), progress=False)
    assert (summary.pairs, summary.frames) == (5, 11)

    original, durations, loop, size = read_animation(src)
    out, out_durations, out_loop, out_size = read_animation(dst)
    assert len(out) == 11 and out_size == size == SIZE and out_loop == loop
    for i in range(6):
        assert same_pixels(original[i], out[2 * i]), f"original frame {i} changed"
    for i in range(5):
        assert out_durations[2 * i] + out_durations[2 * i + 1] == durations[i]
        assert out_durations[2 * i] == durations[i] / 2
    assert out_durations[10] == durations[5] / 2
    assert leftovers(tmp_path) == []


def test_apng_and_webp_keep_their_mode(tmp_path):
    for name, kwargs in (("a.png", {}), ("a.webp", {"lossless": True})):
        src = animation(tmp_path / name, random_frames(3, "RGBA"), duration=50, **kwargs)
        interpolate_clip(src, tmp_path / f"out-{name}", pairwise(average), progress=False)
        with Image.open(src) as a, Image.open(tmp_path / f"out-{name}") as b:
            assert (a.format, a.mode) == (b.format, b.mode)


def test_animation_output_must_keep_the_format(tmp_path):
    src = animation(tmp_path / "clip.gif", [f.quantize(16) for f in random_frames(3)], duration=50)
    with pytest.raises(BadInputError, match=r"\*\.gif"):
        interpolate_clip(src, tmp_path / "out.webp", pairwise(average), progress=False)
    assert leftovers(tmp_path) == []


def test_still_images_are_not_clips(tmp_path):
    random_frames(1)[0].save(tmp_path / "still.png")
    animation(tmp_path / "one.gif", [random_frames(1)[0].quantize(8)])
    assert not is_clip(tmp_path / "still.png") and not is_clip(tmp_path / "one.gif")
    assert not is_clip(tmp_path / "missing.png")
    assert is_clip(tmp_path)
    with pytest.raises(BadInputError, match="not a clip"):
        open_clip(tmp_path / "still.png")


def test_a_raw_mjpeg_stream_is_a_video_not_a_still(tmp_path):
    av = pytest.importorskip("av")
    src = tmp_path / "camera.mjpeg"  # a camera's JPEGs back to back: Pillow reads the first alone
    jpegs = [io.BytesIO() for _ in range(3)]
    for frame, jpeg in zip(random_frames(3), jpegs):
        frame.save(jpeg, "JPEG")
    src.write_bytes(b"".join(jpeg.getvalue() for jpeg in jpegs))
    assert is_clip(src)
    assert interpolate_clip(src, tmp_path / "out.mkv", pairwise(average), progress=False).frames == 5
    with av.open(str(tmp_path / "out.mkv")) as container:
        assert len(list(container.decode(video=0))) == 5


def test_one_frame_gives_one_frame_and_an_empty_directory_fails(tmp_path):
    (tmp_path / "one").mkdir()
    random_frames(1)[0].save(tmp_path / "one" / "0.png")
    summary = interpolate_clip(tmp_path / "one", tmp_path / "out", pairwise(average), progress=False)
    assert (summary.pairs, summary.frames) == (0, 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInputError, match="no image files"):
        interpolate_clip(tmp_path / "empty", tmp_path / "out2", pairwise(average), progress=False)


def make_mp4(path, frames, rate=12):
    av = pytest.importorskip("av")
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = *SIZE, "yuv420p"
        stream.options = {"crf": "0"}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_image(frame)))
        container.mux(stream.encode(None))
    return path


def test_mp4_round_trip_doubles_the_frame_rate(tmp_path):
    av = pytest.importorskip("av")
    # Smooth frames: a lossy codec keeps them close, so "unchanged" can be checked to a tolerance.
    ramp = np.linspace(0, 255, SIZE[0], dtype=np.float32)[None, :, None]
    frames = [Image.fromarray(np.broadcast_to((ramp + 30 * i) % 256, (SIZE[1], SIZE[0], 3)).astype(np.uint8)) for i in range(6)]
    src = make_mp4(tmp_path / "clip.mp4", frames)
    dst = tmp_path / "out.mp4"
    summary = interpolate_clip(src, dst, pairwise(average), progress=False)
    assert (summary.pairs, summary.frames) == (5, 11)
    with av.open(str(src)) as a, av.open(str(dst)) as b:
        sa, sb = a.streams.video[0], b.streams.video[0]
        # Frames come at twice the rate; the last one lasts as in the input, which pulls the average a little below.
        assert sb.guessed_rate == 2 * sa.average_rate
        assert (sb.width, sb.height, sb.codec_context.pix_fmt) == (sa.width, sa.height, sa.codec_context.pix_fmt)
        original = [f.to_ndarray(format="rgb24").astype(np.int32) for f in a.decode(sa)]
        out = [f.to_ndarray(format="rgb24").astype(np.int32) for f in b.decode(sb)]
    assert len(out) == 11
    for i in range(6):
        assert np.abs(out[2 * i] - original[i]).mean() < 2


def test_missing_pyav_is_one_clear_error(tmp_path, monkeypatch):
    """Videos are known by content, so without PyAV a file Pillow cannot read may be one."""
    (tmp_path / "clip.mp4").write_bytes(b"\0" * 64)
    monkeypatch.setitem(sys.modules, "av", None)  # makes "import av" raise ImportError
    with pytest.raises(BadInputError) as info:
        open_clip(tmp_path / "clip.mp4")
    assert str(info.value).endswith(media.VIDEO_EXTRA) and "\n" not in str(info.value)


def failing(at, exception):
    def process(index, frame0, frame1, seed):
        if index == at:
            raise exception
        return average(index, frame0, frame1, seed)

    return pairwise(process)


@pytest.mark.parametrize("kind", ["directory", "gif", "apng", "webp", "mp4"])
@pytest.mark.parametrize("exception", [KeyboardInterrupt(), RuntimeError("boom")])
def test_an_interrupted_run_leaves_no_output(tmp_path, kind, exception):
    frames = random_frames(6)
    if kind == "directory":
        src, dst = tmp_path / "in", tmp_path / "out"
        src.mkdir()
        for i, frame in enumerate(frames):
            frame.save(src / f"{i}.png")
    elif kind == "mp4":
        src, dst = make_mp4(tmp_path / "in.mp4", frames), tmp_path / "out.mp4"
    else:
        suffix = {"gif": ".gif", "apng": ".png", "webp": ".webp"}[kind]
        src, dst = animation(tmp_path / f"in{suffix}", frames, duration=40), tmp_path / f"out{suffix}"
    with pytest.raises(type(exception)):
        interpolate_clip(src, dst, failing(3, exception), inflight=2, progress=False)
    assert not dst.exists()
    assert leftovers(tmp_path) == []


def test_a_failed_run_keeps_an_existing_output_file(tmp_path):
    src = animation(tmp_path / "in.gif", [f.quantize(16) for f in random_frames(4)], duration=40)
    dst = tmp_path / "out.gif"
    dst.write_bytes(b"previous result")
    with pytest.raises(RuntimeError):
        interpolate_clip(src, dst, failing(1, RuntimeError("boom")), progress=False)
    assert dst.read_bytes() == b"previous result"


def test_a_directory_output_must_be_new_or_empty(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for i, frame in enumerate(random_frames(3)):
        frame.save(src / f"{i}.png")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(BadInputError, match="not an empty directory"):
        interpolate_clip(src, tmp_path / "full", pairwise(average), progress=False)
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert interpolate_clip(src, tmp_path / "empty", pairwise(average), progress=False).frames == 5


def test_an_animation_takes_only_powers_of_two(tmp_path):
    animation(tmp_path / "in.gif", [frame.quantize(16) for frame in random_frames(3)], duration=100)
    with pytest.raises(BadInputError, match="an animated GIF takes --factor 2, 4 or 8, not --factor 5/2") as info:
        interpolate_clip(tmp_path / "in.gif", tmp_path / "out.gif", pairwise(average), factor=Fraction(5, 2),
                         progress=False)
    assert "\n" not in str(info.value) and leftovers(tmp_path) == [] and not (tmp_path / "out.gif").exists()


def mean_of_tensors(index, frame0, frame1, seed):
    """A stand-in model that sees what the model sees (a frame's tensor, 32-bit grey at its levels)."""
    return Image.fromarray(to_pixels((frame0.tensor + frame1.tensor) / 2).numpy())


def test_a_directory_of_32_bit_grey_tiffs_keeps_its_levels(tmp_path):
    """Float TIFFs (0 black, 1 white) and 32-bit integer ones are written as 16-bit grey PNGs at the
    levels the model reads: before, a float frame came out black (Pillow's conversion clips 0 to 1
    to 0 and 1) and an integer one was refused (`cannot write mode I as PNG`)."""
    ramp = np.linspace(0, 1, SIZE[0] * SIZE[1], dtype=np.float32).reshape(SIZE[1], SIZE[0])
    for mode, scale in (("F", 1.0), ("I", 65535.0)):
        src = tmp_path / mode
        src.mkdir()
        levels = [ramp * scale, (1 - ramp) * scale]
        for k, grey in enumerate(levels):
            Image.fromarray(grey if mode == "F" else grey.round().astype(np.int32)).save(src / f"{k}.tif")
        with Image.open(src / "0.tif") as written:
            assert written.mode == mode
        interpolate_clip(src, tmp_path / f"{mode}-out", pairwise(mean_of_tensors), progress=False)
        out = sorted((tmp_path / f"{mode}-out").iterdir())
        assert len(out) == 3
        for k in (0, 2):
            with Image.open(out[k]) as frame:
                assert frame.mode == "I;16"
                assert np.array_equal(np.asarray(frame), np.round(levels[k // 2] / scale * 65535).astype(np.uint16))
        with Image.open(out[1]) as middle:  # the two ramps' mean: mid-grey everywhere, within 8-bit rounding
            assert middle.mode == "I;16" and np.abs(np.asarray(middle, np.int32) - 32768).max() <= 2 * 257


@pytest.mark.parametrize("mode, fmt, written", [("CMYK", "JPEG", "RGB"), ("CMYK", "TIFF", "RGB"), ("LAB", "TIFF", "RGB"),
                                                ("F", "TIFF", "I;16"), ("I", "TIFF", "I;16")])
def test_a_pairs_middle_as_png_is_in_a_mode_png_holds(tmp_path, mode, fmt, written):
    """A pair's middle to `-o mid.png` is written as a directory clip writes one (docs/clips-and-video.md,
    "Clips"); before, frames a PNG cannot hold failed as it was saved: `cannot save a CMYK image as PNG`."""
    frames = []
    for k, picture in enumerate(random_frames(2)):
        picture = picture.convert("L").convert("F") if mode == "F" else picture.convert("I") if mode == "I" else picture.convert(mode)
        picture.save(tmp_path / f"{k}.{fmt.lower()}", format=fmt)
        frames.append(media.Frame(k, f"{k}", path=tmp_path / f"{k}.{fmt.lower()}"))
    media.save_middle(mean_of_tensors(0, *frames, 0), frames[0], frames[1], tmp_path / "mid.png")
    with Image.open(tmp_path / "mid.png") as middle:
        assert middle.format == "PNG" and middle.mode == written and middle.size == SIZE
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".", "mid"))) == ["mid.png"]


def test_a_16_bit_grey_apng_keeps_its_levels(tmp_path):
    """Its frames were converted to RGB, which clips every level above 255 (of 65535) to white: the
    originals came back as a white picture at 8 bits. Now a 16-bit grey APNG, originals exact."""
    av = pytest.importorskip("av")  # FFmpeg's APNG muxer: Pillow's finds a 16-bit frame's changes at 8 bits and drops some
    ramps = [((np.arange(SIZE[0] * SIZE[1]).reshape(SIZE[1], SIZE[0]) + 1) * k % 65536).astype(np.uint16) for k in (3, 11, 17)]
    src = tmp_path / "grey16.png"
    with av.open(str(src), "w", format="apng") as container:
        stream = container.add_stream("apng", rate=25)
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], "gray16be"
        for k, ramp in enumerate(ramps):
            frame = av.VideoFrame.from_ndarray(ramp, format="gray16le").reformat(format="gray16be")
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    interpolate_clip(src, tmp_path / "out.png", pairwise(mean_of_tensors), progress=False)
    with Image.open(tmp_path / "out.png") as out:
        assert out.n_frames == 5
        frames = []
        for k in range(5):
            out.seek(k)
            assert out.mode == "I;16"
            frames.append(np.asarray(out, np.int64))
    for k, ramp in enumerate(ramps):
        assert np.array_equal(frames[2 * k], ramp)
    for k in (1, 3):  # the mean of its neighbours, within the 8-bit rounding of the stand-in
        assert np.abs(frames[k] - (frames[k - 1] + frames[k + 1]) / 2).max() <= 257


def test_a_multi_page_tiff_is_refused_naming_it(tmp_path):
    """Pillow counts its pages, FFmpeg decodes the first alone: it went to FFmpeg as a video of one
    frame, the other pages lost, and failed on its side data (an internal error)."""
    pages = random_frames(3)
    pages[0].save(tmp_path / "pages.tif", save_all=True, append_images=pages[1:])
    with pytest.raises(BadInputError, match=r"pages.tif' holds 3 pictures \(TIFF\), which FFmpeg reads as 1: not a clip"):
        interpolate_clip(tmp_path / "pages.tif", tmp_path / "out.mkv", pairwise(average), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.tif"]
