"""The cloud half, E_cond, against the official implementation's conditions (tests/golden)."""

import torch


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
