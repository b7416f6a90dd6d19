"""Stand-in decoders for the decoder sandbox's tests and benchmark (``eden_serve.media.sandboxed.Sandbox(decoder=...)``),
each with ``eden_serve.sandbox.decoder.decode``'s signature: one that crashes, one that hangs, one
that tries what the sandbox forbids, and ones that behave as a compromised decoder would (read the
environment, put secrets and forged log lines in their refusal and on their standard output and
error, start threads without end); and one that does nothing (what the sandbox itself costs).

A stand-in that has something to tell the test writes it into the frames it decodes into (the one
channel a child has that the worker hands on untouched): :func:`said` reads it back.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from eden_serve.errors import CodecError
from eden_serve.sandbox import kept

SECRETS = ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN")  # what a worker's environment may hold
FORGED = "[METRICS]ForgedMetric.Count:1|#Level:Host|#hostname:edge,timestamp:1"  # a line TorchServe would parse as a metric


def _say(out: np.ndarray, text: str) -> np.ndarray:
    data = np.frombuffer(text.encode()[: out.size - 1] + b"\0", np.uint8)
    out.reshape(-1)[: data.size] = data
    return out


def said(pixels: np.ndarray) -> str:
    """What a stand-in wrote into its frames."""
    return bytes(pixels.reshape(-1)).split(b"\0", 1)[0].decode()


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
    """Says each forbidden attempt and what it got."""
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
    return _say(out, " ".join(results))


def environ(parameters, packets, skip, count, max_pixels=None, out=None):
    """Says the secrets its environment holds (first: the frames may be too small for the rest)
    and the names of its variables."""
    return _say(out, json.dumps({"secrets": [os.environ[name] for name in SECRETS if name in os.environ],
                                 "names": sorted(os.environ)}))


def confide(parameters, packets, skip, count, max_pixels=None, out=None):
    """Prints forged metric lines and the secrets it holds, and refuses the payload saying them."""
    secrets = " ".join(f"{name}={os.environ.get(name)}" for name in SECRETS)
    for stream in (1, 2):
        os.write(stream, f"\n{FORGED}\n{secrets}\n".encode())
    print(FORGED, secrets, flush=True)
    print(FORGED, secrets, file=sys.stderr, flush=True)
    raise CodecError(f"refused\n{FORGED}\n{secrets}\n" + "x" * 4096)


def threads(parameters, packets, skip, count, max_pixels=None, out=None):
    """Starts threads until it cannot; says how many it started."""
    threading.stack_size(64 << 10)  # small stacks: the address space's limit is not what stops it
    stop, started = threading.Event(), 0
    try:
        while started < 10_000:
            threading.Thread(target=stop.wait, daemon=True).start()
            started += 1
    except RuntimeError:  # "can't start new thread"
        pass
    stop.set()
    return _say(out, str(started))


def misbehave(parameters, packets, skip, count, max_pixels=None, out=None):
    """The stand-in that the first packet's first bytes name (``crash``, ``hang``, ...): one
    sandbox for them all."""
    name = packets[0].data.split(b":")[0].decode()
    return globals()[name](parameters, packets, skip, count, max_pixels, out)


def hang_going_on(parameters, packets, skip, count, max_pixels=None, out=None):
    """Decodes as the sandbox's own decoder does, and hangs where a payload goes on in a kept child."""
    if packets[0].data is None:  # sent for an earlier payload (eden_serve.sandbox.kept.Continued)
        hang(parameters, packets, skip, count, max_pixels, out)
    return kept.decode(parameters, packets, skip, count, max_pixels, out)


def scribble(parameters, packets, skip, count, max_pixels=None, out=None):
    """Decodes as the sandbox's own decoder does, then behaves as a compromised decoder that stays
    (the zygote told it unmapped the frames, so it is kept) and writes over the frames it answered
    with from a thread of its own, without end."""
    frames = kept.decode(parameters, packets, skip, count, max_pixels, out)
    for name in ("__main__", "eden_serve.sandbox.zygote"):  # the zygote runs as ``python -m``
        zygote = sys.modules.get(name)
        if zygote is not None and hasattr(zygote, "_unmap"):
            zygote._unmap = lambda frames: True
    flat = out.reshape(-1)

    def write() -> None:
        while True:
            flat[:: 997] += 1
            time.sleep(0.001)

    threading.Thread(target=write, daemon=True).start()
    return frames
