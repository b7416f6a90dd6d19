"""A retimed output computes only the middles its frames show and their ancestors, each the middle a
full 2x pass of its depth computes (same pair number, same seed), written in order."""

from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.streaming import interpolate_clip
from eden_serve.errors import BadInputError, PairError
from eden_serve.model import synthetic

SIZE = (48, 32)  # width, height


def seeded(calls):
    """A processor whose middle is the neighbours' mean plus the pair's seed: it tells which pair
    number of its depth a middle was computed as."""

    def process(index, frames, seed):
        calls.append((index, seed, [f.name for f in frames]))
        out = []
        for j, (a, b) in enumerate(zip(frames, frames[1:])):
            mean = (np.asarray(a.image, np.float32) + np.asarray(b.image, np.float32)) / 2
            out.append(Image.fromarray(np.clip(mean.round() + seed + j, 0, 255).astype(np.uint8)))
        return out

    return process


def pixels(directory):
    return [np.asarray(Image.open(p)) for p in sorted(directory.iterdir())]


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_factor_5_2_shows_the_factor_4_middles_and_computes_no_others(tmp_path, chunk):
    """6 frames, 5 intervals; outputs at k * 2/5 frames: per interval pair {0, 2/5 -> 1/2, 4/5 -> 3/4},
    {1/5 -> 1/4, 3/5 -> 1/2} (see test_timing), so 13 frames and 2 middles an interval."""
    src = synthetic.write_clip(tmp_path / "in", 6, SIZE[1], SIZE[0])
    full, sparse = [], []
    interpolate_clip(src, tmp_path / "x4", seeded(full), chunk=chunk, seed=40, factor=4, progress=False)
    summary = interpolate_clip(src, tmp_path / "x2.5", seeded(sparse), chunk=chunk, seed=40, factor=Fraction(5, 2),
                               progress=False)
    quarters = [0, 2, 3, 5, 6, 8, 10, 11, 13, 14, 16, 18, 19]  # 4i + 4 * shown, interval i
    got, expected = pixels(tmp_path / "x2.5"), pixels(tmp_path / "x4")
    assert len(got) == summary.frames == 13
    assert all(np.array_equal(got[k], expected[q]) for k, q in enumerate(quarters))
    assert summary.pairs == 10 == sum(len(names) - 1 for _, _, names in sparse)
    # Every call is a run of consecutive pairs of one depth, seeded from its first pair's number.
    assert all(seed == 40 + index for index, seed, _ in sparse)
    assert sorted(p.name for p in (tmp_path / "x2.5").iterdir()) == [f"{k:06d}.png" for k in range(13)]


def test_every_chunk_holds_at_most_chunk_pairs_cut_at_its_multiples(tmp_path):
    src = synthetic.write_clip(tmp_path / "in", 9, SIZE[1], SIZE[0])
    calls = []
    interpolate_clip(src, tmp_path / "out", seeded(calls), chunk=3, factor=Fraction(7, 2), progress=False)
    for index, _, names in calls:
        pairs = len(names) - 1
        assert 1 <= pairs <= 3
        assert index // 3 == (index + pairs - 1) // 3  # never across a multiple of the chunk


def test_memory_is_bounded_by_the_windows_not_the_clip(tmp_path, live_frames):
    most = {}
    for count in (30, 90):
        src = synthetic.write_clip(tmp_path / f"in{count}", count, SIZE[1], SIZE[0])
        peak = [0]
        calls = []
        process = seeded(calls)

        def counting(index, frames, seed):
            peak[0] = max(peak[0], len(live_frames))
            return process(index, frames, seed)

        interpolate_clip(src, tmp_path / f"out{count}", counting, chunk=2, factor=Fraction(10, 3), inflight=2,
                         progress=False)
        most[count] = peak[0]
    # inflight + 1 windows, each chunk + 1 originals and at most 7 middles an interval (the depth-3
    # tree: a tolerance of 1/4 * 3/10 of an interval needs eighths): 3 * (3 + 14), whatever the length.
    assert max(most.values()) <= 51 < 90, most


def test_a_failing_pair_stops_the_run_and_leaves_nothing(tmp_path):
    src = synthetic.write_clip(tmp_path / "in", 8, SIZE[1], SIZE[0])
    calls = []
    process = seeded(calls)

    def failing(index, frames, seed):
        if len(calls) == 4:
            raise BadInputError("broken pair")
        return process(index, frames, seed)

    with pytest.raises(PairError, match="broken pair"):
        interpolate_clip(src, tmp_path / "out", failing, chunk=2, factor=3, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_one_frame_gives_one_frame(tmp_path):
    src = synthetic.write_clip(tmp_path / "in", 1, SIZE[1], SIZE[0])
    summary = interpolate_clip(src, tmp_path / "out", seeded([]), factor=3, progress=False)
    assert (summary.pairs, summary.frames) == (0, 1)
