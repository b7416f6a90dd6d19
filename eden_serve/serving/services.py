"""The two halves as TorchServe services: :class:`CloudService` (two frames -> wire payload) and
:class:`EdgeService` (wire payload -> the middle frame as PNG).

Every request of a batch is handled on its own: requests of a batch may differ in resolution, and
one bad request must not fail the others. Each step maps a request to a value or to a
:class:`Refusal`, and :meth:`Service.postprocess` turns each into its own status, content type and
body. Every :class:`~eden_serve.errors.EdenError` becomes its 4xx JSON document, out of memory 507,
anything else 500 with a short message (the traceback goes to the worker log); the worker survives.
"""

from __future__ import annotations

import http
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, NamedTuple

import torch

from .. import wire
from ..checkpoint import WEIGHTS_FILES, load_cloud, load_edge
from ..cloud import CloudEncoder
from ..edge import EdgeModel
from ..errors import BadInputError, EdenError, FrameTooLargeError, encoder_refusal, error_response
from ..frames import check_pair, check_size, load_frame, to_png
from .fields import JSON, OCTET_STREAM, PNG, form_field, image_bytes, parse_codec, parse_seed, request_body
from .worker import Settings, choose_device, configure_torch, keep_bodies_raw, max_tokens_for

logger = logging.getLogger(__name__)


class Reply(NamedTuple):
    body: bytes
    content_type: str


class Refusal(NamedTuple):
    """A failed request, reduced to its answer. Not the exception: its traceback holds the frames
    that held the request's body and what was made of it, and the batch's results list holding the
    exception would keep them all alive, in a cycle, until the garbage collector runs."""

    status: int
    document: dict


def refusal(exc: BaseException) -> Refusal:
    """The answer to a failed request; unexpected failures are logged with their traceback."""
    if isinstance(exc, EdenError):
        logger.info("request refused: %d %s: %s", exc.status, exc.kind, exc)
    else:
        logger.error("request failed", exc_info=exc)
        if isinstance(exc, torch.OutOfMemoryError):
            torch.cuda.empty_cache()
    return Refusal(*error_response(exc))


def each(step: Callable[[int, Any], Any], items: list) -> list:
    """``step(idx, item)`` for every item of a batch, each failure kept in its place as a
    :class:`Refusal`. An item refused by an earlier step is passed on untouched."""
    results = []
    for idx, item in enumerate(items):
        if isinstance(item, Refusal):
            results.append(item)
            continue
        try:
            results.append(step(idx, item))
        except Exception as exc:  # one request's failure must not fail the batch
            results.append(refusal(exc))
    return results


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


class Service:
    """One half behind a TorchServe handler: ``preprocess`` parses (only what is cheap),
    ``inference`` runs one request at a time (so a batch of 4K requests holds one request's tensors
    at a time), ``postprocess`` answers each request with its own status."""

    side: ClassVar[str]  # "cloud" or "edge": which weights, and which share of the threads

    def __init__(self, model: CloudEncoder | EdgeModel, settings: Settings, context):
        self.model = model
        self.settings = settings
        self.context = context
        self.max_tokens = max_tokens_for(settings.max_pixels, model.config)

    @classmethod
    def load(cls, context) -> "Service":
        properties = context.system_properties
        settings = Settings.from_yaml(getattr(context, "model_yaml_config", None))
        device = choose_device(properties.get("gpu_id"))
        configure_torch(device, settings.threads, cls.side)
        keep_bodies_raw()
        weights = Path(properties["model_dir"]) / WEIGHTS_FILES[cls.side]
        service = cls(cls.load_model(weights, device, settings), settings, context)
        logger.info(
            "%s: %s model on %s (%d intra-op threads), max_pixels %d; eden_serve from %s", context.model_name,
            service.model.config.name, device, torch.get_num_threads(), settings.max_pixels, Path(__file__).parent.parent,
        )
        return service

    @staticmethod
    def load_model(weights: Path, device: torch.device, settings: Settings) -> CloudEncoder | EdgeModel:
        raise NotImplementedError

    def parse(self, idx: int, request: dict) -> Any:
        raise NotImplementedError

    def run(self, idx: int, job: Any) -> Reply:
        raise NotImplementedError

    def preprocess(self, batch: list[dict]) -> list:
        return each(self.parse, batch)

    def inference(self, jobs: list) -> list:
        return each(self.run, jobs)

    def postprocess(self, outcomes: list) -> list[bytes]:
        """Per-request status and content type on the context; the bodies, in batch order."""
        bodies = []
        for idx, outcome in enumerate(outcomes):
            if isinstance(outcome, Refusal):
                status, reply = outcome.status, Reply(json.dumps(outcome.document).encode(), JSON)
            else:
                status, reply = 200, outcome
            self.context.set_response_status(status, _phrase(status), idx)
            self.context.set_response_content_type(idx, reply.content_type)
            bodies.append(reply.body)
        return bodies

    # Fresh dimension lists: TorchServe fills in ModelName and Level, into its mutable default otherwise.
    def time_metric(self, name: str, seconds: float, idx: int) -> None:
        self.context.metrics.add_time(name, round(seconds * 1000, 3), idx, "ms", [])

    def size_metric(self, name: str, size: int, idx: int) -> None:
        self.context.metrics.add_size(name, size, idx, "B", [])


class EncodeJob(NamedTuple):
    frame0: bytes  # image files, decoded in run()
    frame1: bytes
    seed: int
    codec: str


class CloudService(Service):
    """Form fields frame0, frame1, seed, codec -> wire payload."""

    side = "cloud"
    model: CloudEncoder

    @staticmethod
    def load_model(weights, device, settings):
        return load_cloud(weights, device)

    def parse(self, idx: int, request: dict) -> EncodeJob:
        frame0, frame1 = (image_bytes(form_field(request, name), name) for name in ("frame0", "frame1"))
        return EncodeJob(frame0, frame1, parse_seed(request.get("seed")), parse_codec(request.get("codec"), self.settings.codec))

    def load_frame(self, data: bytes, name: str) -> torch.Tensor:
        frame = load_frame(data, name, self.settings.max_pixels, max_side=wire.MAX_SIDE)
        ph, pw = self.model.config.patch_grid(*frame.shape[-2:])
        if ph * pw > self.max_tokens:
            raise FrameTooLargeError(
                f"{name} is {frame.shape[-1]}x{frame.shape[-2]}, which pads to {ph * pw} tokens, over this server's "
                f"{self.max_tokens} (frames of up to {self.settings.max_pixels} pixels and aspect ratio up to 4:1)"
            )
        return frame

    def run(self, idx: int, job: EncodeJob) -> Reply:
        frame0, frame1 = self.load_frame(job.frame0, "frame0"), self.load_frame(job.frame1, "frame1")
        check_pair(frame0, frame1)
        start = time.perf_counter()
        cond = self.model.encode(frame0, frame1, job.seed)
        encoded = time.perf_counter()
        payload = wire.encode(cond, self.model.config, job.codec)
        self.time_metric("EdenEncodeMs", encoded - start, idx)
        self.size_metric("EdenPayloadBytes", len(payload), idx)
        return Reply(payload, OCTET_STREAM)


class EdgeService(Service):
    """Wire payload (or an upstream error document) -> the middle frame as PNG."""

    side = "edge"
    model: EdgeModel

    @staticmethod
    def load_model(weights, device, settings):
        return load_edge(weights, device, settings.precision)

    def parse(self, idx: int, request: dict) -> bytes:
        body = request_body(request)
        # A workflow hands a failed cloud node's error document on to this node (README: "Errors").
        upstream = encoder_refusal(body)
        if upstream is not None:
            raise upstream
        if isinstance(body, str):
            return body.encode()  # sent as text: wire.decode judges it
        if not isinstance(body, (bytes, bytearray)):
            raise BadInputError(f"request body must be the encoder's wire payload ({OCTET_STREAM}), got a JSON {type(body).__name__}")
        return body

    def run(self, idx: int, payload: bytes) -> Reply:
        cond = wire.decode(payload, self.model.config, max_tokens=self.max_tokens)
        height, width = cond.size
        check_size(width, height, self.settings.max_pixels, "the payload's frame")
        start = time.perf_counter()
        latents = self.model.denoise(cond)
        denoised = time.perf_counter()
        frame = self.model.decode_latents(latents, cond)
        decoded = time.perf_counter()
        self.size_metric("EdenPayloadBytes", len(payload), idx)
        self.time_metric("EdenDenoiseMs", denoised - start, idx)
        self.time_metric("EdenDecodeMs", decoded - denoised, idx)
        return Reply(to_png(frame), PNG)
