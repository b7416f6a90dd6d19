"""The two halves as TorchServe services: :class:`Service`, what both do, and :class:`EdgeService`
(wire payload -> the middle frame as PNG); the cloud's, :class:`~.cloud_service.CloudService`
(frames -> wire payload), is in :mod:`.cloud_service`.

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
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, NamedTuple

import numpy as np
import torch

from .. import wire
from ..checkpoint import WEIGHTS_FILES, load_edge, load_half
from ..cloud.encoder import CloudEncoder
from ..edge import EdgeModel, artefacts, earliest_first, to_host
from ..edge.forward import prepare_render
from ..edge.yuv import to_planes
from ..media.planes import PlaneFormat
from ..edge.conditions import EdgeEncoder, Intake
from ..edge.streams import streams_for
from ..errors import BadInputError, encoder_refusal
from ..media.frames import as_pixels
from ..wire import Chunk, keyed
from ..wire.answers import END, FAILED, MIDDLE, STREAMED, record
from .answer_formats import PNG_ANSWER, AnswerFormat, answer_format
from .bitstreams import decoded, start_sandbox
from .fields import JSON, OCTET_STREAM, parse_first, parse_stream, request_body, stream_of, with_headers
from .overlap import Forwards, Preparation, stated
from .refusals import Refusal, each, refusal, release_cached_memory
from .worker import Settings, choose_device, configure_torch, keep_bodies_raw, max_tokens_for

logger = logging.getLogger(__name__)
# A sticky device error's exit comes this long after the answers, which TorchServe writes at once.
EXIT_GRACE_S = 1.0
DEVICE_FAILURE_EXIT = 75  # EX_TEMPFAIL: TorchServe restarts a worker whatever its exit code
# Threads that encode an edge batch's middles (and stream them) while the next batch computes: zlib releases the GIL.
PNG_THREADS = 2


class Reply(NamedTuple):
    body: bytes
    content_type: str


# TorchServe's gRPC StreamPredictions ends a call on the answer whose ts_stream_next header is
# "false", and fails on one without the header; over HTTP, "false" on an answer with no part sent
# before would send the body with no status line. So it is set only on a gRPC stream's sole answer.
STREAM_NEXT = "ts_stream_next"


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
        self.closing: set[int] = set()  # requests of this batch whose answer must close a gRPC stream

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
        return each(self.parse, batch)

    def inference(self, jobs: list) -> list:
        return each(self.run, jobs)

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
        would fail while TorchServe's /ping still answers 200. TorchServe starts a replacement."""
        logger.critical("%s: the device failed; this worker exits so that TorchServe replaces it", self.context.model_name)
        timer = threading.Timer(EXIT_GRACE_S, os._exit, (DEVICE_FAILURE_EXIT,))
        timer.daemon = True
        timer.start()

    # Fresh dimension lists: TorchServe fills in ModelName and Level, into its mutable default otherwise.
    def time_metric(self, name: str, seconds: float, idx: int) -> None:
        self.context.metrics.add_time(name, round(seconds * 1000, 3), idx, "ms", [])

    def size_metric(self, name: str, size: int, idx: int) -> None:
        self.context.metrics.add_size(name, size, idx, "B", [])


class EdgeJob(NamedTuple):
    payload: bytes
    stream: str | None  # None (a whole answer), or the transport that carries a streamed one: http, grpc
    first: int  # the chunk's first pair to answer: a client asking again for what did not arrive
    answer: AnswerFormat = PNG_ANSWER  # PNGs, or raw frames (:mod:`.answer_formats`)


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
        if service.intake.encoder is not None:  # else it refuses bitstream payloads
            start_sandbox(service.settings, keyed=service.wire_key is not None)
        return service

    @staticmethod
    def load_model(weights, device, settings):
        model = load_edge(weights, device, settings.precision)
        if settings.max_batch_tokens:  # 0 keeps the device's default
            model.batch_tokens = settings.max_batch_tokens
        model.accelerate(settings.acceleration())
        model.warm_up()
        compiled = Path(weights).parent / artefacts.FILE_NAME  # eden-serve archive --prepare put it beside the weights
        if compiled.is_file():
            artefacts.load_into(model, compiled)
        return model

    def __init__(self, model: EdgeModel, settings: Settings, context):
        super().__init__(model, settings, context)
        self.max_chunk_tokens = max(settings.max_chunk_tokens, 2 * self.max_tokens)
        self.pngs = ThreadPoolExecutor(PNG_THREADS, thread_name_prefix="eden-png")
        self.sending = threading.Lock()  # parts of answers go out one at a time, from the encoding threads too
        self.preparation = Preparation(streams_for(model.device))  # the next request opened while a batch computes
        # The cloud half, where the archive carries it, re-derives the conditions of frames payloads.
        cloud_weights = Path(context.system_properties["model_dir"]) / WEIGHTS_FILES["cloud"]
        encoder = EdgeEncoder(*load_half(cloud_weights, "cloud"), model.device) if cloud_weights.is_file() else None
        self.intake = Intake(model, encoder, settings.max_pixels, self.decoded)

    def preprocess(self, batch: list[dict]) -> list:
        batch = [with_headers(request, self.context.get_all_request_header(idx)) for idx, request in enumerate(batch)]
        # Known before any field is judged: a refusal on a gRPC stream must close it too.
        self.closing = {idx for idx, request in enumerate(batch) if stream_of(request) == "grpc"}
        return super().preprocess(batch)

    def parse(self, idx: int, request: dict) -> EdgeJob:
        stream, first = parse_stream(request.get("stream")), parse_first(request.get("first"))
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

    def decoded(self, chunk: wire.BitstreamChunk, max_pixels: int | None) -> np.ndarray:
        """A bitstream payload's frames, decoded here where its cloud signed it, else as
        ``handler.unkeyed_bitstream`` says (:mod:`.bitstreams`)."""
        return decoded(chunk, self.settings, keyed=self.wire_key is not None)

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
        chunk = wire.kind_of(opened).conditions(opened, self.intake)
        self.time_metric("EdenConditionsMs", time.perf_counter() - start, idx)
        return chunk

    def inference(self, jobs: list) -> list:
        """Each request opened on the preparation thread (:mod:`.overlap`), in the order of the
        seeds its payload states, while the forwards of those before it compute."""
        states = [stated(job.payload) if isinstance(job, EdgeJob) else None for job in jobs]
        # For timelines (two_hosts.py --timeline): each request by its first seed, its pair's place in a clip.
        logger.info("edge call at %.3f: requests (first seed, pairs) %s", time.time(), [(s.seeds[0], len(s.seeds)) if s else None for s in states])
        chunks, answers, forwards = list(jobs), {}, Forwards(self.model)
        for idx, chunk in self.preparation.opened(self.open, jobs, earliest_first(states, [getattr(job, "first", 0) for job in jobs])):
            chunks[idx] = chunk
            if isinstance(chunk, Chunk):
                answers[idx] = _Answer(chunk, jobs[idx])
                with self.sending:
                    self.send_ready(idx, answers[idx])
                for batch in forwards.add(chunk, [(idx, j) for j in range(jobs[idx].first, chunk.pairs) if j not in chunk.copies]):
                    self.compute(batch, chunks, answers)
        for batch in forwards.rest():
            self.compute(batch, chunks, answers)
        return [self.reply(idx, answers[idx]) if idx in answers else chunk for idx, chunk in enumerate(chunks)]

    def compute(self, batch: list[tuple[int, int]], chunks: list, answers: dict[int, "_Answer"]) -> None:
        """The middles of ``batch``'s (request, pair)s, encoded on the encoding threads while the
        next batch computes (:meth:`encoded`)."""
        batch = [(idx, j) for idx, j in batch if answers[idx].refusal is None]
        planes = {answers[idx].format.planes for idx, _ in batch}  # converted on the device where all ask the same
        for part, outcome, denoise_s, decode_s in self.forward(batch, chunks, planes.pop() if len(planes) == 1 else None):
            for n, (idx, j) in enumerate(part):
                answer = answers[idx]
                with self.sending:
                    if isinstance(outcome, Refusal):
                        answer.refusal = outcome
                    elif answer.refusal is None:
                        answer.encodings.append(self.pngs.submit(self.encoded, idx, answer, j, outcome[n].numpy()))
                        answer.seconds[0] += denoise_s / len(part)
                        answer.seconds[1] += decode_s / len(part)

    def encoded(self, idx: int, answer: "_Answer", j: int, pixels: np.ndarray) -> bytes:
        """On an encoding thread: pair ``j``'s middle in the request's answer format, streamed as
        soon as it is next in order."""
        data = answer.format.encode(pixels)
        with self.sending:
            answer.middles[j] = data
            if answer.refusal is None:
                self.send_ready(idx, answer)
        return data

    def send_ready(self, idx: int, answer: "_Answer") -> None:
        """Streams request ``idx``'s middles that are encoded and next in order (under ``sending``)."""
        while answer.next is not None and answer.next < len(answer.middles) and isinstance(answer.middles[answer.next], bytes):
            self.send_part(idx, record(MIDDLE, answer.next, answer.middles[answer.next]), STREAMED)
            answer.next += 1

    def reply(self, idx: int, answer: "_Answer") -> Reply | Refusal:
        """Request ``idx``'s answer: its middles whole, or the end of those it streamed."""
        outcome = answer.refusal
        if outcome is None:
            self.time_metric("EdenDenoiseMs", answer.seconds[0], idx)
            self.time_metric("EdenDecodeMs", answer.seconds[1], idx)
            # Each encoding's end, its part streamed included: a middle set but not yet sent must not
            # be answered whole behind the part (nor the end record sent before it).
            for encoding in answer.encodings:
                encoding.result()
            outcome = answer.middles
        if answer.next is not None and (answer.next > answer.first or answer.next == len(answer.middles)):  # streamed: this ends it
            if answer.next > answer.first:
                self.closing.discard(idx)  # TorchServe ends a stream with parts sent itself
            if isinstance(outcome, Refusal):
                return Reply(record(FAILED, 0, json.dumps(outcome.document).encode()), STREAMED)
            return Reply(record(END, 0), STREAMED)
        if isinstance(outcome, Refusal):
            return outcome
        return Reply(*answer.format.whole(outcome[answer.first:]))

    def forward(self, batch: list[tuple[int, int]], chunks: list, planes: PlaneFormat | None = None) -> Iterator[tuple[list, torch.Tensor | Refusal, float, float]]:
        """(pairs, their middles [B, H, W, 3] uint8 or the Refusal of them all, denoise and decode
        seconds) for the (request, pair) of ``batch``. A batch that runs out of memory is tried
        again in halves, down to single pairs, before its pairs are refused with 507."""
        if not batch:
            return
        start = time.time()
        outcome = self.attempt([chunks[idx] for idx, _ in batch], [j for _, j in batch], planes)
        logger.info("edge forward of seeds %s from %.3f to %.3f", [chunks[idx].seeds[j] for idx, j in batch], start, time.time())
        # Out of attempt(): the failure's traceback, and the batch's tensors it held, are gone.
        if isinstance(outcome, Refusal) and outcome.status == 507:
            release_cached_memory()
            if len(batch) > 1:
                half = len(batch) // 2
                logger.warning("a batch of %d pairs ran out of memory; trying %d and %d", len(batch), half, len(batch) - half)
                yield from self.forward(batch[:half], chunks, planes)
                yield from self.forward(batch[half:], chunks, planes)
                return
        if isinstance(outcome, Refusal):
            yield batch, outcome, 0.0, 0.0
        else:
            yield (batch, *outcome)

    def attempt(self, chunks: list[Chunk], pairs: list[int], planes: PlaneFormat | None = None) -> tuple[torch.Tensor, float, float] | Refusal:
        """One batched forward, timed stage by stage: the device is synchronised at each clock
        reading, so that each stage is charged its own kernels."""
        try:
            conditions = [chunk.pair(j) for chunk, j in zip(chunks, pairs)]
            self.model.synchronize()
            start = time.perf_counter()
            latents = self.model.denoise(conditions)
            self.model.synchronize()
            denoised = time.perf_counter()
            frames = self.decode(latents, conditions, [chunk.depth for chunk in chunks], planes)
            self.model.synchronize()
            return frames, denoised - start, time.perf_counter() - denoised
        except Exception as exc:  # the batch's requests fail (or are tried in halves); the others go on
            return refusal(exc)


    def decode(self, latents: torch.Tensor, conditions: list, depths: list[int],
               planes: PlaneFormat | None = None) -> torch.Tensor | list[torch.Tensor]:
        """The middles as pixels on the host, each at its chunk's depth: 8 bits rounded on the device
        (a quarter of the bytes back; with ``planes`` on a GPU, converted to them there, [B, H 3/2,
        W]: half again), as before there were deeper ones; a batch with 16-bit chunks in it comes
        back in float32 and is rounded here, each pair as the in-process pipeline rounds it."""
        if all(depth == 8 for depth in depths) and planes is not None and self.model.device.type == "cuda":
            pixels = self.model.render(latents, prepare_render(conditions, self.model.config, self.model.device), uint8=True)
            return to_host(to_planes(pixels, planes).reshape(len(conditions), -1, pixels.shape[2]))
        if all(depth == 8 for depth in depths):
            return self.model.decode_uint8(latents, conditions)
        frames = self.model.decode_latents(latents, conditions)
        return [as_pixels(frame[None], depth)[0] for frame, depth in zip(frames, depths)]


class _Answer:
    """What one request of an edge call has so far: its middles (encoded, or None until then; a
    cut pair's is in the payload) and the encodings under way, or the refusal of them all; the seconds its
    pairs took in the DiT and the decoder; and for a streamed answer the pair it sends next."""

    def __init__(self, chunk: Chunk, job: EdgeJob):
        self.middles: list = [job.answer.copy(chunk.copies[j]) if j in chunk.copies else None for j in range(chunk.pairs)]
        self.encodings: list[Future] = []
        self.refusal: Refusal | None = None
        self.seconds = [0.0, 0.0]
        self.first = job.first
        self.next: int | None = job.first if job.stream else None
        self.format = job.answer
