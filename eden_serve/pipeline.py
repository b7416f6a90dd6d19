"""The whole computation in one process: a pair, and a clip, through cloud -> wire -> edge.

What the two servers compute together, payload included, so the results equal theirs bit for bit
for the same seed, codec and thread count. With the codec ``none`` the chunk skips the wire: its
tensors go from the cloud's device to the edge's as they are (float32, device to device), as
codec ``fp32`` would deliver them.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from PIL import Image

from . import wire
from .client.processors import FunctionProcessor, Middles, Processor
from .client.streaming import DEFAULT_CHUNK, TIMELINE, ClipOptions, Summary, interpolate_clip
from .cloud.encoder import CloudEncoder
from .cloud.scene_cuts import SCENE_THRESHOLD
from .edge import AttentionPath, EdgeModel
from .edge.conditions import Intake
from .media import Frame
from .media.frames import DEFAULT_MAX_PIXELS, check_pair, load_frame, to_uint8

# The model already uses every core; a second pair overlaps reading, writing and codec work.
DEFAULT_INFLIGHT = 2


def hand_over(cloud: CloudEncoder, intake: Intake, frames: Sequence[torch.Tensor], seed: int, kind: wire.Kind,
              scene_threshold: float | None, encoded: Callable[[], None] = lambda: None) -> tuple[wire.Chunk, int]:
    """The cloud's chunk of ``frames`` as the edge's ``intake`` makes it, on the edge's device, and the
    bytes of the payload it crossed as (0 without the wire); ``encoded()`` is called once the cloud is done."""
    made = kind.make(cloud, frames, seed, scene_threshold)
    encoded()
    received, payload_bytes = kind.cross(made, cloud.config, intake.config)
    return kind.conditions(received, intake), payload_bytes


def interpolate_pair(
    cloud: CloudEncoder,
    edge: EdgeModel,
    frame0: torch.Tensor,
    frame1: torch.Tensor,
    seed: int = 0,
    codec: str = wire.DEFAULT_CODEC,
    path: AttentionPath = "fast",
) -> tuple[torch.Tensor, int]:
    """The middle frame [3, H, W] in [0, 1], and the size of the wire payload it crossed as."""
    middles, payload_bytes = interpolate_chunk(cloud, edge, [frame0, frame1], seed, codec, path=path)
    return middles[0], payload_bytes


def interpolate_chunk(
    cloud: CloudEncoder,
    edge: EdgeModel,
    frames: Sequence[torch.Tensor],
    seed: int = 0,
    codec: str = wire.DEFAULT_CODEC,
    path: AttentionPath = "fast",
    scene_threshold: float | None = None,
) -> tuple[torch.Tensor, int]:
    """The K middle frames of K + 1 consecutive frames, [K, 3, H, W], and the size of the one payload
    they crossed as. Pair j uses seed ``seed + j``; pairs across a scene cut (``scene_threshold``,
    None: off) get the earlier frame, the others are computed in batched forwards of
    ``edge.pairs_per_forward`` pairs. With the frames codec the payload carries the frames, and the
    edge's E_cond (here the cloud's weights on the edge's device) re-derives their conditions."""
    kind = wire.kind(codec, in_process=True)
    chunk, payload_bytes = hand_over(cloud, Intake.beside(edge, cloud.weights), frames, seed, kind, scene_threshold)
    return edge_middles(edge, chunk, path), payload_bytes


def edge_middles(edge: EdgeModel, chunk: wire.Chunk, path: AttentionPath = "fast") -> torch.Tensor:
    """The edge's half of :func:`interpolate_chunk`: the chunk's K middles, [K, 3, H, W]."""
    middles: list[torch.Tensor | None] = [load_frame(chunk.copies[j]) if j in chunk.copies else None for j in range(chunk.pairs)]
    computed = [j for j in range(chunk.pairs) if j not in chunk.copies]
    for batch in edge.batched(computed, chunk.grid):
        for j, middle in zip(batch, edge.interpolate_batch([chunk.pair(j) for j in batch], path)):
            middles[j] = middle
    return torch.stack(middles)


def in_process(
    cloud: CloudEncoder, edge: EdgeModel, codec: str = wire.DEFAULT_CODEC,
    scene_threshold: float | None = SCENE_THRESHOLD,
) -> Processor:
    """The processor of one machine: the same computation as the servers', payload included, so the
    middles equal theirs for the same seed, codec and thread count. Each chunk's stages go to
    :data:`~eden_serve.streaming.TIMELINE`."""
    kind = wire.kind(codec, in_process=True)
    intake = Intake.beside(edge, cloud.weights)

    def process(index: int, frames: list[Frame], seed: int) -> Middles:
        tensors = [frame.tensor for frame in frames]
        for tensor in tensors[1:]:
            check_pair(tensors[0], tensor)

        def event(name: str) -> None:
            TIMELINE.debug("chunk %d (%d pairs): %s", index, len(frames) - 1, name)

        event("cloud asked")
        chunk, payload_bytes = hand_over(cloud, intake, tensors, seed, kind, scene_threshold, lambda: event("encoded"))
        event("payload in")
        event("edge asked")
        middles = edge_middles(edge, chunk)
        event("done")
        return Middles([Image.fromarray(to_uint8(middle)) for middle in middles],
                       payload_bytes=payload_bytes if kind.crosses else None, codec=kind.name if kind.crosses else None)

    return FunctionProcessor(process)


def model_identity(cloud: CloudEncoder, edge: EdgeModel) -> dict:
    """What the middles of a cloud and an edge depend on (a resumed run's journal records it): the
    weights themselves, the edge's device and precision, and the arithmetic of this torch build and CPU."""
    digest = hashlib.blake2b(digest_size=16)
    for model in (cloud, edge):
        for name, tensor in model.weights.state_dict().items():
            digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\n".encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return {"weights": digest.hexdigest(), "device": str(edge.device), "precision": edge.precision,
            "torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": torch.backends.cpu.get_cpu_capability()}


def interpolate_clip_in_process(src: str | Path, dst: str | Path, cloud: CloudEncoder, edge: EdgeModel,
                                codec: str = wire.DEFAULT_CODEC, scene_threshold: float | None = SCENE_THRESHOLD,
                                **options) -> Summary:
    """``eden-serve interpolate`` on a clip: :func:`interpolate_clip` with :func:`in_process`;
    ``options``: :class:`~eden_serve.client.streaming.ClipOptions`' (here by default chunks of
    :data:`DEFAULT_CHUNK` pairs, :data:`DEFAULT_INFLIGHT` in flight, frames of at most
    :data:`~eden_serve.media.frames.DEFAULT_MAX_PIXELS`)."""
    wire.kind(codec, in_process=True)  # a bad name fails before the first pair, not as the first pair's error
    options = ClipOptions(**{"chunk": DEFAULT_CHUNK, "inflight": DEFAULT_INFLIGHT, "max_pixels": DEFAULT_MAX_PIXELS, **options})
    processor = in_process(cloud, edge, codec, scene_threshold=scene_threshold)
    if options.resume:
        options = replace(options, fingerprint={"codec": codec, "batch_tokens": edge.batch_tokens, "scene_threshold": scene_threshold,
                                                **model_identity(cloud, edge)})
    return interpolate_clip(src, dst, processor, options)
