"""A command stopped by a signal while its clip is being written, as a terminal's Ctrl-C or a
supervisor's SIGTERM stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def signalled(argv: list[str], folder: Path, sig: int) -> tuple[int, str]:
    """``eden-serve argv`` run until its partial output appears in ``folder``, then sent ``sig``: its
    exit code and standard error. SIGINT is delivered as a terminal's Ctrl-C delivers it (a shell's
    background job would ignore it)."""
    run = subprocess.Popen([sys.executable, "-m", "eden_serve.commands.cli", *map(str, argv)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while run.poll() is None and not any(name.startswith(".out.partial") for name in os.listdir(folder)):
            time.sleep(0.01)
        assert run.poll() is None, "the command ended before its partial output appeared"
        run.send_signal(sig)
        _, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    return run.returncode, stderr
