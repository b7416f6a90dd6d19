"""CUDA's streams stood in for on a CPU, for the tests of which stream each role's work runs on
(eden_serve/edge/streams.py): every stream made is recorded with its device and priority, and a
stream made current is recorded on the thread that made it current. Nothing else of CUDA is there."""

from __future__ import annotations

import contextlib
import threading

import torch

from eden_serve.edge import streams


class Stream:
    def __init__(self, device=None, priority: int = 0):
        self.device, self.priority = device, priority

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass


def _set_device(device) -> None:
    """What ``torch.cuda.set_device`` takes: an index, or a CUDA device that names one. Plain
    ``cuda`` is refused, as PyTorch refuses it (a ValueError, "Expected a torch.device with a
    specified index or an integer")."""
    if isinstance(device, int):
        return
    device = torch.device(device)
    if device.type != "cuda" or device.index is None:
        raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")


class FakeStreams:
    """``torch.cuda``'s streams replaced for one test (``monkeypatch``), the process's role streams
    forgotten before and after."""

    def __init__(self, monkeypatch):
        self.made: list[Stream] = []
        self.used: list[tuple[str, Stream]] = []  # (thread name, stream) each time a stream is made current
        self._current = threading.local()
        monkeypatch.setattr(streams, "_roles", {}, raising=False)
        monkeypatch.setattr(torch.cuda, "Stream", self._stream)
        monkeypatch.setattr(torch.cuda, "stream", self._using)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: getattr(self._current, "stream", None))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "set_device", _set_device)

    def _stream(self, device=None, priority: int = 0) -> Stream:
        stream = Stream(device, priority)
        self.made.append(stream)
        return stream

    @contextlib.contextmanager
    def _using(self, stream):
        before = getattr(self._current, "stream", None)
        self._current.stream = stream
        self.used.append((threading.current_thread().name, stream))
        try:
            yield
        finally:
            self._current.stream = before
