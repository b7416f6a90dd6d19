"""The two halves as TorchServe services: :class:`CloudService` (two frames -> wire payload) and
:class:`EdgeService` (wire payload -> the middle frame as PNG).

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

import torch

from .. import wire
from ..answers import END, FAILED, MIDDLE, STREAMED, record, zip_of
from ..checkpoint import WEIGHTS_FILES, load_cloud, load_edge
from ..cloud.encoder import CloudEncoder, read_chunk
from ..config import MAX_SEED
from ..edge import EdgeModel, earliest_first
from ..errors import BadInputError, ModelMismatchError, encoder_refusal
from ..media.frames import png_of
from ..wire import Chunk, keyed
from .fields import (
    JSON, OCTET_STREAM, PNG, ZIP, form_field, frame_fields, image_bytes, parse_first, parse_seed, parse_stream,
    parse_threshold, request_body, stream_of, with_headers,
)
from .bitstreams import bitstream_frames
from .refusals import Refusal, each, refusal, release_cached_memory
from .sources import PacketsJob, ProbeJob, answer, codec_of, parse_source, read_source, sealed
from .worker import Settings, choose_device, configure_torch, keep_bodies_raw, max_tokens_for

logger = logging.getLogger(__name__)
# A sticky device error's exit comes this long after the answers, which TorchServe writes at once.
EXIT_GRACE_S = 1.0
DEVICE_FAILURE_EXIT = 75  # EX_TEMPFAIL: TorchServe restarts a worker whatever its exit code
# Threads that PNG-encode an edge batch's middles while the next batch computes: zlib releases the GIL.
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


class EncodeJob(NamedTuple):
    frames: list[bytes] | range  # image files, decoded in run(); or the frames of a server-side source
    seed: int
    codec: str
    scene_threshold: float | None
    source: str | None = None  # a video's name under the media root (docs/cloud-sources.md)


class CloudService(Service):
    """Form fields frame0 ... frameK (2 <= K + 1 <= max_chunk_frames), seed, codec, scene_threshold ->
    one chunk payload. Or, with ``handler.media_root`` set, field ``source`` naming a video under it
    and ``start``, ``frames`` (frames ``start`` ... ``start + frames - 1``) instead of the frames; or
    ``source`` and ``ask=probe`` or ``ask=packets`` (:mod:`.sources`)."""

    side = "cloud"
    model: CloudEncoder

    @staticmethod
    def load_model(weights, device, settings):
        return load_cloud(weights, device)

    def __init__(self, model: CloudEncoder, settings: Settings, context):
        super().__init__(model, settings, context)
        self.max_chunk_tokens = max(settings.max_chunk_tokens, 2 * self.max_tokens)

    def parse(self, idx: int, request: dict) -> EncodeJob | ProbeJob | PacketsJob:
        if request.get("source") is not None:
            named = parse_source(request, self.settings)
            return named if isinstance(named, (ProbeJob, PacketsJob)) else self.parse_options(request, named[1], named[0])
        frames = [image_bytes(form_field(request, name), name) for name in frame_fields(request, self.settings.max_chunk_frames)]
        return self.parse_options(request, frames)

    def parse_options(self, request: dict, frames: list[bytes] | range, source: str | None = None) -> EncodeJob:
        seed = parse_seed(request.get("seed"))
        if seed + len(frames) - 2 > MAX_SEED:
            raise BadInputError(f"seed {seed} leaves no room for the seeds of {len(frames) - 1} pairs below {MAX_SEED}")
        codec = codec_of(request, source, self.settings.codec)
        threshold = parse_threshold(request.get("scene_threshold"), self.settings.scene_threshold)
        return EncodeJob(frames, seed, codec, threshold, source)

    def run(self, idx: int, job: EncodeJob | ProbeJob | PacketsJob) -> Reply:
        if not isinstance(job, EncodeJob):
            return Reply(*answer(self.settings, job))
        if job.source is not None:
            frames = read_source(self.settings, job.source, job.frames, self.model.config, self.max_tokens, self.max_chunk_tokens)
        else:
            frames = read_chunk(job.frames, self.model.config, self.settings.max_pixels, wire.MAX_SIDE, self.max_tokens,
                                self.max_chunk_tokens)
        start = time.perf_counter()
        make = self.model.frames_chunk if job.codec in (wire.FRAMES_CODEC, wire.BITSTREAM_CODEC) else self.model.encode_chunk
        chunk = make(frames, job.seed, job.scene_threshold)
        encoded = time.perf_counter()
        payload = sealed(self.settings, job.codec, job.source, job.frames, chunk, self.model.config, self.wire_key)
        self.time_metric("EdenEncodeMs", encoded - start, idx)
        self.size_metric("EdenPayloadBytes", len(payload), idx)
        return Reply(payload, OCTET_STREAM)


class EdgeJob(NamedTuple):
    payload: bytes
    stream: str | None  # None (a whole answer), or the transport that carries a streamed one: http, grpc
    first: int  # the chunk's first pair to answer: a client asking again for what did not arrive


class EdgeService(Service):
    """Wire payload (or an upstream error document) -> the middle frame as PNG, or for a chunk a
    zip of ``000.png``, ``001.png``, ...; fields ``stream`` and ``first`` (headers over HTTP,
    :data:`~.fields.FIELD_HEADERS`) ask for the middles from pair ``first`` on, each streamed as
    soon as it is computed (:mod:`eden_serve.answers`; docs/streaming.md).

    The pairs of every request in a batch (TorchServe's dynamic batching, and each chunk's own pairs) run in batched
    forwards of one frame size, ``max_batch_tokens`` condition tokens at most (0: the device's, :mod:`eden_serve.edge.sizing`)."""

    side = "edge"
    model: EdgeModel

    @staticmethod
    def load_model(weights, device, settings):
        model = load_edge(weights, device, settings.precision)
        if settings.max_batch_tokens:  # 0 keeps the device's default
            model.batch_tokens = settings.max_batch_tokens
        model.accelerate(settings.acceleration())
        model.warm_up()
        return model

    def __init__(self, model: EdgeModel, settings: Settings, context):
        super().__init__(model, settings, context)
        self.max_chunk_tokens = max(settings.max_chunk_tokens, 2 * self.max_tokens)
        self.pngs = ThreadPoolExecutor(PNG_THREADS, thread_name_prefix="eden-png")
        # The cloud half, where the archive carries it, re-derives the conditions of frames payloads.
        cloud_weights = Path(context.system_properties["model_dir"]) / WEIGHTS_FILES["cloud"]
        self.e_cond = load_cloud(cloud_weights, model.device) if cloud_weights.is_file() else None

    def preprocess(self, batch: list[dict]) -> list:
        batch = [with_headers(request, self.context.get_all_request_header(idx)) for idx, request in enumerate(batch)]
        # Known before any field is judged: a refusal on a gRPC stream must close it too.
        self.closing = {idx for idx, request in enumerate(batch) if stream_of(request) == "grpc"}
        return super().preprocess(batch)

    def parse(self, idx: int, request: dict) -> EdgeJob:
        stream, first = parse_stream(request.get("stream")), parse_first(request.get("first"))
        return EdgeJob(self.parse_payload(request), stream, first)

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

    def decode(self, idx: int, job: EdgeJob) -> Chunk:
        chunk = wire.decode(
            keyed.verify(job.payload, self.wire_key), self.model.config, max_tokens=self.max_tokens, max_frames=self.settings.max_chunk_frames,
            max_chunk_tokens=self.max_chunk_tokens, max_pixels=self.settings.max_pixels,
        )
        if job.first > chunk.pairs or (job.first == chunk.pairs and not job.stream):  # streamed: just the end (docs/streaming.md)
            raise BadInputError(f"first is {job.first}, but the payload holds {chunk.pairs} pairs (0 to {chunk.pairs - 1})")
        self.size_metric("EdenPayloadBytes", len(job.payload), idx)
        if isinstance(chunk, (wire.FramesChunk, wire.BitstreamChunk)):
            if self.e_cond is None:
                raise ModelMismatchError("this edge's archive carries no cloud weights to derive conditions from frames with; "
                                         f"rebuild it with this release's archive.sh, or ask the cloud for codec {wire.DEFAULT_CODEC}")
            start = time.perf_counter()
            if isinstance(chunk, wire.BitstreamChunk):
                chunk = bitstream_frames(chunk, self.settings, keyed=self.wire_key is not None)  # 409 where a digest differs
            chunk = self.e_cond.restore(chunk)
            self.time_metric("EdenConditionsMs", time.perf_counter() - start, idx)
        return self.model.receive(chunk)

    def send_ready(self, idx: int, middles: list, sent: dict[int, int]) -> None:
        """Streams request ``idx``'s middles that are computed and next in order (a PNG still being
        encoded is waited for: a streamed answer wants each middle as soon as it can have it)."""
        while sent[idx] < len(middles) and middles[sent[idx]] is not None:
            png = middles[sent[idx]]
            self.send_part(idx, record(MIDDLE, sent[idx], png.result() if isinstance(png, Future) else png), STREAMED)
            sent[idx] += 1

    def inference(self, jobs: list) -> list:
        chunks = each(self.decode, jobs)
        # For timelines (two_hosts.py --timeline): each request by its first seed, its pair's place in a clip.
        logger.info("edge call at %.3f: requests (first seed, pairs) %s", time.time(), [(c.seeds[0], c.pairs) if isinstance(c, Chunk) else None for c in chunks])
        # Per request: its middles as PNGs or futures of them (a cut's is in the payload), or its Refusal.
        middles: dict[int, list | Refusal] = {}
        seconds: dict[int, list[float]] = {}
        groups: dict[tuple, list[tuple[int, int]]] = {}
        sent: dict[int, int] = {}  # per streamed request: the pair whose middle it sends next
        for idx in earliest_first(chunks, [job.first if isinstance(job, EdgeJob) else 0 for job in jobs]):
            chunk = chunks[idx]
            if isinstance(chunk, Chunk):
                middles[idx] = [chunk.cuts.get(j) for j in range(chunk.pairs)]
                seconds[idx] = [0.0, 0.0]
                computed = [(idx, j) for j in range(jobs[idx].first, chunk.pairs) if j not in chunk.cuts]
                groups.setdefault((chunk.grid, chunk.size), []).extend(computed)
                if jobs[idx].stream:
                    sent[idx] = jobs[idx].first
                    self.send_ready(idx, middles[idx], sent)
        for (grid, _), pairs in groups.items():
            for batch in self.model.batched(pairs, grid):
                batch = [(idx, j) for idx, j in batch if isinstance(middles[idx], list)]
                for part, outcome, denoise_s, decode_s in self.forward(batch, chunks):
                    for n, (idx, j) in enumerate(part):
                        if isinstance(outcome, Refusal):
                            middles[idx] = outcome
                        elif isinstance(middles[idx], list):
                            middles[idx][j] = self.pngs.submit(png_of, outcome[n].numpy())
                            seconds[idx][0] += denoise_s / len(part)
                            seconds[idx][1] += decode_s / len(part)
                    for idx in dict.fromkeys(idx for idx, _ in part if idx in sent and isinstance(middles[idx], list)):
                        self.send_ready(idx, middles[idx], sent)
        results = []
        for idx, chunk in enumerate(chunks):
            outcome = middles.get(idx, chunk)
            if isinstance(outcome, list):
                self.time_metric("EdenDenoiseMs", seconds[idx][0], idx)
                self.time_metric("EdenDecodeMs", seconds[idx][1], idx)
                outcome = [png.result() if isinstance(png, Future) else png for png in outcome]
            if idx in sent and (sent[idx] > jobs[idx].first or sent[idx] == chunk.pairs):  # streamed: this ends it
                failed = isinstance(outcome, Refusal)
                outcome = Reply(record(FAILED, 0, json.dumps(outcome.document).encode()) if failed else record(END, 0), STREAMED)
                if sent[idx] > jobs[idx].first:
                    self.closing.discard(idx)  # TorchServe ends a stream with parts sent itself
            elif isinstance(outcome, list):
                outcome = outcome[jobs[idx].first:]
                outcome = Reply(outcome[0], PNG) if len(outcome) == 1 else Reply(zip_of(outcome), ZIP)
            results.append(outcome)
        return results

    def forward(self, batch: list[tuple[int, int]], chunks: list) -> Iterator[tuple[list, torch.Tensor | Refusal, float, float]]:
        """(pairs, their middles [B, H, W, 3] uint8 or the Refusal of them all, denoise and decode
        seconds) for the (request, pair) of ``batch``. A batch that runs out of memory is tried
        again in halves, down to single pairs, before its pairs are refused with 507."""
        if not batch:
            return
        start = time.time()
        outcome = self.attempt([chunks[idx] for idx, _ in batch], [j for _, j in batch])
        logger.info("edge forward of seeds %s from %.3f to %.3f", [chunks[idx].seeds[j] for idx, j in batch], start, time.time())
        # Out of attempt(): the failure's traceback, and the batch's tensors it held, are gone.
        if isinstance(outcome, Refusal) and outcome.status == 507:
            release_cached_memory()
            if len(batch) > 1:
                half = len(batch) // 2
                logger.warning("a batch of %d pairs ran out of memory; trying %d and %d", len(batch), half, len(batch) - half)
                yield from self.forward(batch[:half], chunks)
                yield from self.forward(batch[half:], chunks)
                return
        if isinstance(outcome, Refusal):
            yield batch, outcome, 0.0, 0.0
        else:
            yield (batch, *outcome)

    def attempt(self, chunks: list[Chunk], pairs: list[int]) -> tuple[torch.Tensor, float, float] | Refusal:
        """One batched forward, timed stage by stage: the device is synchronised at each clock
        reading, so that each stage is charged its own kernels."""
        try:
            conditions = [chunk.pair(j) for chunk, j in zip(chunks, pairs)]
            self.model.synchronize()
            start = time.perf_counter()
            latents = self.model.denoise(conditions)
            self.model.synchronize()
            denoised = time.perf_counter()
            frames = self.model.decode_uint8(latents, conditions)
            self.model.synchronize()
            return frames, denoised - start, time.perf_counter() - denoised
        except Exception as exc:  # the batch's requests fail (or are tried in halves); the others go on
            return refusal(exc)

