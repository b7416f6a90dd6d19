"""Stand-in decoders for the decoder sandbox's tests and benchmark (``eden_serve.media.sandboxed.Sandbox(decoder=...)``),
each with ``eden_serve.sandbox.decoder.decode``'s signature: one that crashes, one that hangs, one
that tries what the sandbox forbids and reports what each attempt got, and one that does nothing
(what the sandbox itself costs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from eden_serve.errors import CodecError


def idle(parameters, packets, skip, count, max_pixels=None, out=None):
    return out


def crash(parameters, packets, skip, count, max_pixels=None, out=None):
    os.kill(os.getpid(), signal.SIGSEGV)


def hang(parameters, packets, skip, count, max_pixels=None, out=None):
    while True:
        time.sleep(1)


def spin(parameters, packets, skip, count, max_pixels=None, out=None):
    while True:
        pass


def allocate(parameters, packets, skip, count, max_pixels=None, out=None):
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))


def attempts(parameters, packets, skip, count, max_pixels=None, out=None):
    """Raises a refusal whose message lists each forbidden attempt and what it got."""
    tries = {
        "open": lambda: open("/etc/hostname", "rb").read(),
        "socket": lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),
        "unix": lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM),
        "exec": lambda: subprocess.run(["/bin/true"], check=True),
        "fork": lambda: os._exit(0) if os.fork() == 0 else None,
        "kill": lambda: os.kill(os.getppid(), 0),
        "write": lambda: open("/tmp/eden-sandbox-escape", "wb"),
    }
    results = []
    for name, attempt in tries.items():
        try:
            attempt()
            results.append(f"{name}=allowed")
        except OSError as exc:
            results.append(f"{name}={exc.errno}")
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            results.append(f"{name}={type(exc).__name__}")
    raise CodecError(" ".join(results))


def misbehave(parameters, packets, skip, count, max_pixels=None, out=None):
    """The stand-in that the first packet's first bytes name (``crash``, ``hang``, ...): one
    sandbox for them all."""
    name = packets[0].data.split(b":")[0].decode()
    return globals()[name](parameters, packets, skip, count, max_pixels, out)
