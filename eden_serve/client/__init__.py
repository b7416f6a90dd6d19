"""Client for EDEN on TorchServe: one pair, or a whole clip streamed through the servers.

Two deployments::

    from eden_serve.client import Client

    with Client("http://127.0.0.1:8080", token=...) as client:            # the workflow on one server
        middle = client.interpolate("a.png", "b.png", seed=0)               # a PIL image
    with Client(cloud="http://cloud:8080", edge="http://edge:8080") as client:  # split: we carry the payload
        summary = client.interpolate_clip("clip.gif", "out.gif", inflight=4)

over HTTP (:class:`~eden_serve.client.transports.http.HttpTransport`) or gRPC (``transport="grpc"``,
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
from pathlib import Path
from typing import Callable, Sequence

from PIL import Image

from ..errors import BadInputError, ChunkTooLargeError, CodecError, DigestMismatchError, ServerError
from ..media import Frame
from ..media.frames import DEFAULT_MAX_PIXELS, oriented_size, png_bytes
from ..wire import BITSTREAM_CODEC, FRAMES_CODEC
from .pace import AUTO, AutoCodec
from .remote import RemoteVideo, named_fields, open_remote, source_name
from .streaming import DEFAULT_CHUNK, DEFAULT_INFLIGHT, TIMELINE, Middles, Processor, Retry, Summary, interpolate_clip
from .tls import ClientTLS
from .transports import DECODER, ENCODER, Stage
from .transports.grpc import GrpcTransport
from .transports.http import HttpTransport

DEFAULT_TIMEOUT = 300.0  # seconds to wait for an answer: a 4K pair on a CPU takes minutes
CLOUD_REQUESTS = 2  # requests at the cloud at once in the split (see Client.processor)
# A bitstream chunk the edge decodes to other pixels (another libavcodec), one put together wrong, or
# one of a video whose packets the cloud cannot send so (untimed, cut by an edit list): the frames
# codec carries it instead (a chunk bad for any codec then fails with the frames codec's answer).
BITSTREAM_FAILURES = {DigestMismatchError.kind, CodecError.kind, BadInputError.kind}


def _as_bytes(frame: str | Path | bytes | Image.Image, name: str) -> bytes:
    if isinstance(frame, (bytes, bytearray)):
        return bytes(frame)
    if isinstance(frame, Image.Image):
        return png_bytes(frame)
    try:
        return Path(frame).read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read {name} {str(frame)!r}: {exc.strerror}") from None

class Client:
    """Talks to ``server`` (the workflow) or to ``cloud`` and ``edge`` (encoder and DiT+decoder),
    over ``transport`` http (:class:`~eden_serve.client.transports.http.HttpTransport`) or grpc
    (:class:`~eden_serve.client.transports.grpc.GrpcTransport`; TorchServe has no gRPC workflow API, so
    ``server`` then names a server with both models).

    ``token`` is the inference token (None: no auth); ``edge_token`` the edge server's, where it
    differs (two TorchServes have two key files). ``codec`` is the wire codec asked of the encoder
    ("auto", in the split only: chosen per chunk by :class:`~eden_serve.client.pace.AutoCodec`) and
    ``scene_threshold`` its scene-cut test (a number, or "off"; None: the server's defaults);
    ``tries`` and ``backoff`` set the retries of each request;
    ``timeout`` is seconds to wait for an answer; ``tls`` says which CA signed the servers'
    certificates (https:// and grpcs:// URLs). Safe to use from several threads.
    """

    def __init__(
        self,
        server: str | None = None,
        *,
        cloud: str | None = None,
        edge: str | None = None,
        token: str | None = None,
        edge_token: str | None = None,
        codec: str | None = None,
        scene_threshold: float | str | None = None,
        tries: int = 5,
        backoff: float = 1.0,
        timeout: float = DEFAULT_TIMEOUT,
        transport: str = "http",
        tls: ClientTLS | None = None,
    ):
        if server is not None and (cloud is not None or edge is not None):
            raise BadInputError("give either server, or cloud and edge, not both")
        if server is None and (cloud is None or edge is None):
            raise BadInputError("give server (the workflow), or both cloud (the encoder) and edge (the DiT+decoder)")
        if codec == AUTO and server is not None:
            raise BadInputError("codec auto picks a codec for the link between cloud and edge: give cloud and edge, not server")
        tokens = {"workflow": token, "encoder": token, "decoder": edge_token or token}
        tls = tls or ClientTLS()
        if transport == "http":
            self.transport = HttpTransport(server, cloud, edge, tokens, timeout, tls)
        elif transport == "grpc":
            cloud, edge = (server, server) if server is not None else (cloud, edge)
            self.transport = GrpcTransport({"encoder": (ENCODER, cloud), "decoder": (DECODER, edge)}, tokens, timeout, tls)
        else:
            raise BadInputError(f"transport must be http or grpc, got {transport!r}")
        self.codec = codec
        self.auto = AutoCodec() if codec == AUTO else None
        self.scene_threshold = scene_threshold
        self.retry = Retry(tries=tries, backoff=backoff)
        self.sources: dict[str, RemoteVideo] = {}  # the cloud: sources read, by name: their packets held

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

    def _chunk(self, encoded: Sequence[bytes], seed: int, size: tuple[int, int], cancel: threading.Event | None = None,
               stages: dict[str, Stage] | None = None, arrived: Callable[[int, Image.Image], None] | None = None,
               index: int = 0, order: int | None = None, named: dict[str, str] | None = None,
               codec: str | None = None) -> Middles:
        """K + 1 encoded frames of ``size`` (width, height) -> their K middle frames, with the bytes
        moved; pair j uses ``seed + j``. In the split each middle goes to ``arrived`` as it comes,
        and a retry of the edge step asks only for the middles that did not; ``index`` (the chunk's
        first pair) labels its timeline, ``order`` is its place in the stages' queues. ``named``: the
        frames are not sent but named (a server-side source's ``source``, ``start`` and ``frames``)."""
        form = {"seed": str(seed), **(named or {})}
        if codec is None and named is not None and self.codec in (AUTO, BITSTREAM_CODEC):
            codec = BITSTREAM_CODEC  # a cloud source's own packets: the fewest bytes there are
        codec = codec or (self.auto.next() if self.auto is not None else self.codec)
        if codec:
            form["codec"] = codec
        if self.scene_threshold is not None:
            form["scene_threshold"] = str(self.scene_threshold)
        pairs, stages = (int(named["frames"]) if named else len(encoded)) - 1, stages or {}
        if not self.split:
            (images, sent, received), retries = self._retried(lambda: self.transport.workflow(encoded, form, pairs, size), cancel)
            return Middles(images, sent, received, None, retries, codec)
        first_byte: list[float] = []  # when the payload began to come down, for --codec auto's link rate

        link = stages.get("link")
        turn = None if link is None else (lambda: link.slot(cancel, order))

        def encode():
            TIMELINE.debug("chunk %d (%d pairs): %s", index, pairs, "cloud asked")
            return self.transport.encode(encoded, form, first_byte.append, turn)

        (payload, sent), retries = self._retried(encode, cancel, stages.get("encoder"), order)
        TIMELINE.debug("chunk %d (%d pairs): %s", index, pairs, "payload in")
        down = len(payload)  # from the cloud: a bitstream payload without the packets, which we hold
        if codec == BITSTREAM_CODEC:
            payload = self.sources[named["source"]].restore(payload)
        images: list[Image.Image] = []

        def receive(j: int, image: Image.Image) -> None:
            TIMELINE.debug("chunk %d (%d pairs): %s", index, pairs, f"middle {j}")
            images.append(image)
            if arrived is not None:
                arrived(j, image)

        def decode():
            if len(images) == pairs:  # every middle came before the answer broke off: nothing to ask for
                return 0
            TIMELINE.debug("chunk %d (%d pairs): %s", index, pairs, "edge asked")
            return self.transport.decode(payload, len(images), pairs, size, receive)

        asked = time.perf_counter()
        received, edge_retries = self._retried(decode, cancel, stages.get("decoder"), order)
        TIMELINE.debug("chunk %d (%d pairs): %s", index, pairs, "done")
        if self.auto is not None and codec != BITSTREAM_CODEC:
            self.auto.downloaded(codec, pairs, len(payload), first_byte[-1], asked)
            self.auto.answered(pairs, asked, time.perf_counter())
        return Middles(images, sent + len(payload), down + received, len(payload), retries + edge_retries, codec)

    def interpolate(self, frame0, frame1, seed: int = 0) -> Image.Image:
        """The middle frame (RGB) of two frames: paths, encoded image bytes or PIL images."""
        data0 = _as_bytes(frame0, "frame0")
        size = frame0.size if isinstance(frame0, Image.Image) else oriented_size(data0, "frame0")
        return self._chunk([data0, _as_bytes(frame1, "frame1")], seed, size).images[0]

    def interpolate_clip(
        self,
        src: str | Path,
        dst: str | Path,
        *,
        seed: int = 0,
        chunk: int = DEFAULT_CHUNK,
        ramp: bool = True,
        inflight: int = DEFAULT_INFLIGHT,
        progress: bool | None = None,
        factor: int = 2,
        resume: bool = False,
        **retiming,
    ) -> Summary:
        """Stream the clip ``src`` through the servers into ``dst``, ``chunk`` pairs per request
        (``ramp``: 1, 1, 2, 4, ... first); pair i uses ``seed + i`` (``factor``, ``resume`` and the
        ``retiming`` options ``fps``, ``time_error``, ``encoding``, ``process_size``: see
        :func:`~eden_serve.client.streaming.interpolate_clip`)."""
        cancel = threading.Event()
        if source_name(src) is not None:
            src = self.source(source_name(src), DEFAULT_MAX_PIXELS if retiming.get("process_size") is None else None)
        return interpolate_clip(src, dst, self.processor(cancel, inflight), chunk=chunk, ramp=ramp, seed=seed,
                                inflight=self.window(inflight), progress=progress, cancel=cancel, factor=factor,
                                resume=resume, fingerprint={"servers": self.transport.urls, "codec": self.codec,
                                                            "scene_threshold": self.scene_threshold}, **retiming)

    def source(self, name: str, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> RemoteVideo:
        """The video ``name`` under the cloud's media root, planned from its probe (docs/cloud-sources.md)."""
        if not self.split:
            raise BadInputError("a cloud: source is read from --cloud and --edge, or from --server over --transport grpc "
                                "(its packets come from the cloud's encoder, not through the workflow)")
        remote = open_remote(name, lambda form: self._retried(lambda: self.transport.encode([], form), None)[0][0], max_pixels)
        self.sources[name] = remote
        return remote

    def window(self, inflight: int) -> int:
        """The chunks to stream at once for ``inflight`` requests per server: in the split, as many
        again are fetched from the cloud while the edge holds ``inflight`` (see :meth:`processor`)."""
        return 2 * inflight if self.split else inflight

    def processor(self, cancel: threading.Event | None = None, inflight: int | None = None) -> Processor:
        """This client as a :mod:`~eden_serve.client.streaming` processor, to run with a window of
        :meth:`window` chunks; retries stop waiting once ``cancel`` is set. In the split, ``inflight``
        caps the requests at the edge and :data:`CLOUD_REQUESTS` those at the cloud (None: no caps),
        each taken in the order of the chunks (:class:`~eden_serve.client.transports.Stage`), and middles
        stream as they come. A chunk a server finds too large is sent again as two halves."""
        stages = {}
        if self.split and inflight is not None:
            # Two at the cloud: one uploading and encoding while the other's payload comes down, and
            # one payload on the link at a time, each arriving as early as it can.
            stages = {"encoder": Stage(min(inflight, CLOUD_REQUESTS)), "link": Stage(1), "decoder": Stage(inflight)}

        def chunk(index: int, frames: list[Frame], seed: int, arrived, order: int | None) -> Middles:
            named = named_fields(frames)
            args = ([] if named else [frame.encoded for frame in frames], seed, frames[0].image.size, cancel, stages, arrived,
                    index, order, named)
            try:
                return self._chunk(*args)
            except (CodecError, ServerError) as exc:
                if named is not None and self.codec in (AUTO, BITSTREAM_CODEC) and exc.kind in BITSTREAM_FAILURES:
                    warnings.warn(f"frames {index} to {index + len(frames) - 1}: {str(exc).split(';')[0]}; sent with the "
                                  f"{FRAMES_CODEC} codec instead")
                    return self._chunk(*args, FRAMES_CODEC)
                if exc.kind != ChunkTooLargeError.kind or len(frames) <= 2:
                    raise
            half = len(frames) // 2
            later = None if arrived is None else (lambda j, image: arrived(half + j, image))
            first = chunk(index, frames[: half + 1], seed, arrived, order)
            second = chunk(index + half, frames[half:], seed + half, later, order)
            return Middles(first.images + second.images, first.sent_bytes + second.sent_bytes,
                           first.received_bytes + second.received_bytes,
                           None if first.payload_bytes is None else first.payload_bytes + second.payload_bytes,
                           first.retries + second.retries, first.codec)

        def process(index: int, frames: list[Frame], seed: int, arrived=None) -> Middles:
            order = getattr(arrived, "order", None)
            try:
                return chunk(index, frames, seed, arrived, order)
            finally:  # a chunk that failed before a stage must not hold back the later ones there
                for stage in stages.values():
                    stage.forget(order)

        def queued(order: int) -> None:
            for stage in stages.values():
                stage.expect(order)

        process.queued = queued
        process.streams = self.split
        return process

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
