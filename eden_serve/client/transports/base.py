"""What every transport shares: the :class:`Transport` base class (each step's URL and the token it
sends, a warning before a token goes in clear, what a server's refusal means to the client), how
requests are retried (:class:`Retry`), take their turns (:class:`Stage`) and are cut when their run
stops (:class:`RunRequests`, :func:`cuttable`), and the inference token every transport sends
(:func:`read_token`).
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import json
import os
import threading
import time
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

from PIL import Image

from ...errors import BadInputError, ServerError, TransientError, UnavailableError, error_from_document
from ..tls import ClientTLS

TOKEN_ENV = "EDEN_TOKEN"

# TorchServe's names for the workflow and the two models (eden-serve archive).
WORKFLOW = "eden"
ENCODER = "eden_encoder"
DECODER = "eden_ditdec"


class Transport:
    """The servers, as the client reaches them: the workflow at ``server``, or the encoder at
    ``cloud`` and the DiT+decoder at ``edge``, with ``tokens`` by step (workflow, encoder,
    decoder; None: no auth), ``timeout`` seconds for an answer and ``tls``. ``urls``: each step's
    URL; :attr:`split`: whether the client carries the payload from the cloud to the edge."""

    name: ClassVar[str]
    schemes: ClassVar[tuple[str, ...]]  # the URL schemes it serves
    secure: ClassVar[tuple[str, ...]]  # those of them under TLS: a token sent over the others goes in clear
    workflow_api: ClassVar[bool]  # whether it reaches TorchServe's workflows (else a server is its two models)
    urls: dict[str, str]
    authorization: dict[str, str | None]  # by step: the Authorization a request sends, or None

    def __init__(self, server: str | None, cloud: str | None, edge: str | None, tokens: dict[str, str | None], timeout: float,
                 tls: ClientTLS):
        raise NotImplementedError

    def reach(self, urls: dict[str, str], tokens: dict[str, str | None]) -> None:
        """Each step's URL and, where it has a token, the ``Bearer`` authorization it sends, said in one
        warning line where the token would go in clear to another machine (every transport's constructor calls it)."""
        self.urls = urls
        for token in filter(None, tokens.values()):
            # An HTTP header or gRPC metadata holds visible ASCII: a pasted "…" or "✓" failed the
            # first request's encoding, an internal error; TorchServe's keys are letters and digits.
            unfit = [c for c in token if not (c.isascii() and c.isprintable()) or c == " "]
            if unfit:
                raise BadInputError(f"the token holds {unfit[0]!r}, a space or a character outside visible ASCII, which no "
                                    "header carries; give the key as TorchServe wrote it")
        self.authorization = {step: f"Bearer {tokens[step]}" if tokens.get(step) else None for step in urls}
        for step, url in urls.items():
            warn_cleartext(url, tokens.get(step), tuple(s for s in self.schemes if s not in self.secure))

    @property
    def split(self) -> bool:
        return "encoder" in self.urls

    def workflow(self, frames: list[bytes], form: dict[str, str], pairs: int, size: tuple[int, int]) -> tuple[list[Image.Image], int, int]:
        """A chunk's middles through the workflow, the bytes sent and the bytes received."""
        raise NotImplementedError

    def ask_cloud(self, frames: list[bytes], form: dict[str, str], first_byte: Callable[[float], None] | None = None,
                  turn: Callable[[], contextlib.AbstractContextManager] | None = None) -> tuple[bytes, int]:
        """The cloud step: the answer to a chunk's frames (or the form that names them), and the
        bytes sent for it; ``first_byte`` gets the time the answer began to arrive, and it is read
        in ``turn()`` where the transport can hold it back (the link's turn, in chunk order)."""
        raise NotImplementedError

    def ask_edge(self, payload: bytes, first: int, pairs: int, size: tuple[int, int],
                 deliver: Callable[[int, Image.Image], None]) -> int:
        """The edge step: the middles of pairs ``first`` ... ``pairs - 1`` of ``payload``, handed
        to ``deliver(j, image)`` as they stream in; the bytes received. Raises TransientError where
        the answer ends early."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class RunRequests:
    """One run's requests: those in flight, which :meth:`cut` ends at once when the run stops (each
    then fails as a dropped connection does, instead of waiting for a server that may not answer),
    and ``planes``, the planes its output's writer takes, which an edge that answers raw frames is
    asked for (None: RGB). A transport sends each request in :func:`cuttable`, saying how to cut
    it, and reads the run's wishes from :func:`sending_for`; the requests sent while :meth:`sending`
    (the run's worker, in its thread) are this run's. Scoped to the run, not the transport: one
    client shared by several runs had every run's requests cut by one stop, and a run's planes
    asked for in the next run's requests."""

    def __init__(self):
        self._lock = threading.Lock()
        self._cuts: dict[object, Callable[[], None]] = {}
        self.planes = None

    @contextlib.contextmanager
    def sending(self):
        token = _SENDING.set(self)
        try:
            yield
        finally:
            _SENDING.reset(token)

    def cut(self) -> None:
        # Under the lock, as cuttable's end is: a request that has ended, and whose connection may
        # already serve another run's request, is never cut.
        with self._lock:
            for cut in list(self._cuts.values()):
                cut()


# The run a thread sends requests for: a context variable, so that a transport's calls (and those
# of a transport mounted from outside, its signatures unchanged) need not carry it.
_SENDING: contextvars.ContextVar[RunRequests | None] = contextvars.ContextVar("eden_sending", default=None)


def sending_for() -> RunRequests | None:
    """The run this thread sends requests for; None outside a run (a single pair, a source's probe)."""
    return _SENDING.get()


@contextlib.contextmanager
def cuttable(cut: Callable[[], None]):
    """A request in flight, which ``cut()`` ends at once, for the run this thread sends for (none: it
    is never cut). ``cut`` may be called from another thread; it must not touch other requests."""
    run = _SENDING.get()
    if run is None:
        yield
        return
    key = object()
    with run._lock:
        run._cuts[key] = cut
    try:
        yield
    finally:
        with run._lock:
            del run._cuts[key]


@dataclass(frozen=True)
class Retry:
    """Exponential backoff: ``tries`` attempts in all, ``backoff`` seconds before the second, doubling
    up to ``max_backoff``. Only :class:`TransientError` is retried."""

    tries: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0

    def __post_init__(self):
        if self.tries < 1 or self.backoff < 0:
            raise BadInputError(f"retry needs tries >= 1 and backoff >= 0, got {self.tries} and {self.backoff}")

    def call(self, operation: Callable[[], object], cancel: threading.Event | None = None):
        """``operation()``, retried; raises :class:`UnavailableError` once the tries are spent, or as
        soon as ``cancel`` is set while waiting."""
        for attempt in range(self.tries):
            if cancel is not None and cancel.is_set():  # the run has stopped: nothing more is sent
                raise UnavailableError("cancelled before it was sent")
            try:
                return operation()
            except TransientError as exc:
                failure = exc
            if attempt + 1 < self.tries:
                delay = min(self.backoff * 2**attempt, self.max_backoff)
                if cancel is not None and cancel.wait(delay):
                    raise UnavailableError(f"{failure} (cancelled)") from failure
                if cancel is None:
                    time.sleep(delay)
        raise UnavailableError(f"{failure} (gave up after {self.tries} tries)") from failure


class Stage:
    """At most ``limit`` requests of one step at a time. The split client gives its cloud and its edge
    step one each, with a window of chunks twice as wide: so payloads keep crossing the link while the
    edge computes earlier ones, rather than the two taking turns (TorchServe answers a batch's
    requests together, which empties a shared window at once).

    Requests enter in the order of their chunks, not in the order their threads happen to ask: a
    chunk's place (its ``order``) is announced with :meth:`expect` when it is queued, and a request
    with an order waits while an earlier announced chunk has not entered (or been withdrawn with
    :meth:`forget`). Otherwise the first chunk of a clip, whose thread may ask last, would reach the
    cloud, the link and the edge after later ones and its middle come with theirs (docs/streaming.md,
    "Where the first middle's time went"). Requests without an order enter as they ask."""

    def __init__(self, limit: int):
        self.limit = limit
        self._changed = threading.Condition()
        self._busy = 0
        self._waiting: list[object] = []  # tickets in the order they asked
        self._expected: set[int] = set()  # announced orders that have not entered

    def expect(self, order: int) -> None:
        with self._changed:
            self._expected.add(order)

    def forget(self, order: int) -> None:
        """Order ``order`` will not ask (its chunk failed or was done elsewhere): later ones need not wait."""
        with self._changed:
            self._expected.discard(order)
            self._changed.notify_all()

    def _next(self) -> object | None:
        """The ticket to enter next: the earliest announced order if it is waiting, else (while an
        earlier announced chunk has yet to ask) no ordered one; unordered tickets by when they asked."""
        earliest = min(self._expected, default=None)
        for ticket in self._waiting:
            order = getattr(ticket, "order", None)
            if order is None or order not in self._expected or order == earliest:
                return ticket
        return None

    @contextlib.contextmanager
    def slot(self, cancel: threading.Event | None, order: int | None = None):
        ticket = _Ticket(order)
        with self._changed:
            self._waiting.append(ticket)
            try:
                while self._next() is not ticket or self._busy >= self.limit:
                    if cancel is not None and cancel.is_set():
                        raise UnavailableError("cancelled while waiting for a request slot")
                    self._changed.wait(0.5)
            finally:
                self._waiting.remove(ticket)
                self._changed.notify_all()
            self._expected.discard(order)
            self._busy += 1
        try:
            yield
        finally:
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()


def refusal_error(status: int, kind: str, message: str) -> TransientError | ServerError:
    """What a server's refusal with ``status`` is to the client: where the server failed (5xx: a
    worker restarting, a full queue, a device lost) worth another try; otherwise the request's own
    fault, told as the server's status and kind."""
    return TransientError(message) if status >= 500 else ServerError(status, kind, message)


def check_document(body: bytes, where: str) -> None:
    """Raises what ``body`` means where it is a server's JSON error document: TorchServe passes a
    handler's refusal on as a body (a workflow's with status 200, over gRPC with status OK), so the
    body, not the status, says it."""
    refused = error_from_document(body)
    if refused is not None:
        raise refusal_error(refused.status, refused.kind, f"{refused} ({where})")


def warn_cleartext(url: str, token: str | None, clear: tuple[str, ...] = ("http", "grpc")) -> None:
    """One warning line before ``token`` goes in clear (a scheme of ``clear``: ``http://``,
    ``grpc://``) to a host that is not this machine: anyone on the way can read it and use the server."""
    parts = urllib.parse.urlsplit(url)
    if not token or parts.scheme not in clear:
        return
    host = parts.hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost" or host.endswith(".localhost")
    if not loopback:
        warnings.warn(f"the token goes in clear to {parts.scheme}://{parts.netloc}, which is not this machine; "
                      "serve TLS and use https:// or grpcs:// (docs/tls.md)")


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


class _Ticket:
    __slots__ = ("order",)

    def __init__(self, order: int | None):
        self.order = order
