"""A real headless browser and a real ``eden-serve page`` for the tests, both always stopped.

The browser is Debian's chromium (``setup.sh`` installs it), driven by Playwright with a fresh
profile and the flags that keep it off the network this machine does not have; Playwright's own
browser downloads (``playwright install``) are never used.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ADDRESS = re.compile(r"open (http://(\S+?)/\?token=(\S+))")


@contextlib.contextmanager
def chromium(viewport: tuple[int, int] = (1200, 1400)) -> Iterator:
    """A Playwright browser context of a headless chromium with a fresh profile, closed on exit."""
    with tempfile.TemporaryDirectory(prefix="eden-chromium-") as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True, accept_downloads=True,
            viewport={"width": viewport[0], "height": viewport[1]})
        try:
            yield context
        finally:
            context.close()


@dataclass
class PageServer:
    url: str  # with the token
    origin: str  # http://HOST:PORT
    token: str
    process: subprocess.Popen
    output: list[str]  # what it printed


@contextlib.contextmanager
def page_server(*options: str, startup_timeout: float = 300, env: dict[str, str] | None = None) -> Iterator[PageServer]:
    """``eden-serve page OPTIONS`` in its own process, once it prints its address; stopped on exit
    (SIGTERM, then SIGKILL). ``env`` adds to its environment (harness/faults: faults armed in it)."""
    process = subprocess.Popen([sys.executable, "-m", "eden_serve.commands.cli", "page", *options], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True, env={**os.environ, **(env or {})})
    output: list[str] = []
    found = threading.Event()

    def read():
        for line in process.stdout:
            output.append(line.rstrip("\n"))
            if ADDRESS.search(line):
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + startup_timeout
        while not found.wait(0.2):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"eden-serve page did not start: {' | '.join(output)[-2000:]}")
        url, host, token = ADDRESS.search("\n".join(output)).groups()
        yield PageServer(url, f"http://{host}", token, process, output)
    finally:
        _stop(process)
        reader.join(timeout=10)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def until(page, script: str, timeout: float = 300, every: float = 0.1):
    """The value of ``script`` in ``page`` once it is truthy (polled: the page's content security
    policy forbids the evaluated predicates of Playwright's own waits)."""
    deadline = time.monotonic() + timeout
    while True:
        value = page.evaluate(script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{script} still false after {timeout} s")
        time.sleep(every)


def drop(page, path: Path, target: str = "#drop", mime: str = "video/mp4") -> None:
    """Drop the file ``path`` on ``target``, as a person dragging it from a file manager would."""
    data = base64.b64encode(path.read_bytes()).decode()
    transfer = page.evaluate_handle(
        """([data, name, type]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], name, { type }));
            return transfer;
        }""", [data, path.name, mime])
    page.dispatch_event(target, "dragover", {"dataTransfer": transfer})
    page.dispatch_event(target, "drop", {"dataTransfer": transfer})
