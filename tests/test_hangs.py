"""harness/hangs.py: a test run that would hang ends instead, saying where: a test stuck past its
limit, and a thread left running that is not a daemon (the run hung after its summary); threads
that end in time, and daemons, cost nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HANGS = '''
import threading
never = threading.Event()

def test_passes_but_leaves_a_thread_waiting():
    threading.Thread(target=never.wait, name="waits-for-ever").start()
'''
STUCK = '''
import threading

def test_waits_for_ever():
    threading.Event().wait()
'''
INTERRUPTED = '''
import _thread, time
import pytest

def test_a_simulated_ctrl_c_reaches_the_run():
    with pytest.raises(KeyboardInterrupt):
        _thread.interrupt_main()
        time.sleep(5)
'''
ENDS = '''
import threading, time
from concurrent.futures import ThreadPoolExecutor

POOL = ThreadPoolExecutor(2, thread_name_prefix="idle-pool")  # kept, never shut down: its workers end at exit

def test_leaves_a_thread_that_ends_soon_a_daemon_and_an_idle_pool():
    threading.Thread(target=time.sleep, args=(0.5,), name="ends-soon").start()
    threading.Thread(target=threading.Event().wait, name="a-daemon", daemon=True).start()
    POOL.submit(time.sleep, 0.1).result()
'''
BUSY_POOL = '''
import threading
from concurrent.futures import ThreadPoolExecutor

POOL = ThreadPoolExecutor(1, thread_name_prefix="busy-pool")

def test_leaves_a_pool_task_waiting():
    POOL.submit(threading.Event().wait)
'''


def run(tmp_path: Path, body: str, sigint=None) -> subprocess.CompletedProcess:
    (tmp_path / "test_it.py").write_text(body)
    env = {**os.environ, "EDEN_THREAD_GRACE_S": "2", "EDEN_TEST_HANG_S": "3", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "harness.hangs", "-p", "no:cacheprovider",
                           str(tmp_path / "test_it.py")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=None if sigint is None else lambda: signal.signal(signal.SIGINT, sigint))


def test_a_thread_left_waiting_fails_the_run_and_is_named(tmp_path):
    done = run(tmp_path, HANGS)
    assert done.returncode == int(pytest.ExitCode.TESTS_FAILED), done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "waits-for-ever" in done.stderr and "in wait" in done.stderr  # its name and where it stands


def test_threads_that_end_in_time_and_daemons_pass(tmp_path):
    done = run(tmp_path, ENDS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left running" not in done.stderr


def test_a_pool_task_left_waiting_fails_the_run(tmp_path):
    done = run(tmp_path, BUSY_POOL)
    assert done.returncode == int(pytest.ExitCode.TESTS_FAILED), done.stdout + done.stderr
    assert "busy-pool_0" in done.stderr


def test_a_test_stuck_past_its_limit_ends_the_run_with_every_stack(tmp_path):
    done = run(tmp_path, STUCK)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "test_waits_for_ever" in done.stderr and "Timeout" in done.stderr


def test_a_run_started_with_sigint_ignored_still_takes_a_simulated_ctrl_c(tmp_path):
    """As a shell without job control starts a background job (or nohup): SIGINT ignored."""
    done = run(tmp_path, INTERRUPTED, sigint=signal.SIG_IGN)
    assert done.returncode == 0, done.stdout + done.stderr
