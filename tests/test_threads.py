"""A clip's reading and writing on threads of their own (eden_serve/media/threads.py): order kept,
a bounded number of items ahead, errors handed over where they would have been raised, and threads
that stop when asked."""

import threading
import time
from fractions import Fraction

import pytest

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.errors import BadInputError, PairError
from eden_serve.media.base import ClipWriter
from eden_serve.media.threads import Prefetch, ThreadedWriter


def test_prefetch_keeps_the_order_and_reads_a_bounded_way_ahead():
    made = []

    def items():
        for i in range(50):
            made.append(i)
            yield i

    reader = Prefetch(items, depth=4)
    got = []
    for item in reader:
        got.append(item)
        time.sleep(0.002)
        assert len(made) - len(got) <= 4 + 1  # the queue, and one in the producer's hands
    assert got == list(range(50))


def test_prefetch_hands_an_error_over_after_the_items_before_it():
    def items():
        yield from range(3)
        raise BadInputError("frame 3 is not timed after frame 2")

    got = []
    with pytest.raises(BadInputError, match="frame 3"):
        for item in Prefetch(items, depth=2):
            got.append(item)
    assert got == [0, 1, 2]


def test_prefetch_stops_its_thread_when_asked():
    endless = Prefetch(lambda: iter(int, 1), depth=2, name="eden-test-read")  # never ends by itself
    next(iter(endless))
    endless.stop()
    assert "eden-test-read" not in {thread.name for thread in threading.enumerate()}


class Recorder(ClipWriter):
    continues = True

    def __init__(self, fail_at: int | None = None):
        self.calls, self.fail_at, self.closed = [], fail_at, False
        self.thread = None

    def add(self, frame):
        self.thread = threading.current_thread().name
        if frame == self.fail_at:
            raise BadInputError(f"cannot write frame {frame}")
        time.sleep(0.001)
        self.calls.append(("add", frame))

    def add_middle(self, middle, before, after, position=None):
        self.calls.append(("middle", middle))

    def checkpoint(self):
        return {"count": len(self.calls)}

    def finish(self):
        self.calls.append(("finish",))

    def close(self):
        self.closed = True


def test_the_writer_writes_in_order_on_its_thread_and_checkpoints_after_what_came_before():
    recorder = Recorder()
    writer = ThreadedWriter(recorder, depth=3)
    for i in range(10):
        writer.add(i)
        writer.add_middle(f"m{i}", i, i + 1)
    assert writer.checkpoint() == {"count": 20}  # waited for the 20 calls queued before it
    writer.finish()
    writer.close()
    assert recorder.calls == [c for i in range(10) for c in (("add", i), ("middle", f"m{i}"))] + [("finish",)]
    assert recorder.thread == "eden-write" and recorder.closed and writer.continues


def test_a_writers_error_is_raised_by_the_next_call_and_stops_the_writing():
    recorder = Recorder(fail_at=3)
    writer = ThreadedWriter(recorder)
    with pytest.raises(BadInputError, match="cannot write frame 3"):
        for i in range(100):
            writer.add(i)
            time.sleep(0.001)
    with pytest.raises(BadInputError, match="cannot write frame 3"):
        writer.finish()
    writer.close()
    assert [c[1] for c in recorder.calls] == [0, 1, 2] and recorder.closed


def test_closed_unfinished_the_writer_drops_what_is_queued():
    """An error or Ctrl-C elsewhere: the output will not appear, so what is queued is not encoded.
    The first frame is being written, held until close() has been called."""
    recorder, started, closing = Recorder(), threading.Event(), threading.Event()
    writer = ThreadedWriter(recorder, depth=100)
    queued = writer._queue.put

    def put(item, *args, **kwargs):
        queued(item, *args, **kwargs)
        if item is None:  # close() has asked the thread to stop
            closing.set()

    writer._queue.put = put
    recorder.add = lambda frame: (started.set(), closing.wait(), recorder.calls.append(("add", frame)))
    for i in range(100):
        writer.add(i)
    assert started.wait(30)
    writer.close()
    assert recorder.closed and recorder.calls == [("add", 0)]


def test_a_video_run_that_fails_midway_leaves_no_output_and_no_thread(tmp_path):
    """A chunk failing mid-clip stops the run as before (its pairs named, no output): the reading
    and the writing threads are stopped and joined on the way out, before the files close."""
    pytest.importorskip("av")
    from test_video import average, real_video

    src = real_video(tmp_path / "in.mp4", 12, Fraction(25), audio=None)

    def failing(index, frame0, frame1, seed):
        if index == 6:
            raise BadInputError("the stand-in model fails on pair 6")
        return average(index, frame0, frame1, seed)

    with pytest.raises(PairError, match="pair 6"):
        interpolate_clip(src, tmp_path / "out.mp4", pairwise(failing), chunk=1, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mp4"]
    assert not {"eden-read", "eden-write"} & {thread.name for thread in threading.enumerate()}
