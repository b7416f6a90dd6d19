"""A command stopped by a signal while its clip is being written, as a terminal's Ctrl-C or a
supervisor's SIGTERM stops it; or signalled again and again from a later moment (its output
there), until it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def partial_output(names: list[str]) -> bool:
    return any(name.startswith(".out.partial") for name in names)


def signalled(argv: list[str], folder: Path, sig: int, when: Callable[[list[str]], bool] = partial_output,
              every: float | None = None, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``eden-serve argv`` run until ``when`` holds for the names in ``folder`` (by default: its
    partial output has appeared), then sent ``sig``, and sent it again every ``every`` seconds
    until it ends where ``every`` is given: its exit code and standard error. SIGINT is delivered
    as a terminal's Ctrl-C delivers it (a shell's background job would ignore it). ``env``: added
    to the command's environment (a fault armed for it, harness/faults' ``clip-hold``, so that the
    moment comes before the run ends however fast the machine computes)."""
    run = subprocess.Popen([sys.executable, "-m", "eden_serve.commands.cli", *map(str, argv)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while run.poll() is None and not when(os.listdir(folder)):
            time.sleep(0.01)
        assert run.poll() is None, "the command ended before the moment to signal it came"
        run.send_signal(sig)
        while every is not None and run.poll() is None:
            time.sleep(every)
            if run.poll() is None:  # not yet waited for: its pid is still its own
                run.send_signal(sig)
        _, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    return run.returncode, stderr
