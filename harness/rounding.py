"""The documented bound between two computations of the same middle whose float sums may run in
other orders: another batch shape, thread count, CPU capability or device (docs/clips-and-video.md,
"Reproducible"). The middles then differ in their last float bits, which moves a rare pixel across an
8-bit rounding boundary: at most one level, on under 0.1% of the values. Where the computation is the
same, the tests demand equality instead.

A GIF cannot keep that bound: each frame's palette is chosen from its own pixels by median cut, so
one pixel a level off can move a palette entry and, with it, every pixel mapped to it. Its frames are
held to their mean instead: under one level on average, which a wrong middle (another seed, another
pair) misses by tens of levels.
"""

from __future__ import annotations

import numpy as np

LEVELS = 1
SHARE = 1e-3
GIF_MEAN = 1.0


def rounding_difference(got, want) -> str | None:
    """Why ``got`` is not ``want`` up to rounding, or None where it is."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} is not {want.shape}"
    difference = np.abs(got.astype(np.int64) - want.astype(np.int64))
    if difference.max(initial=0) > LEVELS:
        return f"a value is {difference.max()} levels off (the bound: {LEVELS})"
    if (difference > 0).mean() >= SHARE:
        return f"{(difference > 0).mean():.2%} of the values differ (the bound: {SHARE:.1%})"
    return None


def assert_within_rounding(got, want, what: str = "") -> None:
    reason = rounding_difference(got, want)
    assert reason is None, f"{what}: {reason}" if what else reason


def assert_gif_frame_close(got, want, what: str = "") -> None:
    """A GIF frame up to rounding and its palette: under one level off on average."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} is not {want.shape}"
    mean = np.abs(got.astype(np.int64) - want.astype(np.int64)).mean()
    assert mean < GIF_MEAN, f"{what}: {mean:.2f} levels off on average (the bound: {GIF_MEAN})"


def assert_same_frames(got, want, factor: int = 2) -> None:
    """The frames of two runs of one clip, in output order (an original, then its ``factor`` - 1
    middles): each original equal, each middle within the bound."""
    assert len(got) == len(want), f"{len(got)} frames, not {len(want)}"
    for k, (a, b) in enumerate(zip(got, want)):
        if k % factor == 0:
            assert np.array_equal(a, b), f"original {k // factor}"
        else:
            assert_within_rounding(a, b, f"frame {k} (a middle)")
