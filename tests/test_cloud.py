"""The cloud half, E_cond, against the official implementation's conditions (tests/golden); and its
frames-codec side: the decisions sent with the frames, and the conditions re-derived from them."""

from pathlib import Path

import numpy as np
import pytest
import torch

from eden_serve import wire
from eden_serve.cloud.limits import read_chunk
from eden_serve.cloud.scene_cuts import SCENE_THRESHOLD
from eden_serve.config import PRESETS
from eden_serve.edge.conditions import EdgeEncoder
from eden_serve.errors import BadInputError, ChunkTooLargeError, FrameTooLargeError, ModelMismatchError
from eden_serve.media.frames import DEFAULT_MAX_PIXELS, load_frame, to_png
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import module_from_state
from eden_serve.model.synthetic import image_header
from eden_serve.model.synthetic import state_dict as synthetic_state_dict
from eden_serve.serving.worker import max_tokens_for


def test_cloud_conditions_match_golden(golden):
    cond = golden.cloud().encode(golden.frame0, golden.frame1, seed=golden.seed)
    a = golden.arrays
    assert cond.cond_dit.shape == a["cond_dit"].shape
    torch.testing.assert_close(cond.cond_dit, a["cond_dit"], atol=1e-5, rtol=0)
    torch.testing.assert_close(cond.cond_dec, a["cond_dec"], atol=1e-5, rtol=0)
    assert abs(cond.mean - a["stats_mean"].item()) < 1e-6
    assert abs(cond.std - a["stats_std"].item()) < 1e-6
    assert abs(cond.difference - a["difference"].item()) < 1e-5
    h, w = golden.frame0.shape[1:]
    assert cond.grid == golden.config.patch_grid(h, w) and cond.size == (h, w)


# A header that declares 4K pixels and holds none: a request judged from its headers is answered
# without decoding one; decoding it would find it unreadable (400 bad_input).
HEADER_4K = image_header("PNG", 3840, 2160)
LIMITS = dict(max_pixels=DEFAULT_MAX_PIXELS, max_side=65535, max_tokens=max_tokens_for(DEFAULT_MAX_PIXELS, PRESETS["tiny"]))


def test_a_chunk_over_the_token_budget_is_refused_from_its_headers():
    with pytest.raises(ChunkTooLargeError, match=r"^17 frames of 3840x2160 are \d+ tokens, over this server's 131072 per request"):
        read_chunk([HEADER_4K] * 17, PRESETS["tiny"], max_chunk_tokens=1 << 17, **LIMITS)


def test_frames_of_two_sizes_are_refused_from_their_headers():
    small = to_png(torch.zeros(3, 48, 64))
    with pytest.raises(BadInputError, match=r"^frames differ in size: frame0 is 3840x2160, frame16 is 64x48$"):
        read_chunk([HEADER_4K] * 16 + [small], PRESETS["tiny"], max_chunk_tokens=1 << 30, **LIMITS)
    with pytest.raises(FrameTooLargeError, match=r"^frame1 is 3840x2160 = 8294400 pixels, over the limit of 100000$"):
        read_chunk([small, HEADER_4K, b"not an image"], PRESETS["tiny"], max_chunk_tokens=1 << 30,
                   **{**LIMITS, "max_pixels": 100_000})


def test_a_chunk_is_decoded_into_one_batch_as_frames_decode_alone():
    frames = [to_png(frame) for frame in synthetic.frame_pair(40, 60)] * 2
    batch = read_chunk(frames, PRESETS["tiny"], max_chunk_tokens=1 << 17, **LIMITS)
    assert batch.shape == (4, 3, 40, 60)
    assert all(torch.equal(batch[i], load_frame(data)) for i, data in enumerate(frames))


# --- the frames codec: the edge's E_cond re-derives what the cloud would have sent -----------------

CLIP = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))  # real video, a scene cut after 05.png


def test_restored_chunk_equals_the_encoded_one_bit_for_bit(tiny_models, tiny_state):
    cloud, _ = tiny_models
    frames = [load_frame(path) for path in CLIP[:6]]
    expected = cloud.encode_chunk(frames, seed=11, scene_threshold=SCENE_THRESHOLD)
    sent = cloud.frames_chunk(frames, seed=11, scene_threshold=SCENE_THRESHOLD)
    assert sent.cuts == sorted(expected.cuts) == [3]
    # the edge's own copy of the cloud half, loaded apart from the cloud's
    edge_cond = EdgeEncoder(module_from_state(tiny_state, "cloud", PRESETS["tiny"]), PRESETS["tiny"])
    got = edge_cond.conditions(wire.decode(wire.encode(sent, cloud.config, "frames"), cloud.config))
    for name in ("cond_dit", "cond_dec"):
        assert torch.equal(getattr(got, name).values, getattr(expected, name).values)
    assert (got.means, got.stds, got.seeds, got.grid, got.size) == (expected.means, expected.stds, expected.seeds, expected.grid, expected.size)
    assert got.differences == [float(np.float32(d)) for d in expected.differences]
    assert got.cuts == expected.cuts
    assert got.copies == expected.copies  # the cut's copy: the same PNG bytes


def test_frames_of_more_than_8_bits_are_refused(tiny_models):
    cloud, _ = tiny_models
    frames = [load_frame(path) for path in CLIP[:2]]
    frames[1] = frames[1].clone()
    frames[1][0, 0, 0] = 0.5 / 65535  # a 16-bit grey level
    with pytest.raises(BadInputError, match="frame1 has more than 8 bits"):
        cloud.frames_chunk(frames)


def test_restore_refuses_frames_for_other_cloud_weights(tiny_models):
    cloud, _ = tiny_models
    other = EdgeEncoder(module_from_state(synthetic_state_dict(PRESETS["tiny"], seed=1), "cloud", PRESETS["tiny"]), PRESETS["tiny"])
    assert other.digest != cloud.digest and len(cloud.digest) == 64
    sent = cloud.frames_chunk([load_frame(path) for path in CLIP[:2]])
    with pytest.raises(ModelMismatchError, match="cloud weights") as caught:
        other.conditions(sent)
    assert caught.value.status == 409
