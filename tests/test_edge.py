"""The edge half, G_DiT + D_dec, against the official implementation's outputs (tests/golden), and
its two attention paths against each other."""

import math

import numpy as np
import torch

from eden_serve import synthetic
from eden_serve.checkpoint import module_from_state
from eden_serve.cloud import CloudEncoder
from eden_serve.config import PRESETS, preset
from eden_serve.edge import BATCH_TOKENS, EdgeModel, batches, initial_noise
from eden_serve.synthetic import frame_pair
from eden_serve.synthetic import state_dict as synthetic_state_dict


def test_noise_contract_matches_golden(golden):
    noise = golden.arrays["noise"]
    assert torch.equal(initial_noise(golden.seed, noise.shape[1], golden.config), noise)


def test_both_paths_reproduce_golden_output(golden):
    cond = golden.cloud().encode(golden.frame0, golden.frame1, seed=golden.seed)
    edge = golden.edge()
    for path in ("reference", "fast"):
        out = edge.interpolate(cond, path)
        assert out.shape == golden.arrays["output"].shape
        assert (out - golden.arrays["output"]).abs().max().item() <= 1e-4, path
        u8 = (out * 255).round().to(torch.int16)
        # A value within 1e-4 of a rounding boundary may land on the other side.
        assert (u8 - golden.arrays["output_u8"].to(torch.int16)).abs().max().item() <= 1, path


def test_bf16_stays_close_to_fp32(golden):
    """bf16 matrix products: measured max 6.6e-3, mean 1.1e-3 on tests/golden; bound 4x that."""
    cond = golden.cloud().encode(golden.frame0, golden.frame1, seed=golden.seed)
    out = golden.edge("bf16").interpolate(cond)
    error = (out - golden.arrays["output"]).abs()
    assert error.max().item() < 0.03 and error.mean().item() < 0.005


def test_fast_path_equals_reference_with_official_dimensions():
    config = PRESETS["official"]
    state = synthetic_state_dict(config, seed=3)
    cloud = CloudEncoder(module_from_state(state, "cloud", config), config)
    edge = EdgeModel(module_from_state(state, "edge", config), config)
    cond = cloud.encode(*frame_pair(50, 70), seed=5)
    fast, reference = edge.interpolate(cond, "fast"), edge.interpolate(cond, "reference")
    assert (fast - reference).abs().max().item() <= 1e-4


def test_seed_changes_output_and_same_seed_repeats(tiny_models):
    cloud, edge = tiny_models
    frames = frame_pair(40, 60)
    a, b, c = (edge.interpolate(cloud.encode(*frames, seed=s)) for s in (0, 0, 1))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_batched_pairs_equal_one_at_a_time(tiny_models):
    """A batch of pairs gives each pair's frame up to float rounding: measured max 1.8e-7 here,
    which moves a rare pixel across an 8-bit rounding boundary."""
    cloud, edge = tiny_models
    frames = [torch.from_numpy(np.array(f)).permute(2, 0, 1).float() / 255 for f in synthetic.clip(5, 70, 100)]
    chunk = cloud.encode_chunk(frames, seed=11)
    pairs = [chunk.pair(j) for j in range(chunk.pairs)]
    for path in ("fast", "reference"):
        one = torch.stack([edge.interpolate(pair, path) for pair in pairs])
        batched = edge.interpolate_batch(pairs, path)
        assert batched.shape == (4, 3, 70, 100)
        assert (batched - one).abs().max().item() <= 1e-5, path
    assert not torch.equal(one[0], one[1])  # the pairs differ, so the batch did not mix them up


def test_batches_stay_within_the_token_budget():
    assert [list(b) for b in batches(range(7), 100, 250)] == [[0, 1], [2, 3], [4, 5], [6]]
    assert [list(b) for b in batches(range(3), 100, 50)] == [[0], [1], [2]]  # at least one pair each
    assert [list(b) for b in batches(range(3), 100, 10**6)] == [[0, 1, 2]]


def test_the_batch_budget_depends_on_the_device(tiny_models):
    """On a CPU only small frames batch (README "Clip chunks"): 6 pairs at 136x240, 2 at 256x448,
    one at 480x854 with the official patch grid; a GPU takes 16 times as many tokens."""
    _, edge = tiny_models
    assert edge.batch_tokens == BATCH_TOKENS["cpu"] == 1024 and BATCH_TOKENS["cuda"] == 16384
    official = preset("official")
    sizes = [len(next(batches(range(17), math.prod(official.patch_grid(h, w)), edge.batch_tokens)))
             for h, w in ((136, 240), (256, 448), (480, 854))]
    assert sizes == [6, 2, 1]
