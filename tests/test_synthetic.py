"""The synthetic stand-ins: deterministic, of the official layout, and shaped like the real things."""

import numpy as np
import pytest
import torch

from eden_serve.config import PRESETS
from eden_serve.model import synthetic
from eden_serve.model.weights import expected_layout

TINY = PRESETS["tiny"]


def test_weights_are_deterministic_and_of_the_official_layout():
    a, b, c = synthetic.state_dict(TINY, 0), synthetic.state_dict(TINY, 0), synthetic.state_dict(TINY, 1)
    assert {k: tuple(v.shape) for k, v in a.items()} == expected_layout(TINY)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["proj_in.weight"], c["proj_in.weight"])


@pytest.mark.parametrize("size", [(256, 448), (64, 96), (33, 70)])
def test_scene_frames_move_and_keep_their_size(size):
    first, second = synthetic.scene(*size, 0.0), synthetic.scene(*size, 1.0)
    assert first.shape == (*size, 3) and first.dtype == np.uint8
    assert not np.array_equal(first, second)
    assert np.array_equal(first, synthetic.scene(*size, 0.0))


def test_a_clip_keeps_moving_on_screen(tmp_path):
    frames = [np.asarray(f) for f in synthetic.clip(12, 64, 96)]
    assert all(not np.array_equal(a, b) for a, b in zip(frames, frames[1:]))
    # The ball (orange: red well above blue) stays inside the frame to the end.
    last = frames[-1].astype(int)
    assert ((last[..., 0] - last[..., 2]) > 100).sum() > 50
    folder = synthetic.write_clip(tmp_path / "clip", 3, 64, 96)
    assert sorted(p.name for p in folder.iterdir()) == ["frame0.png", "frame1.png", "frame2.png"]


def test_frame_pair_is_the_scene_as_tensors():
    frame0, frame1 = synthetic.frame_pair(40, 60)
    assert frame0.shape == (3, 40, 60) and frame0.dtype == torch.float32
    assert np.array_equal((frame0 * 255).round().byte().permute(1, 2, 0).numpy(), synthetic.scene(40, 60, 0.0))


@pytest.mark.parametrize("profile", ["plain", "outliers"])
def test_chunks_are_layer_norm_outputs_on_the_encoder_grid(profile):
    chunk = synthetic.chunk(TINY, (100, 130), frames=3, profile=profile, seed=2)
    assert chunk.grid == TINY.patch_grid(100, 130) == (8, 10) and chunk.size == (100, 130)
    assert (chunk.frames, chunk.pairs, chunk.seeds) == (3, 2, [2, 3])
    tokens = chunk.cond_dit.frames(0, 3)
    assert tokens.shape == chunk.cond_dec.frames(0, 3).shape == (3, 80, TINY.hidden_dim)
    # Per token, a LayerNorm output with weight ~1 and bias ~0: mean near 0.
    assert tokens.mean(-1).abs().max() < 0.5
    assert torch.equal(tokens, synthetic.chunk(TINY, (100, 130), frames=3, profile=profile, seed=2).cond_dit.frames(0, 3))
