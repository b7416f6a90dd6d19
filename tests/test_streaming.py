"""The streaming engine: order, a bounded window, failures named by pair, retries."""

import random
import socket
import threading
import time
from concurrent.futures import Future
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from eden_serve.client import Client
from eden_serve.client.transports import Retry
from eden_serve.clips.dispatch import Chunking
from eden_serve.clips.levels import Item, Level
from eden_serve.clips.processors import FunctionProcessor, Middles, pairwise
from eden_serve.clips.retimed import retime
from eden_serve.clips.schedule import Schedule
from eden_serve.clips.streaming import Summary, interpolate_clip
from eden_serve.errors import (
    BadInputError,
    PairError,
    ServerError,
    TransientError,
    UnavailableError,
)
from eden_serve.media.base import Frame
from eden_serve.media.timing import Retiming

SIZE = (96, 64)


def frame_dir(path, count, seed=0):
    """``count`` random RGB frames named frame0.png ... in ``path``."""
    rng = np.random.default_rng(seed)
    path.mkdir()
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8)).save(path / f"frame{i}.png")
    return path


def solid(value):
    return Image.new("RGB", SIZE, (value, value, value))


def middles(out_dir):
    return [np.asarray(Image.open(p))[0, 0, 0] for p in sorted(out_dir.iterdir())[1::2]]


def test_output_is_in_order_when_pairs_finish_out_of_order(tmp_path):
    src = frame_dir(tmp_path / "in", 16)
    seeds = {}
    rng = random.Random(0)
    delays = [rng.uniform(0, 0.05) for _ in range(15)]

    def process(index, frame0, frame1, seed):
        time.sleep(delays[index])
        seeds[index] = seed
        return solid(index * 10)

    summary = interpolate_clip(src, tmp_path / "out", pairwise(process), seed=100, inflight=5, progress=False)
    assert (summary.pairs, summary.frames) == (15, 31)
    assert middles(tmp_path / "out") == [i * 10 for i in range(15)]
    assert seeds == {i: 100 + i for i in range(15)}
    originals = sorted((tmp_path / "out").iterdir())[0::2]
    assert [p.read_bytes() for p in originals] == [(src / f"frame{i}.png").read_bytes() for i in range(16)]


@pytest.mark.parametrize("inflight", [1, 3])
def test_the_window_bounds_pairs_in_flight_and_frames_held(tmp_path, live_frames, inflight):
    src = frame_dir(tmp_path / "in", 30)
    live = live_frames
    lock = threading.Lock()
    state = {"running": 0, "most_running": 0, "most_frames": 0}

    def process(index, frame0, frame1, seed):
        with lock:
            state["running"] += 1
            state["most_running"] = max(state["most_running"], state["running"])
            state["most_frames"] = max(state["most_frames"], len(live))
        time.sleep(0.01)
        with lock:
            state["running"] -= 1
        return solid(index)

    interpolate_clip(src, tmp_path / "out", pairwise(process), inflight=inflight, progress=False)
    assert state["most_running"] == inflight  # the window fills (pairs overlap) ...
    assert state["most_frames"] <= inflight + 2  # ... and the clip is never read ahead of it


def test_a_failing_pair_stops_the_run_and_is_named(tmp_path):
    src = frame_dir(tmp_path / "in", 8)

    def process(index, frame0, frame1, seed):
        if index == 3:
            raise BadInputError("frames differ in size")
        return solid(index)

    with pytest.raises(PairError, match=r"^pair 3 \(frame3\.png → frame4\.png\): frames differ in size$") as info:
        interpolate_clip(src, tmp_path / "out", pairwise(process), progress=False)
    assert info.value.index == 3 and info.value.status == 400
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["in"]


def test_a_bug_in_the_processor_propagates_unchanged(tmp_path):
    src = frame_dir(tmp_path / "in", 4)

    def process(index, frame0, frame1, seed):
        raise ZeroDivisionError("bug")

    with pytest.raises(ZeroDivisionError):
        interpolate_clip(src, tmp_path / "out", pairwise(process), progress=False)


def test_an_interrupt_cancels_and_leaves_no_output(tmp_path):
    src = frame_dir(tmp_path / "in", 12)
    cancel = threading.Event()
    started = []

    def process(index, frame0, frame1, seed):
        started.append(index)
        if index == 2:
            raise KeyboardInterrupt
        time.sleep(0.02)
        return solid(index)

    with pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, tmp_path / "out", pairwise(process), inflight=2, progress=False, cancel=cancel)
    assert cancel.is_set()
    assert max(started) <= 4  # pairs beyond the window were never started
    assert [p.name for p in tmp_path.iterdir()] == ["in"]


class Flaky:
    """An operation that fails ``failures`` times with ``error``, then returns "ok"."""

    def __init__(self, failures, error):
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_retry_retries_transient_errors_with_backoff():
    operation = Flaky(3, TransientError("HTTP 503"))
    started = time.perf_counter()
    assert Retry(tries=4, backoff=0.01).call(operation) == "ok"
    assert operation.calls == 4
    assert time.perf_counter() - started >= 0.01 + 0.02 + 0.04


def test_retry_gives_up_after_its_tries():
    operation = Flaky(10, TransientError("HTTP 503 Service Unavailable"))
    with pytest.raises(UnavailableError, match=r"HTTP 503 Service Unavailable \(gave up after 3 tries\)"):
        Retry(tries=3, backoff=0).call(operation)
    assert operation.calls == 3


def test_retry_does_not_retry_a_refusal():
    operation = Flaky(1, ServerError(400, "bad_input", "not an image"))
    with pytest.raises(ServerError):
        Retry(tries=5, backoff=10).call(operation)
    assert operation.calls == 1


def test_retry_stops_waiting_when_cancelled():
    cancel = threading.Event()
    threading.Timer(0.05, cancel.set).start()
    started = time.perf_counter()
    with pytest.raises(UnavailableError, match="cancelled"):
        Retry(tries=5, backoff=30).call(Flaky(10, TransientError("down")), cancel)
    assert time.perf_counter() - started < 5


def test_transient_errors_in_a_run_are_retried(tmp_path):
    src = frame_dir(tmp_path / "in", 5)
    retry = Retry(tries=3, backoff=0.001)
    attempts = {}

    def process(index, frame0, frame1, seed):
        def attempt():
            attempts[index] = attempts.get(index, 0) + 1
            if attempts[index] < 3:
                raise TransientError("worker restarting")
            return solid(index)

        return retry.call(attempt)

    summary = interpolate_clip(src, tmp_path / "out", pairwise(process), progress=False)
    assert summary.pairs == 4 and attempts == {i: 3 for i in range(4)}
    assert middles(tmp_path / "out") == [0, 1, 2, 3]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_is_down_stops_the_run_after_the_retries(tmp_path):
    src = frame_dir(tmp_path / "in", 4)
    client = Client(f"http://127.0.0.1:{closed_port()}", tries=3, backoff=0.01)
    with pytest.raises(PairError, match=r"^pairs 0-2 \(frame0\.png → frame3\.png\): connection refused \(http://.*\) \(gave up after 3 tries\)$"):
        client.interpolate_clip(src, tmp_path / "out", ramp=False, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["in"]


def test_summary_line():
    summary = Summary(10, 21, 4.0, sent_bytes=2_000_000, received_bytes=500_000, payload_bytes=300_000, retries=3)
    assert str(summary) == (
        "10 pairs, 21 frames written in 4.00 s: 2.50 pairs/s; per pair: 200.0 kB sent, 50.0 kB received, 30.0 kB wire payload; "
        "3 requests retried"
    )
    assert str(Summary(pairs=0, frames=1, seconds=0.0)) == "0 pairs, 1 frames written in 0.00 s: 0.00 pairs/s"


def test_progress_bar_shows_pairs_per_second(tmp_path, capsys):
    src = frame_dir(tmp_path / "in", 3)
    interpolate_clip(src, tmp_path / "out", pairwise(lambda i, a, b, s: Middles([solid(i)], payload_bytes=10)), progress=True)
    assert "pair/s" in capsys.readouterr().err


def chunks_of(src, tmp_path, name, **options) -> list[tuple[int, int]]:
    """(first pair, pairs) of every chunk a run hands its processor."""
    calls = []

    def process(index, frames, seed):
        calls.append((index, len(frames) - 1))
        return [solid(index + j) for j in range(len(frames) - 1)]

    interpolate_clip(src, tmp_path / name, process, progress=False, **options)
    return sorted(calls)


def test_ramped_chunks_grow_to_k_and_then_end_where_unramped_ones_do(tmp_path):
    src = frame_dir(tmp_path / "in", 40)
    ramped = chunks_of(src, tmp_path, "ramped", chunk=8, ramp=True)
    fixed = chunks_of(src, tmp_path, "fixed", chunk=8)
    assert ramped == [(0, 1), (1, 1), (2, 2), (4, 4), (8, 8), (16, 8), (24, 8), (32, 7)]
    assert fixed == [(0, 8), (8, 8), (16, 8), (24, 8), (32, 7)]
    assert middles(tmp_path / "ramped") == middles(tmp_path / "fixed") == list(range(39))


def test_ramping_costs_a_few_frames_per_clip(tmp_path):
    """Each chunk sends its K + 1 frames; on a long clip the ramp adds 3 (K = 8), under 5%."""
    src = frame_dir(tmp_path / "in", 241)
    sent = {ramp: sum(pairs + 1 for _, pairs in chunks_of(src, tmp_path, f"out{ramp}", chunk=8, ramp=ramp))
            for ramp in (False, True)}
    assert sent == {False: 270, True: 273}
    assert sent[True] / sent[False] < 1.05


def test_a_ramp_shorter_than_the_chunk_and_a_chunk_of_one(tmp_path):
    src = frame_dir(tmp_path / "in", 14)
    assert chunks_of(src, tmp_path, "six", chunk=6, ramp=True) == [(0, 1), (1, 1), (2, 2), (4, 2), (6, 6), (12, 1)]
    assert chunks_of(src, tmp_path, "one", chunk=1, ramp=True) == [(i, 1) for i in range(13)]


def streaming(process):
    return FunctionProcessor(process, streams=True)


def test_streamed_middles_are_written_as_they_arrive_in_order(tmp_path):
    """Middle 0 of a chunk of 4 is on disk while the processor still holds the other three."""
    src = frame_dir(tmp_path / "in", 5)
    seen_on_disk = []

    @streaming
    def process(index, frames, seed, arrived):
        arrived(0, solid(0))
        arrived(2, solid(2))  # ahead of 1: held back until 1 is written
        deadline = time.monotonic() + 30
        written = []
        while time.monotonic() < deadline and len(written) < 2:
            written = sorted(p.name for p in tmp_path.glob(".out.partial-*/*"))
            time.sleep(0.01)
        seen_on_disk.append(len(written))
        time.sleep(0.2)  # had middle 2 been written before 1, a third file would be there by now
        seen_on_disk.append(len(list(tmp_path.glob(".out.partial-*/*"))))
        return [solid(j) for j in range(4)]

    summary = interpolate_clip(src, tmp_path / "out", process, chunk=4, progress=False)
    assert seen_on_disk == [2, 2]  # original 0 and middle 0
    assert (summary.pairs, summary.frames) == (4, 9)
    assert middles(tmp_path / "out") == [0, 1, 2, 3]


def test_a_middle_handed_over_twice_is_written_once(tmp_path):
    src = frame_dir(tmp_path / "in", 4)

    @streaming
    def process(index, frames, seed, arrived):
        arrived(0, solid(10 + index))
        arrived(0, solid(99))  # a retried request sending it again: the first stands
        return [solid(10 + index + j) for j in range(len(frames) - 1)]

    summary = interpolate_clip(src, tmp_path / "out", process, chunk=3, progress=False)
    assert (summary.pairs, summary.frames) == (3, 7)
    assert middles(tmp_path / "out") == [10, 11, 12]


def test_a_stream_that_fails_after_some_middles_leaves_no_output(tmp_path):
    src = frame_dir(tmp_path / "in", 4)

    @streaming
    def process(index, frames, seed, arrived):
        arrived(0, solid(0))
        raise ServerError(400, "bad_input", "refused after one middle")

    with pytest.raises(PairError, match=r"^pairs 0-2 .*refused after one middle"):
        interpolate_clip(src, tmp_path / "out", process, chunk=3, progress=False)
    assert list(tmp_path.iterdir()) == [tmp_path / "in"]


def test_a_streaming_processor_learns_each_chunks_order_on_the_main_thread_before_it_runs(tmp_path):
    """Ramped chunks of 1, 1, 2 and 4 pairs are numbered 0 to 3 as submitted; ``queued`` hears each
    number on the main thread before the chunk's worker calls the processor with it."""
    src = frame_dir(tmp_path / "in", 9)
    queued, calls = [], []

    @streaming
    def process(index, frames, seed, arrived):
        calls.append((index, arrived.order, arrived.order in [order for order, _ in queued]))
        return [solid(j) for j in range(len(frames) - 1)]

    process.queued = lambda order: queued.append((order, threading.current_thread() is threading.main_thread()))
    interpolate_clip(src, tmp_path / "out", process, chunk=8, ramp=True, progress=False)
    assert queued == [(0, True), (1, True), (2, True), (3, True)]
    assert sorted(calls) == [(0, 0, True), (1, 1, True), (2, 2, True), (4, 3, True)]


class Recorded:
    """The declared chunks (``submit``, ``collect``) in this thread, and no more: each chunk's
    middles are grey, its submissions recorded."""

    def __init__(self):
        self.submitted = []

    def submit(self, depth, index, frames):
        self.submitted.append((depth, index, len(frames) - 1))
        future = Future()
        future.set_result([Image.new("RGB", frames[0].size[::-1], (128, 128, 128))] * (len(frames) - 1))
        return future

    def collect(self, future, index, frames):
        yield from future.result()


class Written:
    """An output stream as a list: a level's sink, a retimed run's placer."""

    def __init__(self):
        self.positions, self.closed = [], False

    def push(self, item):
        self.positions.append(item.position)

    def place(self, picture, before, after, position):
        self.positions.append(before.index + position)

    def close(self):
        self.closed = True


def grey_frames(count):
    return [Frame(i, f"f{i}", image=Image.new("RGB", SIZE, (i, i, i))) for i in range(count)]


def test_a_level_asks_only_its_declared_chunking_and_chunks():
    """A level driven without a run: ramped chunks of 1, 1, 2 pairs, then the rest, and the stream
    of a 2x pass, each original followed by its middle."""
    chunks, out = Recorded(), Written()
    level = Level(1, 0, out, Chunking(chunk=2, ramp=True, inflight=1), chunks)
    for frame in grey_frames(6):
        level.push(Item(frame))
    level.close()
    assert chunks.submitted == [(1, 0, 1), (1, 1, 1), (1, 2, 2), (1, 4, 1)]
    assert out.closed and out.positions == [0, Fraction(1, 2)] * 5 + [0]


def test_a_retimed_output_asks_only_its_declared_chunking_chunks_and_placer():
    """Factor 3 without a run: every output frame placed at its time, k / 3, each showing a middle
    computed through the chunks (at most two pairs each)."""
    chunks, out = Recorded(), Written()
    read = retime(grey_frames(4), Schedule(Retiming(Fraction(3))), Chunking(chunk=2, ramp=False, inflight=2), chunks, out)
    assert read == 4 and out.positions == [Fraction(k, 3) for k in range(3 * 3 + 1)]
    assert chunks.submitted and all(depth >= 1 and pairs <= 2 for depth, _, pairs in chunks.submitted)



def test_each_run_takes_its_own_processor_through_the_wrappers_around_it(tmp_path):
    """A processor that keeps a run's state between its calls is given to each run as one of its
    own (Processor.for_run), from inside a wrapper the caller put around it too; the processor
    given is left as it was. One that keeps none is itself."""
    from eden_serve.clips.processors import Processor, Wrapper

    class OfOneRun(Processor):
        def __init__(self, made):
            self.made, self.seen = made, []

        def for_run(self, cancel):
            self.made.append(OfOneRun(self.made))
            return self.made[-1]

        def __call__(self, index, frames, seed, arrived=None):
            self.seen.append(index)
            return [solid(index + j) for j in range(len(frames) - 1)]

    class Passing(Wrapper):
        def __call__(self, index, frames, seed, arrived=None):
            return self.inner(index, frames, seed, arrived)

    src, made = frame_dir(tmp_path / "in", 5), []
    shared = Passing(OfOneRun(made))
    for name in ("a", "b"):
        interpolate_clip(src, tmp_path / name, shared, inflight=1, progress=False)
    assert shared.inner.seen == [] and [run.seen for run in made] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    stateless = Passing(FunctionProcessor(lambda index, frames, seed: []))
    assert stateless.for_run(threading.Event()) is stateless
