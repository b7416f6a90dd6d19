"""Work made on a stream of its own and handed to the stream that computes: the next request's
conditions (its tokens uploaded, its frames through E_cond) prepared on a GPU while the current
batch's forward runs there.

:class:`SideStream` runs the preparation under its own stream (:meth:`~SideStream.making`), marks its
end with an event (:meth:`~SideStream.hand_over`), and the computing thread's stream waits for that
event, not for the whole device, before it reads the tensors (:meth:`~SideStream.take`). Those tensors
are then marked as used by the computing stream, so that the caching allocator does not give their
memory to the side stream again while the forward may still read it. The CUDA calls sit behind
:class:`StreamAPI`; on a CPU :class:`HostStreams` runs the same code path with nothing to order.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, NamedTuple, Protocol

import torch


class StreamAPI(Protocol):
    """What :class:`SideStream` needs of a device's streams and events."""

    def stream(self) -> object:
        """A new stream of the device."""

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

    def stream(self):
        return torch.cuda.Stream(self.device)

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

    def stream(self):
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
    """One stream of ``api``'s device for preparations, made by one thread at a time."""

    def __init__(self, api: StreamAPI):
        self.api = api
        self.stream = api.stream()

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
