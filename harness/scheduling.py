"""Keeps a test run, and every process it starts, under the ordinary time-sharing policy.

This machine has moved a running pytest to SCHED_FIFO part-way through a run, more than once in one
run (the kernel logs "RT throttling activated"). A process started from it then inherits the
real-time policy. Once that left a command's spinning OpenMP threads holding both cores from the thread
they waited for: the command never ended, and neither could the test's timeout, whose thread was
starved too. The likely cause was SVT-AV1, which moves the thread that opens it (as root) to
SCHED_FIFO; encoders now open through eden_serve.media.encoding.open_encoder, which puts it back.
Nothing in the project asks for a real-time policy, so any thread of the run found under one (a
library's doing) is put back under SCHED_OTHER, and the run says how often that happened. Only the
watcher itself runs real-time, so that nothing it watches can keep it from running.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

REAL_TIME = {getattr(os, name) for name in ("SCHED_FIFO", "SCHED_RR") if hasattr(os, name)}
PROC = Path("/proc")


def _children() -> dict[int, list[int]]:
    """Parent pid -> its child pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for stat in PROC.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def _descendants(root: int) -> list[int]:
    tree, found, stack = _children(), [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(tree.get(pid, ()))
    return found


def make_ordinary(pids: list[int], spare: int | None = None) -> list[str]:
    """Puts every thread of ``pids`` but ``spare`` found under a real-time policy back under
    SCHED_OTHER; what it moved, as "pid/tid"."""
    moved = []
    for pid in pids:
        for task in (PROC / str(pid) / "task").glob("[0-9]*"):
            tid = int(task.name)
            if tid == spare:
                continue
            try:
                if os.sched_getscheduler(tid) in REAL_TIME:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    moved.append(f"{pid}/{tid}")
            except OSError:
                continue  # exited meanwhile, or not ours to change
    return moved


class OrdinaryScheduling:
    """A daemon thread that, every ``interval`` seconds, puts this process's threads and those of
    all its descendants back under SCHED_OTHER where they were moved to a real-time policy. It
    runs under SCHED_FIFO at the highest priority (where it may: root), so that real-time threads
    spinning on every core cannot starve it; it sleeps between its scans of /proc."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.moved: list[str] = []
        self._stop = threading.Event()
        self._scan = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="ordinary-scheduling", daemon=True)

    def _watch(self) -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(os.sched_get_priority_max(os.SCHED_FIFO)))
        except (OSError, AttributeError):
            pass  # not root: it watches as an ordinary thread, which RT throttling still lets run
        me = threading.get_native_id()
        while not self._stop.wait(self.interval):
            with self._scan:
                self.moved += make_ordinary(_descendants(os.getpid()), spare=me)

    @contextlib.contextmanager
    def paused(self):
        """No scan meanwhile (a test of this module makes real-time processes on purpose)."""
        with self._scan:
            yield

    def __enter__(self) -> "OrdinaryScheduling":
        if hasattr(os, "sched_getscheduler") and PROC.is_dir():
            self.moved += make_ordinary(_descendants(os.getpid()))  # a run started real-time: from now on
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
