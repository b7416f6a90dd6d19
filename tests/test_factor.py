"""--factor 4 and 8: level l is a 2x pass over level l - 1's frames, with the same seed and chunk.

In process with the tiny model, factor 4 (8) must equal two (three) runs of 2x file for file; the
writers place the middles at 1/F, 2/F, ... of each interval (video time stamps, animation delays).
One test runs factor 4 through a real TorchServe in the split deployment.
"""

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image
from test_video import CFR_12, audio_end, frame_times, make_video, packets, video_end

from eden_serve.client import Client
from eden_serve.clips.pipeline import interpolate_clip_in_process
from eden_serve.commands.cli import main
from eden_serve.errors import BadInputError
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import load_archived
from harness.servers import build_archives, torchserve
from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.serving.worker import default_threads, usable_cores

SIZE = (96, 64)  # width, height


def files(directory):
    """name -> bytes of every file of an output directory."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def passes_of_2x(src, dst, count, run):
    """``count`` runs of 2x, each over the output of the one before; the last writes ``dst``."""
    for k in range(count):
        out = dst if k == count - 1 else dst.with_name(f"{dst.name}-pass{k + 1}")
        run(src, out, 2)
        src = out
    return dst


@pytest.mark.parametrize("factor, frames, chunk", [(4, 6, 3), (8, 3, 2)])
def test_factor_equals_passes_of_2x_with_the_same_seed(tmp_path, tiny_models, factor, frames, chunk):
    src = synthetic.write_clip(tmp_path / "in", frames, SIZE[1], SIZE[0])

    def run(source, out, f):
        return interpolate_clip_in_process(source, out, *tiny_models, seed=11, chunk=chunk, factor=f, progress=False)

    summary = run(src, tmp_path / "direct", factor)
    expected = passes_of_2x(src, tmp_path / "passes", factor.bit_length() - 1, run)
    assert (summary.pairs, summary.frames) == ((factor - 1) * (frames - 1), factor * (frames - 1) + 1)
    got = files(tmp_path / "direct")
    assert len(got) == factor * (frames - 1) + 1
    assert got == files(expected)  # same names, same bytes: middles exactly as two (three) passes make them
    originals = list(got.values())[::factor]
    assert originals == [(src / f"frame{i}.png").read_bytes() for i in range(frames)]


def test_at_factor_4_all_three_frames_across_a_cut_are_copies(tmp_path, tiny_models):
    """The real clip of two videos joined between 05.png and 06.png: the cut's middle is a copy of
    05.png, and at the next level so are the middles of (05.png, copy), a pair of equal frames, and
    (copy, 06.png), a cut again. No other level-1 middle is a copy (synthetic weights make level-2
    pairs unlike one another, so they say nothing here). Still two 2x passes, file for file."""
    src = Path(__file__).parent / "data" / "scene_cut"
    names = sorted(p.name for p in src.glob("*.png"))

    def run(source, out, f):
        return interpolate_clip_in_process(source, out, *tiny_models, chunk=3, factor=f, progress=False)

    run(src, tmp_path / "direct", 4)
    out = [np.asarray(Image.open(p).convert("RGB")) for p in sorted((tmp_path / "direct").iterdir())]
    cut = names.index("05.png")
    assert all(np.array_equal(out[4 * cut + k], out[4 * cut]) for k in (1, 2, 3))
    assert [k // 4 for k in range(2, len(out), 4) if np.array_equal(out[k], out[k - 2])] == [cut]
    assert files(tmp_path / "direct") == files(passes_of_2x(src, tmp_path / "passes", 2, run))


def solid(value, mode="RGB"):
    return Image.new("RGB", SIZE, (value,) * 3).convert(mode)


def average(index, frame0, frame1, seed):
    mean = (np.asarray(frame0.image.convert("RGB"), np.float32) + np.asarray(frame1.image.convert("RGB"), np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))


def test_levels_seed_chunk_and_place_every_middle(tmp_path):
    """Grey levels 0, 64, 128: averaging puts each level-2 middle at its quarter exactly; the
    calls of each level are a 2x pass over the frames of the level before, seeded from 100."""
    src = tmp_path / "in"
    src.mkdir()
    for i, value in enumerate((0, 64, 128)):
        solid(value).save(src / f"frame{i}.png")
    calls = []

    def recording(index, frames, seed):
        calls.append((index, seed, [int(np.asarray(f.image)[0, 0, 0]) for f in frames]))
        return [average(index, a, b, seed) for a, b in zip(frames, frames[1:])]

    summary = interpolate_clip(src, tmp_path / "out", recording, chunk=2, seed=100, factor=4, progress=False)
    values = [int(np.asarray(Image.open(p))[0, 0, 0]) for p in sorted((tmp_path / "out").iterdir())]
    assert values == [0, 16, 32, 48, 64, 80, 96, 112, 128]
    assert (summary.pairs, summary.frames) == (6, 9)
    assert sorted(calls) == sorted([(0, 100, [0, 64, 128]), (0, 100, [0, 32, 64]), (2, 102, [64, 96, 128])])


@pytest.mark.parametrize("mode", ["RGBA", "L", "P"])
def test_middles_take_their_neighbours_format_as_a_2x_pass_writes_them(tmp_path, mode):
    rng = np.random.default_rng(1)
    src = tmp_path / "in"
    src.mkdir()
    for i in range(3):
        rgba = rng.integers(0, 256, (SIZE[1], SIZE[0], 4), dtype=np.uint8)
        image = Image.fromarray(rgba, "RGBA")
        (image.convert("RGB").quantize(32) if mode == "P" else image.convert(mode)).save(src / f"frame{i}.png")

    def run(source, out, f):
        return interpolate_clip(source, out, pairwise(average), chunk=2, factor=f, progress=False)

    run(src, tmp_path / "direct", 4)
    assert files(tmp_path / "direct") == files(passes_of_2x(src, tmp_path / "passes", 2, run))
    assert {Image.open(p).mode for p in (tmp_path / "direct").iterdir()} == {mode}


def animation(path, count, durations):
    frames = [solid(40 * i).quantize(16) if path.suffix == ".gif" else solid(40 * i) for i in range(count)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=durations, loop=0,
                   **({"lossless": True} if path.suffix == ".webp" else {}))
    return path


def durations_of(path):
    with Image.open(path) as image:
        out = []
        for i in range(image.n_frames):
            image.seek(i)
            image.load()
            out.append(image.info.get("duration", 0))  # a GIF frame of no delay has none
        return out


@pytest.mark.parametrize("suffix, tick", [(".gif", 10), (".png", 0.5), (".webp", 1)])
@pytest.mark.parametrize("factor", [4, 8])
def test_animation_delays_split_in_whole_ticks_keeping_each_total(tmp_path, suffix, tick, factor):
    durations = [70, 40, 130, 10, 90]
    src = animation(tmp_path / f"in{suffix}", 5, durations)
    dst = tmp_path / f"out{suffix}"
    interpolate_clip(src, dst, pairwise(average), chunk=3, factor=factor, progress=False)
    got = durations_of(dst)
    assert len(got) == factor * 4 + 1
    for i, total in enumerate(durations[:-1]):
        parts = got[factor * i : factor * (i + 1)]
        assert sum(parts) == total, (i, parts)
        ticks = [round(part / tick) for part in parts]
        assert max(ticks) - min(ticks) <= 1 and ticks[0] == max(ticks), (i, parts)  # whole ticks, spread evenly
    assert abs(got[-1] - durations[-1] / factor) < tick  # the last frame: its first share, as at 2x


def test_video_middles_sit_at_each_quarter_and_the_audio_is_kept(tmp_path):
    times = [0, 40, 80, 200, 240, 250, 290]  # milliseconds, a variable frame rate
    src = make_video(tmp_path / "in.mkv", times, Fraction(1, 1000))
    dst = tmp_path / "out.mkv"
    summary = interpolate_clip(src, dst, pairwise(average), chunk=2, factor=4, progress=False)
    assert summary.frames == 4 * 6 + 1
    seconds = [Fraction(t, 1000) for t in times]
    expected = [a + k * (b - a) / 4 for a, b in zip(seconds, seconds[1:]) for k in range(4)] + seconds[-1:]
    got = frame_times(dst)
    with av.open(str(dst)) as container:
        tick = container.streams.video[0].time_base  # Matroska counts milliseconds
    assert len(got) == len(expected)
    assert all(abs(g - e) <= tick / 2 for g, e in zip(got, expected)), (got, expected)
    assert got[::4] == frame_times(src)
    assert packets(dst, "audio") == packets(src, "audio")
    assert video_end(dst) == video_end(src) and audio_end(dst) == audio_end(src)  # the last frame lasts as before


def test_video_rate_is_multiplied(tmp_path):
    src = make_video(tmp_path / "in.mp4", *CFR_12)
    interpolate_clip(src, tmp_path / "out.mp4", pairwise(average), factor=8, progress=False)
    with av.open(str(src)) as a, av.open(str(tmp_path / "out.mp4")) as b:
        assert b.streams.video[0].guessed_rate == 8 * a.streams.video[0].average_rate
        assert b.streams.video[0].frames == 8 * 11 + 1


def test_memory_is_bounded_by_the_windows_not_the_clip(tmp_path, live_frames):
    """The most frames alive at once (originals and the middles handed on) does not grow with the clip."""
    live = live_frames
    most = {}
    for count in (40, 120):
        src = synthetic.write_clip(tmp_path / f"in{count}", count, SIZE[1], SIZE[0])
        peak = [0]

        def process(index, frame0, frame1, seed):
            peak[0] = max(peak[0], len(live))
            return average(index, frame0, frame1, seed)

        interpolate_clip(src, tmp_path / f"out{count}", pairwise(process), chunk=2, factor=8, inflight=2, progress=False)
        most[count] = peak[0]
    # Per level at most: the two chunks in flight and the one being written or gathered, 3 frames each.
    assert most[120] == most[40] <= 3 * (2 + 1) * 3, most


@pytest.mark.parametrize("factor", [1, Fraction(1, 2), 65])
def test_factor_must_be_above_1_and_at_most_64(tmp_path, factor):
    src = synthetic.write_clip(tmp_path / "in", 3, SIZE[1], SIZE[0])
    with pytest.raises(BadInputError, match=f"--factor must be above 1 and at most 64, got {factor}"):
        interpolate_clip(src, tmp_path / "out", pairwise(average), factor=factor, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_command_line_factor(tmp_path, capsys):
    src = synthetic.write_clip(tmp_path / "in", 3, SIZE[1], SIZE[0])
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out"), "--factor", "8", "--config", "tiny"]) == 0
    assert len(list((tmp_path / "out").iterdir())) == 17
    assert "14 pairs, 17 frames written" in capsys.readouterr().out
    frames = [str(src / "frame0.png"), str(src / "frame1.png")]
    assert main(["interpolate", *frames, "-o", str(tmp_path / "m.png"), "--factor", "4", "--config", "tiny"]) == 2
    assert "error: --factor, --fps, --input-fps, --resume, --process-size and the video encoder options apply to a clip" in \
        capsys.readouterr().err
    assert main(["interpolate", str(src), "-o", str(tmp_path / "x"), "--factor", "3x", "--config", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--factor takes N, N/D or a decimal" in err
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """One TorchServe holding both halves, used as cloud and edge, and the in-process factor-4 output
    of a 5-frame clip with the weights of its archives and the workers' thread count."""
    root = tmp_path_factory.mktemp("split")
    src = synthetic.write_clip(root / "in", 5, SIZE[1], SIZE[0])
    store = build_archives(root / "store", config="tiny")
    threads = torch.get_num_threads()
    torch.set_num_threads(default_threads("edge", usable_cores()))
    try:
        models = load_archived(store)
        interpolate_clip_in_process(src, root / "expected", *models, seed=5, chunk=3, factor=4, progress=False)
        interpolate_clip_in_process(src, root / "expected-5-2", *models, seed=5, chunk=3, factor=Fraction(5, 2),
                                    progress=False)
    finally:
        torch.set_num_threads(threads)
    with torchserve(store, models=["eden_encoder.mar", "eden_ditdec.mar"]) as server:
        yield server, src, root / "expected"


def split_client(server, client=Client):
    return client(cloud=server.inference_url, edge=server.inference_url, token=server.keys["inference"])


@pytest.mark.serving
def test_factor_4_in_the_split_equals_in_process(tmp_path, split):
    """Each level-1 middle goes back to the cloud as a frame. One request at a time and chunks not
    ramped, so that the edge batches exactly the pairs of one chunk, as in process: the result is equal
    bit for bit (a ramped first chunk of one pair is another batch shape, whose sums may run in
    another order on some CPUs: ATEN_CPU_CAPABILITY=default showed it)."""
    server, src, expected = split
    with split_client(server) as client:
        summary = client.interpolate_clip(src, tmp_path / "out", seed=5, chunk=3, factor=4, inflight=1, ramp=False,
                                            progress=False)
    assert (summary.pairs, summary.frames) == (12, 17)
    assert summary.payload_bytes > 0
    assert files(tmp_path / "out") == files(expected)


@pytest.mark.serving
def test_factor_5_2_in_the_split_equals_in_process(tmp_path, split):
    """A retimed run sends the servers only the middles it shows and their ancestors, as in process."""
    server, src, expected = split
    with split_client(server) as client:
        summary = client.interpolate_clip(src, tmp_path / "out", seed=5, chunk=3, factor=Fraction(5, 2), inflight=1,
                                          ramp=False, progress=False)
    assert (summary.pairs, summary.frames) == (8, 11)  # 4 intervals, 2 middles each; frames at k * 2/5 up to 4
    assert files(tmp_path / "out") == files(expected.with_name("expected-5-2"))


class StoppingClient(Client):
    """Stops the run (as Ctrl-C would) when asked for level 2's pairs from 6 on."""

    def processor(self, cancel=None, inflight=None):
        process = super().processor(cancel, inflight)

        def stopping(index, frames, seed):
            if "+" in frames[0].name + frames[1].name and index >= 6:
                raise KeyboardInterrupt
            return process(index, frames, seed)

        return stopping


@pytest.mark.serving
def test_resume_through_the_servers(tmp_path, split):
    server, src, expected = split
    options = dict(seed=5, chunk=3, factor=4, inflight=1, ramp=False, progress=False, resume=True)
    with split_client(server, StoppingClient) as client, pytest.warns(UserWarning, match="stopped"):
        with pytest.raises(KeyboardInterrupt):
            client.interpolate_clip(src, tmp_path / "out", **options)
    with split_client(server) as client:
        summary = client.interpolate_clip(src, tmp_path / "out", **options)
    assert summary.resumed == 9 and summary.pairs == 3  # originals 0-3 were done: 3 + 6 pairs
    assert files(tmp_path / "out") == files(expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
