"""--process-size: the model sees the frames at the process size, the middles come back at the
clip's, the originals are untouched, and the pixel limit applies to the size the model sees."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.commands.cli import main
from eden_serve.errors import FrameTooLargeError, PairError

REAL = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))[:3]  # 160x68


def test_the_model_sees_the_process_size_and_the_middles_come_back_full_size(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for path in REAL:
        (src / path.name).write_bytes(path.read_bytes())
    seen = []

    def average(index, frame0, frame1, seed):
        seen.append((frame0.image.size, frame1.image.size))
        mean = (np.asarray(frame0.image, np.float32) + np.asarray(frame1.image, np.float32)) / 2
        return Image.fromarray(mean.round().astype(np.uint8))

    interpolate_clip(src, tmp_path / "out", pairwise(average), process_size=(34, 80), progress=False)
    assert seen == [((80, 34), (80, 34))] * 2
    out = sorted((tmp_path / "out").iterdir())
    assert [Image.open(p).size for p in out] == [(160, 68)] * 5
    assert [out[0].read_bytes(), out[2].read_bytes(), out[4].read_bytes()] == [p.read_bytes() for p in REAL]
    # The middle is the half-size mean scaled back: close to the full-size mean, not equal to it.
    with Image.open(out[1]) as middle, Image.open(REAL[0]) as a, Image.open(REAL[1]) as b:
        full = (np.asarray(a.convert("RGB"), np.float32) + np.asarray(b.convert("RGB"), np.float32)) / 2
        error = np.abs(np.asarray(middle, np.float32) - full).mean()
    assert 0 < error < 12


def test_the_pixel_limit_applies_to_the_process_size(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for path in REAL[:2]:
        (src / path.name).write_bytes(path.read_bytes())

    def first(index, frame0, frame1, seed):
        return frame0.image.convert("RGB")

    with pytest.raises(PairError, match="02.png is 160x68 = 10880 pixels, over the limit of 9600"):
        interpolate_clip(src, tmp_path / "a", pairwise(first), max_pixels=160 * 60, progress=False)
    interpolate_clip(src, tmp_path / "b", pairwise(first), max_pixels=160 * 60, process_size=(34, 80), progress=False)
    with pytest.raises(FrameTooLargeError, match="--process-size is 160x68"):
        interpolate_clip(src, tmp_path / "c", pairwise(first), max_pixels=80 * 34, process_size=(68, 160), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "in"]


@pytest.mark.parametrize("size", ["0x5", "big"])
def test_a_bad_process_size_is_one_line_and_exit_2(tmp_path, capsys, size):
    with pytest.raises(SystemExit) as info:
        main(["interpolate", str(tmp_path), "-o", str(tmp_path / "out"), "--process-size", size])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "--process-size" in err
    assert list(tmp_path.iterdir()) == []
