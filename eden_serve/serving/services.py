"""The two halves as TorchServe services: :class:`Service`, what both do, and :class:`EdgeService`
(wire payload -> the middle frame as PNG); the cloud's, :class:`~.cloud_service.CloudService`
(frames -> wire payload), is in :mod:`.cloud_service`. The edge's requests come in here (parsed,
opened); its batching and overlap are :mod:`.overlap`'s, its answers out :mod:`.replies`'.

Every request of a batch is handled on its own: requests of a batch may differ in resolution, and
one bad request must not fail the others. Each step maps a request to a value or to a
:class:`Refusal`, and :meth:`Service.postprocess` turns each into its own status, content type and
body. Every :class:`~eden_serve.errors.EdenError` becomes its 4xx JSON document, out of memory 507,
anything else 500 with a short message (the traceback goes to the worker log); the worker survives,
except a sticky device error (503): the GPU is then lost to this process, and the worker exits once
it has answered so that TorchServe starts a new one.
"""

from __future__ import annotations

import http
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch

from .. import wire
from ..cloud.encoder import CloudEncoder
from ..edge import EdgeModel, artefacts
from ..edge.conditions import EdgeEncoder, EdgeSide
from ..errors import BadInputError, encoder_refusal
from ..model.checkpoint import WEIGHTS_FILES, load_edge, load_half
from ..wire import Chunk, keyed
from .answer_formats import answer_format
from .bitstreams import packet_decoder, start_sandbox
from .fields import JSON, OCTET_STREAM, http_headers, parse_first, parse_stream, request_body, with_headers
from .overlap import Forwards, Preparation, earliest_first, forwards, header_seeds
from .refusals import Refusal, request_by_request
from .replies import Answer, EdgeJob, Replies, Reply
from .worker import Settings, choose_device, configure_torch, keep_bodies_raw, max_tokens_for

logger = logging.getLogger(__name__)
# A sticky device error's exit comes this long after the answers, which TorchServe writes at once.
EXIT_GRACE_S = 1.0
DEVICE_FAILURE_EXIT = 75  # EX_TEMPFAIL: TorchServe restarts a worker whatever its exit code
# The served stages' metrics, by the forward's stage: the seconds its clock gave each.
STAGE_METRICS = {"denoise": "EdenDenoiseMs", "decode": "EdenDecodeMs"}


# TorchServe's gRPC StreamPredictions ends a call on the answer whose ts_stream_next header is
# "false", and its frontend fails the worker on one without the header (a NullPointerException:
# the worker restarted, its batch lost); Predictions, unary, ignores it. Over HTTP, "false" on an
# answer with no part sent before would send the body with no status line, and the request hung.
# So it is set on every sole answer to a request that came over gRPC, whichever method and whatever
# its stream field says, and never over HTTP.
STREAM_NEXT = "ts_stream_next"
WORKFLOW_MODEL = "__"  # in the name of a workflow's own copy of a model: eden__eden_ditdec


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
    wire_key: bytes | None = None  # the key of the payloads' tags (wire/keyed.py); None: no tags
    # (idx, body, content type): a part of request idx's answer, sent before the batch is answered
    # (TorchServe's intermediate responses); the handler sets it.
    send_part: Callable[[int, bytes, str], None] | None = None

    def __init__(self, model: CloudEncoder | EdgeModel, settings: Settings, context):
        self.model = model
        self.settings = settings
        self.context = context
        self.max_tokens = max_tokens_for(settings.max_pixels, model.config)
        self.closing: set[int] = set()  # requests of this batch that came over gRPC, whose answer must close its call

    @classmethod
    def load(cls, context) -> "Service":
        properties = context.system_properties
        settings = Settings.from_yaml(getattr(context, "model_yaml_config", None))
        device = choose_device(properties.get("gpu_id"))
        configure_torch(device, settings.threads, cls.side)
        keep_bodies_raw()
        weights = Path(properties["model_dir"]) / WEIGHTS_FILES[cls.side]
        service = cls(cls.load_model(weights, device, settings), settings, context)
        service.wire_key = keyed.key_from_environment()
        logger.info(
            "%s: %s model on %s (%d intra-op threads), max_pixels %d, keyed payloads %s; eden_serve from %s", context.model_name,
            service.model.config.name, device, torch.get_num_threads(), settings.max_pixels,
            "on" if service.wire_key else "off", Path(__file__).parent.parent,
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
        # Known before any field is judged: a refusal must close a gRPC call too.
        self.closing = {idx for idx in range(len(batch)) if not http_headers(self.context.get_all_request_header(idx))}
        return request_by_request(self.parse, batch)

    def inference(self, jobs: list) -> list:
        return request_by_request(self.run, jobs)

    def postprocess(self, outcomes: list) -> list[bytes]:
        """Per-request status and content type on the context; the bodies, in batch order. After a
        sticky device error, the worker exits once these are sent (:meth:`leave`)."""
        if any(isinstance(o, Refusal) and o.device_failure for o in outcomes):
            self.leave()
        bodies = []
        for idx, outcome in enumerate(outcomes):
            if isinstance(outcome, Refusal):
                status, reply = outcome.status, Reply(json.dumps(outcome.document).encode(), JSON)
            else:
                status, reply = 200, outcome
            self.context.set_response_status(status, _phrase(status), idx)
            self.context.set_response_content_type(idx, reply.content_type)
            if idx in self.closing:
                self.context.set_response_header(idx, STREAM_NEXT, "false")
            bodies.append(reply.body)
        return bodies

    def leave(self) -> None:
        """Exit this worker process shortly: its CUDA context is broken, so every later request
        would fail while TorchServe's /ping still answers 200. TorchServe starts a replacement.
        The failure was logged as it was met (:func:`.refusals.refusal`)."""
        logger.info("%s: exiting in %.1f s", self.context.model_name, EXIT_GRACE_S)
        timer = threading.Timer(EXIT_GRACE_S, os._exit, (DEVICE_FAILURE_EXIT,))
        timer.daemon = True
        timer.start()

    # Fresh dimension lists: TorchServe fills in ModelName and Level, into its mutable default otherwise.
    def time_metric(self, name: str, seconds: float, idx: int) -> None:
        self.context.metrics.add_time(name, round(seconds * 1000, 3), idx, "ms", [])

    def size_metric(self, name: str, size: int, idx: int) -> None:
        self.context.metrics.add_size(name, size, idx, "B", [])


class EdgeService(Service):
    """Wire payload (or an upstream error document) -> the middle frame as PNG, or for a chunk a
    zip of ``000.png``, ``001.png``, ...; fields ``stream`` and ``first`` (headers over HTTP,
    :data:`~.fields.FIELD_HEADERS`) ask for the middles from pair ``first`` on, each streamed as
    soon as it is computed (:mod:`eden_serve.answers`; docs/streaming.md).

    The pairs of every request in a batch (TorchServe's dynamic batching, and each chunk's own pairs) run in batched
    forwards of one frame size, ``max_batch_tokens`` condition tokens at most (0: the device's, :mod:`eden_serve.edge.sizing`)."""

    side = "edge"
    model: EdgeModel

    @classmethod
    def load(cls, context) -> "EdgeService":
        service = super().load(context)
        if service.edge_side.encoder is not None:  # else it refuses bitstream payloads
            start_sandbox(service.settings, keyed=service.wire_key is not None)
        return service

    @staticmethod
    def load_model(weights, device, settings):
        """The edge model of ``weights``, accelerated as ``settings`` say, warmed up. Where the
        archive carries compiled artefacts (``compiled.bin``, beside the weights), their shapes
        start compiling in the background at load, not at the first answer as a clip in process
        does (docs/gpu.md, "Compiled ahead"): TorchServe sends a worker nothing before its load
        returns, and a worker outlives many clips, so the time after its load is most often idle;
        held for the first answer, the compilations would always run beside the first client's
        clip. A worker loaded under traffic (scaled up, or replaced after a device failure)
        answers its first requests beside them, as the served edge did before."""
        model = load_edge(weights, device, settings.precision)
        if settings.max_batch_tokens:  # 0 keeps the device's default
            model.sizing.batch_tokens = settings.max_batch_tokens
        compiled = Path(weights).parent / artefacts.FILE_NAME  # eden-serve archive --prepare put it beside the weights
        prepared = compiled.is_file()
        acceleration = settings.acceleration()
        model.accelerate(acceleration.with_prepared(model.device) if prepared else acceleration)
        model.warm_up()
        if prepared and artefacts.load_into(model, compiled):
            model.runner.release()
        return model

    def __init__(self, model: EdgeModel, settings: Settings, context):
        super().__init__(model, settings, context)
        self.max_chunk_tokens = max(settings.max_chunk_tokens, 2 * self.max_tokens)
        self.replies = Replies()
        self.preparation = Preparation.for_device(model.device)  # requests opened while a batch computes
        # The cloud half, where the archive carries it, re-derives the conditions of frames payloads.
        cloud_weights = Path(context.system_properties["model_dir"]) / WEIGHTS_FILES["cloud"]
        encoder = EdgeEncoder(*load_half(cloud_weights, "cloud"), model.device) if cloud_weights.is_file() else None
        self.edge_side = EdgeSide(model, encoder, packet_decoder(settings, keyed=False))
        self._wire_key: bytes | None = None

    @property
    def wire_key(self) -> bytes | None:
        return self._wire_key

    @wire_key.setter
    def wire_key(self, key: bytes | None) -> None:
        """With the key, the payloads' tags are checked, and a bitstream payload's packets, signed by
        its cloud, are decoded in this process (:func:`.bitstreams.packet_decoder`)."""
        self._wire_key = key
        self.edge_side.decoder = packet_decoder(self.settings, keyed=key is not None)

    @property
    def send_part(self) -> Callable[[int, bytes, str], None] | None:
        return self.replies.send_part

    @send_part.setter
    def send_part(self, send: Callable[[int, bytes, str], None] | None) -> None:
        self.replies.send_part = send

    def preprocess(self, batch: list[dict]) -> list:
        batch = [with_headers(request, self.context.get_all_request_header(idx)) for idx, request in enumerate(batch)]
        return super().preprocess(batch)

    def parse(self, idx: int, request: dict) -> EdgeJob:
        stream, first = parse_stream(request.get("stream")), parse_first(request.get("first"))
        # A workflow hands its nodes the client's HTTP headers, and takes a node's first part as its
        # whole answer (docs/streaming.md): a stream asked through it would answer a fragment.
        if stream is not None and WORKFLOW_MODEL in self.context.model_name:
            raise BadInputError("a workflow answers in one part: ask for a stream (X-Eden-Stream) of "
                                "/predictions/eden_ditdec, not of /wfpredict")
        answer = answer_format(request.get("answer"), request.get("host"), self.settings.raw_answers)
        return EdgeJob(self.parse_payload(request), stream, first, answer)

    def parse_payload(self, request: dict) -> bytes:
        body = request_body(request)
        # A workflow hands a failed cloud node's error document on to this node (docs/serving.md: "Errors").
        upstream = encoder_refusal(body)
        if upstream is not None:
            raise upstream
        if isinstance(body, str):
            return body.encode()  # sent as text: wire.decode judges it
        if not isinstance(body, (bytes, bytearray)):
            raise BadInputError(f"request body must be the encoder's wire payload ({OCTET_STREAM}), got a JSON {type(body).__name__}")
        return body

    def open(self, idx: int, job: EdgeJob) -> Chunk:
        """The payload's conditions on the device, as its kind makes them (a bitstream payload's
        packets decoded: 409 where a frame's digest differs)."""
        opened = wire.decode(
            keyed.verify(job.payload, self.wire_key), self.model.config, max_tokens=self.max_tokens, max_frames=self.settings.max_chunk_frames,
            max_chunk_tokens=self.max_chunk_tokens, max_pixels=self.settings.max_pixels,
        )
        if job.first > opened.pairs or (job.first == opened.pairs and not job.stream):  # streamed: just the end (docs/streaming.md)
            raise BadInputError(f"first is {job.first}, but the payload holds {opened.pairs} pairs (0 to {opened.pairs - 1})")
        self.size_metric("EdenPayloadBytes", len(job.payload), idx)
        start = time.perf_counter()
        chunk = wire.kind_of(opened).conditions(opened, self.edge_side)
        self.time_metric("EdenConditionsMs", time.perf_counter() - start, idx)
        return chunk

    def inference(self, jobs: list) -> list:
        """Each request opened on the preparation thread (:mod:`.overlap`), in the order of the
        seeds its payload states, while the forwards of those before it compute; its middles
        answered as :mod:`.replies` says."""
        seeds = [header_seeds(job.payload) if isinstance(job, EdgeJob) else None for job in jobs]
        # For timelines (two_hosts.py --timeline): each request by its first seed, its pair's place in a clip.
        logger.info("edge call at %.3f: requests (first seed, pairs) %s", time.time(), [(s.seeds[0], len(s.seeds)) if s else None for s in seeds])
        chunks, answers, grouped = list(jobs), {}, Forwards(self.model.sizing)
        for idx, chunk in self.preparation.opened(self.open, jobs, earliest_first(seeds, [getattr(job, "first", 0) for job in jobs])):
            chunks[idx] = chunk
            if isinstance(chunk, Chunk):
                answers[idx] = self.replies.begin(idx, chunk, jobs[idx])
                for batch in grouped.add(chunk, [(idx, j) for j in range(jobs[idx].first, chunk.pairs) if j not in chunk.copies]):
                    self.compute(batch, chunks, answers)
        for batch in grouped.rest():
            self.compute(batch, chunks, answers)
        return [self.reply(idx, answers[idx]) if idx in answers else chunk for idx, chunk in enumerate(chunks)]

    def compute(self, batch: list[tuple[int, int]], chunks: list, answers: dict[int, Answer]) -> None:
        """The middles of ``batch``'s (request, pair)s (those of requests not refused yet), encoded
        on the encoding threads while the next batch computes."""
        batch = [(idx, j) for idx, j in batch if answers[idx].refusal is None]
        planes = {answers[idx].format.planes for idx, _ in batch}  # converted on a GPU where all ask the same
        for part, outcome, seconds in forwards(self.model, batch, chunks, planes.pop() if len(planes) == 1 else None):
            self.replies.computed(part, outcome, seconds, answers)

    def reply(self, idx: int, answer: Answer) -> Reply | Refusal:
        """Request ``idx``'s answer, and the seconds its pairs took in each stage as its metrics."""
        if answer.refusal is None:
            for stage, metric in STAGE_METRICS.items():
                self.time_metric(metric, answer.seconds.get(stage, 0.0), idx)
        return self.replies.reply(idx, answer, self.closing)
