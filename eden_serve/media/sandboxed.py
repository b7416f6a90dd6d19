"""Decoding packets that the edge does not trust, in a process of their own (docs/errors-and-limits.md,
"The decoder's sandbox"): a crash or a hang of libavcodec on hostile packets costs that request its
answer, never the worker, its other requests or its streams. This is the worker's side; the other
is :mod:`eden_serve.sandbox` (the zygote, its children, their confinement, the decoder), which
imports no PyTorch.

A zygote (:mod:`eden_serve.sandbox.zygote`), started when the edge worker loads, forks one child
per payload. The child, before it reads a byte of the packets, closes every file but its socket,
takes resource limits (address space, CPU seconds, no file writes, no core file) and a seccomp
filter (:mod:`pyseccomp` over libseccomp): only the system calls that decoding takes, so no socket,
no exec, no new process, no file opened, at most a few threads. It decodes into a sealed memfd that
the worker made, sized for the frames declared, and answers with one status record. The worker
reads only that record and the pixels: nothing a compromised child writes is unpickled or parsed
beyond a length-prefixed text, and its words reach no client (a refusal is a fixed message per
kind) and the log only as one bounded, escaped line. The zygote starts with none of the worker's
environment (its keys and tokens): :func:`zygote_environment`. The worker kills the child at the
deadline, or once it answered.
"""

from __future__ import annotations

import fcntl
import json
import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from ..errors import CodecError, DigestMismatchError, PayloadTooLargeError, TooMuchWorkError
from ..sandbox import zygote
from ..sandbox.confine import Tasks, pids_cgroup, remove
from ..sandbox.decoder import pixel_dtype
from ..sandbox.zygote import DECODER, LENGTH, MAX_MESSAGE, STATUS
from ..wire.bitstream import Packet, StreamParameters

logger = logging.getLogger(__name__)
# The refusals a child may report, by type, each told in the worker's own words: a child's words
# reach no client. Any other type is a malformed payload.
REFUSALS = {
    CodecError.kind: (CodecError, "malformed payload: its packets do not decode to the frames its header declares"),
    PayloadTooLargeError.kind: (PayloadTooLargeError, "the payload's packets decode to frames over this edge's pixel limit"),
    DigestMismatchError.kind: (DigestMismatchError, "this edge cannot decode the cloud's packets (no PyAV, or its FFmpeg "
                                                    "lacks the decoder); send this chunk with the frames codec"),
    TooMuchWorkError.kind: (TooMuchWorkError, "decoding the payload's packets is more work than this edge does for one "
                                              "request; send shorter chunks"),
}
CRASHED = "malformed payload: the decoder crashed on its packets (its process ended without an answer)"
DEADLINE_S = 30.0  # handler.decode_deadline_s's default
LOGGED = 160  # characters of a child's message the log gets, escaped on one line
# The zygote's environment beyond where Python finds the package and its libraries: one thread for
# each numeric library, so that every fork copies a process holding no other thread's locks.
ENVIRONMENT = {"PATH": os.defpath, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def zygote_environment() -> dict[str, str]:
    """The zygote's whole environment: :data:`ENVIRONMENT` and the worker's ``PYTHONPATH`` and
    ``LD_LIBRARY_PATH``, nothing else of the worker's (its cloud keys, hub tokens, ...)."""
    return {**ENVIRONMENT, **{name: os.environ[name] for name in ("PYTHONPATH", "LD_LIBRARY_PATH") if os.environ.get(name)}}


class Sandbox:
    """The zygote of one worker, started by :meth:`start` (or at the first payload) and again after
    it died, and the child forked for the next payload, while the previous one decodes rather than
    on the next one's time."""

    def __init__(self, decoder: str = DECODER):
        self.decoder = decoder  # MODULE:FUNCTION, with :func:`.packets.decode`'s signature
        self._lock = threading.Lock()
        self._zygote: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._spare: socket.socket | None = None  # our end of the next child's socket

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        self._zygote = subprocess.Popen([sys.executable, "-m", zygote.__name__, str(theirs.fileno()), self.decoder],
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=zygote_environment())
        theirs.close()
        self._control = ours

    def start(self) -> None:
        """Starts the zygote and asks it for the first child, without waiting for either."""
        with self._lock:
            self._ready()

    def _ready(self) -> None:
        if self._control is None:
            self._start()
        if self._spare is None:
            self._ask()

    def _ask(self) -> None:
        """Asks the zygote for a child; its pidfd is read when the child is taken."""
        ours, theirs = socket.socketpair()
        try:
            socket.send_fds(self._control, [b"F"], [theirs.fileno()])
        finally:
            theirs.close()
        self._spare = ours

    def _take(self) -> tuple[socket.socket, int]:
        """A child's socket and pidfd; the next child is asked for at once."""
        with self._lock:
            for _ in range(3):
                try:
                    self._ready()
                    connection, self._spare = self._spare, None
                    message, fds, _, _ = socket.recv_fds(self._control, 1, 1)
                    if fds:
                        self._ask()
                        return connection, fds[0]
                    connection.close()
                    if message:  # that child had ended already
                        continue
                except OSError:
                    pass
                logger.warning("the decoder sandbox's zygote is gone; starting another")
                self.close()
            raise CodecError("this edge could not start a process to decode the payload's packets in; see its log")

    def close(self) -> None:
        for connection in (self._control, self._spare):
            if connection is not None:
                connection.close()
        self._control = self._spare = None
        if self._zygote is not None:
            self._zygote.kill()
            self._zygote.wait()
            parent = pids_cgroup()
            if parent is not None:
                remove(Tasks.of(self._zygote.pid, parent))
            self._zygote = None

    def decode(self, parameters: StreamParameters, packets: list[Packet], skip: int, count: int, max_pixels: int | None = None,
               deadline: float = DEADLINE_S) -> np.ndarray:
        """:func:`.packets.decode` in a child process, which has ``deadline`` seconds."""
        height, width = parameters.size
        if max_pixels is not None and width * height > max_pixels:  # told here: a child's refusal names no size
            raise PayloadTooLargeError(f"the packets are for frames of {width}x{height}, over this edge's limit of {max_pixels} pixels")
        dtype = np.dtype(pixel_dtype(parameters.pix_fmt))
        size = max(1, count * height * width * 3 * dtype.itemsize)
        memfd = os.memfd_create("eden-frames", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        connection, pidfd = None, None
        try:
            os.ftruncate(memfd, size)
            # Sealed: the child can write pixels but not shrink the file under this process's mapping (SIGBUS).
            fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            connection, pidfd = self._take()
            _exchange(connection, memfd, _job(parameters, packets, skip, count, max_pixels), deadline)
            view = mmap.mmap(memfd, size, mmap.MAP_SHARED, mmap.PROT_READ)
            return np.frombuffer(view, dtype, count * height * width * 3).reshape(count, height, width, 3)
        finally:
            if pidfd is not None:
                _end(pidfd)
            if connection is not None:
                connection.close()
            os.close(memfd)


def _job(parameters: StreamParameters, packets: list[Packet], skip: int, count: int, max_pixels: int | None) -> list[bytes]:
    header = {"stream": parameters.to_header(), "skip": skip, "count": count, "max_pixels": max_pixels,
              "packets": [[len(p.data), p.pts, p.dts, p.key] for p in packets]}
    text = json.dumps(header).encode()
    return [LENGTH.pack(len(text)), text, *(p.data for p in packets)]


def _exchange(connection: socket.socket, memfd: int, job: list[bytes], deadline: float) -> None:
    """Sends the job (the memfd with its first part), and raises what the child's status record
    says (nothing: decoded)."""
    until = time.monotonic() + deadline
    try:
        connection.settimeout(deadline)
        socket.send_fds(connection, job[:1], [memfd])
        for part in job[1:]:
            connection.settimeout(max(until - time.monotonic(), 0.001))
            connection.sendall(part)
        head = _read(connection, STATUS.size, until)
        kind, length = STATUS.unpack(head) if len(head) == STATUS.size else (b"", 0)
        text = _read(connection, min(length, MAX_MESSAGE), until).decode("utf-8", "replace") if kind == b"E" else ""
    except TimeoutError:
        raise TooMuchWorkError(f"decoding the payload's packets took over this edge's deadline of {deadline:g} s "
                               "(handler.decode_deadline_s); send shorter chunks") from None
    except OSError:
        kind = b""
    if kind == b"K":
        return
    if kind != b"E":
        raise CodecError(CRASHED)
    name, _, message = text.partition("\n")
    refusal, words = REFUSALS.get(name, REFUSALS[CodecError.kind])
    logger.info("the sandboxed decoder refused a payload (%s): %s", ascii(name[:40]), ascii(message[:LOGGED]))
    raise refusal(words)


def _read(connection: socket.socket, count: int, until: float) -> bytes:
    data = b""
    while len(data) < count:
        connection.settimeout(max(until - time.monotonic(), 0.001))
        got = connection.recv(count - len(data))
        if not got:
            break
        data += got
    return data


def _end(pidfd: int) -> None:
    """Kills the child (a no-op where it has exited). Its memfd holds only its own payload's frames,
    so a child that lingered could change nothing but the answer to the request that sent it."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.close(pidfd)


_sandbox = Sandbox()


def start() -> None:
    """Starts this process's sandbox: an edge worker that will decode in it, as it loads."""
    _sandbox.start()


def decode(parameters: StreamParameters, packets: list[Packet], skip: int, count: int, max_pixels: int | None = None,
           deadline: float = DEADLINE_S) -> np.ndarray:
    """:func:`.packets.decode` in this process's sandbox."""
    return _sandbox.decode(parameters, packets, skip, count, max_pixels, deadline)


def decode_chunk(chunk, max_pixels: int | None = None, deadline: float = DEADLINE_S) -> np.ndarray:
    """:func:`.packets.decode_chunk`, the packets decoded in the sandbox."""
    return decode(chunk.parameters, chunk.packets, chunk.skip, chunk.frames, max_pixels, deadline=deadline)
