"""The cloud's scene-cut test on a real clip: two real videos joined at the same size."""

from pathlib import Path

import pytest
import torch

from eden_serve.cloud import SCENE_THRESHOLD, is_scene_cut, scene_change
from eden_serve.frames import load_frame

CLIP = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))


@pytest.fixture(scope="module")
def frames():
    return [load_frame(path) for path in CLIP]


def test_the_cut_pair_is_flagged_and_no_other(frames):
    flagged = [(a.name, b.name) for a, b, f0, f1 in zip(CLIP, CLIP[1:], frames, frames[1:]) if is_scene_cut(f0, f1)]
    assert flagged == [("05.png", "06.png")]


def test_the_default_threshold_has_a_margin_on_both_sides(frames):
    changes = [scene_change(a, b) for a, b in zip(frames, frames[1:])]
    cut = changes.pop(3)
    assert max(changes) < SCENE_THRESHOLD / 2 and cut > SCENE_THRESHOLD * 1.5


def test_no_threshold_turns_detection_off(frames):
    assert not any(is_scene_cut(a, b, threshold=None) for a, b in zip(frames, frames[1:]))


def test_the_change_is_zero_for_equal_frames_and_symmetric(frames):
    a, b = frames[3], frames[4]
    assert scene_change(a, a) == pytest.approx(0, abs=1e-6)
    assert scene_change(a, b) == pytest.approx(scene_change(b, a), abs=1e-6)


def test_frames_smaller_than_the_thumbnail_are_measured(frames):
    small = [torch.nn.functional.interpolate(f[None], size=(5, 12), mode="area")[0] for f in frames[3:5]]
    assert is_scene_cut(*small)
