"""The edge's requests opened ahead of the compute (eden_serve/serving/overlap.py), and the hand-over
from the preparation's stream to the computing one (eden_serve/edge/streams.py), with a stand-in for
the CUDA stream and event API."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from eden_serve import wire
from eden_serve.edge.sizing import batches
from eden_serve.edge.streams import CudaStreams, HostStreams, SideStream
from eden_serve.errors import CodecError
from eden_serve.model import synthetic
from eden_serve.serving.overlap import GPU_PREPARE_THREADS, Forwards, Preparation, device_tensors, earliest_first, header_seeds
from eden_serve.serving.refusals import Refusal
from eden_serve.wire import keyed
from harness.cuda_streams import FakeStreams


def slow_open(failing: set[int], opened_on: list[str]):
    def open_(idx: int, job: str) -> str:
        opened_on.append(threading.current_thread().name)
        time.sleep(0.01 * (idx % 3))  # opens finish out of step with the order asked
        if idx in failing:
            raise CodecError(f"payload {idx} is corrupt")
        return job.upper()

    return open_


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_requests_come_in_the_order_asked_and_a_failing_one_alone_is_refused(ahead):
    jobs = ["a", "b", Refusal(400, {"type": "bad_input"}), "d", "e"]
    opened_on: list[str] = []
    preparation = Preparation(HostStreams(), ahead)
    try:
        got = list(preparation.opened(slow_open({3}, opened_on), jobs, [4, 2, 3, 0, 1]))
    finally:
        preparation.close()
    assert [idx for idx, _ in got] == [4, 2, 3, 0, 1]
    outcomes = dict(got)
    assert (outcomes[4], outcomes[0], outcomes[1]) == ("E", "A", "B")
    assert outcomes[2] is jobs[2]  # refused before: passed on, not opened
    assert isinstance(outcomes[3], Refusal) and (outcomes[3].status, outcomes[3].document["type"]) == (400, "bad_payload")
    assert len(opened_on) == 4
    assert all(name.startswith("eden-prepare") for name in opened_on) if ahead else all(name == threading.current_thread().name for name in opened_on)


def test_the_next_request_is_opened_while_the_caller_computes():
    """The caller holds request 0 until request 1's opening has begun: only a preparation that runs
    beside the caller gets there."""
    started = {idx: threading.Event() for idx in range(3)}

    def open_(idx, job):
        started[idx].set()
        return job

    preparation = Preparation(HostStreams(), ahead=1)
    seen = []
    try:
        for idx, _ in preparation.opened(open_, ["a", "b", "c"], [0, 1, 2]):
            if idx + 1 in started:
                seen.append(started[idx + 1].wait(timeout=30))
    finally:
        preparation.close()
    assert seen == [True, True]


@pytest.mark.parametrize("threads", [1, 4])
def test_requests_opened_on_several_threads_come_in_the_order_asked(threads):
    jobs = ["a", "b", Refusal(400, {"type": "bad_input"}), "d", "e"]
    opened_on: list[str] = []
    preparation = Preparation(HostStreams(), ahead=3, threads=threads)
    try:
        got = list(preparation.opened(slow_open({3}, opened_on), jobs, [4, 2, 3, 0, 1]))
    finally:
        preparation.close()
    assert [idx for idx, _ in got] == [4, 2, 3, 0, 1]
    assert [got[k][1] for k in (0, 3, 4)] == ["E", "A", "B"] and isinstance(got[2][1], Refusal)


def test_a_gpus_preparation_opens_a_calls_requests_at_once():
    """Each opening waits until all four have begun: only four threads side by side get there (on a
    GPU opening a request is host work that lets go of the GIL, which the forwards wait for)."""
    started = threading.Barrier(4, timeout=30)

    def open_(idx, job):
        started.wait()
        return job

    preparation = Preparation(HostStreams(), ahead=GPU_PREPARE_THREADS - 1, threads=GPU_PREPARE_THREADS)
    try:
        got = list(preparation.opened(open_, list("abcd"), [0, 1, 2, 3]))
    finally:
        preparation.close()
    assert got == list(enumerate("abcd"))


def test_a_cpus_preparation_opens_the_next_request_alone():
    preparation = Preparation.for_device(torch.device("cpu"))
    try:
        assert (preparation.ahead, preparation.thread._max_workers) == (1, 1)
    finally:
        preparation.close()


def test_at_most_ahead_requests_are_opened_before_the_caller_takes_them():
    opened = []
    preparation = Preparation(HostStreams(), ahead=1)
    try:
        iterator = preparation.opened(lambda idx, job: opened.append(idx) or job, list("abcd"), [0, 1, 2, 3])
        next(iterator)
        # Behind every opening asked so far on the one preparing thread (a sleep was a guess that a
        # loaded machine could miss): what it opened by then is all it was asked.
        preparation.thread.submit(lambda: None).result()
        assert opened == [0, 1]
        iterator.close()
    finally:
        preparation.close()


class RecordingStreams:
    """A stand-in for CUDA streams and events: it records each call with the stream it names."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.local = threading.local()
        self.made = self.records = 0

    def stream(self, role):
        self.made += 1
        return f"{role}{self.made}"

    def current(self):
        return getattr(self.local, "stream", "compute")

    def using(self, stream):
        api = self

        class Using:
            def __enter__(self):
                api.local.stream = stream
                api.calls.append(("using", stream))

            def __exit__(self, *exc):
                api.local.stream = "compute"

        return Using()

    def record(self, stream):
        self.records += 1
        event = f"event{self.records}"
        self.calls.append(("record", stream, event))
        return event

    def wait(self, stream, event):
        self.calls.append(("wait", stream, event))

    def keep(self, tensor, stream):
        self.calls.append(("keep", stream, tensor.shape))


def test_a_preparation_runs_on_its_stream_and_the_compute_waits_for_its_event(tiny_models):
    cloud, _ = tiny_models
    chunk = cloud.encode_chunk([torch.rand(3, 64, 96, generator=torch.Generator().manual_seed(i)) for i in range(3)])
    api = RecordingStreams()

    def open_(idx, job):
        api.calls.append(("open", idx, api.current()))
        return chunk if job == "chunk" else "not a chunk"

    preparation = Preparation(api, ahead=1)
    try:
        got = list(preparation.opened(open_, ["chunk", "other"], [0, 1]))
    finally:
        preparation.close()
    assert [outcome is chunk for _, outcome in got] == [True, False]
    tensors = device_tensors(chunk)
    assert len(tensors) == 2  # the DiT's and the decoder's tokens, fp32 codec: no scales
    preparing = [call for call in api.calls if call[0] in ("using", "open", "record")]
    assert preparing == [("using", "prepare1"), ("open", 0, "prepare1"), ("record", "prepare1", "event1"),
                         ("using", "prepare1"), ("open", 1, "prepare1"), ("record", "prepare1", "event2")]
    # The compute stream waits for each preparation's own event, and keeps the chunk's tensors.
    computing = [call for call in api.calls if call[0] in ("wait", "keep")]
    assert computing == [("wait", "compute", "event1"), *(("keep", "compute", t.shape) for t in tensors), ("wait", "compute", "event2")]


def test_side_stream_take_waits_then_keeps():
    api = RecordingStreams()
    side = SideStream(api)
    with side.making():
        ticket = side.hand_over()
    side.take(ticket, [torch.zeros(2), torch.zeros(3)])
    assert api.calls == [("using", "prepare1"), ("record", "prepare1", "event1"), ("wait", "compute", "event1"),
                         ("keep", "compute", torch.Size([2])), ("keep", "compute", torch.Size([3]))]


def test_every_preparation_of_a_device_runs_on_its_one_preparation_stream(monkeypatch):
    """The preparation's stream is made once per device for the process, not per preparation (a
    worker's streams would come round again from the pool), and is not the graphs' stream."""
    fake = FakeStreams(monkeypatch)
    sides = [Preparation(CudaStreams(torch.device("cuda:0")), ahead=0).side for _ in range(3)]
    assert all(side.stream is sides[0].stream for side in sides) and len(fake.made) == 1
    assert sides[0].stream.priority == 0


class Budget:
    """A stand-in for EdgeModel's sizing: ``per_forward`` pairs per forward."""

    def __init__(self, per_forward: int):
        self.per_forward = per_forward

    def pairs(self, grid):
        return self.per_forward

    def batches(self, items, grid):
        return batches(items, 1, self.per_forward)


class Sized:
    def __init__(self, grid, size):
        self.grid, self.size = grid, size


def test_a_forward_is_handed_out_as_soon_as_it_is_full_the_rest_at_the_end():
    forwards = Forwards(Budget(3))
    small, large = Sized((4, 6), (64, 96)), Sized((6, 8), (96, 128))
    assert forwards.add(small, [(0, 0), (0, 1)]) == []
    assert forwards.add(large, [(1, 0)]) == []
    assert forwards.add(small, [(2, 0), (2, 1), (2, 2), (2, 3), (2, 4)]) == [[(0, 0), (0, 1), (2, 0)], [(2, 1), (2, 2), (2, 3)]]
    assert list(forwards.rest()) == [[(2, 4)], [(1, 0)]]


def test_the_seeds_a_payload_states_order_its_request(tiny_models):
    cloud, _ = tiny_models
    frames = [torch.rand(3, 64, 96, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    payload = wire.encode(cloud.encode_chunk(frames, seed=41), cloud.config, "fp32")
    assert header_seeds(payload).seeds == [41, 42]
    assert header_seeds(keyed.sign(payload, b"k" * 32)).seeds == [41, 42]  # a tag is skipped, not checked
    assert header_seeds(payload[:20]) is None and header_seeds(b"not a payload") is None
    assert earliest_first([header_seeds(payload), None, header_seeds(wire.encode(cloud.encode_chunk(frames, seed=7), cloud.config, "fp32"))],
                          [1, 0, 0]) == [1, 2, 0]


def test_a_worker_calls_requests_run_in_their_clips_order(tiny_models):
    """Chunks that arrived as pairs 8-9, 0-1, a refusal, and 2-3 asked from its second pair on run
    refusal first, then by the seed of the first pair asked: 0, 3, 8 (not in arrival order)."""
    cloud, _ = tiny_models
    frames = [torch.from_numpy(np.array(f)).permute(2, 0, 1).float() / 255 for f in synthetic.clip(3, 32, 32)]
    later, first, middle = (cloud.encode_chunk(frames, seed=seed) for seed in (8, 0, 2))
    assert earliest_first([later, first, ValueError("refused"), middle], [0, 0, 0, 1]) == [2, 1, 3, 0]
