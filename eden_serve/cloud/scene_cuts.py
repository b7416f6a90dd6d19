"""Scene cuts: which pairs of a chunk straddle a cut, so that the cloud sends the earlier frame as
the middle of such a pair and the edge spends nothing on it.

A pair across a cut changes both its structure and its colours, a pair within a shot at most one
of them (fast motion blurs the structure, light shifts the colours): :func:`scene_change` adds the
two, measured on small thumbnails. :func:`scene_cuts` is the cloud's test on a chunk's frames.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Measured on real clips (docs/clips-and-video.md, "Video"); 0.9 sits about 0.3 from the nearest
# score on either side.
SCENE_THRESHOLD = 0.9
SCENE_THUMBNAIL_WIDTH = 64
# A thumbnail's rows at most (an aspect of 16:1): a frame taller than that is squeezed, as one wider
# than 64:7 is stretched. Its rows followed the frame's aspect, so a 1x65536 frame's thumbnail was
# 64 x 4194304 (201 s and 17 GiB for one pair, within every limit of a request).
SCENE_THUMBNAIL_ROWS = 16 * SCENE_THUMBNAIL_WIDTH
SCENE_BINS = 8  # per RGB channel: a joint histogram of 512 bins
SSIM_WINDOW = 7


def _thumbnail(frame: torch.Tensor) -> torch.Tensor:
    """[3, H, W] -> [3, h, 64], averaged over areas: noise and compression artefacts fade out."""
    height = min(SCENE_THUMBNAIL_ROWS, max(SSIM_WINDOW, round(frame.shape[-2] * SCENE_THUMBNAIL_WIDTH / frame.shape[-1])))
    return F.interpolate(frame[None].float(), size=(height, SCENE_THUMBNAIL_WIDTH), mode="area")[0]


def _local_mean(image: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(image, SSIM_WINDOW, stride=1)


def _ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean structural similarity of two [h, w] images in [0, 1], over uniform 7x7 windows."""
    x, y = a[None, None], b[None, None]
    mx, my = _local_mean(x), _local_mean(y)
    vx, vy = _local_mean(x * x) - mx * mx, _local_mean(y * y) - my * my
    cov = _local_mean(x * y) - mx * my
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    return ((2 * mx * my + c1) * (2 * cov + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2))).mean()


def _histogram(thumbnail: torch.Tensor) -> torch.Tensor:
    bins = (thumbnail.clamp(0, 1) * SCENE_BINS).long().clamp_max(SCENE_BINS - 1)
    index = (bins[0] * SCENE_BINS + bins[1]) * SCENE_BINS + bins[2]
    return torch.bincount(index.flatten(), minlength=SCENE_BINS ** 3) / index.numel()


def scene_features(frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`scene_change` compares of a [3, H, W] frame: its luma thumbnail and its colour
    histogram (a clip's frames are each measured once, then compared pair by pair)."""
    thumbnail = _thumbnail(frame)
    luma = torch.tensor([0.299, 0.587, 0.114], device=thumbnail.device)[:, None, None]
    return (thumbnail * luma).sum(0), _histogram(thumbnail)


def feature_change(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> float:
    """:func:`scene_change` from two frames' :func:`scene_features`."""
    structure = 1 - _ssim(a[0], b[0])
    colours = (a[1] - b[1]).abs().sum() / 2
    return (structure + colours).item()


def scene_change(frame0: torch.Tensor, frame1: torch.Tensor) -> float:
    """How unlike two [3, H, W] frames in [0, 1] are: 1 - SSIM of their luma thumbnails plus the
    total variation distance of their colour histograms; 0 for equal frames, at most 3."""
    return feature_change(scene_features(frame0), scene_features(frame1))


def scene_cuts(frames: list[torch.Tensor], threshold: float | None) -> list[int]:
    """The pairs of consecutive [3, H, W] ``frames`` that straddle a scene cut: their
    :func:`scene_change` is over ``threshold``, or their frames are equal (a cut's copy and its
    earlier frame, at the next level of a 4x run); none where ``threshold`` is None (detection off).
    Each frame is measured once, then compared pair by pair."""
    if threshold is None:
        return []
    features = [scene_features(frame) for frame in frames]
    return [j for j in range(len(frames) - 1)
            if torch.equal(frames[j], frames[j + 1]) or feature_change(features[j], features[j + 1]) > threshold]
