"""A worker's setup: its settings from the archive's model-config.yaml, its device and its threads."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from .. import wire
from ..cloud.scene_cuts import SCENE_THRESHOLD
from ..config import EdenConfig
from ..edge import PRECISIONS, Acceleration
from ..edge.acceleration import GRAPH_MODES, Compile
from ..errors import BadInputError, DeviceUnavailableError
from ..media.frames import DEFAULT_MAX_PIXELS

logger = logging.getLogger(__name__)
UNKEYED_BITSTREAM = ("sandbox", "refuse")
RAW_POLICIES = ("loopback", "any", "off")  # handler.raw_answers


@dataclass(frozen=True)
class Settings:
    """The ``handler:`` section of an archive's model-config.yaml."""

    max_pixels: int = DEFAULT_MAX_PIXELS  # per frame; larger requests get 413
    max_chunk_frames: int = 17  # frames per request (K + 1); more get 413
    max_chunk_tokens: int = 1 << 17  # condition tokens of all a request's frames; a pair of the largest frames always fits
    codec: str = wire.DEFAULT_CODEC  # cloud: the codec of requests that name none
    scene_threshold: float | None = SCENE_THRESHOLD  # cloud: scene-cut test of requests that name none; null: off
    precision: str = "fp32"  # edge: compute precision
    max_batch_tokens: int = 0  # edge: condition tokens per batched forward; 0: the device's default
    cuda_graphs: str = "auto"  # edge: replay the forward from CUDA graphs: auto (on a GPU), on, off
    threads: int = 0  # CPU intra-op threads per worker; 0: this half's share (docs/serving.md: "GPUs and threads")
    media_root: str | None = None  # cloud: the directory of server-side sources; null: off (docs/cloud-sources.md)
    # What one request may make a worker do (docs/errors-and-limits.md, "What one request can make a server do").
    max_decoded_pixels: int = 1 << 30  # frames a request makes a worker decode (skipped ones too) x their pixels
    max_demuxed_packets: int = 1 << 16  # cloud: packets one request may read from a source
    max_source_packets: int = 1 << 20  # cloud: packets of a source's video stream (read once per file)
    decode_deadline_s: float = 30.0  # one request's decoding (edge: a bitstream payload's, in the sandbox; cloud: a source's)
    unkeyed_bitstream: str = "sandbox"  # edge: decode bitstream payloads without a wire key's tag in the sandbox, or refuse them
    raw_answers: str = "loopback"  # edge: answer raw frames to requests that ask: loopback, any, off (docs/serving.md)
    # edge: torch.compile, from the model-config's pt2 section (not the handler's); auto where it has
    # none: nothing compiled, unless the archive carries compiled artefacts: then inductor in the
    # background on a GPU (docs/gpu.md)
    compile: Compile | None | str = "auto"

    @classmethod
    def from_yaml(cls, model_yaml_config: dict | None) -> "Settings":
        section = (model_yaml_config or {}).get("handler") or {}
        if not isinstance(section, dict):
            raise ValueError(f"model-config.yaml: handler must be a mapping, got {type(section).__name__}")
        known = {field.name for field in fields(cls)} - {"compile"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"model-config.yaml: unknown handler setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
        try:
            settings = cls(**section, compile=Compile.from_pt2((model_yaml_config or {}).get("pt2")))
        except BadInputError as exc:
            raise ValueError(str(exc)) from None
        for name, least in (("max_pixels", 1), ("max_chunk_frames", 2), ("max_chunk_tokens", 1), ("max_batch_tokens", 0),
                            ("max_decoded_pixels", 1), ("max_demuxed_packets", 1), ("max_source_packets", 1)):
            value = getattr(settings, name)
            if type(value) is not int or value < least:
                raise ValueError(f"model-config.yaml: handler.{name} must be an integer >= {least}, got {value!r}")
        if type(settings.threads) is not int or settings.threads < 0:
            raise ValueError(f"model-config.yaml: handler.threads must be an integer >= 0, got {settings.threads!r}")
        if settings.cuda_graphs not in GRAPH_MODES:
            raise ValueError(f"model-config.yaml: handler.cuda_graphs must be one of {', '.join(GRAPH_MODES)}, got {settings.cuda_graphs!r}")
        if settings.precision not in PRECISIONS:
            raise ValueError(f"model-config.yaml: handler.precision must be one of {', '.join(PRECISIONS)}, got {settings.precision!r}")
        threshold = settings.scene_threshold
        if threshold is not None and (type(threshold) not in (int, float) or not 0 <= threshold <= 3):
            raise ValueError(f"model-config.yaml: handler.scene_threshold must be a number in [0, 3] or null, got {threshold!r}")
        deadline = settings.decode_deadline_s
        if type(deadline) not in (int, float) or not 0 < deadline <= 3600:
            raise ValueError(f"model-config.yaml: handler.decode_deadline_s must be a number of seconds in (0, 3600], got {deadline!r}")
        if settings.unkeyed_bitstream not in UNKEYED_BITSTREAM:
            raise ValueError(f"model-config.yaml: handler.unkeyed_bitstream must be one of {', '.join(UNKEYED_BITSTREAM)}, "
                             f"got {settings.unkeyed_bitstream!r}")
        if settings.raw_answers not in RAW_POLICIES:
            raise ValueError(f"model-config.yaml: handler.raw_answers must be one of {', '.join(RAW_POLICIES)}, got {settings.raw_answers!r}")
        root = settings.media_root
        if root is not None and (not isinstance(root, str) or not os.path.isabs(root)):
            raise ValueError(f"model-config.yaml: handler.media_root must be an absolute directory path or null, got {root!r}")
        wire.kind(settings.codec)
        return settings

    def acceleration(self) -> Acceleration:
        """How the edge runs its forward (eden_serve/edge/acceleration.py)."""
        return Acceleration(self.cuda_graphs, self.compile)


def choose_device(gpu_id: int | None) -> torch.device:
    """The GPU TorchServe assigned (``gpu_id``), or the CPU when it assigned none.

    A worker assigned a GPU that it cannot use fails to load (:class:`DeviceUnavailableError`):
    running on the CPU instead would be tens of times slower with nothing but a log line to say so.
    TorchServe drops a model's ``deviceIds`` when one is not below its GPU count and then deals the
    GPUs out round-robin, so on one GPU both halves share GPU 0. The modulo only matters when the
    worker sees fewer GPUs than TorchServe counted (CUDA_VISIBLE_DEVICES set for the workers).
    """
    if gpu_id is None:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        built = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, but no usable GPU (driver, CUDA_VISIBLE_DEVICES)"
        raise DeviceUnavailableError(
            f"TorchServe assigned GPU {gpu_id} to this worker, but this PyTorch {torch.__version__} has {built}; "
            "install the CUDA build, or run TorchServe without GPUs (number_of_gpu=0) to serve on the CPU"
        )
    return torch.device(f"cuda:{gpu_id % torch.cuda.device_count()}")


def cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The CPU limit of this container in whole cores (cgroup v2 ``cpu.max``, rounded up), or None.

    A Kubernetes CPU limit leaves every core of the node visible to the scheduler's affinity, so
    threads sized by the core count would each get a sliver of the quota and stall in throttling.
    """
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def usable_cores() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return min(cores, quota) if quota else cores


def default_threads(side: str, cores: int, device_type: str = "cpu") -> int:
    """CPU threads of one worker when ``handler.threads`` is 0: on a CPU, the edge, the bottleneck,
    every core and the encoder, busy a few percent of the time, an eighth of them; on a GPU the
    host only launches kernels and encodes PNGs, and a few threads do (docs/serving.md: "GPUs and threads")."""
    if device_type == "cuda":
        return max(1, min(4, cores // 2))
    return max(1, cores // 8) if side == "cloud" else cores


def configure_torch(device: torch.device, threads: int, side: str) -> None:
    """Process-wide PyTorch settings of a worker, made once when it loads.

    The intra-op threads on either device (see :func:`default_threads`): on a GPU the host's own
    work (conversions, PNGs) otherwise spreads over every core of the node. Inter-op parallelism
    is unused, and PyTorch accepts that setting only before any parallel work, which holds at a
    worker's start. On CUDA, this worker's GPU becomes the current device (libraries that allocate
    on the current device then use it, not GPU 0), and float32 matmuls go back to full float32:
    importing TorchServe's BaseHandler switches them to TF32 on Ampere and newer, and the server
    computes what ``eden-serve interpolate`` computes.
    """
    if device.type == "cuda":
        _set_device(device)
        torch.set_float32_matmul_precision("highest")
    torch.set_num_threads(threads or default_threads(side, usable_cores(), device.type))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # set before in this process, or inter-op work has started
        logger.info("inter-op threads stay at %d", torch.get_num_interop_threads())


def _set_device(device: torch.device) -> None:
    """Make ``device`` current, which makes its CUDA context: a GPU in exclusive-process compute mode
    that another process holds refuses it, and the worker then fails to load saying why."""
    try:
        torch.cuda.set_device(device)
    except RuntimeError as exc:
        if "busy or unavailable" not in str(exc):
            raise
        raise DeviceUnavailableError(
            f"GPU {device.index} is busy or unavailable ({' '.join(str(exc).split())[:200]}): in exclusive-process compute "
            "mode (nvidia-smi -q -d COMPUTE) a GPU takes one process; give each worker a GPU of its own (deviceIds, one "
            "worker per GPU) or set the compute mode to DEFAULT (nvidia-smi -c DEFAULT)"
        ) from None


def keep_bodies_raw() -> None:
    """Bodies reach the handler as the bytes that were sent, whatever their content type.

    TorchServe's worker parses an application/json body (a form part too) before the handler sees
    it: an 80 MiB one costs it seconds and several times its size, and the handlers read bodies
    themselves, bounded (:func:`~eden_serve.errors.error_from_document`). The worker reads this
    variable at each request, so setting it while loading covers every start (torchserve, the
    launcher, a container).
    """
    os.environ["TS_DECODE_INPUT_REQUEST"] = "false"


def max_tokens_for(max_pixels: int, config: EdenConfig) -> int:
    """Tokens per frame that the pixel limit allows, for frames of aspect ratio up to 4:1.

    A frame of H x W <= P pixels pads to at most (H + m)(W + m) = HW + m(H + W) + m^2 pixels
    (m: the pad multiple), and H + W <= 2.5 sqrt(P) while neither side exceeds four times the other.
    The edge passes this to ``wire.decode`` so a payload cannot make it allocate beyond what the
    limit implies; the cloud refuses frames above it up front, so both halves agree.
    """
    m = config.pad_multiple
    padded = max_pixels + 2.5 * m * math.sqrt(max_pixels) + m * m
    return math.ceil(padded / config.patch_size**2)
