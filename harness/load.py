"""Load against a real TorchServe of eden-serve (issue 32's goals), for benchmarks/hostile_load.py and
tests/test_hostile_load.py: good workflow pairs interleaved with harness/hostile's requests
(:func:`hostile_mix`), and clip runs over ``--cloud/--edge`` while the edge's and the encoder's
workers are killed under that load (:func:`kills_under_load`). Every good answer is compared with
the in-process computation of its pair; every hostile answer with its documented one.

The server holds both models and the workflow (harness/hostile's :data:`~harness.hostile.MODELS`),
so one TorchServe is the workflow, the cloud and the edge.
"""

from __future__ import annotations

import io
import os
import queue
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from eden_serve.client import Client
from eden_serve.clips.pipeline import interpolate_clip_in_process, interpolate_pair
from eden_serve.media.frames import load_frame, to_uint8
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import load_archived
from harness.rounding import rounding_difference
from eden_serve.serving.worker import default_threads, usable_cores
from harness.hostile import TIMEOUT, Hostile, PageHostile, PageTarget

SIZE = (48, 64)  # height, width of the good pairs and the clips: tiny
MODEL_NAMES = ("eden_encoder", "eden_ditdec")


@dataclass(frozen=True)
class Pair:
    """A good pair: its two PNGs, its seed, and the middle this process computes for it."""

    frame0: bytes
    frame1: bytes
    seed: int
    expected: np.ndarray


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def edge_threads() -> int:
    """The edge workers' thread count, whose results this process must equal."""
    return default_threads("edge", usable_cores())


def good_pairs(store: Path, count: int = 8) -> list[Pair]:
    """``count`` distinct pairs of :data:`SIZE` and their middles, computed in this process with the
    archives' weights and the edge workers' thread count."""
    cloud, edge = load_archived(store)
    threads = torch.get_num_threads()
    torch.set_num_threads(edge_threads())
    try:
        made = []
        for i in range(count):
            t = 0.37 * i
            f0, f1 = png(synthetic.scene(*SIZE, t)), png(synthetic.scene(*SIZE, t + 0.5))
            middle, _ = interpolate_pair(cloud, edge, load_frame(f0), load_frame(f1), seed=100 + i)
            made.append(Pair(f0, f1, 100 + i, to_uint8(middle)))
        return made
    finally:
        torch.set_num_threads(threads)


def same_frame(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal up to the rounding of the edge's batched forwards, which batch requests as they come
    (harness/rounding.py: the documented bound)."""
    return rounding_difference(got, want) is None


@dataclass
class Tally:
    """What came back, counted from several threads."""

    good: int = 0
    lost: list[str] = field(default_factory=list)  # a good pair without its middle: why
    wrong: int = 0
    hostile: int = 0
    mismatched: list[str] = field(default_factory=list)  # a hostile request not answered as documented
    by_class: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def ask_pair(self, client: Client, pair: Pair) -> None:
        try:
            got = np.asarray(client.interpolate(pair.frame0, pair.frame1, pair.seed).convert("RGB"))
        except Exception as exc:  # noqa: BLE001 - any failure is a lost pair, counted and told
            with self._lock:
                self.lost.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        with self._lock:
            self.good += 1
            self.wrong += not same_frame(got, pair.expected)

    def ask_hostile(self, server, hostile: Hostile | PageHostile, session) -> None:
        try:
            got = hostile.send(server, session)
        except Exception as exc:  # noqa: BLE001 - no answer at all is a mismatch too
            got = (type(exc).__name__, None)
        with self._lock:
            self.hostile += 1
            self.by_class[hostile.kind] = self.by_class.get(hostile.kind, 0) + 1
            if got != hostile.expected:
                self.mismatched.append(f"{hostile.kind}: {hostile.name} ({hostile.route}): {got}, documented {hostile.expected}")


def worker_pids(server) -> dict[str, list[int]]:
    return {name: server.worker_pids(name) for name in MODEL_NAMES}


def hostile_mix(server, pairs: list[Pair], count: int, hostiles: list[Hostile | PageHostile], clients: int = 8, seed: int = 0,
                page: PageTarget | None = None) -> tuple[Tally, float]:
    """``count`` good workflow pairs (cycling through ``pairs``, no retries: a pair that fails is
    lost) and ``hostiles``, shuffled together and sent by ``clients`` threads (those to the page, to
    ``page``); the tally and the seconds it took. The caller compares the workers' pids before and after."""
    import requests

    tasks: queue.Queue = queue.Queue()
    work = [("good", pairs[i % len(pairs)]) for i in range(count)] + [("hostile", h) for h in hostiles]
    random.Random(seed).shuffle(work)
    for task in work:
        tasks.put(task)
    tally = Tally()

    def client_thread():
        with Client(server.inference_url, token=server.keys["inference"], tries=1, timeout=TIMEOUT) as client, \
                requests.Session() as session:
            while True:
                try:
                    kind, task = tasks.get_nowait()
                except queue.Empty:
                    return
                if kind == "good":
                    tally.ask_pair(client, task)
                else:
                    tally.ask_hostile(page if isinstance(task, PageHostile) else server, task, session)

    started = time.perf_counter()
    threads = [threading.Thread(target=client_thread) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tally, time.perf_counter() - started


@dataclass
class Clips:
    """A clip's frames on disk and its in-process output, for the runs that must equal it."""

    src: Path
    expected: list[np.ndarray]


def clip_and_expected(store: Path, folder: Path, frames: int = 9) -> Clips:
    src = folder / "clip"
    src.mkdir(parents=True)
    for i, frame in enumerate(synthetic.clip(frames, *SIZE)):
        frame.save(src / f"frame{i:03d}.png")
    cloud, edge = load_archived(store)
    threads = torch.get_num_threads()
    torch.set_num_threads(edge_threads())
    try:
        interpolate_clip_in_process(src, folder / "expected", cloud, edge, progress=False)
    finally:
        torch.set_num_threads(threads)
    return Clips(src, frames_in(folder / "expected"))


def frames_in(directory: Path) -> list[np.ndarray]:
    return [np.asarray(Image.open(p).convert("RGB")) for p in sorted(directory.iterdir())]


@dataclass
class KillRun:
    """Clip runs and good pairs while workers were killed: what came back, and the kills made."""

    clip_runs: int = 0
    clips_failed: list[str] = field(default_factory=list)
    clips_wrong: int = 0
    clip_retries: int = 0
    pairs: Tally = field(default_factory=Tally)
    kills: list[str] = field(default_factory=list)
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_clip(self, right: bool, retries: int) -> None:
        with self._lock:
            self.clip_runs, self.clips_wrong, self.clip_retries = self.clip_runs + 1, self.clips_wrong + (not right), self.clip_retries + retries


def kills_under_load(server, clips: Clips, pairs: list[Pair], folder: Path, kills: int = 3, clients: int = 8,
                     interval: float = 8.0) -> KillRun:
    """Clip runs over the split (cloud then edge: one over HTTP, one over gRPC) and good workflow
    pairs from the other ``clients - 2`` threads, all with retries, while every ``interval`` seconds
    a worker is killed (SIGKILL), the edge's and the encoder's in turn, ``kills`` in all; each
    thread goes on until the last kill's worker is back, so every kill lands on work in flight."""
    run, done = KillRun(), threading.Event()
    token = server.keys["inference"]

    def clip_thread(transport: str):
        url = server.inference_url if transport == "http" else server.grpc_url
        n = 0
        while not done.is_set() or n == 0:
            out = folder / f"{transport}-{n}"
            n += 1
            try:
                with Client(cloud=url, edge=url, token=token, transport=transport, tries=10, backoff=0.5, timeout=60) as client:
                    summary = client.interpolate_clip(clips.src, out, chunk=4, inflight=2, progress=False)
            except Exception as exc:  # noqa: BLE001 - a run that ended is the failure counted
                run.clips_failed.append(f"{transport}: {type(exc).__name__}: {exc}"[:300])
                continue
            got = frames_in(out)
            run.add_clip(len(got) == len(clips.expected) and all(same_frame(a, b) for a, b in zip(got, clips.expected)), summary.retries)

    def pair_thread(seed: int):
        with Client(server.inference_url, token=token, tries=10, backoff=0.5, timeout=60) as client:
            i = seed
            while not done.is_set():
                run.pairs.ask_pair(client, pairs[i % len(pairs)])
                i += 1

    threads = [threading.Thread(target=clip_thread, args=(t,)) for t in ("http", "grpc")]
    threads += [threading.Thread(target=pair_thread, args=(i,)) for i in range(max(clients - 2, 0))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    try:
        for k in range(kills):
            time.sleep(interval)
            name = MODEL_NAMES[1 - k % 2]  # the edge first
            pid = server.worker_pids(name)[0]
            os.kill(pid, signal.SIGKILL)
            run.kills.append(f"{name} {pid}")
            wait_replaced(server, name, pid)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    run.seconds = time.perf_counter() - started
    return run


def wait_replaced(server, name: str, pid: int, timeout: float = 180) -> None:
    """Until ``name`` has a ready worker other than ``pid``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if server.ready(name) and pid not in server.worker_pids(name):
                return
        except Exception:  # noqa: BLE001 - the management API may be busy while the worker restarts
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}'s worker {pid} was not replaced in {timeout:g} s")
        time.sleep(0.5)
