"""harness/scheduling.py: a test run's processes put back under the ordinary policy."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.scheduling import OrdinaryScheduling, make_ordinary


def real_time_child() -> subprocess.Popen:
    """A child process that moves itself to SCHED_FIFO, then sleeps."""
    code = "import os, time; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)); print('ready', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if child.stdout.readline().strip() != "ready":
        child.kill()
        pytest.skip(f"cannot set SCHED_FIFO here: {child.communicate()[1].strip().splitlines()[-1:]}")
    return child


def test_a_real_time_child_is_moved_back_and_an_ordinary_one_left_alone(ordinary_scheduling):
    with ordinary_scheduling.paused():  # the run's own watcher would move the child first
        child = real_time_child()
        ordinary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            os.sched_setscheduler(ordinary.pid, os.SCHED_OTHER, os.sched_param(0))  # whatever this run was under
            assert os.sched_getscheduler(child.pid) == os.SCHED_FIFO
            assert make_ordinary([ordinary.pid, child.pid]) == [f"{child.pid}/{child.pid}"]
            assert os.sched_getscheduler(child.pid) == os.sched_getscheduler(ordinary.pid) == os.SCHED_OTHER
            assert make_ordinary([ordinary.pid, child.pid]) == []
        finally:
            for process in (child, ordinary):
                process.kill()
                process.communicate()


def test_the_watcher_finds_a_descendant_within_its_interval(ordinary_scheduling):
    with ordinary_scheduling.paused(), OrdinaryScheduling(interval=0.05) as watcher:
        child = real_time_child()
        try:
            deadline = time.monotonic() + 30
            while os.sched_getscheduler(child.pid) != os.SCHED_OTHER and time.monotonic() < deadline:
                time.sleep(0.05)
            assert os.sched_getscheduler(child.pid) == os.SCHED_OTHER
        finally:
            child.kill()
            child.communicate()
    assert f"{child.pid}/{child.pid}" in watcher.moved
