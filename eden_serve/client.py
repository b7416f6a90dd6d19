"""HTTP client for EDEN on TorchServe: one pair, or a whole clip streamed through the servers.

Two deployments::

    from eden_serve.client import Client

    with Client("http://127.0.0.1:8080", token=...) as client:            # the workflow on one server
        middle = client.interpolate("a.png", "b.png", seed=0)               # a PIL image
    with Client(cloud="http://cloud:8080", edge="http://edge:8080") as client:  # split: we carry the payload
        summary = client.interpolate_clip("clip.gif", "out.gif", inflight=4)

Every request is retried with exponential backoff on connection errors and 5xx answers (a worker
being restarted answers 503 or drops the connection); a 4xx answer is final and raised as
:class:`ServerError` with the server's own message. In the split deployment each step is retried on
its own, so an edge failure does not re-run the encoder.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import re
import struct
import threading
import time
import zipfile
from pathlib import Path
from typing import Sequence

import requests
from PIL import Image, UnidentifiedImageError

from .clips import Frame
from .errors import (
    BadInputError, ChunkTooLargeError, ServerError, TransientError, UnavailableError, connection_failure, error_from_document,
)
from .frames import PNG_SIGNATURE, oriented_size, png_bytes
from .pace import AUTO, AutoCodec
from .serving.tls import ClientTLS, certificate_failure
from .streaming import DEFAULT_CHUNK, DEFAULT_INFLIGHT, Middles, Processor, Retry, Summary, interpolate_clip

TOKEN_ENV = "EDEN_TOKEN"
WORKFLOW = "eden"
ENCODER = "eden_encoder"
DECODER = "eden_ditdec"
DEFAULT_TIMEOUT = 300.0  # seconds to wait for an answer: a 4K pair on a CPU takes minutes
CONNECT_TIMEOUT = 10.0
CLOUD_REQUESTS = 2  # requests at the cloud at once in the split (see Client.processor)


def read_token(token: str | None = None, token_file: str | Path | None = None) -> str | None:
    """The inference token: ``token`` itself, else the inference key of a TorchServe
    ``key_file.json``, else the ``EDEN_TOKEN`` environment variable, else None (no auth)."""
    if token:
        return token
    if token_file:
        try:
            keys = json.loads(Path(token_file).read_text())
            return keys["inference"]["key"]
        except OSError as exc:
            raise BadInputError(f"cannot read token file {str(token_file)!r}: {exc.strerror}") from None
        except (ValueError, KeyError, TypeError):
            raise BadInputError(f"{str(token_file)!r} is not a TorchServe key file (no inference key)") from None
    return os.environ.get(TOKEN_ENV) or None


def _base(url: str, option: str) -> str:
    if not isinstance(url, str) or not re.match(r"https?://[^/]", url):
        raise BadInputError(f"{option} must be an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


def _check(response: requests.Response) -> requests.Response:
    """The response, or the error it means, looked for in the body rather than the status (README:
    "Workflow caveat")."""
    refused = error_from_document(response.content)
    if refused is None and response.status_code < 400:
        return response
    if refused is not None:
        status, kind, message = refused.status, refused.kind, str(refused)
    elif response.status_code == 413 and not response.content:  # TorchServe's own, before any handler
        status, kind = 413, "request_too_large"
        sent = len(response.request.body or b"")
        message = (f"the server refused a request of {sent} bytes as too large: over its max_request_size "
                   "(README: Capacity); send smaller frames, or a smaller codec to the edge")
    else:
        status, kind = response.status_code, "http_error"
        message = " ".join(response.content[:300].decode(errors="replace").split()) or response.reason
    where = f"HTTP {status} from {response.url}"
    if status >= 500:
        raise TransientError(f"{message} ({where})")
    raise ServerError(status, kind, f"{message} ({where})")


def _middle_image(content: bytes, size: tuple[int, int], where: str) -> Image.Image:
    """A middle frame: an 8-bit RGB PNG of ``size`` (width, height), read from its header first."""
    if content[:8] != PNG_SIGNATURE or content[12:16] != b"IHDR" or len(content) < 26:
        start = " ".join(content[:100].decode(errors="replace").split())
        raise ServerError(502, "bad_answer", f"the answer is not a PNG: {start!r} {where}")
    width, height, depth, colour = struct.unpack(">IIBB", content[16:26])
    if (width, height) != size or (depth, colour) != (8, 2):  # colour type 2: RGB
        mode = "" if (depth, colour) == (8, 2) else f" not in 8-bit RGB (depth {depth}, colour type {colour})"
        raise ServerError(502, "bad_answer", f"the answer is a {width}x{height} PNG{mode}, for frames of {size[0]}x{size[1]} {where}")
    try:
        image = Image.open(io.BytesIO(content), formats=["PNG"])
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, struct.error) as exc:
        raise ServerError(502, "bad_answer", f"the answer is a broken PNG ({type(exc).__name__}) {where}") from None
    return image

def _as_bytes(frame: str | Path | bytes | Image.Image, name: str) -> bytes:
    if isinstance(frame, (bytes, bytearray)):
        return bytes(frame)
    if isinstance(frame, Image.Image):
        return png_bytes(frame)
    try:
        return Path(frame).read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read {name} {str(frame)!r}: {exc.strerror}") from None


class _Stage:
    """At most ``limit`` requests of one step at a time, admitted in the order they ask. The split
    client gives its cloud and its edge step one each, with a window of chunks twice as wide: so
    payloads keep crossing the link while the edge computes earlier ones, rather than the two taking
    turns (TorchServe answers a batch's requests together, which empties a shared window at once)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._changed = threading.Condition()
        self._busy = 0
        self._waiting: list[object] = []

    @contextlib.contextmanager
    def slot(self, cancel: threading.Event | None):
        ticket = object()
        with self._changed:
            self._waiting.append(ticket)
            try:
                while self._waiting[0] is not ticket or self._busy >= self.limit:
                    if cancel is not None and cancel.is_set():
                        raise UnavailableError("cancelled while waiting for a request slot")
                    self._changed.wait(0.5)
            finally:
                self._waiting.remove(ticket)
                self._changed.notify_all()
            self._busy += 1
        try:
            yield
        finally:
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()


class Client:
    """Talks to ``server`` (the workflow) or to ``cloud`` and ``edge`` (encoder and DiT+decoder).

    ``token`` is the inference token (None: no auth); ``edge_token`` the edge server's, where it
    differs (two TorchServes have two key files). ``codec`` is the wire codec asked of the encoder
    ("auto", in the split only: chosen per chunk by :class:`~eden_serve.pace.AutoCodec`) and
    ``scene_threshold`` its scene-cut test (a number, or "off"; None: the server's defaults);
    ``tries`` and ``backoff`` set the retries of each request;
    ``timeout`` is seconds to wait for an answer; ``tls`` says which CA signed the servers'
    certificates (https:// URLs).
    Safe to use from several threads: each request borrows an idle ``requests.Session``.
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
        tls: ClientTLS | None = None,
    ):
        if server is not None and (cloud is not None or edge is not None):
            raise BadInputError("give either server, or cloud and edge, not both")
        if server is None and (cloud is None or edge is None):
            raise BadInputError("give server (the workflow), or both cloud (the encoder) and edge (the DiT+decoder)")
        if server is not None:
            self.urls = {"workflow": f"{_base(server, 'server')}/wfpredict/{WORKFLOW}"}
        else:
            self.urls = {
                "encoder": f"{_base(cloud, 'cloud')}/predictions/{ENCODER}",
                "decoder": f"{_base(edge, 'edge')}/predictions/{DECODER}",
            }
        tokens = {"workflow": token, "encoder": token, "decoder": edge_token or token}
        self.headers = {step: {"Authorization": f"Bearer {t}"} if t else {} for step, t in tokens.items()}
        if codec == AUTO and server is not None:
            raise BadInputError("codec auto picks a codec for the link between cloud and edge: give cloud and edge, not server")
        self.codec = codec
        self.auto = AutoCodec() if codec == AUTO else None
        self.scene_threshold = scene_threshold
        self.retry = Retry(tries=tries, backoff=backoff)
        self.timeout = (CONNECT_TIMEOUT, timeout)
        self.tls = tls or ClientTLS()
        self._idle: queue.SimpleQueue[requests.Session] = queue.SimpleQueue()

    @property
    def split(self) -> bool:
        return "encoder" in self.urls

    @contextlib.contextmanager
    def _session(self):
        try:
            session = self._idle.get_nowait()
        except queue.Empty:
            session = requests.Session()
        try:
            yield session
        finally:
            self._idle.put(session)

    def _post(self, step: str, cancel: threading.Event | None, headers: dict | None = None,
              stage: _Stage | None = None, **kwargs) -> tuple[requests.Response, int]:
        """The answer to a POST to ``step``'s URL, and how many times it had to be retried."""
        url = self.urls[step]
        headers = {**self.headers[step], **(headers or {})}
        attempts = 0

        def attempt() -> requests.Response:
            nonlocal attempts
            attempts += 1
            with self._session() as session:
                try:
                    # verify per request: a session's would lose to $REQUESTS_CA_BUNDLE.
                    return _check(session.post(url, headers=headers, timeout=self.timeout, verify=self.tls.verify, **kwargs))
                except requests.exceptions.SSLError as exc:
                    refused = certificate_failure(exc)
                    if refused is None:
                        raise connection_failure(exc, url) from exc
                    raise BadInputError(f"{url}: {refused}") from None
                except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                    raise connection_failure(exc, url) from exc
                except requests.RequestException as exc:
                    raise BadInputError(f"{url}: {type(exc).__name__} ({' '.join(str(exc).split())[:300]})") from None

        with stage.slot(cancel) if stage is not None else contextlib.nullcontext():
            response = self.retry.call(attempt, cancel)
        return response, attempts - 1

    def _chunk(self, encoded: Sequence[bytes], seed: int, size: tuple[int, int],
               cancel: threading.Event | None = None, stages: dict[str, _Stage] | None = None) -> Middles:
        """K + 1 encoded frames of ``size`` (width, height) -> their K middle frames, with the bytes
        moved; pair j uses ``seed + j``."""
        form = {"seed": str(seed)}
        codec = self.auto.next() if self.auto is not None else self.codec
        if codec:
            form["codec"] = codec
        if self.scene_threshold is not None:
            form["scene_threshold"] = str(self.scene_threshold)
        files = {f"frame{i}": (f"frame{i}", data, "application/octet-stream") for i, data in enumerate(encoded)}
        payload_bytes = None
        if self.split:
            stages = stages or {}
            first_byte: list[float] = []  # a response hook runs once the headers are in, before the body is read
            hooks = {"response": lambda response, **_: first_byte.append(time.perf_counter())} if self.auto is not None else None
            encoded_answer, retries = self._post("encoder", cancel, files=files, data=form, stage=stages.get("encoder"), hooks=hooks)
            payload = encoded_answer.content
            payload_bytes = len(payload)
            headers = {"Content-Type": "application/octet-stream"}
            sent = time.perf_counter()
            answer, edge_retries = self._post("decoder", cancel, data=payload, headers=headers, stage=stages.get("decoder"))
            if self.auto is not None:
                self.auto.downloaded(codec, len(encoded) - 1, payload_bytes, first_byte[-1], sent)
                self.auto.answered(len(encoded) - 1, sent, time.perf_counter())
            retries += edge_retries
            sent = len(encoded_answer.request.body) + len(payload)
            received = len(payload) + len(answer.content)
        else:
            answer, retries = self._post("workflow", cancel, files=files, data=form)
            sent, received = len(answer.request.body), len(answer.content)
        images = _middle_frames(answer, len(encoded) - 1, size)
        return Middles(images, sent, received, payload_bytes, retries)

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
        inflight: int = DEFAULT_INFLIGHT,
        progress: bool | None = None,
        factor: int = 2,
        resume: bool = False,
        **retiming,
    ) -> Summary:
        """Stream the clip ``src`` through the servers into ``dst``, ``chunk`` pairs per request;
        pair i uses ``seed + i`` (``factor``, ``resume`` and the ``retiming`` options ``fps``,
        ``time_error``, ``encoding``, ``process_size``: see :func:`interpolate_clip`)."""
        cancel = threading.Event()
        return interpolate_clip(src, dst, self.processor(cancel, inflight), chunk=chunk, seed=seed, inflight=self.window(inflight),
                                progress=progress, cancel=cancel, factor=factor, resume=resume,
                                fingerprint={"servers": self.urls, "codec": self.codec,
                                             "scene_threshold": self.scene_threshold}, **retiming)

    def window(self, inflight: int) -> int:
        """The chunks to stream at once for ``inflight`` requests per server: in the split, as many
        again are fetched from the cloud while the edge holds ``inflight`` (see :meth:`processor`)."""
        return 2 * inflight if self.split else inflight

    def processor(self, cancel: threading.Event | None = None, inflight: int | None = None) -> Processor:
        """This client as a :mod:`~eden_serve.streaming` processor, to run with a window of
        :meth:`window` chunks; retries stop waiting once ``cancel`` is set. In the split, ``inflight``
        caps the requests at the edge and :data:`CLOUD_REQUESTS` those at the cloud (None: no caps),
        taken in the order the chunks ask. A chunk a server finds too large is sent again as two
        halves."""
        stages = None
        if self.split and inflight is not None:
            # Two at the cloud: one uploading and encoding while the other's payload comes down. More
            # would only split the link between payloads, each arriving later.
            stages = {"encoder": _Stage(min(inflight, CLOUD_REQUESTS)), "decoder": _Stage(inflight)}

        def process(index: int, frames: list[Frame], seed: int) -> Middles:
            try:
                return self._chunk([frame.encoded for frame in frames], seed, frames[0].image.size, cancel, stages)
            except ServerError as exc:
                if exc.kind != ChunkTooLargeError.kind or len(frames) <= 2:
                    raise
            half = len(frames) // 2
            first, second = process(index, frames[: half + 1], seed), process(index + half, frames[half:], seed + half)
            return Middles(first.images + second.images, first.sent_bytes + second.sent_bytes,
                           first.received_bytes + second.received_bytes,
                           None if first.payload_bytes is None else first.payload_bytes + second.payload_bytes,
                           first.retries + second.retries)

        return process

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _middle_frames(answer: requests.Response, pairs: int, size: tuple[int, int]) -> list[Image.Image]:
    """The middle frames of an answer: one PNG for a pair, else a stored zip of ``000.png``,
    ``001.png``, ... Each is judged by its header (an 8-bit RGB PNG of the frames' size, as the edge
    makes them) before any pixel is decoded, so a broken or hostile server cannot make the client
    decode a bomb, or write frames of another size."""
    where = f"(from {answer.url})"
    if pairs == 1:
        return [_middle_image(answer.content, size, where)]
    names = [f"{j:03d}.png" for j in range(pairs)]
    most = size[1] * (3 * size[0] + 1) * 2 + (1 << 16)  # an uncompressed PNG of the frame, twice over
    try:
        with zipfile.ZipFile(io.BytesIO(answer.content)) as archive:
            entries = archive.infolist()
            if [e.filename for e in entries] != names or any(e.compress_type != zipfile.ZIP_STORED or e.file_size > most for e in entries):
                raise ServerError(502, "bad_answer", f"the answer is not a zip of {pairs} stored PNGs {names[0]}...{names[-1]} {where}")
            return [_middle_image(archive.read(name), size, where) for name in names]
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        start = " ".join(answer.content[:100].decode(errors="replace").split())
        raise ServerError(502, "bad_answer", f"the answer is not a zip of {pairs} PNGs ({exc}): {start!r} {where}") from None
