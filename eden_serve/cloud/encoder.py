"""The cloud side, E_cond: consecutive frames -> a :class:`~eden_serve.wire.Chunk` of conditions.

Pad to whole query patches, normalise each frame by its own statistics, embed patches twice (one
embedding for the DiT, one for the decoder), add positions, LayerNorm; plus the frame-difference
scalar. Only the four ``*_cond_*`` modules' weights are needed here. And the scene-cut test
(:func:`scene_change`), so that a pair across a cut costs the edge nothing.

With the frames codec the cloud sends the frames and its decisions instead
(:meth:`CloudEncoder.frames_chunk`), and the edge runs this same E_cond on them
(:meth:`CloudEncoder.restore`).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..config import EdenConfig
from ..errors import BadInputError, ChunkTooLargeError, FrameTooLargeError, ModelMismatchError
from ..media.frames import check_frame, from_uint8, image_to_tensor, open_image, to_pixels, to_png, to_uint8
from ..model import CloudWeights, pos_embedding
from ..wire import DEFAULT_CODEC, Chunk, Conditions, FramesChunk, Tokens


# Tokens per batched patch embedding (see encode_chunk): 8192 x 768 float32 is 25 MB.
EMBED_TOKENS = 8192


def pad_frames(frames: torch.Tensor, config: EdenConfig) -> torch.Tensor:
    """[B, 3, H, W] -> [B, 3, H_pad, W_pad], replicating the border."""
    top, bottom, left, right = config.padding(*frames.shape[-2:])
    return F.pad(frames, (left, right, top, bottom), mode="replicate")


def read_chunk(images: Sequence[bytes], config: EdenConfig, max_pixels: int, max_side: int, max_tokens: int,
               max_chunk_tokens: int) -> torch.Tensor:
    """A request's frames, image files ``frame0`` ... ``frameK`` -> [F, 3, H, W] float32 in [0, 1].

    Judged from the headers before a pixel is decoded, with the statuses decoding them first would
    give: each frame readable (400), within ``max_pixels``, ``max_side`` and ``max_tokens`` (413);
    all of one size (400); ``max_chunk_tokens`` in all (413). Then decoded one at a time into the
    batch, so a request's memory is bounded by the chunk limit: the batch, plus one frame's
    decoding (its 8-bit pixels), whatever its files declare.
    """
    sizes = []
    for i, data in enumerate(images):
        width, height = check_frame(data, f"frame{i}", max_pixels, max_side)
        check_tokens(width, height, 1, config, max_pixels, max_tokens, max_chunk_tokens, f"frame{i}")
        sizes.append((width, height))
    (width, height), count = sizes[0], len(sizes)
    for i, size in enumerate(sizes[1:], 1):
        if size != (width, height):
            raise BadInputError(f"frames differ in size: frame0 is {width}x{height}, frame{i} is {size[0]}x{size[1]}")
    check_tokens(width, height, count, config, max_pixels, max_tokens, max_chunk_tokens)
    batch = torch.empty(count, 3, height, width)
    for i, data in enumerate(images):
        image = open_image(data, f"frame{i}", max_pixels, max_side)
        if image.size != (width, height):  # an orientation stated after the pixel data, which the header read skips
            raise BadInputError(f"frame{i} decodes to {image.width}x{image.height}, not the {width}x{height} its header states")
        image_to_tensor(image, batch[i])
        del image
    return batch


def check_tokens(width: int, height: int, count: int, config: EdenConfig, max_pixels: int, max_tokens: int,
                 max_chunk_tokens: int, name: str = "frame") -> None:
    """``count`` frames of ``width`` x ``height`` within the token limits of one frame (413
    ``frame_too_large``) and of one request (413 ``chunk_too_large``)."""
    ph, pw = config.patch_grid(height, width)
    if ph * pw > max_tokens:
        raise FrameTooLargeError(
            f"{name} is {width}x{height}, which pads to {ph * pw} tokens, over this server's {max_tokens} "
            f"(frames of up to {max_pixels} pixels and aspect ratio up to 4:1)"
        )
    if count * ph * pw > max_chunk_tokens:
        raise ChunkTooLargeError(
            f"{count} frames of {width}x{height} are {count * ph * pw} tokens, over this server's {max_chunk_tokens} "
            f"per request; send at most {max_chunk_tokens // (ph * pw)} frames of this size"
        )


class CloudEncoder:
    def __init__(self, weights: CloudWeights, config: EdenConfig, device: str | torch.device = "cpu"):
        self.config = config
        self.device = torch.device(device)
        self.weights = weights.to(self.device).eval()

    @torch.inference_mode()
    def encode_chunk(self, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None,
                     on_device: bool = False) -> Chunk:
        """F >= 2 consecutive [3, H, W] float frames in [0, 1] -> their chunk for the edge: every frame
        embedded once, in batched patch embeddings; pair j gets seed ``seed + j``. A pair whose
        :func:`scene_change` passes ``scene_threshold`` (None: detection off) is a cut: its middle
        is the earlier frame, which travels as a PNG instead of costing the edge its DiT. So is a
        pair of equal frames, such as a cut's copy and its earlier frame at the next level of a 4x
        run: all the frames across a cut are then copies. The tokens come back on the CPU for the
        wire, or with ``on_device`` where they were made, for an edge in the same process: then each
        cut's middle is the earlier frame's 8-bit pixels [H, W, 3] on the device, no PNG made."""
        x = self._frames(frames)
        differences, cuts = self._pairs(x, scene_threshold)
        cond_dit, cond_dec, means, stds = self._embed_frames(x)
        return Chunk(
            cond_dit=Tokens(cond_dit if on_device else cond_dit.cpu()),
            cond_dec=Tokens(cond_dec if on_device else cond_dec.cpu()),
            means=means,
            stds=stds,
            differences=differences,
            seeds=[seed + j for j in range(len(x) - 1)],
            grid=self.config.patch_grid(*x[0].shape[-2:]),
            size=tuple(x[0].shape[-2:]),
            cuts={j: to_pixels(x[j]) if on_device else to_png(x[j].cpu()) for j in cuts},
        )

    @torch.inference_mode()
    def frames_chunk(self, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None) -> FramesChunk:
        """What the frames codec sends: the frames as 8-bit pixels, and the same decisions about
        their pairs as :meth:`encode_chunk` makes (differences, cuts, seeds). The edge makes the
        tokens with :meth:`restore`. Frames of more than 8 bits (16-bit grey) are refused: their
        pixels would not give back the same tensors."""
        x = self._frames(frames)
        pixels = np.stack([to_uint8(frame.cpu()) for frame in x])
        for i, frame in enumerate(x):
            if not torch.equal(from_uint8(pixels[i]).to(self.device), frame):
                raise BadInputError(f"frame{i} has more than 8 bits per channel, which the frames codec does not carry; "
                                    f"use a token codec such as {DEFAULT_CODEC}")
        differences, cuts = self._pairs(x, scene_threshold)
        return FramesChunk(pixels, differences, [seed + j for j in range(len(x) - 1)], cuts, self.digest)

    @torch.inference_mode()
    def restore(self, chunk: FramesChunk) -> Chunk:
        """The edge's half of the frames codec: the chunk :meth:`encode_chunk` makes of these
        frames, with the cloud's decisions. The same weights, frames and threads give the same
        tokens bit for bit, so the edge computes what the fp32 codec would have given it."""
        if chunk.cloud != self.digest:
            raise ModelMismatchError(
                f"payload's frames are for cloud weights {chunk.cloud[:16]}, but this edge derives conditions with "
                f"{self.digest[:16]}; deploy the archives of one archive.sh run to cloud and edge"
            )
        x = [from_uint8(frame).to(self.device) for frame in chunk.pixels]
        cond_dit, cond_dec, means, stds = self._embed_frames(x)
        return Chunk(
            Tokens(cond_dit.cpu()), Tokens(cond_dec.cpu()), means, stds, chunk.differences, chunk.seeds,
            self.config.patch_grid(*chunk.size), chunk.size, {j: to_png(x[j].cpu()) for j in chunk.cuts},
        )

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 of the weights (names, shapes and float32 values), which a frames payload names."""
        hasher = hashlib.sha256()
        for name, value in sorted(self.weights.state_dict().items()):
            hasher.update(f"{name}:{tuple(value.shape)}:".encode())
            hasher.update(value.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
        return hasher.hexdigest()

    def _frames(self, frames: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        shape = frames[0].shape
        assert len(frames) >= 2 and len(shape) == 3 and shape[0] == 3 and all(f.shape == shape for f in frames), "checked by the caller"
        return [frame.to(self.device, torch.float32) for frame in frames]

    def _pairs(self, x: list[torch.Tensor], scene_threshold: float | None) -> tuple[list[float], list[int]]:
        """Each pair's difference scalar, and the pairs across a scene cut."""
        norms = [self._channel_norm(frame) for frame in x]  # each frame's once, not once per pair
        differences = [self._difference(x[j], x[j + 1], norms[j], norms[j + 1]).item() for j in range(len(x) - 1)]
        del norms
        cut = [False] * (len(x) - 1)
        if scene_threshold is not None:
            features = [scene_features(frame) for frame in x]
            cut = [torch.equal(x[j], x[j + 1]) or feature_change(features[j], features[j + 1]) > scene_threshold
                   for j in range(len(x) - 1)]
        return differences, [j for j in range(len(x) - 1) if cut[j]]

    def _embed_frames(self, x: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[float], list[float]]:
        """Every frame's tokens [F, N, D] for the DiT and for the decoder, and its statistics."""
        ph, pw = self.config.patch_grid(*x[0].shape[-2:])
        pos = pos_embedding(self.config, ph, pw, 1, self.device)
        w = self.weights
        cond_dit = torch.empty(len(x), ph * pw, self.config.hidden_dim, device=self.device)
        cond_dec = torch.empty_like(cond_dit)
        means, stds = [], []
        # Frames go through in groups of at most EMBED_TOKENS tokens: each intermediate then stays
        # under glibc's 32 MB mmap ceiling and is reused from the heap, rather than mapped and
        # faulted in afresh for every chunk (which cost a long chunk a third more time per frame).
        step = max(1, EMBED_TOKENS // (ph * pw))
        for start in range(0, len(x), step):
            padded = pad_frames(torch.stack(x[start : start + step]), self.config)
            mean = padded.mean(dim=(1, 2, 3), keepdim=True)
            std = padded.std(dim=(1, 2, 3), keepdim=True) + 1e-8
            patches = self._patches(padded.sub_(mean).div_(std))
            for conv, norm, out in ((w.patch_cond_dit, w.norm_cond_dit, cond_dit), (w.patch_cond_dec, w.norm_cond_dec, cond_dec)):
                out[start : start + step] = norm(self._embed(conv, patches).add_(pos))
            means += mean.flatten().tolist()
            stds += std.flatten().tolist()
        return cond_dit, cond_dec, means, stds

    def encode(self, frame0: torch.Tensor, frame1: torch.Tensor, seed: int = 0) -> Conditions:
        """Two frames -> the conditions of their pair (the chunk of two, unpacked)."""
        return self.encode_chunk([frame0, frame1], seed).pair(0)

    def _patches(self, frames: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, N, 3 p p]: non-overlapping patches, row-major, in the conv's order."""
        b, c, h, w = frames.shape
        p = self.config.patch_size
        patches = frames.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return patches.reshape(b, (h // p) * (w // p), c * p * p)

    @staticmethod
    def _embed(conv: torch.nn.Conv2d, patches: torch.Tensor) -> torch.Tensor:
        # A stride-p conv with a p x p kernel is one matrix product over the patches, which the
        # CPU runs several times faster than its convolution kernel for this shape.
        return F.linear(patches, conv.weight.flatten(1), conv.bias)

    @staticmethod
    def _channel_norm(frame: torch.Tensor) -> torch.Tensor:
        """[3, H, W] -> [H, W]: each pixel's colour norm, as ``cosine_similarity`` takes it (eps 1e-8)."""
        return (frame * frame).sum(0).sqrt().clamp_min(1e-8)

    def _difference(self, a: torch.Tensor, b: torch.Tensor, norm_a: torch.Tensor, norm_b: torch.Tensor) -> torch.Tensor:
        """Standardised mean cosine similarity of two unpadded frames along channels, given their
        :meth:`_channel_norm`.

        Written out (as ``cosine_similarity`` defines it): its norm kernel reduces over the
        3-channel axis about 20x slower than these sums.
        """
        cos = ((a * b).sum(0) / (norm_a * norm_b)).mean()
        return (cos - self.config.cos_sim_mean) / self.config.cos_sim_std


# Scene cuts: a pair across a cut changes both its structure and its colours, a pair within a shot
# at most one of them (fast motion blurs the structure, light shifts the colours). Measured on real
# clips (docs/clips-and-video.md, "Video"); 0.9 sits about 0.3 from the nearest score on either side.
SCENE_THRESHOLD = 0.9
SCENE_THUMBNAIL_WIDTH = 64
SCENE_BINS = 8  # per RGB channel: a joint histogram of 512 bins
SSIM_WINDOW = 7


def _thumbnail(frame: torch.Tensor) -> torch.Tensor:
    """[3, H, W] -> [3, h, 64], averaged over areas: noise and compression artefacts fade out."""
    height = max(SSIM_WINDOW, round(frame.shape[-2] * SCENE_THUMBNAIL_WIDTH / frame.shape[-1]))
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


def is_scene_cut(frame0: torch.Tensor, frame1: torch.Tensor, threshold: float | None = SCENE_THRESHOLD) -> bool:
    """True when the pair straddles a scene cut; ``threshold=None`` turns detection off."""
    return threshold is not None and scene_change(frame0, frame1) > threshold
