"""The sandbox's zygote (``python -m eden_serve.sandbox.zygote FD DECODER``), started by an edge
worker (:class:`eden_serve.media.sandboxed.Sandbox`, through :class:`Started`, the worker's hold on
it), and the child it forks for a payload, which the worker may keep for the next payloads of the
same stream.

The zygote imports PyAV, Pillow and the decoder once (:func:`.decoder.warm_up`), and no PyTorch,
so a fork copies a small process. The child, before it reads a byte of the packets, puts
``/dev/null`` on its standard input, output and error (nothing it writes reaches the worker's log,
which TorchServe parses), closes every other file but its socket and takes its limits and filter
(:mod:`.confine`); it decodes into the memfd that came with its job, unmaps it and answers one
status record, then waits for its next job (:func:`_child`).

Worker to child (trusted), per job: ``u32`` length with the job's memfd, a JSON header (the
stream's parameters, skip, count, max_pixels, each packet's length, pts, dts and key flag, and
``had``: how many of the packets this child was sent for an earlier payload), then the bytes of the
packets from the ``had``-th on. Child to worker:
``kind`` (1 byte: ``K`` decoded, ``E`` refused), ``u32`` length, then for ``E`` the error's type
and message (UTF-8, type and message split by a newline), at most :data:`MAX_MESSAGE` bytes. The
worker answers its client by the type alone, and logs a bounded, escaped line of the message.
"""

from __future__ import annotations

import base64
import gc
import importlib
import json
import logging
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
from types import SimpleNamespace

import numpy as np

from ..errors import CodecError, EdenError
from .confine import Tasks, confine, pids_cgroup, remove, seccomp_filter
from .decoder import pixel_dtype, warm_up

logger = logging.getLogger(__name__)
LENGTH = struct.Struct(">I")
STATUS = struct.Struct(">cI")
MAX_MESSAGE = 1024
DECODER = "eden_serve.sandbox.kept:decode"
IDLE_S = 60.0  # the longest a child waits for its next job


def _child(connection: socket.socket, decoder, rules) -> None:
    """Decodes each job into the memfd that comes with it, confined before it reads a byte of the
    packets, and answers its status; ends when the worker closes the socket, or sends no job for
    :data:`IDLE_S` (a kept child's worker lets it go sooner, :mod:`eden_serve.media.sandboxed`)."""
    confined = False
    while True:
        try:
            length, fds, _, _ = socket.recv_fds(connection, LENGTH.size, 1)
        except OSError:  # idle too long
            return
        if len(length) != LENGTH.size or len(fds) != 1:
            return
        frames = mmap.mmap(fds[0], os.fstat(fds[0]).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fds[0])
        if not confined:  # the first job's frames: the worker sends a kept child none larger
            connection.settimeout(IDLE_S)  # before the filter, which forbids the fcntl it takes
            confine(connection.fileno(), len(frames), rules)
            confined = True
        status = _decode(connection, decoder, frames, LENGTH.unpack(length)[0])
        unmapped = _unmap(frames)
        if status is not None:
            connection.sendall(status)
        if status is None or not unmapped:
            return


def _unmap(frames: mmap.mmap) -> bool:
    """Unmaps a job's frames before its answer: the worker then seals them against writing, which
    it can only while no process maps them writable. False where a reference to them is left (an
    error's traceback): the child then ends after its answer, which unmaps them."""
    try:
        frames.close()
    except BufferError:
        return False
    return True


def _decode(connection: socket.socket, decoder, frames: mmap.mmap, size: int) -> bytes | None:
    """One job's status record (None: no status, the worker answers a malformed payload)."""
    try:
        header = json.loads(_read_exactly(connection, size))
        # The wire's own classes live beside PyTorch; the decoder takes any object with their attributes.
        stream = header["stream"]
        parameters = SimpleNamespace(**{**stream, "extradata": base64.b64decode(stream["extradata"])})
        # The packets sent for an earlier payload come without their data (kept.Continued).
        packets = [SimpleNamespace(data=None if i < header["had"] else _read_exactly(connection, length), pts=pts, dts=dts, key=key)
                   for i, (length, pts, dts, key) in enumerate(header["packets"])]
        out = np.frombuffer(frames, pixel_dtype(parameters.pix_fmt)).reshape(header["count"], parameters.height, parameters.width, 3)
        try:
            decoder(parameters, packets, header["skip"], header["count"], header["max_pixels"], out)
        finally:
            del out
        return STATUS.pack(b"K", 0)
    except EdenError as exc:
        text = f"{exc.kind}\n{exc}".encode()[:MAX_MESSAGE]
        return STATUS.pack(b"E", len(text)) + text
    except Exception:  # noqa: BLE001 - no status: the worker answers a malformed payload
        return None


def _read_exactly(connection: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        got = connection.recv(count - len(data))
        if not got:
            raise CodecError("the edge sent a job cut short")
        data += got
    return bytes(data)


class Started:
    """A zygote as the worker that started it holds it: the process, the socket it is asked for
    children on (``control``), and our end of the next child's socket (``spare``, once :meth:`ask`
    asked for one), until :meth:`stop`."""

    def __init__(self, decoder: str, environment: dict[str, str]):
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno()), decoder],
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=environment)
        theirs.close()
        self.control: socket.socket | None = ours
        self.spare: socket.socket | None = None

    def ask(self) -> None:
        """Asks the zygote for a child; its pidfd is read when the child is taken."""
        ours, theirs = socket.socketpair()
        try:
            socket.send_fds(self.control, [b"F"], [theirs.fileno()])
        finally:
            theirs.close()
        self.spare = ours

    def stop(self) -> None:
        """Closes our sockets, kills the zygote and waits for it (a Popen never waited for warns
        that it is still running, and leaves a zombie), and removes its children's groups."""
        if self.control is None:
            return
        for connection in (self.control, self.spare):
            if connection is not None:
                connection.close()
        self.control = self.spare = None
        self.process.kill()
        self.process.wait()
        parent = pids_cgroup()
        if parent is not None:
            remove(Tasks.of(self.process.pid, parent))


def zygote(control: socket.socket, decoder: str) -> None:
    """Forks a child for each socket that arrives on ``control`` (a passed file), and answers each
    with the child's pidfd; ends when the worker closes ``control``."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    warm_up()
    module, _, name = decoder.partition(":")
    decode_into = getattr(importlib.import_module(module), name)
    # No collection in a child: it would touch every object, copying the zygote's whole heap page by page.
    gc.freeze()
    gc.disable()
    rules = seccomp_filter()  # built once: each child only loads it
    if rules is None:
        logger.warning("the decoder sandbox has no seccomp filter (pyseccomp or libseccomp is missing): limits only")
    tasks = Tasks()
    try:
        _fork_children(control, decode_into, rules, tasks)
    finally:
        tasks.close()


def _fork_children(control: socket.socket, decode_into, rules, tasks: Tasks) -> None:
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            return
        if not message or len(fds) != 1:
            return
        group = tasks.make()
        pid = os.fork()
        if pid == 0:
            control.close()
            try:
                for standard in (0, 1, 2):
                    os.dup2(devnull, standard)
                _child(socket.socket(fileno=fds[0]), decode_into, rules)
            finally:
                os._exit(0)
        os.close(fds[0])
        tasks.place(group, pid)
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            control.sendall(b"P")
            continue
        socket.send_fds(control, [b"P"], [pidfd])
        os.close(pidfd)

if __name__ == "__main__":
    zygote(socket.socket(fileno=int(sys.argv[1])), sys.argv[2])
