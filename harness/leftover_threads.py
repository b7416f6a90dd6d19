"""Threads a test run leaves behind. A thread that is not a daemon and never ends keeps the
interpreter from exiting after the last test: the run prints its summary, then hangs until it is
killed, and whatever the tests found is lost with it. As a pytest plugin (conftest.py names it), this
waits a while for such threads at the end of the session (``EDEN_THREAD_GRACE_S``, default 60 s),
then names each with where it stands, fails the run and ends the process."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

import pytest

GRACE_S = float(os.environ.get("EDEN_THREAD_GRACE_S", 60))  # what the threads left get to end on their own, together


def left_running(grace_s: float = GRACE_S) -> list[threading.Thread]:
    """The threads, not daemons, still running after up to ``grace_s`` seconds' wait for them."""
    deadline = time.monotonic() + grace_s
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]


def described(threads: list[threading.Thread]) -> str:
    """Each thread's name and the stack it stands in."""
    frames = sys._current_frames()
    lines = [f"{len(threads)} thread(s) that are not daemons were left running by the tests; the run could not have ended:"]
    for thread in threads:
        lines.append(f"--- {thread.name} (ident {thread.ident})")
        frame = frames.get(thread.ident)
        lines += [line.rstrip() for line in traceback.format_stack(frame)] if frame is not None else ["    (no Python frame)"]
    return "\n".join(lines)


_LEFT: list[threading.Thread] = []


def pytest_sessionfinish(session, exitstatus):
    _LEFT.extend(left_running())
    if _LEFT:
        print("\n" + described(_LEFT), file=sys.stderr, flush=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _LEFT:  # the interpreter would wait for them for ever
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(pytest.ExitCode.TESTS_FAILED))
