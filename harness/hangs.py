"""A test run that would hang ends instead, saying where. As a pytest plugin (conftest.py names it):

- **A test stuck** past ``EDEN_TEST_HANG_S`` (default 900 s; the slowest test takes about a
  minute on 2 cores) has every thread's stack written to the run's own stderr, and the run exits 1
  at once (faulthandler's watchdog, which needs neither the interpreter nor a free thread).
- **A thread left running** that is not a daemon keeps the interpreter from exiting after the last
  test: the run would print its summary, then wait until it is killed, and whatever the tests found
  would be lost with it. Such threads get ``EDEN_THREAD_GRACE_S`` (default 60 s) to end, together;
  then each is named with where it stands, the run fails and the process ends.

- **Ctrl-C as the tests simulate it** (``_thread.interrupt_main``) reaches the run even where the
  run was started with SIGINT ignored (in the background by a shell without job control, or under
  nohup): Python keeps an ignored SIGINT, and a simulated one then does nothing, so a test that
  stops a run waited out the client's timeouts (10 minutes and more) instead.

Neither limit is on how fast anything runs: only on waiting for ever."""

from __future__ import annotations

import concurrent.futures.thread
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback

import pytest

HANG_S = float(os.environ.get("EDEN_TEST_HANG_S", 900))
GRACE_S = float(os.environ.get("EDEN_THREAD_GRACE_S", 60))

_STDERR: list = []  # the run's own stderr, duplicated before pytest captures file descriptor 2
_LEFT: list[threading.Thread] = []


def left_running(grace_s: float = GRACE_S) -> list[threading.Thread]:
    """The threads, not daemons, still running after up to ``grace_s`` seconds' wait for them, less
    the idle workers of thread pools: the interpreter's exit tells those to end, and they do."""
    deadline = time.monotonic() + grace_s
    for thread in _holding():
        thread.join(max(0.0, deadline - time.monotonic()))
    return _holding()


def _holding() -> list[threading.Thread]:
    frames = sys._current_frames()
    return [thread for thread in threading.enumerate()
            if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
            and not _idle_pool_worker(frames.get(thread.ident))]


def _idle_pool_worker(frame) -> bool:
    """Whether a thread stands in a thread pool's loop, waiting for work (not inside a task)."""
    return frame is not None and frame.f_code is concurrent.futures.thread._worker.__code__


def described(threads: list[threading.Thread]) -> str:
    """Each thread's name and the stack it stands in."""
    frames = sys._current_frames()
    lines = [f"{len(threads)} thread(s) that are not daemons were left running by the tests; the run could not have ended:"]
    for thread in threads:
        lines.append(f"--- {thread.name} (ident {thread.ident})")
        frame = frames.get(thread.ident)
        lines += [line.rstrip() for line in traceback.format_stack(frame)] if frame is not None else ["    (no Python frame)"]
    return "\n".join(lines)


def pytest_configure(config):
    _STDERR.append(os.fdopen(os.dup(sys.__stderr__.fileno()), "w"))
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=_STDERR[0])  # the stack names the test's file and function
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


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
    for stderr in _STDERR:
        stderr.close()
