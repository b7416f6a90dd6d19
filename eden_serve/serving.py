"""TorchServe glue for the two halves: everything the handlers in ``handlers/`` do, testable without a server.

A handler is a thin :class:`ts.torch_handler.base_handler.BaseHandler` subclass that calls
:meth:`EncoderService.load` / :meth:`EdgeService.load` in ``initialize`` and :func:`each` /
:func:`respond` in ``preprocess``, ``inference`` and ``postprocess``. Every request of a batch is
handled on its own (requests of a batch may differ in resolution, and one bad request must not fail
the others): each step maps a request to a value or to the exception it raised, and :func:`respond`
turns each into its own status, content type and body.

Errors: every :class:`~eden_serve.errors.EdenError` becomes its 4xx JSON document, out of memory
507, anything else 500 with a short message (the traceback goes to the worker log); the worker
process survives all of them. TorchServe is imported only where metrics are emitted, so the
package imports without it.
"""

from __future__ import annotations

import http
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

from . import wire
from .checkpoint import load_cloud, load_edge
from .cloud import CloudEncoder
from .config import MAX_SEED, EdenConfig
from .edge import EdgeModel
from .errors import BadInputError, EdenError, FrameTooLargeError, error_from_document, error_response
from .frames import DEFAULT_MAX_PIXELS, check_pair, check_size, load_frame, to_png

logger = logging.getLogger(__name__)

CLOUD_WEIGHTS = "eden_cloud.safetensors"
EDGE_WEIGHTS = "eden_edge.safetensors"
OCTET_STREAM = "application/octet-stream"
PNG = "image/png"
JSON = "application/json"
FORM_HELP = "send multipart/form-data with image fields frame0 and frame1, optional seed (integer) and codec"


# --- settings, device, threads -------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The ``handler:`` section of an archive's model-config.yaml."""

    max_pixels: int = DEFAULT_MAX_PIXELS  # per frame; larger requests get 413
    codec: str = wire.DEFAULT_CODEC  # encoder: the codec of requests that name none
    precision: str = "fp32"  # edge: compute precision, fp32 or bf16
    threads: int = 0  # CPU intra-op threads per worker; 0: this half's share of the cores (see default_threads)

    @classmethod
    def from_yaml(cls, model_yaml_config: dict | None) -> "Settings":
        section = (model_yaml_config or {}).get("handler") or {}
        if not isinstance(section, dict):
            raise ValueError(f"model-config.yaml: handler must be a mapping, got {type(section).__name__}")
        known = {"max_pixels", "codec", "precision", "threads"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"model-config.yaml: unknown handler setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
        settings = cls(**section)
        if type(settings.max_pixels) is not int or settings.max_pixels < 1:
            raise ValueError(f"model-config.yaml: handler.max_pixels must be a positive integer, got {settings.max_pixels!r}")
        if type(settings.threads) is not int or settings.threads < 0:
            raise ValueError(f"model-config.yaml: handler.threads must be an integer >= 0, got {settings.threads!r}")
        if settings.precision not in ("fp32", "bf16"):
            raise ValueError(f"model-config.yaml: handler.precision must be fp32 or bf16, got {settings.precision!r}")
        wire.parse_codec(settings.codec)
        return settings


def choose_device(gpu_id: int | None) -> torch.device:
    """The GPU TorchServe assigned (``gpu_id``), or the CPU when it assigned none or CUDA is absent.

    TorchServe drops a model's ``deviceIds`` when one is not below its GPU count and then deals the
    GPUs out round-robin, so on one GPU both halves share GPU 0. The modulo only matters when the
    worker sees fewer GPUs than TorchServe counted (CUDA_VISIBLE_DEVICES set for the workers).
    """
    if gpu_id is None or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device(f"cuda:{gpu_id % torch.cuda.device_count()}")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_threads(side: str, cores: int) -> int:
    """CPU threads of one worker when both halves share a machine (the workflow) and
    ``handler.threads`` is 0. The encoder does well under a tenth of a pair's arithmetic, so it
    gets an eighth of the cores (at least one) and the edge the rest: together they never
    oversubscribe the cores, and the edge, the bottleneck, gets what the encoder does not need."""
    cloud = max(1, cores // 8)
    return cloud if side == "cloud" else max(1, cores - cloud)


def configure_torch(device: torch.device, threads: int, side: str) -> None:
    """Process-wide PyTorch settings of a worker, made once when it loads.

    On CUDA: importing TorchServe's BaseHandler switches float32 matmuls to TF32 on Ampere and
    newer; back to full float32, so the server computes what ``eden-serve interpolate`` computes.

    On CPU: keep the workers from oversubscribing the cores. Each worker is a process handling one
    batch at a time; ``handler.threads`` sets its threads (e.g. all cores on a node that serves one
    half), else :func:`default_threads`. Inter-op parallelism is unused (no ``torch.jit.fork``),
    so it gets one thread; PyTorch accepts that setting only once per process and before any
    parallel work, which holds at the start of a worker.
    """
    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest")
        return
    torch.set_num_threads(threads or default_threads(side, usable_cores()))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # set before in this process, or inter-op work has started
        logger.info("inter-op threads stay at %d", torch.get_num_interop_threads())


def max_tokens_for(max_pixels: int, config: EdenConfig) -> int:
    """Tokens per frame that the pixel limit allows, for frames of aspect ratio up to 4:1.

    A frame of H x W <= P pixels pads to at most (H + m)(W + m) = HW + m(H + W) + m^2 pixels
    (m: the pad multiple), and H + W <= 2.5 sqrt(P) while neither side exceeds four times the other.
    The edge passes this to ``wire.decode`` so a payload cannot make it allocate beyond what the
    limit implies; the encoder refuses frames above it up front, so both halves agree.
    """
    m = config.pad_multiple
    padded = max_pixels + 2.5 * m * math.sqrt(max_pixels) + m * m
    return math.ceil(padded / config.patch_size**2)


def _setup(context, weights: str, side: str) -> tuple[Settings, torch.device, Path]:
    properties = context.system_properties
    settings = Settings.from_yaml(getattr(context, "model_yaml_config", None))
    device = choose_device(properties.get("gpu_id"))
    configure_torch(device, settings.threads, side)
    return settings, device, Path(properties["model_dir"]) / weights


def _log_loaded(context, device: torch.device, config: EdenConfig, settings: Settings) -> None:
    logger.info(
        "%s: %s model on %s (%d intra-op threads), max_pixels %d; eden_serve from %s",
        context.model_name, config.name, device, torch.get_num_threads(), settings.max_pixels, Path(__file__).parent,
    )


# --- per-request plumbing ------------------------------------------------------------------------


class Reply(NamedTuple):
    body: bytes
    content_type: str


def each(step: Callable[[int, Any], Any], items: list) -> list:
    """``step(idx, item)`` for every item of a batch, each failure caught and kept in its place.

    An item that is already an exception (an earlier step failed) is passed on untouched.
    """
    results = []
    for idx, item in enumerate(items):
        if isinstance(item, BaseException):
            results.append(item)
            continue
        try:
            results.append(step(idx, item))
        except Exception as exc:  # one request's failure must not fail the batch
            results.append(exc)
    return results


def error_reply(exc: BaseException) -> tuple[int, Reply]:
    """Status and JSON body for a failed request; unexpected failures are logged with traceback."""
    if isinstance(exc, EdenError):
        logger.info("request refused: %d %s: %s", exc.status, exc.kind, exc)
        status, document = error_response(exc)
    else:
        logger.error("request failed", exc_info=exc)
        if isinstance(exc, torch.OutOfMemoryError):
            torch.cuda.empty_cache()
        status, document = error_response(exc)
    return status, Reply(json.dumps(document).encode(), JSON)


def respond(context, outcomes: list) -> list[bytes]:
    """Per-request status and content type on the context; the bodies, in batch order."""
    bodies = []
    for idx, outcome in enumerate(outcomes):
        if isinstance(outcome, BaseException):
            status, reply = error_reply(outcome)
        else:
            status, reply = 200, outcome
        context.set_response_status(status, _phrase(status), idx)
        context.set_response_content_type(idx, reply.content_type)
        bodies.append(reply.body)
    return bodies


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def _emit(context, name: str, value: float, unit: str, idx: int) -> None:
    """One gauge per request, with the dimensions its declaration in the metrics config names."""
    # Imported here: only TorchServe's workers have a context with metrics, and they have ts.
    from ts.metrics.dimension import Dimension
    from ts.metrics.metric_type_enum import MetricTypes

    dimensions = [Dimension("ModelName", context.model_name), Dimension("Level", "Model")]
    context.metrics.add_metric(name, value, unit, idx, dimensions, MetricTypes.GAUGE)


# --- request fields ------------------------------------------------------------------------------


def form_field(request: dict, name: str) -> Any:
    """A form field of a TorchServe request, or BadInputError when it is missing.

    TorchServe passes each multipart field as its own key; a value is bytes, a str (text parts) or
    an already parsed object (application/json parts).
    """
    value = request.get(name)
    if value is None:
        raise BadInputError(f"missing form field {name!r}; {FORM_HELP}")
    return value


def image_bytes(value: Any, name: str) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()  # a text part: the image decoder refuses it
    raise BadInputError(f"form field {name!r} must be an image file, got a JSON {type(value).__name__}; {FORM_HELP}")


def _text(value: Any, name: str) -> str:
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("ascii").strip()
        except UnicodeDecodeError:
            raise BadInputError(f"form field {name!r} must be ASCII text") from None
    if isinstance(value, str):
        return value.strip()
    raise BadInputError(f"form field {name!r} must be text, got a JSON {type(value).__name__}")


def parse_seed(value: Any) -> int:
    if value is None:
        return 0
    if type(value) is int:
        seed = value
    else:
        text = _text(value, "seed")
        if not (text.isascii() and text.isdigit()):  # no sign, inner spaces, 1e3, 0x10 or "²"
            raise BadInputError(f"seed must be a decimal integer in [0, {MAX_SEED}], got {text!r:.40}")
        seed = int(text)
    if not 0 <= seed <= MAX_SEED:
        raise BadInputError(f"seed must be in [0, {MAX_SEED}], got {seed}")
    return seed


def parse_codec(value: Any, default: str) -> str:
    if value is None:
        return default
    name = _text(value, "codec")
    wire.parse_codec(name)
    return name


def request_body(request: dict) -> Any:
    """The raw body of a request: key "body" (workflows, raw POSTs) or "data"."""
    for key in ("body", "data"):
        value = request.get(key)
        if value not in (None, b"", ""):
            return value
    raise BadInputError("empty request; POST the wire payload made by the encoder as the request body")


# --- the two services ----------------------------------------------------------------------------


class EncodeJob(NamedTuple):
    frame0: bytes  # image files, decoded in run()
    frame1: bytes
    seed: int
    codec: str


class EncoderService:
    """The cloud half: form fields frame0, frame1, seed, codec -> wire payload.

    ``parse`` (preprocess) checks only what is cheap; frames are decoded in ``run`` (inference), one
    request at a time, so a batch of 4K pairs holds one pair's tensors at a time.
    """

    def __init__(self, encoder: CloudEncoder, settings: Settings, context):
        self.encoder = encoder
        self.settings = settings
        self.context = context
        self.max_tokens = max_tokens_for(settings.max_pixels, encoder.config)

    @classmethod
    def load(cls, context) -> "EncoderService":
        settings, device, weights = _setup(context, CLOUD_WEIGHTS, "cloud")
        service = cls(load_cloud(weights, device), settings, context)
        _log_loaded(context, device, service.encoder.config, settings)
        return service

    def parse(self, idx: int, request: dict) -> EncodeJob:
        frame0, frame1 = (image_bytes(form_field(request, name), name) for name in ("frame0", "frame1"))
        return EncodeJob(frame0, frame1, parse_seed(request.get("seed")), parse_codec(request.get("codec"), self.settings.codec))

    def load_frame(self, data: bytes, name: str) -> torch.Tensor:
        frame = load_frame(data, name, self.settings.max_pixels)
        height, width = frame.shape[-2:]
        ph, pw = self.encoder.config.patch_grid(height, width)
        if ph * pw > self.max_tokens:
            raise FrameTooLargeError(
                f"{name} is {width}x{height}, which pads to {ph * pw} tokens, over this server's {self.max_tokens} "
                f"(frames of up to {self.settings.max_pixels} pixels and aspect ratio up to 4:1)"
            )
        return frame

    def run(self, idx: int, job: EncodeJob) -> Reply:
        frame0, frame1 = self.load_frame(job.frame0, "frame0"), self.load_frame(job.frame1, "frame1")
        check_pair(frame0, frame1)
        start = time.perf_counter()
        cond = self.encoder.encode(frame0, frame1, job.seed)
        encoded = time.perf_counter()
        payload = wire.encode(cond, self.encoder.config, job.codec)
        _emit(self.context, "EdenEncodeMs", round((encoded - start) * 1000, 3), "ms", idx)
        _emit(self.context, "EdenPayloadBytes", len(payload), "B", idx)
        return Reply(payload, OCTET_STREAM)


class EdgeService:
    """The edge half: wire payload (or an upstream error document) -> the middle frame as PNG.

    ``parse`` (preprocess) only recognises the body; payloads are decoded in ``run`` (inference),
    one request at a time, so a batch of 4K payloads holds one request's conditions at a time.
    """

    def __init__(self, decoder: EdgeModel, settings: Settings, context):
        self.decoder = decoder
        self.settings = settings
        self.context = context
        self.max_tokens = max_tokens_for(settings.max_pixels, decoder.config)

    @classmethod
    def load(cls, context) -> "EdgeService":
        settings, device, weights = _setup(context, EDGE_WEIGHTS, "edge")
        service = cls(load_edge(weights, device, settings.precision), settings, context)
        _log_loaded(context, device, service.decoder.config, settings)
        return service

    def parse(self, idx: int, request: dict) -> bytes:
        body = request_body(request)
        upstream = error_from_document(body)
        if upstream is not None:
            raise upstream
        if isinstance(body, str):
            return body.encode()  # sent as text: wire.decode judges it
        if not isinstance(body, (bytes, bytearray)):
            raise BadInputError(f"request body must be the encoder's wire payload ({OCTET_STREAM}), got a JSON {type(body).__name__}")
        return body

    def run(self, idx: int, payload: bytes) -> Reply:
        cond = wire.decode(payload, self.decoder.config, max_tokens=self.max_tokens)
        height, width = cond.size
        check_size(width, height, self.settings.max_pixels, "the payload's frame")
        start = time.perf_counter()
        latents = self.decoder.denoise(cond)
        denoised = time.perf_counter()
        frame = self.decoder.decode_latents(latents, cond)
        decoded = time.perf_counter()
        _emit(self.context, "EdenPayloadBytes", len(payload), "B", idx)
        _emit(self.context, "EdenDenoiseMs", round((denoised - start) * 1000, 3), "ms", idx)
        _emit(self.context, "EdenDecodeMs", round((decoded - denoised) * 1000, 3), "ms", idx)
        return Reply(to_png(frame), PNG)
