"""Client for EDEN on TorchServe: one pair, or a whole clip streamed through the servers.

Two deployments::

    from eden_serve.client import Client

    with Client("http://127.0.0.1:8080", token=...) as client:            # the workflow on one server
        middle = client.interpolate("a.png", "b.png", seed=0)               # a PIL image
    with Client(cloud="http://cloud:8080", edge="http://edge:8080") as client:  # split: we carry the payload
        summary = client.interpolate_clip("clip.gif", "out.gif", inflight=4)

over HTTP or gRPC, as the URLs' scheme says (``http://``, ``https://``, ``grpc://``, ``grpcs://``:
:mod:`eden_serve.client.transports`). In the split the edge streams each middle as soon as it is computed,
the clip's first chunks ramp up (1, 1, 2, 4, ... pairs), and each step takes the chunks in their
order, so the first middle comes after one pair's work (docs/streaming.md).

Every request is retried with exponential backoff on connection errors and 5xx answers (a worker
being restarted answers 503 or drops the connection); a 4xx answer is final and raised as
:class:`ServerError` with the server's own message. In the split deployment each step is retried on
its own, so an edge failure does not re-run the encoder, and asks only for the middles that did not
arrive.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from PIL import Image

from .. import wire
from ..clips.processors import Middles, Processor
from ..clips.streaming import DEFAULT_CHUNK, DEFAULT_INFLIGHT, TIMELINE, ClipOptions, Summary, interpolate_clip
from ..clips.workers import Arrivals
from ..errors import BadInputError, ChunkTooLargeError, CodecError, ServerError
from ..media import Frame
from ..media.frames import DEFAULT_MAX_PIXELS, Picture, oriented_size, png_bytes
from .pace import codec_policy
from .remote import RemoteVideo, named_fields, open_remote, source_name
from .tls import ClientTLS
from .transports import DECODER, ENCODER, Retry, RunRequests, Stage, transport_for

__all__ = ["DECODER", "DEFAULT_TIMEOUT", "ENCODER", "Client", "ClientOptions"]

DEFAULT_TIMEOUT = 300.0  # seconds to wait for an answer: a 4K pair on a CPU takes minutes
CLOUD_REQUESTS = 2  # requests at the cloud at once in the split (see Client.processor)


def _as_bytes(frame: str | Path | bytes | Image.Image, name: str) -> bytes:
    if isinstance(frame, (bytes, bytearray)):
        return bytes(frame)
    if isinstance(frame, Image.Image):
        return png_bytes(frame)
    try:
        return Path(frame).read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read {name} {str(frame)!r}: {exc.strerror}") from None


@dataclass(frozen=True)
class ClientOptions:
    """How the client reaches its servers: ``token``, the inference token (None: no auth);
    ``edge_token``, the edge server's where it differs (two TorchServes have two key files);
    ``tls``, the CA that signed the servers' certificates (https:// and grpcs:// URLs); ``timeout``,
    seconds to wait for an answer; ``tries`` and ``backoff``, the retries of each request
    (:class:`~.transports.Retry`); ``transport``, a transport's name, http or grpc
    (:data:`~.transports.TRANSPORTS`; None: the URLs' scheme says)."""

    token: str | None = None
    edge_token: str | None = None
    tls: ClientTLS | None = None
    timeout: float = DEFAULT_TIMEOUT
    tries: int = 5
    backoff: float = 1.0
    transport: str | None = None


@dataclass(frozen=True)
class _Chunk:
    """One chunk as the client asks for it: its ``encoded`` frames of ``size`` (width, height), or
    the fields that ``named`` them on the cloud; pair j seeded ``seed + j``. ``index`` (its first
    pair) labels its timeline, ``order`` is its place in the stages' queues."""

    encoded: Sequence[bytes]
    seed: int
    size: tuple[int, int]
    named: dict[str, str] | None = None
    index: int = 0
    order: int | None = None

    @property
    def pairs(self) -> int:
        return (int(self.named["frames"]) if self.named else len(self.encoded)) - 1

    def event(self, name: str) -> None:
        TIMELINE.debug("chunk %d (%d pairs): %s", self.index, self.pairs, name)


class Client:
    """Talks to ``server`` (the workflow) or to ``cloud`` and ``edge`` (encoder and DiT+decoder),
    over the transport their URLs' scheme picks: HTTP (:class:`~.transports.http.HttpTransport`) or
    gRPC (:class:`~.transports.grpc.GrpcTransport`; TorchServe has no gRPC workflow API, so
    ``server`` then names a server with both models).

    ``codec`` is the wire codec asked of the encoder ("auto", in the split only: chosen per chunk by
    :class:`~.pace.AutoCodec`) and ``scene_threshold`` its scene-cut test (a number, or "off";
    None: the server's defaults). How to reach the servers is ``options`` (:class:`ClientOptions`),
    or its fields ``given`` by name: ``Client(url, token=..., tries=3)``. Safe to use from several threads,
    several clip runs at once included: a run that stops cuts its own requests in flight, not the others'.
    """

    def __init__(self, server: str | None = None, *, cloud: str | None = None, edge: str | None = None, codec: str | None = None,
                 scene_threshold: float | str | None = None, options: ClientOptions | None = None, **given):
        options = replace(options, **given) if options is not None else ClientOptions(**given)
        if server is not None and (cloud is not None or edge is not None):
            raise BadInputError("give either server, or cloud and edge, not both")
        if server is None and (cloud is None or edge is None):
            raise BadInputError("give server (the workflow), or both cloud (the encoder) and edge (the DiT+decoder)")
        self.codec = codec
        self.policy = codec_policy(codec, split=server is None)
        transport = transport_for(server if server is not None else cloud, options.transport)
        tokens = {"workflow": options.token, "encoder": options.token, "decoder": options.edge_token or options.token}
        self.transport = transport(server, cloud, edge, tokens, options.timeout, options.tls or ClientTLS())
        self.scene_threshold = scene_threshold
        self.retry = Retry(tries=options.tries, backoff=options.backoff)
        self.sources: dict[str, RemoteVideo] = {}  # the cloud: sources read, by name: their packets held
        self.unsent: set[str] = set()  # the cloud: sources the cloud refused to send as their packets (400)
        self._unsent_lock = threading.Lock()

    def _unsend(self, source: str) -> bool:
        """Mark ``source`` as one the cloud cannot send as its packets; whether it was not yet."""
        with self._unsent_lock:
            new = source not in self.unsent
            self.unsent.add(source)
        return new

    @property
    def split(self) -> bool:
        return self.transport.split

    def _retried(self, operation: Callable, cancel: threading.Event | None, stage: Stage | None = None,
                 order: int | None = None):
        """``operation()`` with retries, in a slot of ``stage`` (taken in chunk ``order``); and how many
        times it had to be retried."""
        attempts = 0

        def attempt():
            nonlocal attempts
            attempts += 1
            return operation()

        with stage.slot(cancel, order) if stage is not None else contextlib.nullcontext():
            return self.retry.call(attempt, cancel), attempts - 1

    def _codec(self, chunk: _Chunk) -> str | None:
        """The codec a chunk is asked for with: a source's own packets where the codec allows it;
        uploaded frames (a local file's, a retimed run's later levels), and a source the cloud could
        not send that way, never go as a source's kind, which the cloud refuses for them, but as its
        fallback from the start."""
        named = chunk.named is not None and chunk.named.get("source") not in self.unsent
        if named and self.policy.sources:
            return wire.BITSTREAM_CODEC  # the fewest bytes there are
        codec = self.policy.next()
        kind = wire.KINDS.get(codec)
        return kind.fallback if kind is not None and kind.from_source and not named else codec

    def _middles(self, chunk: _Chunk, codec: str | None, cancel: threading.Event | None = None,
                 stages: dict[str, Stage] | None = None, arrived: Arrivals | None = None) -> Middles:
        """A chunk's K middle frames, with the bytes moved; in the split each middle goes to
        ``arrived`` as it comes, and a retry of the edge step asks only for the middles that did not."""
        form = {"seed": str(chunk.seed), **(chunk.named or {}), **({"codec": codec} if codec else {})}
        if self.scene_threshold is not None:
            form["scene_threshold"] = str(self.scene_threshold)
        if not self.split:
            (images, sent, received), retries = self._retried(
                lambda: self.transport.workflow(list(chunk.encoded), form, chunk.pairs, chunk.size), cancel)
            return Middles(images, sent, received, None, retries, codec)
        stages = stages or {}
        kind = wire.KINDS.get(codec)
        answer, sent, first_byte, retries = self._from_cloud(chunk, form, cancel, stages)
        payload = answer if kind is None else kind.complete(answer, self.sources.get((chunk.named or {}).get("source")))
        asked = time.perf_counter()
        images, received, edge_retries = self._from_edge(chunk, payload, cancel, stages, arrived)
        chunk.event("done")
        if kind is None or not kind.from_source:  # a source's packets are no measure of a codec's bytes
            self.policy.downloaded(codec, chunk.pairs, len(payload), first_byte, asked)
            self.policy.answered(chunk.pairs, asked, time.perf_counter())
        return Middles(images, sent + len(payload), len(answer) + received, len(payload), retries + edge_retries, codec)

    def _from_cloud(self, chunk: _Chunk, form: dict[str, str], cancel: threading.Event | None,
                    stages: dict[str, Stage]) -> tuple[bytes, int, float, int]:
        """The cloud's answer, the bytes sent for it, when it began to come down (for ``--codec
        auto``'s link rate) and the retries; its body is read in the link's turn, in chunk order."""
        first_byte: list[float] = []
        link = stages.get("link")
        turn = None if link is None else (lambda: link.slot(cancel, chunk.order))

        def ask():
            chunk.event("cloud asked")
            return self.transport.ask_cloud(list(chunk.encoded), form, first_byte.append, turn)

        (answer, sent), retries = self._retried(ask, cancel, stages.get("encoder"), chunk.order)
        chunk.event("payload in")
        return answer, sent, first_byte[-1], retries

    def _from_edge(self, chunk: _Chunk, payload: bytes, cancel: threading.Event | None, stages: dict[str, Stage],
                   arrived: Arrivals | None) -> tuple[list[Image.Image], int, int]:
        """The chunk's middles from the edge, each handed to ``arrived`` as it comes; the bytes
        received and the retries."""
        images: list[Image.Image] = []

        def deliver(j: int, image: Image.Image) -> None:
            chunk.event(f"middle {j}")
            images.append(image)
            if arrived is not None:
                arrived(j, image)

        def ask():
            if len(images) == chunk.pairs:  # every middle came before the answer broke off: nothing to ask for
                return 0
            chunk.event("edge asked")
            return self.transport.ask_edge(payload, len(images), chunk.pairs, chunk.size, deliver)

        received, retries = self._retried(ask, cancel, stages.get("decoder"), chunk.order)
        return images, received, retries

    def interpolate(self, frame0, frame1, seed: int = 0) -> Picture:
        """The middle frame (RGB) of two frames: paths, encoded image bytes or PIL images; an image,
        or its 16-bit pixels [H, W, 3] where the frames have more than 8 bits."""
        data0 = _as_bytes(frame0, "frame0")
        size = frame0.size if isinstance(frame0, Image.Image) else oriented_size(data0, "frame0")
        chunk = _Chunk([data0, _as_bytes(frame1, "frame1")], seed, size)
        return self._middles(chunk, self._codec(chunk)).images[0]

    def interpolate_clip(self, src: str | Path, dst: str | Path, **options) -> Summary:
        """Stream the clip ``src`` through the servers into ``dst``, with the options of
        :func:`~eden_serve.clips.streaming.interpolate_clip` (:class:`~.streaming.ClipOptions`):
        here by default ``chunk`` pairs per request, :data:`DEFAULT_CHUNK`, ``ramp``ed (1, 1, 2, 4,
        ... first), ``inflight`` requests per server, :data:`DEFAULT_INFLIGHT`."""
        options = ClipOptions(**{"chunk": DEFAULT_CHUNK, "ramp": True, "inflight": DEFAULT_INFLIGHT, **options})
        cancel = threading.Event()
        if source_name(src) is not None:
            src = self.source(source_name(src), DEFAULT_MAX_PIXELS if options.process_size is None else None)
        fingerprint = {"servers": self.transport.urls, "codec": self.codec, "scene_threshold": self.scene_threshold}
        processor = self.processor(cancel, options.inflight)
        return interpolate_clip(src, dst, processor, replace(options, inflight=self.window(options.inflight), cancel=cancel,
                                                             fingerprint=fingerprint))

    def source(self, name: str, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> RemoteVideo:
        """The video ``name`` under the cloud's media root, planned from its probe (docs/cloud-sources.md)."""
        if not self.split:
            raise BadInputError("a cloud: source is read from --cloud and --edge, or from --server over --transport grpc "
                                "(its packets come from the cloud's encoder, not through the workflow)")
        remote = open_remote(name, lambda form: self._retried(lambda: self.transport.ask_cloud([], form), None)[0][0], max_pixels)
        self.sources[name] = remote
        return remote

    def window(self, inflight: int) -> int:
        """The chunks to stream at once for ``inflight`` requests per server: in the split, as many
        again are fetched from the cloud while the edge holds ``inflight`` (see :meth:`processor`)."""
        return 2 * inflight if self.split else inflight

    def processor(self, cancel: threading.Event | None = None, inflight: int | None = None) -> Processor:
        """This client as a :mod:`~eden_serve.clips.streaming` processor, to run with a window of
        :meth:`window` chunks; retries stop waiting once ``cancel`` is set. In the split, ``inflight``
        caps the requests at the edge and :data:`CLOUD_REQUESTS` those at the cloud (None: no caps),
        each taken in the order of the chunks (:class:`~eden_serve.client.transports.Stage`), and middles
        stream as they come. A chunk a server finds too large is sent again as two halves. One
        processor may serve several runs at once: each run's requests, turns and planes are its own
        (:meth:`~eden_serve.clips.processors.Processor.for_run`)."""
        return _Processor(self, cancel, inflight)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Processor(Processor):
    """A :class:`Client` as a processor (:meth:`Client.processor`)."""

    def __init__(self, client: Client, cancel: threading.Event | None, inflight: int | None):
        self.client, self.cancel, self.streams, self.inflight = client, cancel, client.split, inflight
        self.requests = RunRequests()  # this run's: another run through the same client is neither cut nor given its planes
        self.stages: dict[str, Stage] = {}
        if client.split and inflight is not None:
            # Two at the cloud: one uploading and encoding while the other's payload comes down, and
            # one payload on the link at a time, each arriving as early as it can.
            self.stages = {"encoder": Stage(min(inflight, CLOUD_REQUESTS)), "link": Stage(1), "decoder": Stage(inflight)}

    def __call__(self, index: int, frames: list[Frame], seed: int, arrived: Arrivals | None = None) -> Middles:
        order = None if arrived is None else arrived.order
        try:
            with self.requests.sending():
                return self._middles_of(index, frames, seed, arrived, order)
        finally:  # a chunk that failed before a stage must not hold back the later ones there
            for stage in self.stages.values():
                stage.forget(order)

    def for_run(self, cancel: threading.Event) -> "_Processor":
        """A processor of this one's client and caps for one run: its requests, its stages' turns
        and its planes are its own, however many runs this one is given to at once. Its retries
        stop with the run where this one was given no ``cancel`` of its own."""
        return _Processor(self.client, self.cancel if self.cancel is not None else cancel, self.inflight)

    def queued(self, order: int) -> None:
        for stage in self.stages.values():
            stage.expect(order)

    def stopped(self) -> None:
        self.requests.cut()

    def planes(self, format) -> None:
        """Ask an edge that answers raw frames for ``format``'s 8-bit planes (what the output's writer
        takes): half the bytes of RGB, converted on the edge's device."""
        if getattr(self.client.transport, "raw", False) and format.depth == 8:
            self.requests.planes = format  # this run's: not the client's, which other runs share

    def _middles_of(self, index: int, frames: list[Frame], seed: int, arrived, order: int | None) -> Middles:
        """The chunk's middles: sent again with its kind's fallback where that kind failed on it, or
        as two halves where a server finds it too large."""
        named = named_fields(frames)
        chunk = _Chunk([] if named else [frame.encoded for frame in frames], seed, frames[0].size, named, index, order)
        codec = self.client._codec(chunk)
        try:
            return self.client._middles(chunk, codec, self.cancel, self.stages, arrived)
        except (CodecError, ServerError) as exc:
            kind = wire.KINDS.get(codec)
            if kind is not None and exc.kind in kind.fallback_on:
                # A refusal (400) is the source's (its codec, its packets' times), not this chunk's as a digest
                # mismatch is: told once, for the first chunk refused (others may be in flight already).
                later = bool(kind.from_source and named and exc.kind == BadInputError.kind)
                if not later or self.client._unsend(named["source"]):
                    warnings.warn(f"frames {index} to {index + len(frames) - 1}: {str(exc).split(';')[0]}; sent with the "
                                  f"{kind.fallback} codec instead{', as are its later chunks' if later else ''}")
                return self.client._middles(chunk, kind.fallback, self.cancel, self.stages, arrived)
            if exc.kind != ChunkTooLargeError.kind or len(frames) <= 2:
                raise
        half = len(frames) // 2
        later = None if arrived is None else _Shifted(arrived, half)
        first = self._middles_of(index, frames[: half + 1], seed, arrived, order)
        first.add(self._middles_of(index + half, frames[half:], seed + half, later, order))
        return first


class _Shifted:
    """``arrived`` for the second half of a chunk sent in two: its middle j is the chunk's ``shift + j``."""

    def __init__(self, arrived, shift: int):
        self.arrived, self.shift, self.order = arrived, shift, arrived.order

    def __call__(self, j: int, image: Image.Image) -> None:
        self.arrived(self.shift + j, image)
