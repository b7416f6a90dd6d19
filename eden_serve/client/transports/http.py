"""The client's HTTP transport: TorchServe's HTTP inference API, the workflow at one server or the
encoder and the DiT+decoder at two, the edge's answers streamed (HTTP chunked transfer)."""

from __future__ import annotations

import contextlib
import queue
import re
import socket
import threading
import time
import urllib.parse
import weakref
from typing import Callable, Iterator, Sequence

import numpy as np
import requests
import torch
from PIL import Image
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ...errors import BadInputError, ServerError, TransientError, connection_failure, error_from_document
from ...media.planes import PlaneFormat, Planes
from ...wire.answers import STREAMED, StreamedAnswer, middle_of, most_answer_bytes, whole_answer
from ...wire.raw import RAW, RawPlanes, loopback, whole_raw
from ..tls import ClientTLS
from .base import DECODER, ENCODER, WORKFLOW, Transport, cuttable, refusal_error, sending_for

CONNECT_TIMEOUT = 10.0
MAX_ANSWER_BYTES = 512 << 20  # as the gRPC transport's messages: above TorchServe's largest answer (its max_response_size)
READ_BYTES = 1 << 20  # read at a time; each must come within the timeout


def _base(url: str, option: str) -> str:
    """``url`` as the base of the server's paths: its scheme in any case, as URLs' are (``HTTP://``
    was refused); no query or fragment, which ended up before the paths (``/?x=1/wfpredict/eden``)."""
    try:
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    except ValueError:  # a malformed host or port, "http://[::1" say
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise BadInputError(f"{option} must be an http:// or https:// URL, got {url!r}")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise BadInputError(f"{option} must be a server's address without a query or fragment, got {url!r}")
    return urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc, parts.path.rstrip("/"), "", ""))


def _read(response: requests.Response, deadline: "_Deadline", most: int, what: str) -> bytes:
    """The body, within ``deadline``, refused once it goes past ``most`` bytes (``what`` says what
    takes that many): held whole as it came, a body without end from a broken or hostile server
    took the client's memory."""
    deadline.renew()
    content = bytearray()
    for data in response.iter_content(chunk_size=READ_BYTES):
        deadline.renew()
        content += data
        if len(content) > most:
            raise ServerError(502, "bad_answer", f"the answer goes on past {most} bytes, more than {what} (from {response.url})")
    return bytes(content)


def _check(response: requests.Response, deadline: "_Deadline", most: int, what: str) -> bytes:
    """The body of the response, or the error it means, looked for in the body rather than the
    status (docs/serving.md: "Workflow caveat")."""
    content = _read(response, deadline, most, what)
    refused = error_from_document(content)
    if refused is None and response.status_code < 400:
        return content
    if refused is not None:
        status, kind, message = refused.status, refused.kind, str(refused)
    elif response.status_code == 413 and not content:  # TorchServe's own, before any handler
        status, kind = 413, "request_too_large"
        sent = len(response.request.body or b"")
        message = (f"the server refused a request of {sent} bytes as too large: over its max_request_size "
                   "(docs/deploy.md: Capacity); send smaller frames, or a smaller codec to the edge")
    else:
        status, kind = response.status_code, "http_error"
        message = " ".join(content[:300].decode(errors="replace").split()) or response.reason
    raise refusal_error(status, kind, f"{message} (HTTP {status} from {response.url})")


@contextlib.contextmanager
def _connection_errors(url: str):
    """A failure to reach ``url`` or to read its answer, as the error to raise: a dropped or stalled
    connection is worth retrying (a worker being restarted drops it), a malformed request is not."""
    try:
        yield
    except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
        raise connection_failure(exc, url) from exc
    except requests.exceptions.ContentDecodingError as exc:  # the server's fault, not the request's
        raise ServerError(502, "bad_answer", f"the answer does not decode as its Content-Encoding says "
                                             f"({' '.join(str(exc).split())[:200]}) (from {url})") from None
    except requests.RequestException as exc:
        raise BadInputError(f"{url}: {type(exc).__name__} ({' '.join(str(exc).split())[:300]})") from None


class _Cuttable(HTTPAdapter):
    """requests' adapter, its connections remembered so that :meth:`cut` can shut their sockets: a
    request waiting for an answer (a server that hangs: up to ``--timeout``, 300 s) then fails at
    once, and its worker, which a stopped run waits for, ends. One session's, which one request
    holds at a time: cutting it cuts that request alone."""

    def __init__(self):
        self._connections: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": self._pool(HTTPConnectionPool), "https": self._pool(HTTPSConnectionPool)}

    def _pool(self, base: type) -> type:
        adapter = self

        class Pool(base):
            def _new_conn(self):
                connection = super()._new_conn()
                with adapter._lock:
                    adapter._connections.add(connection)
                return connection

        return Pool

    def cut(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError, AttributeError):  # closed meanwhile, or not yet connected
                connection.sock.shutdown(socket.SHUT_RDWR)


class _Deadline:
    """The time the next part of an answer's body has to come in (each :data:`READ_BYTES`, and each
    middle of a streamed answer, renew it), past which the request's connection is cut: the
    socket's timeout bounds each read alone, and a server that sent a byte now and then held the
    client for ever. A slow link still moves a MiB within it. One watching thread a request, from
    its first :meth:`renew` to :meth:`stop`; once stopped, it cuts nothing."""

    def __init__(self, seconds: float, cut: Callable[[], None]):
        self.seconds, self.cut, self.expired = seconds, cut, False
        self._changed = threading.Condition()
        self._end: float | None = None
        self._stopped = False

    def renew(self) -> None:
        with self._changed:
            started, self._end = self._end is not None, time.monotonic() + self.seconds
        if not started:
            threading.Thread(target=self._watch, name="eden-http-deadline", daemon=True).start()

    def _watch(self) -> None:
        with self._changed:
            while not self._stopped:
                left = self._end - time.monotonic()
                if left <= 0:
                    self.expired = True
                    self.cut()
                    return
                self._changed.wait(left)

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()


class HttpTransport(Transport):
    """TorchServe's HTTP inference API: the workflow at ``server``, or the encoder at ``cloud`` and
    the DiT+decoder at ``edge``, whose answers stream in chunks (HTTP chunked transfer). Each call is
    one attempt; :class:`~eden_serve.client.Client` retries. Safe to use from several threads: each
    request borrows an idle ``requests.Session``."""

    name = "http"
    schemes = ("http", "https")
    secure = ("https",)
    workflow_api = True

    def __init__(self, server: str | None, cloud: str | None, edge: str | None, tokens: dict[str, str | None], timeout: float,
                 tls: ClientTLS):
        if server is not None:
            self.reach({"workflow": f"{_base(server, 'server')}/wfpredict/{WORKFLOW}"}, tokens)
        else:
            self.reach({"encoder": f"{_base(cloud, 'cloud')}/predictions/{ENCODER}",
                        "decoder": f"{_base(edge, 'edge')}/predictions/{DECODER}"}, tokens)
        self.headers = {step: {"Authorization": value} if value else {} for step, value in self.authorization.items()}
        self.timeout = (CONNECT_TIMEOUT, timeout)
        self.tls = tls
        # An edge on this machine answers raw frames, cheaper than PNGs to make and to read (docs/serving.md, "Raw answers").
        self.raw = "decoder" in self.urls and loopback(urllib.parse.urlsplit(self.urls["decoder"]).netloc)
        # Raw answers as these planes outside a run (a run's are its own: RunRequests.planes).
        self.planes: PlaneFormat | None = None
        self._idle: queue.SimpleQueue[requests.Session] = queue.SimpleQueue()

    def _session(self) -> requests.Session:
        session = requests.Session()
        adapter = _Cuttable()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session

    @contextlib.contextmanager
    def _post(self, step: str, headers: dict | None = None, **kwargs) -> Iterator[tuple[requests.Response, _Deadline]]:
        """The answer to a POST to ``step``'s URL, and the deadline of its body, which its reader
        starts; errors reading it are mapped too: past the deadline, a timeout (retried)."""
        url = self.urls[step]
        try:
            session = self._idle.get_nowait()
        except queue.Empty:
            session = self._session()
        cut = session.get_adapter(url).cut
        deadline = _Deadline(self.timeout[1], cut)
        try:
            # Cut by its run's stop alone: the session is this request's until it goes back to _idle.
            with cuttable(cut), _connection_errors(url):
                # verify per request: a session's would lose to $REQUESTS_CA_BUNDLE.
                with session.post(url, headers={**self.headers[step], **(headers or {})}, timeout=self.timeout,
                                  verify=self.tls.verify, **kwargs) as response:
                    try:
                        yield response, deadline
                    except (requests.RequestException, TransientError):
                        if deadline.expired:
                            raise TransientError(f"timed out: the answer came slower than a MiB (or a middle) "
                                                 f"in {deadline.seconds:g} s ({url})") from None
                        raise
        finally:
            deadline.stop()
            self._idle.put(session)

    def workflow(self, frames: list[bytes], form: dict[str, str], pairs: int, size: tuple[int, int]):
        """The middles of a chunk through the workflow, the bytes sent and the bytes received."""
        with self._post("workflow", files=_files(frames, form), stream=True) as (response, deadline):
            content = _check(response, deadline, most_answer_bytes(pairs, size), _middles(pairs, size))
            return whole_answer(content, pairs, size, f"(from {response.url})"), len(response.request.body), len(content)

    def ask_cloud(self, frames: list[bytes], form: dict[str, str], first_byte: Callable[[float], None] | None = None,
                  turn: Callable[[], contextlib.AbstractContextManager] | None = None) -> tuple[bytes, int]:
        """The answer's body is read in a ``turn()`` (the link's, in chunk order): until then TCP's
        flow control holds it at the cloud, all but what the receive buffer takes, so that it does
        not share the link with the payload before it."""
        with self._post("encoder", files=_files(frames, form), stream=True) as (response, deadline):
            with turn() if turn is not None else contextlib.nullcontext():
                if first_byte is not None:
                    first_byte(time.perf_counter())
                return _check(response, deadline, MAX_ANSWER_BYTES, "the largest answer TorchServe sends"), len(response.request.body)

    def ask_edge(self, payload: bytes, first: int, pairs: int, size: tuple[int, int],
                 deliver: Callable[[int, Image.Image], None]) -> int:
        """The middles stream in HTTP chunks (an edge that answers whole is read whole)."""
        headers = {"Content-Type": "application/octet-stream", "X-Eden-Stream": "http", "X-Eden-First": str(first)}
        run = sending_for()
        planes = self.planes if run is None else run.planes
        if self.raw:
            headers["X-Eden-Answer"] = "raw" if planes is None else (f"yuv:{planes.matrix}:{'full' if planes.full else 'limited'}"
                                                                     f"{':left' if planes.left else ''}")
        deliver = self._as_planes(deliver, planes)
        with self._post("decoder", headers, data=payload, stream=True) as (response, deadline):
            content_type = response.headers.get("Content-Type", "").split(";")[0].strip()
            if content_type != STREAMED:  # a refusal, or an edge that does not stream
                content = _check(response, deadline, most_answer_bytes(pairs - first, size, self.raw), _middles(pairs - first, size))
                where = f"(from {response.url})"
                if self.raw and content_type == RAW:
                    middles = [middle_of(m) for m in whole_raw(content, pairs - first, size, where)]
                else:
                    middles = whole_answer(content, pairs - first, size, where)
                for j, image in enumerate(middles, first):
                    deliver(j, image)
                return len(content)
            answer = StreamedAnswer(first, pairs, size, f"(from {response.url})", self.raw)
            received, renewed = 0, 0
            deadline.renew()
            for data in response.iter_content(chunk_size=None):
                received += len(data)
                if received - renewed >= READ_BYTES:
                    deadline.renew()
                    renewed = received
                for j, image in answer.feed(data):
                    deliver(j, image)
                    deadline.renew()
            if not answer.finish():
                raise TransientError(f"the answer ended after {answer.next - first} of {pairs - first} middles ({response.url})")
        return received

    def _as_planes(self, deliver: Callable[[int, object], None], format: PlaneFormat | None) -> Callable[[int, object], None]:
        """``deliver`` given the planes of a raw answer as the writer takes them (:class:`~eden_serve.media.planes.Planes`)."""

        def delivered(j: int, middle) -> None:
            if isinstance(middle, RawPlanes):
                if format is None or (middle.matrix, middle.full, middle.left) != (format.matrix, format.full, format.left):
                    raise ServerError(502, "bad_answer", f"the edge answered planes in {middle.matrix}, full range {middle.full}, "
                                                         f"chroma sited {'left' if middle.left else 'centre'}, "
                                                         f"where {format} was asked")
                middle = Planes(torch.from_numpy(np.array(middle.data)), middle.width, middle.height, format)
            deliver(j, middle)

        return delivered

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


def _middles(pairs: int, size: tuple[int, int]) -> str:
    return f"{pairs} middle{'s' if pairs > 1 else ''} of {size[0]}x{size[1]} take"


def _files(frames: Sequence[bytes], form: dict[str, str]) -> dict:
    """A multipart form, also for a request that names a server-side source instead of frames."""
    files = {f"frame{i}": (f"frame{i}", data, "application/octet-stream") for i, data in enumerate(frames)}
    return files | {key: (None, value) for key, value in form.items()}

