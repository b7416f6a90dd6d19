"""The whole computation in one process: a pair, and a clip, through cloud -> wire -> edge.

What the two servers compute together, payload included, so the results equal theirs bit for bit
for the same seed, codec and thread count. With the codec ``none`` the chunk skips the wire: its
tensors go from the cloud's device to the edge's as they are (float32, device to device), as
codec ``fp32`` would deliver them.

A clip's frames stay tensors from the decoder to the encoder (docs/video.md, "The clip's
pipeline"): a chunk's pixels (8-bit, or 16-bit from a deeper source) go to the device in one copy,
the cloud and the edge work there, and the middles come back as pixels of the chunk's depth in one
copy per chunk, each chunk's work on a CUDA stream of its worker thread's own, so that one chunk's
cloud runs beside another's edge.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from .. import wire
from ..cloud.encoder import CloudEncoder
from ..cloud.scene_cuts import SCENE_THRESHOLD
from ..edge import AttentionPath, EdgeModel, middles_of, upload
from ..edge.conditions import EdgeSide
from ..edge.streams import capture_gate
from ..edge.yuv import to_planes
from ..errors import BadInputError
from ..media import PIPE, Frame, decoder_memory, decoders, open_clip
from ..media.planes import PlaneFormat, Planes
from ..media.video import VideoClip, rgb_pixels
from ..media.frames import DEFAULT_MAX_PIXELS, DEPTHS, as_pixels, check_pair, levels, load_frame, pixels_to_tensor, to_pixels
from .processors import FunctionProcessor, Middles, Processor
from .streaming import DEFAULT_CHUNK, TIMELINE, ClipOptions, Summary, interpolate_clip

# The model already uses every core; a second pair overlaps reading, writing and codec work.
DEFAULT_INFLIGHT = 2


@dataclass(frozen=True)
class ClipDefaults:
    """How a clip runs in this process where the command line does not say: pairs per chunk (the
    most pairs one batched forward can take), chunks in flight, and whether the first chunks ramp
    up (1, 1, 2, 4, ... pairs: the first middle waits for one pair's work, not a chunk's)."""

    chunk: int
    inflight: int
    ramp: bool = False


# A GPU's forward takes 8 pairs at 1080p and 16 at 480x854 (edge/sizing.py), and runs faster per
# pair the more it takes; a third chunk in flight keeps the next one's frames and E_cond ready
# while two take their turns at the edge (docs/gpu.md "The clip's defaults"). Its first chunks
# ramp, their one-off sizes uncaptured (edge/graphs.py): the first middle is one pair's work. A
# CPU's chunks stay fixed: ramped there, a short clip took 1.4 times as long (docs/video.md,
# "Encoder speed", which also says why ramped runs with libsvtav1 once hung).
CLIP_DEFAULTS = {"cpu": ClipDefaults(DEFAULT_CHUNK, DEFAULT_INFLIGHT), "cuda": ClipDefaults(16, 3, ramp=True)}


def clip_defaults(device: torch.device) -> ClipDefaults:
    return CLIP_DEFAULTS.get(device.type, CLIP_DEFAULTS["cpu"])


def hand_over(cloud: CloudEncoder, edge_side: EdgeSide, made, kind: wire.Kind) -> tuple[wire.Chunk, int]:
    """What the cloud ``made`` of a chunk's frames (``kind.make``) as the edge's ``edge_side`` makes
    it, on the edge's device, and the bytes of the payload it crossed as (0 without the wire)."""
    received, payload_bytes = kind.cross(made, cloud.config, edge_side.config)
    return kind.conditions(received, edge_side), payload_bytes


def interpolate_pair(
    cloud: CloudEncoder,
    edge: EdgeModel,
    frame0: torch.Tensor,
    frame1: torch.Tensor,
    seed: int = 0,
    codec: str = wire.DEFAULT_CODEC,
    path: AttentionPath = "fast",
) -> tuple[torch.Tensor, int]:
    """The middle frame [3, H, W] in [0, 1] of two 8-bit frames, on either attention ``path``, and
    the size of the wire payload it crossed as."""
    kind = wire.kind(codec, in_process=True)
    chunk, payload_bytes = hand_over(cloud, EdgeSide.beside(edge, cloud.weights), kind.make(cloud, [frame0, frame1], seed), kind)
    return edge_middles(edge, chunk, path)[0], payload_bytes


def interpolate_chunk(
    cloud: CloudEncoder,
    edge: EdgeModel,
    frames: Sequence[torch.Tensor],
    seed: int = 0,
    codec: str = wire.DEFAULT_CODEC,
    scene_threshold: float | None = None,
    depth: int = 8,
) -> tuple[torch.Tensor, int]:
    """The K middle frames of K + 1 consecutive frames of ``depth`` bits, [K, 3, H, W], and the size
    of the one payload they crossed as. Pair j uses seed ``seed + j``; pairs across a scene cut
    (``scene_threshold``, None: off) get the earlier frame, at the frames' depth, the others are
    computed in batched forwards of ``edge.sizing`` pairs. With the frames codec the payload carries
    the frames, and the edge's E_cond (here the cloud's weights on the edge's device) re-derives
    their conditions."""
    kind = wire.kind(codec, in_process=True)
    made = kind.make(cloud, frames, seed, scene_threshold, depth=depth)
    chunk, payload_bytes = hand_over(cloud, EdgeSide.beside(edge, cloud.weights), made, kind)
    return edge_middles(edge, chunk), payload_bytes


def edge_middles(edge: EdgeModel, chunk: wire.Chunk, path: AttentionPath = "fast") -> torch.Tensor:
    """The edge's half of :func:`interpolate_chunk`: the chunk's K middles, [K, 3, H, W]."""
    middles: list[torch.Tensor | None] = [_cut_frame(chunk.copies[j]) if j in chunk.copies else None for j in range(chunk.pairs)]
    computed = [j for j in range(chunk.pairs) if j not in chunk.copies]
    for batch in edge.sizing.batches(computed, chunk.grid):
        for j, middle in zip(batch, middles_of(edge, [chunk.pair(j) for j in batch], uint8=False, path=path)):
            middles[j] = middle
    return torch.stack(middles)


def _cut_frame(copy: bytes | torch.Tensor) -> torch.Tensor:
    """A cut's middle, [3, H, W] float32 on the CPU, from its PNG or (handed over) its pixels."""
    return load_frame(copy) if isinstance(copy, bytes) else pixels_to_tensor(copy).cpu()


def pixel_middles(edge: EdgeModel, chunk: wire.Chunk, planes: PlaneFormat | None = None) -> list:
    """The chunk's K middles as pixels [H, W, 3] of its depth on the host (8 bits, or 16 for
    frames deeper than 8): made on the edge's device in batched forwards (the scene cuts' copies
    beside them), then copied back in one copy; with ``planes``, 8-bit middles as the output's
    planes (:mod:`.edge.yuv`), converted there: half the bytes come back."""
    height, width = chunk.size
    middles = torch.empty((chunk.pairs, height, width, 3), dtype=DEPTHS[chunk.depth], device=edge.device)
    for j, copy in chunk.copies.items():
        middles[j] = copy.to(edge.device) if isinstance(copy, torch.Tensor) else to_pixels(load_frame(copy), chunk.depth)
    computed = [j for j in range(chunk.pairs) if j not in chunk.copies]
    for batch in edge.sizing.batches(computed, chunk.grid):
        inputs = edge.prepare([chunk.pair(j) for j in batch])
        made = edge.forward(inputs) if chunk.depth == 8 else as_pixels(edge.forward(inputs, uint8=False), chunk.depth)
        for j, middle in zip(batch, made):  # one by one: indexing with a list is not defined for uint16
            middles[j] = middle
    if planes is None or middles.dtype != torch.uint8:
        return list(edge.to_host(middles))
    return [Planes(each, width, height, planes) for each in edge.to_host(to_planes(middles, planes))]


def frame_tensors(frames: Sequence[Frame], device: torch.device) -> list[torch.Tensor]:
    """The frames as the cloud takes them, [3, H, W] float32 in [0, 1]: where all have pixels of one
    shape and depth (a video's), made on ``device`` from one copy of their pixels; else each frame's tensor."""
    first = frames[0].pixels
    if any(frame.pixels is None or frame.pixels.shape != first.shape or frame.pixels.dtype != first.dtype for frame in frames):
        return [frame.tensor for frame in frames]
    # [F, H, W, 3] uint8 or uint16, stacked into page-locked memory for a GPU: upload then copies
    # them once, not again into page-locked memory first (106 MB a chunk of 16 at 1080p).
    stacked = torch.empty((len(frames), *first.shape), dtype=first.dtype, pin_memory=device.type == "cuda")
    pixels = upload(torch.stack([frame.pixels for frame in frames], out=stacked), device)
    return list(pixels.permute(0, 3, 1, 2).contiguous().float().div_(levels(first.dtype)).unbind())  # as pixels_to_tensor makes each


_streams = threading.local()


@contextlib.contextmanager
def worker_stream(*devices: torch.device) -> Iterator[None]:
    """A CUDA stream of this thread's own as the current one on each of ``devices`` (the cloud's and
    the edge's): a worker's syncs (the cloud's statistics, the copy back) then wait for its own
    chunk's work, not for the other workers'. With two GPUs (``--device cuda:0,cuda:1``) the edge's
    work otherwise went to its GPU's default stream, shared by every worker."""
    streams = _streams.__dict__.setdefault("by_device", {})
    with contextlib.ExitStack() as entered:
        for device in dict.fromkeys(d for d in devices if d.type == "cuda"):
            if device not in streams:
                streams[device] = torch.cuda.Stream(device)
            entered.enter_context(torch.cuda.stream(streams[device]))
        yield


MIDDLES_AS = ("auto", "planes", "rgb")  # auto: planes where the edge is a GPU (a CPU has no copy back to halve)


class InProcess(FunctionProcessor):
    """:func:`in_process`'s processor; :meth:`planes` asks for its middles as an output's planes,
    which it gives where ``middles_as`` says."""

    format: PlaneFormat | None = None

    def __init__(self, function: Callable, middles_as: str, device: torch.device):
        super().__init__(function)
        self.converts = middles_as == "planes" or (middles_as == "auto" and device.type == "cuda")

    def planes(self, format: PlaneFormat) -> None:
        """Give the middles as ``format``'s planes (a writer that takes them, where they go to it alone)."""
        if self.converts:
            self.format = format


def in_process(
    cloud: CloudEncoder, edge: EdgeModel, codec: str = wire.DEFAULT_CODEC,
    scene_threshold: float | None = SCENE_THRESHOLD, middles_as: str = "auto",
) -> Processor:
    """The processor of one machine: the same computation as the servers', payload included, so the
    middles equal theirs for the same seed, codec and thread count. Each chunk's stages go to
    :data:`~eden_serve.streaming.TIMELINE`. ``middles_as``: :data:`MIDDLES_AS`, where a writer takes planes."""
    kind = wire.kind(codec, in_process=True)
    edge_side = EdgeSide.beside(edge, cloud.weights)
    processor = InProcess(lambda index, frames, seed: process(index, frames, seed), middles_as, edge.device)

    def process(index: int, frames: list[Frame], seed: int) -> Middles:
        def event(name: str) -> None:
            TIMELINE.debug("chunk %d (%d pairs): %s", index, len(frames) - 1, name)

        with worker_stream(cloud.device, edge.device):
            tensors = frame_tensors(frames, cloud.device)
            for tensor in tensors[1:]:
                check_pair(tensors[0], tensor)
            event("cloud asked")
            made = kind.make(cloud, tensors, seed, scene_threshold, depth=max(frame.depth for frame in frames))
            event("encoded")
            chunk, payload_bytes = hand_over(cloud, edge_side, made, kind)
            event("payload in")
            event("edge asked")
            middles = pixel_middles(edge, chunk, processor.format)
        event("done")
        return Middles(middles, payload_bytes=payload_bytes if kind.crosses else None, codec=kind.name if kind.crosses else None)

    return processor


def decoded_by(src: str | Path, setting: str, device: torch.device, options: ClipOptions) -> str | Path | VideoClip:
    """``src`` as the clip engine opens it, or where ``setting`` (:data:`~.media.decoders.DECODERS`)
    asks for another decoder than the host's, a video file opened with it: the one named, or for
    ``auto`` the fastest on its first frames (:func:`~.media.decoders.choose`) beside a GPU, or
    the host's untried where it won them on such a stream here before."""
    if setting == "host" or str(src) == PIPE or options.raw is not None or not Path(src).is_file():
        return src
    found = {decoder.name: decoder for decoder in decoders.candidates(device)}
    for decoder in found.values():
        decoder.waiting = capture_gate(device).shared  # NVDEC's waits for the device never meet the edge's captures
    if setting != "auto" and setting not in found:
        raise BadInputError(f"--decoder {setting}: not here ({', '.join(found)} are)")
    if len(found) == 1:
        return src
    with open_clip(src, options.max_pixels) as clip:
        if clip.kind != "video" or (setting == "auto" and clip.alpha is not None):  # VP8's or VP9's alpha: libvpx's, the host's
            return src
    if setting == "auto":
        chosen = decoders.choose(Path(src), list(found.values()), rgb_pixels, memory=decoder_memory.Memory(device))[0]
    else:
        chosen = found[setting]
    return VideoClip(Path(src), options.max_pixels, decoder=chosen) if chosen.name != "host" else src


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
    """``eden-serve interpolate`` on a clip: :func:`interpolate_clip` with :func:`in_process`
    (``middles_as``, of :data:`MIDDLES_AS`, among the options); ``src`` read by the host's decoder,
    or a clip opened with another (:func:`decoded_by`, which the command runs beside the models'
    load); ``options``: :class:`~eden_serve.clips.streaming.ClipOptions`' (here by default chunks of
    :data:`DEFAULT_CHUNK` pairs, :data:`DEFAULT_INFLIGHT` in flight, frames of at most
    :data:`~eden_serve.media.frames.DEFAULT_MAX_PIXELS`)."""
    wire.kind(codec, in_process=True)  # a bad name fails before the first pair, not as the first pair's error
    middles_as = options.pop("middles_as", "auto")
    # The compilations held until then (prepared artefacts: edge/artefacts.load_into) start once the first middle is out.
    options = ClipOptions(**{"chunk": DEFAULT_CHUNK, "inflight": DEFAULT_INFLIGHT, "max_pixels": DEFAULT_MAX_PIXELS,
                             "first_middle": edge.runner.release, **options})
    processor = in_process(cloud, edge, codec, scene_threshold=scene_threshold, middles_as=middles_as)
    edge.sizing.forwards = options.inflight  # each chunk in flight runs its own forward: the memory is shared by them
    if options.resume:
        options = replace(options, fingerprint={"codec": codec, "batch_tokens": edge.sizing.batch_tokens, "scene_threshold": scene_threshold,
                                                **model_identity(cloud, edge)})
    return interpolate_clip(src, dst, processor, options)
