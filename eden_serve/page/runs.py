"""The page's runs: each one clip through the functions the commands call
(:func:`~eden_serve.commands.shared.clip_in_process`, :func:`~eden_serve.commands.shared.clip_through`), one at a
time on one thread, so runs of several pages queue instead of sharing the device.

A run watches its processor (:func:`eden_serve.clips.streaming.interpolate_clip`'s ``watch``): the pairs
done, the latest middle (the live preview: tone-mapped for an HDR clip, as the clips' previews are,
:mod:`eden_serve.page.media`), each chunk's bytes by wire codec, the scene cuts (a
middle that is its earlier frame, copied by the cloud's decision), and, from the timeline events
(:data:`eden_serve.clips.streaming.TIMELINE`), each chunk's time at the cloud, on the wire and at the edge.
Cancelling (the page closed) stops it at the next chunk boundary and leaves no output. At most
:data:`RUNS_KEPT` finished runs are kept, with their results: the oldest go first, those of closed
pages before those of open ones.
"""

from __future__ import annotations

import io
import logging
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image

from ..clips.processors import Processor, Wrapper
from ..clips.resize import resized
from ..clips.streaming import TIMELINE, Summary
from ..commands.shared import PROG, failure
from ..media.colour import Colour, tone_mapped
from ..media.frames import Picture, as_image, picture_size, widened

MAX_CHUNKS_SHOWN = 400  # the newest chunks' timelines a page is sent
PREVIEW_WIDTH = 480  # pixels, at most, of the live preview
PREVIEW_EVERY = 0.2  # seconds between two previews made
RUNS_KEPT = 16  # finished runs kept, each with its folder (its result and the result's preview)
FINISHED = ("done", "failed", "cancelled")


class Cancelled(Exception):
    """The run was cancelled: its page was closed, or it asked so. Not an EdenError, so the clip
    engine passes it through unchanged and removes the partial output."""


class _Relay:
    """A streaming processor's ``arrived``, passed on after the run has seen the middle."""

    def __init__(self, arrived, run: "Run", frames: list):
        self.arrived, self.run, self.frames = arrived, run, frames
        self.order = getattr(arrived, "order", None)
        self.seen = 0

    def __call__(self, j: int, image: Image.Image) -> None:
        self.seen += 1
        self.run.middle(self.frames, j, image, streamed=True)
        self.arrived(j, image)


class _Watched(Wrapper):
    """A processor whose middles ``run`` counts and shows (:meth:`Run.watch`)."""

    def __init__(self, inner: Processor, run: "Run"):
        super().__init__(inner)
        self.run = run

    def __call__(self, index, frames, seed, arrived=None):
        self.run.check()
        relay = None if arrived is None else _Relay(arrived, self.run, frames)
        result = self.inner(index, frames, seed, relay)
        self.run.check()
        self.run.chunk_done(frames, result, relay.seen if relay else 0)
        return result


class Run:
    """One clip through the page: its state, what it has done so far, and how to stop it."""

    def __init__(self, key: str, args, source: str | Path, output: Path, total: int | None, title: str = "",
                 colour: Colour = Colour()):
        self.key, self.args, self.source, self.output, self.total = key, args, source, output, total
        self.title = title  # the download's name
        self.colour = colour  # the clip's: an HDR clip's previews are tone-mapped
        self.state = "queued"
        self.page_open = True  # its page's connection: a finished run of a closed page goes first
        self.cancel = threading.Event()
        self.lock = threading.Lock()
        self.pairs = 0
        self.started = self.finished = self.first_middle = None
        self.preview, self.previews, self.previewed = None, 0, 0.0
        self.cuts: set[int] = set()
        self.chunks: list[dict] = []
        self.codecs: dict[str, dict] = {}
        self.summary = self.reason = ""
        self.events: dict[tuple, dict] = {}

    def check(self) -> None:
        if self.cancel.is_set():
            raise Cancelled("cancelled")

    def watch(self, processor: Processor) -> Processor:
        """``processor`` as the run sees it: the same middles, counted and shown as they come."""
        return _Watched(processor, self)

    def middle(self, frames: list, j: int, picture: Picture, streamed: bool = False) -> None:
        """Middle ``j`` of a chunk of ``frames``: counted (``streamed``: as it arrived), a scene cut
        where the pair is two originals and the middle is the earlier one, the live preview where
        the last is old enough."""
        image, before = as_image(picture), frames[j].image
        cut = (_original(frames[j]) and _original(frames[j + 1]) and image.size == before.size
               and np.array_equal(np.asarray(image.convert("RGB")), np.asarray(before.convert("RGB"))))
        now = time.time()
        with self.lock:
            self.first_middle = self.first_middle or now
            if streamed:
                self.pairs += 1
            if cut:
                self.cuts.add(frames[j].index)
            make_preview = now - self.previewed >= PREVIEW_EVERY
            if make_preview:
                self.previewed = now
        if make_preview:
            preview = _png(picture, self.colour)
            with self.lock:
                self.preview, self.previews = preview, self.previews + 1

    def chunk_done(self, frames: list, result, streamed: int) -> None:
        images = list(getattr(result, "images", result))
        for j, image in enumerate(images[streamed:], start=streamed):
            self.middle(frames, j, image)
        with self.lock:
            self.pairs += len(images) - streamed
            codec = getattr(result, "codec", None) or ("the server's" if self.args.cloud or self.args.server else "none")
            moved = self.codecs.setdefault(codec, {"pairs": 0, "sent": 0, "received": 0, "payload": 0})
            moved["pairs"] += len(images)
            moved["sent"] += getattr(result, "sent_bytes", 0)
            moved["received"] += getattr(result, "received_bytes", 0)
            moved["payload"] += getattr(result, "payload_bytes", None) or 0

    def event(self, first: int, pairs: int, name: str, at: float) -> None:
        """A timeline event of the chunk of ``pairs`` pairs from pair ``first``, at ``at`` (epoch s)."""
        with self.lock:
            times = self.events.setdefault((first, pairs), {})
            times.setdefault(name, at)
            if name != "done":
                return
            del self.events[(first, pairs)]
            self.chunks.append(_stages(first, pairs, times, self.started))
            del self.chunks[:-MAX_CHUNKS_SHOWN]

    def begin(self) -> None:
        with self.lock:
            self.state, self.started = "running", time.time()

    def end(self, state: str, summary: Summary | None = None, reason: str = "") -> None:
        with self.lock:
            self.state, self.finished, self.reason = state, time.time(), reason
            self.summary = str(summary) if summary is not None else ""

    def snapshot(self, position: int = 0) -> dict:
        with self.lock:
            now = self.finished or time.time()
            elapsed = now - self.started if self.started else 0.0
            rate = self.pairs / elapsed if elapsed > 0 else 0.0
            left = (self.total - self.pairs) / rate if rate > 0 and self.total is not None else None
            return {
                "id": self.key, "state": self.state, "position": position, "pairs": self.pairs, "total": self.total,
                "rate": rate, "elapsed": elapsed, "left": left, "started": self.started, "finished": self.finished,
                "first_middle": self.first_middle - self.started if self.first_middle and self.started else None,
                "previews": self.previews, "cuts": sorted(self.cuts), "chunks": list(self.chunks),
                "codecs": {name: dict(moved) for name, moved in self.codecs.items()},
                "summary": self.summary, "reason": self.reason,
            }


def _original(frame) -> bool:
    """Whether a chunk's frame is one of the clip's: those carry where they came from (a file, a
    time, a duration, a source), a middle handed on to the next level is its image alone
    (clips/levels.py, clips/retimed.py)."""
    return any(value is not None for value in (frame.path, frame.time, frame.duration, frame.source))


def _stages(first: int, pairs: int, times: dict, started: float | None) -> dict:
    """A chunk's seconds at each stage, from its timeline events (docs/page.md says which)."""

    def between(a: str, b: str) -> float | None:
        return times[b] - times[a] if a in times and b in times else None

    at = times["cloud asked"] - started if "cloud asked" in times and started else None
    return {"first": first, "pairs": pairs, "at": at,
            "cloud": between("cloud asked", "encoded") if "encoded" in times else between("cloud asked", "payload in"),
            "wire": between("encoded", "payload in"), "edge": between("edge asked", "done")}


def _png(picture: Picture, colour: Colour) -> bytes:
    """The live preview of a middle: at most :data:`PREVIEW_WIDTH` wide, tone-mapped where the clip is HDR."""
    width, height = picture_size(picture)
    size = (PREVIEW_WIDTH, max(1, round(height * PREVIEW_WIDTH / width))) if width > PREVIEW_WIDTH else None
    if colour.hdr:  # scaled at its depth, then tone-mapped
        pixels = picture if isinstance(picture, torch.Tensor) else torch.from_numpy(np.array(picture.convert("RGB")))
        pixels = resized(widened(pixels, 16), size, Image.Resampling.BICUBIC) if size else pixels
        image = Image.fromarray(tone_mapped(pixels.numpy(), colour))
    else:
        image = as_image(picture)
        image = image.resize(size) if size else image
    out = io.BytesIO()
    image.convert("RGB").save(out, "PNG", compress_level=1)
    return out.getvalue()


class _Timeline(logging.Handler):
    """The timeline events of the run in progress (one at a time: the runner's)."""

    def __init__(self, run: Run):
        super().__init__(logging.DEBUG)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.args, tuple) and len(record.args) == 3:
            first, pairs, name = record.args
            self.run.event(first, pairs, str(name), record.created)


class Runner:
    """Runs one at a time, in the order they were submitted, with ``execute(run) -> Summary``."""

    def __init__(self, execute: Callable[[Run], Summary]):
        self.execute = execute
        self.waiting: list[Run] = []
        self.runs: dict[str, Run] = {}
        self.lock = threading.Lock()
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="eden-page-runs", daemon=True)
        self.thread.start()

    def submit(self, run: Run) -> None:
        with self.lock:
            self.runs[run.key] = run
            self.waiting.append(run)
        self.queue.put(run)

    def position(self, run: Run) -> int:
        """How many runs go before ``run`` (0: it runs, or has run)."""
        with self.lock:
            return self.waiting.index(run) + 1 if run in self.waiting else 0

    def stop(self) -> None:
        """Cancel every run and wait for the one in progress to stop."""
        for run in list(self.runs.values()):
            run.cancel.set()
        self.queue.put(None)
        self.thread.join()

    def _loop(self) -> None:
        while (run := self.queue.get()) is not None:
            with self.lock:
                self.waiting.remove(run)
            if run.cancel.is_set():
                run.end("cancelled")
            else:
                self._run(run)
            self.prune()

    def prune(self) -> None:
        """The finished runs past :data:`RUNS_KEPT` forgotten and their folders removed: the oldest
        first, those of closed pages before those of open ones."""
        with self.lock:
            finished = sorted((run for run in self.runs.values() if run.state in FINISHED),
                              key=lambda run: (run.page_open, run.finished or 0))
            gone = finished[:max(0, len(finished) - RUNS_KEPT)]
            for run in gone:
                del self.runs[run.key]
        for run in gone:
            shutil.rmtree(run.output.parent, ignore_errors=True)

    def _run(self, run: Run) -> None:
        handler = _Timeline(run)
        TIMELINE.addHandler(handler)
        TIMELINE.setLevel(logging.DEBUG)
        run.begin()
        try:
            run.end("done", self.execute(run))
        except Cancelled:
            run.end("cancelled")
        except Exception as exc:  # a failure the command would print: the same line
            run.end("cancelled" if run.cancel.is_set() else "failed", reason=f"{PROG}: {failure(exc)}")
        finally:
            TIMELINE.removeHandler(handler)
            TIMELINE.setLevel(logging.NOTSET)
