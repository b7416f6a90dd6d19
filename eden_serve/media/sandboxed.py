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
import math
import mmap
import os
import select
import signal
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CodecError, DigestMismatchError, PayloadTooLargeError, TooMuchWorkError
from ..sandbox.confine import CPU_SECONDS, cpu_seconds
from ..sandbox.decoder import first_shown, pixel_dtype
from ..sandbox.kept import Kept, Turns, last_shown, mark, stream_key
from ..sandbox.zygote import DECODER, LENGTH, MAX_MESSAGE, STATUS, Started
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
KEPT_CHILDREN = 4  # children kept for their streams' next chunks, the least recently used ended
KEPT_IDLE_S = 30.0  # a kept child waiting longer for its stream's next chunk is ended
KEEP_CPU_S = CPU_SECONDS / 2  # a child that spent more is not kept: every job has at least the rest
WAIT_S = 30.0  # the longest a request waits for another on the same stream before decoding on its own
LOGGED = 160  # characters of a child's message the log gets, escaped on one line
# The zygote's environment beyond where Python finds the package and its libraries: one thread for
# each numeric library, so that every fork copies a process holding no other thread's locks.
ENVIRONMENT = {"PATH": os.defpath, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def zygote_environment() -> dict[str, str]:
    """The zygote's whole environment: :data:`ENVIRONMENT` and the worker's ``PYTHONPATH`` and
    ``LD_LIBRARY_PATH``, nothing else of the worker's (its cloud keys, hub tokens, ...)."""
    return {**ENVIRONMENT, **{name: os.environ[name] for name in ("PYTHONPATH", "LD_LIBRARY_PATH") if os.environ.get(name)}}


class Child:
    """A child as the worker holds it: its socket, its pidfd, and the most frames' bytes it may map
    (its first job's, by which its address space's limit was set)."""

    def __init__(self, connection: socket.socket, pidfd: int, budget: int):
        self.connection, self.pidfd, self.budget = connection, pidfd, budget
        self.pid = next(int(line.split()[1]) for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines()
                        if line.startswith("Pid:"))
        self.ended = False

    def cpu_seconds(self) -> float:
        """The CPU time its threads took, as the kernel counts it (not as the child says)."""
        try:
            return cpu_seconds(self.pid)
        except OSError:
            return math.inf

    def end(self) -> None:
        """Kills it (a no-op where it has exited) and waits until it is gone, a second at most: its
        mappings with it."""
        if self.ended:
            return
        self.ended = True
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        select.select([self.pidfd], [], [], 1.0)  # readable once it has exited
        os.close(self.pidfd)
        self.connection.close()


@dataclass(frozen=True)
class Job:
    """One payload's decoding, and the time by which it must be done."""

    parameters: StreamParameters
    packets: list[Packet]
    skip: int
    count: int
    max_pixels: int | None
    deadline: float
    until: float

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.count, *self.parameters.size, 3

    @property
    def frame_bytes(self) -> int:
        return max(1, math.prod(self.shape) * np.dtype(pixel_dtype(self.parameters.pix_fmt)).itemsize)


class Sandbox:
    """The zygote of one worker, started by :meth:`start` (or at the first payload) and again after
    it died, and the child forked for the next payload, while the previous one decodes rather than
    on the next one's time; and the children kept, ``keep`` at most, each for the next chunk of the
    stream it decoded (:mod:`eden_serve.sandbox.kept`)."""

    def __init__(self, decoder: str = DECODER, keep: int = KEPT_CHILDREN):
        self.decoder = decoder  # MODULE:FUNCTION, with :func:`.packets.decode`'s signature
        self.keep = keep
        self.kept = Turns(keep, WAIT_S, KEPT_IDLE_S, end=lambda kept: kept.decoder.end())
        # Where this sandbox is let go of unclosed, or at the interpreter's exit (the process's own
        # is never closed), its kept children end, and its zygote stops (_ready): else the zygote
        # is never waited for, and their sockets are left to the collector.
        weakref.finalize(self, _here_only(self.kept.close))
        self._lock = threading.Lock()
        self._zygote: Started | None = None
        self._stopped: weakref.finalize | None = None  # the zygote's stop, run once
        self._live: set[Child] = set()  # every child taken and not yet ended
        self.children = 0  # children taken from the zygote
        self.continued = 0  # payloads that went on in a kept child
        self.sent = 0  # packets sent to children

    def start(self) -> None:
        """Starts the zygote and asks it for the first child, without waiting for either."""
        with self._lock:
            self._ready()

    def _ready(self) -> Started:
        if self._zygote is None:
            self._zygote = Started(self.decoder, zygote_environment())
            self._stopped = weakref.finalize(self, _here_only(self._zygote.stop))
        if self._zygote.spare is None:
            self._zygote.ask()
        return self._zygote

    def _take(self, budget: int) -> Child:
        """A child, which may map ``budget`` bytes of frames; the next child is asked for at once."""
        with self._lock:
            for _ in range(3):
                try:
                    zygote = self._ready()
                    connection, zygote.spare = zygote.spare, None
                    message, fds, _, _ = socket.recv_fds(zygote.control, 1, 1)
                    if fds:
                        zygote.ask()
                        child = Child(connection, fds[0], budget)
                        self._live = {c for c in self._live if not c.ended} | {child}
                        self.children += 1
                        return child
                    connection.close()
                    if message:  # that child had ended already
                        continue
                except OSError:
                    pass
                logger.warning("the decoder sandbox's zygote is gone; starting another")
                self._stop()
            raise CodecError("this edge could not start a process to decode the payload's packets in; see its log")

    def close(self) -> None:
        """Ends the children kept, those decoding and the zygote: none outlives this."""
        self.kept.close()
        with self._lock:
            live, self._live = self._live, set()
        for child in live:
            child.end()
        self._stop()

    def _stop(self) -> None:
        if self._zygote is not None:
            self._stopped()
            self._zygote = None

    def decode(self, parameters: StreamParameters, packets: list[Packet], skip: int, count: int, max_pixels: int | None = None,
               deadline: float = DEADLINE_S) -> np.ndarray:
        """:func:`.packets.decode` in a child process, which has ``deadline`` seconds: a child kept
        from the stream's chunk before where it can go on, else a new one."""
        height, width = parameters.size
        if max_pixels is not None and width * height > max_pixels:  # told here: a child's refusal names no size
            raise PayloadTooLargeError(f"the packets are for frames of {width}x{height}, over this edge's limit of {max_pixels} pixels")
        job = Job(parameters, packets, skip, count, max_pixels, deadline, time.monotonic() + deadline)
        first = first_shown(packets, skip) if self.keep else None
        if first is None:  # the frames are then counted, not named by time: nothing to go on from
            child = self._take(job.frame_bytes)
            try:
                return self._run(child, job, 0)
            finally:
                child.end()
        marks = [mark(p) for p in packets]
        key = stream_key(parameters, marks)
        turn, kept = self.kept.take(key, first)
        after = None
        try:
            pixels, after = self._go_on(kept, job, marks, first)
        finally:
            if turn:
                self.kept.give(key, after)
            elif after is not None:
                after.decoder.end()
        return pixels

    def _go_on(self, kept: Kept | None, job: Job, marks: list[bytes], first: int) -> tuple[np.ndarray, Kept | None]:
        """The frames, from ``kept``'s child where it can go on to them, else from a new child, and
        the child to keep for the stream's next chunk (None: none)."""
        if kept is not None and kept.continues(marks, first) and job.frame_bytes <= kept.decoder.budget:
            try:
                pixels = self._run(kept.decoder, job, len(kept.marks))
                self.continued += 1
                return pixels, self._keeping(kept.decoder, job, marks, first)
            except BaseException as exc:
                kept.decoder.end()
                if type(exc) is not CodecError:  # past the deadline, over a limit: as from the key frame
                    raise
            # A child that could not go on (a stream unlike what it was told, or a child gone wrong):
            # the payload decodes from its key frame, within the deadline left.
        elif kept is not None:
            kept.decoder.end()
        child = self._take(job.frame_bytes)
        try:
            return self._run(child, job, 0), self._keeping(child, job, marks, first)
        except BaseException:
            child.end()
            raise

    def _keeping(self, child: Child, job: Job, marks: list[bytes], first: int) -> Kept | None:
        """``child`` kept for the stream's next chunk, unless it spent half its CPU time's limit (so
        that every job on a kept child has at least half of it), or ended."""
        since = last_shown(job.packets, first, job.count)
        if child.ended or since is None or child.cpu_seconds() > KEEP_CPU_S:
            child.end()
            return None
        return Kept(child, marks, since)

    def _run(self, child: Child, job: Job, had: int) -> np.ndarray:
        """``job`` decoded in ``child``, which was sent the first ``had`` packets for an earlier payload;
        a child past the deadline is ended."""
        memfd = os.memfd_create("eden-frames", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(memfd, job.frame_bytes)
            # The child can write pixels but not shrink the file under this process's mapping (SIGBUS).
            fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            try:
                _exchange(child.connection, memfd, _parts(job, had), job)
            except BaseException:
                child.end()
                raise
            self.sent += len(job.packets) - had
            _seal(memfd, child)
            view = mmap.mmap(memfd, job.frame_bytes, mmap.MAP_SHARED, mmap.PROT_READ)
            return np.frombuffer(view, pixel_dtype(job.parameters.pix_fmt), math.prod(job.shape)).reshape(job.shape)
        finally:
            os.close(memfd)


def _seal(memfd: int, child: Child) -> None:
    """Seals the frames against writing before they are read, so that no child, kept or not, can
    change a pixel after they were checked. The kernel seals only while no process maps them
    writable: a child that still does (it unmaps them before it answers) is ended first."""
    seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
    try:
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, seals)
    except OSError:
        child.end()
        try:
            fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, seals)
        except OSError:
            raise CodecError(CRASHED) from None


def _parts(job: Job, had: int) -> list[bytes]:
    header = {"stream": job.parameters.to_header(), "skip": job.skip, "count": job.count, "max_pixels": job.max_pixels,
              "had": had, "packets": [[len(p.data), p.pts, p.dts, p.key] for p in job.packets]}
    text = json.dumps(header).encode()
    return [LENGTH.pack(len(text)), text, *(p.data for p in job.packets[had:])]


def _exchange(connection: socket.socket, memfd: int, parts: list[bytes], job: Job) -> None:
    """Sends the job (the memfd with its first part), and raises what the child's status record
    says (nothing: decoded)."""
    until = job.until
    try:
        connection.settimeout(max(until - time.monotonic(), 0.001))
        socket.send_fds(connection, parts[:1], [memfd])
        for part in parts[1:]:
            connection.settimeout(max(until - time.monotonic(), 0.001))
            connection.sendall(part)
        head = _read(connection, STATUS.size, until)
        kind, length = STATUS.unpack(head) if len(head) == STATUS.size else (b"", 0)
        text = _read(connection, min(length, MAX_MESSAGE), until).decode("utf-8", "replace") if kind == b"E" else ""
    except TimeoutError:
        raise TooMuchWorkError(f"decoding the payload's packets took over this edge's deadline of {job.deadline:g} s "
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


def _here_only(end):
    """``end`` as a finalizer of this process's: a fork of it runs the finalizers it inherited as it
    exits, and would end this process's children and zygote."""
    process = os.getpid()
    return lambda: end() if os.getpid() == process else None


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
