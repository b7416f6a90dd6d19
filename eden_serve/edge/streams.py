"""Work made on a stream of its own and handed to the stream that computes: the next request's
conditions (its tokens uploaded, its frames through E_cond) prepared on a GPU while the current
batch's forward runs there.

:class:`SideStream` runs the preparation under its own stream (:meth:`~SideStream.making`), marks its
end with an event (:meth:`~SideStream.hand_over`), and the computing thread's stream waits for that
event, not for the whole device, before it reads the tensors (:meth:`~SideStream.take`). Those tensors
are then marked as used by the computing stream, so that the caching allocator does not give their
memory to the side stream again while the forward may still read it. The CUDA calls sit behind
:class:`StreamAPI`; on a CPU :class:`HostStreams` runs the same code path with nothing to order.

Each role has one stream per device for the whole process (:func:`role_stream`): the graphs' captures
and replays, the preparation, the compiler. ``torch.cuda.Stream()`` hands out the streams of a small
pool in turn (32 per priority and device), so streams made per job come round again in a long-lived
worker: a compile job's stream would then be the replays', and a capture would take in another
thread's work queued on its stream. The graphs' stream is taken from the high-priority pool, which
nothing else here draws from, so that no other role's stream is ever the one a capture runs on.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterable, NamedTuple, Protocol

import torch

ROLES = ("graphs", "prepare", "compile")
_HIGH = -1  # the high-priority pool: the graphs' stream, and no other
_roles: dict[tuple[torch.device, str], tuple[object, threading.RLock]] = {}
_made = threading.Lock()


def indexed(device: str | torch.device) -> torch.device:
    """``device`` with its index: plain ``cuda`` (what ``--device cuda`` and ``auto`` give) becomes
    the current GPU. ``torch.cuda.set_device`` refuses a CUDA device without an index, and
    ``cuda`` does not compare equal to ``cuda:0``, the device of the tensors made there."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _role(device: torch.device, role: str) -> tuple[object, threading.RLock]:
    assert role in ROLES, role
    device = indexed(device)
    with _made:
        if (device, role) not in _roles:
            stream = torch.cuda.Stream(device, priority=_HIGH if role == "graphs" else 0) if device.type == "cuda" else None
            _roles[device, role] = (stream, threading.RLock())
        return _roles[device, role]


def role_stream(device: torch.device, role: str):
    """``role``'s stream of ``device`` (one of :data:`ROLES`), made at its first use, the same for
    the rest of the process; None on a CPU."""
    return _role(device, role)[0]


def role_lock(device: torch.device, role: str) -> threading.RLock:
    """The lock under which the work of ``role`` on ``device`` takes its turns on the role's stream."""
    return _role(device, role)[1]


class CaptureGate:
    """Keeps a CUDA graph's capture apart from work that may wait for the whole device.

    A capture forbids, in every thread, what would wait for its stream: a device-wide
    synchronisation elsewhere fails ("operation not permitted when stream is capturing") and
    invalidates the capture, whatever the capture's error mode. The compiler's first run of a key
    does that (inductor's autotuning times its kernels between device synchronisations), and so do
    a timer's wait and NVDEC's. On an H200, compiling in the background beside the clip's first
    captures failed that way (2026-11-28). Such work holds the gate :meth:`shared` (many at once); a
    capture holds it alone (:meth:`capturing`), and where it would have to wait (a compile takes
    a minute) the caller runs its key uncaptured this once instead."""

    def __init__(self):
        self._turn = threading.Condition()
        self._shared = 0
        self._capturing: int | None = None  # the capturing thread's ident

    @contextlib.contextmanager
    def shared(self):
        """Work that may synchronise the whole device: it waits for another thread's capture under
        way to end (the capturing thread's own waits are its capture's to answer)."""
        me = threading.get_ident()
        with self._turn:
            self._turn.wait_for(lambda: self._capturing in (None, me))
            self._shared += 1
        try:
            yield
        finally:
            with self._turn:
                self._shared -= 1
                self._turn.notify_all()

    @contextlib.contextmanager
    def capturing(self, wait: bool):
        """The gate alone, for a capture: yields True, or, where it is held and ``wait`` is false,
        yields False at once (the caller does not capture)."""
        with self._turn:
            free = lambda: self._capturing is None and self._shared == 0  # noqa: E731
            took = self._turn.wait_for(free) if wait else free()
            if took:
                self._capturing = threading.get_ident()
        try:
            yield took
        finally:
            if took:
                with self._turn:
                    self._capturing = None
                    self._turn.notify_all()


_gates: dict[torch.device, CaptureGate] = {}


def capture_gate(device: str | torch.device) -> CaptureGate:
    """The :class:`CaptureGate` of ``device``, the same for the whole process (a CPU's keeps the
    stand-ins' captures apart from the compiler as a GPU's would)."""
    device = indexed(device)
    with _made:
        return _gates.setdefault(device, CaptureGate())


class StreamAPI(Protocol):
    """What :class:`SideStream` needs of a device's streams and events."""

    def stream(self, role: str) -> object:
        """The device's stream for ``role`` (:func:`role_stream`)."""

    def current(self) -> object:
        """The calling thread's current stream."""

    def using(self, stream: object) -> contextlib.AbstractContextManager:
        """A context in which the calling thread's work is queued on ``stream``."""

    def record(self, stream: object) -> object:
        """An event recorded on ``stream`` now: done once the work queued before it is."""

    def wait(self, stream: object, event: object) -> None:
        """Work queued on ``stream`` after this waits for ``event``."""

    def keep(self, tensor: torch.Tensor, stream: object) -> None:
        """``tensor``'s memory is not reused before the work queued on ``stream`` until now is done."""


class CudaStreams:
    """:class:`StreamAPI` on a CUDA device."""

    def __init__(self, device: torch.device):
        self.device = device

    def stream(self, role):
        return role_stream(self.device, role)

    def current(self):
        return torch.cuda.current_stream(self.device)

    def using(self, stream):
        return torch.cuda.stream(stream)

    def record(self, stream):
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream, event):
        stream.wait_event(event)

    def keep(self, tensor, stream):
        if tensor.device.type == "cuda":
            tensor.record_stream(stream)


class HostStreams:
    """:class:`StreamAPI` on a CPU: its work runs as it is called, in order; nothing to wait for."""

    def stream(self, role):
        return None

    def current(self):
        return None

    def using(self, stream):
        return contextlib.nullcontext()

    def record(self, stream):
        return None

    def wait(self, stream, event):
        pass

    def keep(self, tensor, stream):
        pass


def streams_for(device: torch.device) -> StreamAPI:
    return CudaStreams(device) if device.type == "cuda" else HostStreams()


class Ticket(NamedTuple):
    """The end of one preparation on the side stream."""

    event: object


class SideStream:
    """The preparations' stream of ``api``'s device (one per process: preparations on several
    threads at once only wait for each other's work as well)."""

    def __init__(self, api: StreamAPI):
        self.api = api
        self.stream = api.stream("prepare")

    def making(self) -> contextlib.AbstractContextManager:
        """The context in which a preparation's device work is queued on the side stream."""
        return self.api.using(self.stream)

    def hand_over(self) -> Ticket:
        """Marks the end of the preparation queued so far (called on the preparing thread)."""
        return Ticket(self.api.record(self.stream))

    def take(self, ticket: Ticket, tensors: Iterable[torch.Tensor]) -> None:
        """On the computing thread: its stream waits for the preparation of ``ticket``, and keeps
        ``tensors`` (what the preparation made) from being reused until its own work on them is done."""
        computing = self.api.current()
        self.api.wait(computing, ticket.event)
        for tensor in tensors:
            self.api.keep(tensor, computing)
