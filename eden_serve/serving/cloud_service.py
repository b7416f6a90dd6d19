"""The cloud half as a TorchServe service: :class:`CloudService`, a chunk's frames (uploaded, or
named in a server-side source) -> its payload, of the kind the request's codec names."""

from __future__ import annotations

import time
from typing import NamedTuple

from .. import wire
from ..cloud.encoder import CloudEncoder
from ..cloud.limits import images_depth, read_chunk
from ..config import MAX_SEED
from ..errors import BadInputError
from ..media.frames import frames_on
from ..model.checkpoint import load_cloud
from ..wire import keyed
from .fields import OCTET_STREAM, form_field, frame_fields, image_bytes, parse_kind, parse_seed, parse_threshold
from .services import Reply, Service
from .sources import PacketsJob, ProbeJob, SourceChunk, answer, parse_source, read_source, source_depth
from .worker import Settings


class EncodeJob(NamedTuple):
    frames: list[bytes] | range  # image files, decoded in run(); or the frames of a server-side source
    seed: int
    kind: wire.Kind
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
        kind = parse_kind(request.get("codec"), self.settings.codec, source=source is not None)
        threshold = parse_threshold(request.get("scene_threshold"), self.settings.scene_threshold)
        return EncodeJob(frames, seed, kind, threshold, source)

    def run(self, idx: int, job: EncodeJob | ProbeJob | PacketsJob) -> Reply:
        """The payload of a chunk, signed where this cloud holds a wire key, as its kind answers a
        client (a bitstream payload without the packets the client holds)."""
        if not isinstance(job, EncodeJob):
            return Reply(*answer(self.settings, job))
        source = None
        if job.source is not None:
            pixels = read_source(self.settings, job.source, job.frames, self.model.config, self.max_tokens, self.max_chunk_tokens)
            frames = frames_on(pixels, self.model.device)
            source = SourceChunk(self.settings, job.source, job.frames, pixels)
            depth = source_depth(self.settings, job.source)
        else:
            frames = read_chunk(job.frames, self.model.config, self.settings.max_pixels, wire.MAX_SIDE, self.max_tokens,
                                self.max_chunk_tokens)
            depth = images_depth(job.frames)
        start = time.perf_counter()
        chunk = job.kind.make(self.model, frames, job.seed, job.scene_threshold, source, depth)
        encoded = time.perf_counter()
        payload = job.kind.seal(chunk, self.model.config)
        payload = job.kind.answer(payload if self.wire_key is None else keyed.sign(payload, self.wire_key))
        self.time_metric("EdenEncodeMs", encoded - start, idx)
        self.size_metric("EdenPayloadBytes", len(payload), idx)
        return Reply(payload, OCTET_STREAM)
