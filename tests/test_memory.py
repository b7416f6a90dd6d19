"""Memory over a long run (benchmarks/soak.py measures it): what a run is done with is freed by
reference counting alone, so that it does not wait for a full collection of the cyclic collector,
which in a process of torch's size comes only after many chunks (a streamed chunk's middles were
kept that way: a cycle between its arrivals and its future)."""

import gc
import threading
import weakref
from concurrent.futures import Future

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import FunctionProcessor
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.clips.workers import Arrivals

SIZE = (32, 24)  # width, height


@pytest.fixture
def no_cyclic_collector():
    """Only reference counting frees, as between the collector's rare full collections."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_finished_chunks_arrivals_and_result_are_freed_without_the_cyclic_collector(no_cyclic_collector):
    arrivals = Arrivals(2)
    future: Future = Future()
    arrivals.watch(future)
    middle = Image.new("RGB", SIZE)
    arrivals(0, middle)
    future.set_result([middle])
    assert arrivals.wait(0) is middle  # the callback still wakes a waiter
    gone = weakref.ref(middle), weakref.ref(arrivals), weakref.ref(future)
    del arrivals, future, middle
    assert [ref() for ref in gone] == [None, None, None]


def test_a_long_streamed_run_holds_only_the_middles_of_its_chunks_in_flight(tmp_path, no_cyclic_collector):
    """120 pairs in chunks of 2, 4 in flight, each middle streamed then returned: while it runs, the
    middles alive stay within a few chunks' (they grew with the pairs, to all 120), and none
    outlives the run."""
    src = tmp_path / "in"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(121):
        Image.fromarray(rng.integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8)).save(src / f"frame{i:03d}.png")
    made_so_far: list[weakref.ref] = []  # images are not hashable: no WeakSet
    most, lock = [0], threading.Lock()

    def alive() -> int:
        return sum(ref() is not None for ref in made_so_far)

    def process(index, frames, seed, arrived):
        made = [Image.new("RGB", SIZE, (j, j, j)) for j in range(len(frames) - 1)]
        with lock:
            most[0] = max(most[0], alive())
            made_so_far.extend(weakref.ref(image) for image in made)
        for j, image in enumerate(made):
            arrived(j, image)
        return made

    summary = interpolate_clip(src, tmp_path / "out", FunctionProcessor(process, streams=True), chunk=2, inflight=4,
                               progress=False)
    assert summary.pairs == 120
    assert most[0] <= 24, f"{most[0]} middles alive at once"  # 4 in flight and a few waiting to be written: 12 chunks' at most
    assert alive() == 0
