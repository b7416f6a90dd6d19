"""The graph cache (eden_serve/edge/graphs.py) against a stand-in for the CUDA graph API that keeps
what CUDA keeps (its static output, and nothing of the function captured): capture once per key,
replay after, the static buffers, the outputs, the bounds and the eviction order; what a graph
reads kept alive by its entry; a capture that fails leaving its key eager; the graphs' stream."""

import gc
import logging
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from eden_serve.config import PRESETS
from eden_serve.edge import Acceleration, EdgeModel, middles_of
from eden_serve.edge.graphs import CudaGraphs, DeadTensorError, GraphCache, RerunGraphs, pool_bytes
from eden_serve.edge.streams import CaptureGate, role_stream
from eden_serve.errors import BadInputError
from eden_serve.model import weights as model_module
from eden_serve.model.checkpoint import module_from_state
from eden_serve.wire import Conditions
from harness.cuda_streams import FakeStreams


class Ledger(RerunGraphs):
    """The stand-in, with the memory each capture holds set by the test and every call recorded."""

    def __init__(self, pool_bytes: int = 0, fail_captures: int = 0, error: type = torch.OutOfMemoryError):
        super().__init__()
        self.pool_bytes = pool_bytes
        self.fail_captures = fail_captures  # the next captures to fail, with ``error``
        self.error = error
        self.calls = []

    def capture(self, fn):
        if self.fail_captures:
            self.fail_captures -= 1
            raise self.error("CUDA out of memory (stand-in)" if self.error is torch.OutOfMemoryError else
                             "operation not permitted when stream is capturing (stand-in)")
        graph, out, _ = super().capture(fn)
        self.calls.append(("capture", graph))
        return graph, out, self.pool_bytes

    def replay(self, graph):
        self.calls.append(("replay", graph))
        super().replay(graph)

    def release(self, graph):
        self.calls.append(("release", graph))
        super().release(graph)


def double(static):
    (x,) = static
    return x * 2 + 1


def run(cache: GraphCache, key, x: torch.Tensor, batch: int = 4) -> torch.Tensor:
    return cache.run(key, double, (x,), batch)


def test_a_key_is_captured_once_and_replayed_on_new_inputs():
    api = Ledger()
    cache = GraphCache(api)
    a, b = torch.arange(12.0).reshape(4, 3), torch.full((4, 3), 5.0)
    out_a = run(cache, "k", a)
    out_b = run(cache, "k", b)
    assert torch.equal(out_a, a * 2 + 1) and torch.equal(out_b, b * 2 + 1)  # b was copied into the static buffer
    assert api.captured == cache.captures == 1 and [c[0] for c in api.calls] == ["capture", "replay", "replay"]


def test_outputs_are_not_aliased_across_replays():
    cache = GraphCache(Ledger())
    first = run(cache, "k", torch.ones(4, 3))
    second = run(cache, "k", torch.zeros(4, 3))
    assert torch.equal(first, torch.full((4, 3), 3.0)) and torch.equal(second, torch.ones(4, 3))
    assert first.data_ptr() != second.data_ptr()


def test_a_smaller_batch_fills_the_first_rows_of_the_static_buffers():
    cache = GraphCache(Ledger())
    run(cache, "k", torch.ones(4, 3))
    out = run(cache, "k", torch.full((3, 3), 2.0))
    assert torch.equal(out, torch.full((3, 3), 5.0))  # three rows back, of the three given
    (static,) = cache._entries["k"].inputs
    assert torch.equal(static[3], torch.ones(3))  # the fourth row: the earlier input, finite


def test_the_least_recently_used_graph_goes_first_and_is_released():
    api = Ledger()
    cache = GraphCache(api, max_graphs=2)
    x = torch.ones(4, 3)
    run(cache, "a", x)
    run(cache, "b", x)
    run(cache, "a", x)  # a is now the most recent
    run(cache, "c", x)
    assert cache.keys() == ["a", "c"] and api.released == 1
    released = [graph for call, graph in api.calls if call == "release"]
    captured = [graph for call, graph in api.calls if call == "capture"]
    assert released == [captured[1]]  # b's graph


def test_an_evicted_key_is_captured_again():
    api = Ledger()
    cache = GraphCache(api, max_graphs=1)
    x = torch.ones(4, 3)
    for key in ("a", "b", "a"):
        assert torch.equal(run(cache, key, x), x * 2 + 1)
    assert api.captured == 3 and api.released == 2 and cache.keys() == ["a"]


def test_the_memory_bound_evicts_until_the_graphs_fit():
    """Each graph holds its pool (1000 bytes here) and its static inputs (4 x 3 float32 = 48)."""
    api = Ledger(pool_bytes=1000)
    cache = GraphCache(api, max_graphs=10, max_bytes=2500)
    x = torch.ones(4, 3)
    for key in "abc":
        run(cache, key, x)
    assert cache.keys() == ["b", "c"] and cache.bytes == 2 * 1048
    cache.max_bytes = 10
    run(cache, "d", x)
    assert cache.keys() == ["d"] and cache.bytes == 1048  # the newest stays, even alone over the bound
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0 and api.released == 4


def test_an_evicted_graph_drops_its_buffers_before_its_release():
    cache = GraphCache(Ledger(), max_graphs=1)
    run(cache, "a", torch.ones(4, 3))
    entry = cache._entries["a"]
    run(cache, "b", torch.ones(4, 3))
    assert entry.inputs == () and entry.out is None and entry.graph is None


def test_running_out_of_memory_in_a_capture_releases_the_others_and_tries_once_more():
    api = Ledger()
    cache = GraphCache(api)
    x = torch.ones(4, 3)
    run(cache, "a", x)
    run(cache, "b", x)
    api.fail_captures = 1
    assert torch.equal(run(cache, "c", x), x * 2 + 1)
    assert cache.keys() == ["c"] and api.released == 2
    api.fail_captures = 2
    with pytest.raises(torch.OutOfMemoryError):
        run(cache, "d", x)
    assert cache.keys() == []


def test_the_bounds_are_checked():
    with pytest.raises(ValueError, match="max_graphs must be at least 1"):
        GraphCache(Ledger(), max_graphs=0)


def test_callers_on_several_threads_take_turns():
    """A replay that yields the host midway (as a GPU's runs on while the host goes on): without
    turns, another thread's inputs would land in the static buffer before the output is read."""

    class Slow(Ledger):
        def replay(self, graph):
            time.sleep(0.001)
            super().replay(graph)

    cache = GraphCache(Slow())
    inputs = [torch.full((4, 3), float(i)) for i in range(8)]
    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(lambda x: [run(cache, "k", x) for _ in range(20)], inputs))
    assert all(torch.equal(out, x * 2 + 1) for x, outs in zip(inputs, outputs) for out in outs)


def test_a_replaced_graph_is_captured_and_swapped_in_one_turn():
    """A compiled stage's graph (eden_serve/edge/compiling.py): captured in one turn with putting it
    in place of the key's graph, which is released; the other keys and the bounds kept."""
    api = Ledger()
    cache = GraphCache(api, max_graphs=2)
    run(cache, "a", torch.ones(4, 3))
    run(cache, "b", torch.ones(4, 3))
    old = cache._entries["a"].graph
    taken = []

    def triple(static):
        taken.append(cache._lock._is_owned())
        return static[0] * 3

    cache.replace("a", triple, (torch.zeros(4, 3),), 4)
    assert taken and all(taken)  # warm-up and capture: no other capture or release meanwhile
    assert ("release", old) in api.calls and cache.keys() == ["b", "a"] and cache.captures == 3
    assert torch.equal(run(cache, "a", torch.full((2, 3), 2.0), batch=4), torch.full((2, 3), 6.0))  # the new graph
    cache.replace("c", triple, (torch.zeros(4, 3),), 4)  # a new key: the count bound evicts the oldest
    assert cache.keys() == ["a", "c"]


def test_a_replay_keeps_nothing_of_the_function_captured():
    """The stand-in keeps what a CUDA graph keeps: a replay reads the tensors the capture read, and
    one that died since fails loudly (on a GPU the replay would read their memory, reused)."""
    api = RerunGraphs()
    weight = torch.full((3,), 2.0)
    static = torch.ones(4, 3)
    graph, out, _ = api.capture(lambda: static * weight + 1)
    static.fill_(2.0)
    api.replay(graph)
    assert torch.equal(out, torch.full((4, 3), 5.0))  # the capture's operations on the buffers' values now
    del weight
    gc.collect()
    with pytest.raises(DeadTensorError, match="died after its capture"):
        api.replay(graph)


CONFIG = PRESETS["tiny"]


def a_pair(seed: int) -> Conditions:
    tokens = torch.randn(2, 48, CONFIG.hidden_dim, generator=torch.Generator().manual_seed(seed))
    return Conditions(tokens, tokens.flip(0), 0.4, 0.2, 0.3, (6, 8), (91, 125), seed)


def constants(inputs) -> list[torch.Tensor]:
    """The tensors a stage reads besides its per-call inputs: the positional embeddings, the Euler grid."""
    stages = (inputs.sample, inputs.render)
    return list({id(t): t for stage in stages for t in vars(stage).values() if isinstance(t, torch.Tensor)
                 and not any(t is c for c in stage.per_call() if c is not None)}.values())


def test_a_graph_holds_what_its_replay_reads_through_eviction_and_collection(tiny_state):
    """The positional embeddings and the other constants a captured stage reads stay alive while its
    graph is cached, with the embedding cache emptied and the garbage collected; the replay then
    still gives the eager middles. Released, the graphs let them go."""
    edge = EdgeModel(module_from_state(tiny_state, "edge", CONFIG), CONFIG)
    expected = [middles_of(edge, [a_pair(seed)]) for seed in (1, 2)]
    edge.accelerate(Acceleration(capture_at=1), graph_api=RerunGraphs())
    inputs = edge.prepare([a_pair(1)])
    assert torch.equal(edge.forward(inputs), expected[0])
    held = [weakref.ref(t) for t in constants(inputs)]
    assert len(held) == 3  # the query grid's embedding (read by both stages), the patch grid's, the Euler grid
    del inputs
    model_module.EMBEDDINGS.clear()
    gc.collect()
    assert sum(ref() is not None for ref in held) == 3 and len(edge.runner.graphs) == 2
    assert torch.equal(middles_of(edge, [a_pair(2)]), expected[1])
    edge.runner.graphs.clear()
    model_module.EMBEDDINGS.clear()
    gc.collect()
    assert sum(ref() is not None for ref in held) == 1  # the Euler grid, the model's own


def test_a_capture_that_fails_leaves_its_key_eager_with_one_warning(caplog):
    """A capture error other than memory (an operation a capture forbids, say) costs the key its
    graph, not its forwards: they run eagerly, without another capture, and the other keys keep
    theirs."""
    api = Ledger(fail_captures=1, error=RuntimeError)
    cache = GraphCache(api)
    x = torch.arange(12.0).reshape(4, 3)
    with caplog.at_level(logging.WARNING, logger="eden_serve.edge.graphs"):
        outs = [run(cache, "a", x), run(cache, "a", x[:3]), run(cache, "b", x)]
    assert torch.equal(outs[0], x * 2 + 1) and torch.equal(outs[1], x[:3] * 2 + 1) and torch.equal(outs[2], x * 2 + 1)
    assert "a" in cache.eager and "stream is capturing" in cache.eager["a"] and cache.keys() == ["b"] and api.captured == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "runs eagerly" in warnings[0].getMessage()


def test_the_graphs_of_every_cache_share_one_high_priority_stream(monkeypatch):
    """The graphs' captures and replays run on one stream per device for the whole process, from
    the high-priority pool (which nothing else draws from), however many caches and captures."""
    fake = FakeStreams(monkeypatch)
    first, second = CudaGraphs(torch.device("cuda:0")), CudaGraphs(torch.device("cuda", 0))
    assert first.stream is second.stream is role_stream(torch.device("cuda:0"), "graphs") and first.lock is second.lock
    assert [s.priority for s in fake.made] == [-1]
    assert role_stream(torch.device("cuda:0"), "prepare") is not first.stream and len(fake.made) == 2


def test_a_graphs_bytes_are_its_pools_segments(monkeypatch):
    """The bound counts the segments the caching allocator holds in the graph's own pool, on its
    device (read after the capture), not the device's reserved memory before and after it."""
    segments = [{"device": 0, "segment_pool_id": (0, 7), "total_size": 2 << 20},
                {"device": 0, "segment_pool_id": (0, 7), "total_size": 20 << 20},
                {"device": 0, "segment_pool_id": (0, 0), "total_size": 512 << 20},  # the ordinary pool
                {"device": 1, "segment_pool_id": (0, 7), "total_size": 4 << 20},
                {"device": 0, "segment_pool_id": (0, 8), "total_size": 6 << 20}]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *args, **kwargs: segments)

    class Graph:
        def pool(self):
            return (0, 7)

    assert pool_bytes(Graph(), torch.device("cuda:0")) == 22 << 20


def test_the_capture_gate_keeps_captures_apart_from_waits_for_the_device():
    """A capture holds the gate alone: one that would wait for shared work is refused at once (its
    caller runs uncaptured), and shared work waits for another thread's capture to end, not for
    its own thread's; a capture asked to wait gets the gate once the shared work is done."""
    gate = CaptureGate()
    order = []
    with gate.shared():
        with gate.capturing(wait=False) as took:
            assert not took
        waiter = threading.Thread(target=lambda: order.append(("captured", gate.capturing(wait=True).__enter__())))
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive() and not order  # waits for the shared work
        order.append(("shared done", True))
    waiter.join(5)
    assert [name for name, _ in order] == ["shared done", "captured"]
    gate = CaptureGate()
    with gate.capturing(wait=True) as took:
        assert took
        with gate.shared():  # the capturing thread's own: not a deadlock
            pass
        other = threading.Thread(target=lambda: gate.shared().__enter__() and None)
        other.start()
        other.join(0.2)
        assert other.is_alive()  # another thread's wait for the device waits for the capture
    other.join(5)
    assert not other.is_alive()


def test_a_key_is_captured_at_its_capture_at_call_and_an_evicted_one_at_once():
    """The first calls of a key run uncaptured (no capture, no pool); the ``capture_at``-th
    captures, later ones replay; a key evicted after its capture is captured again at its return."""
    api = Ledger()
    cache = GraphCache(api, max_graphs=1, capture_at=3)
    x = torch.arange(12.0).reshape(4, 3)
    outs = [run(cache, "a", x + k) for k in range(2)]
    assert api.captured == 0 and len(cache) == 0 and all(torch.equal(o, (x + k) * 2 + 1) for k, o in enumerate(outs))
    assert torch.equal(run(cache, "a", x), x * 2 + 1) and api.captured == 1 and cache.keys() == ["a"]
    assert torch.equal(run(cache, "a", x[:2] + 5), (x[:2] + 5) * 2 + 1) and api.captured == 1  # replayed
    for _ in range(3):
        run(cache, "b", x)  # b's third call captures it, evicting a
    assert cache.keys() == ["b"] and api.captured == 2
    assert torch.equal(run(cache, "a", x), x * 2 + 1) and cache.keys() == ["a"] and api.captured == 3
    with pytest.raises(ValueError, match="capture_at must be at least 1"):
        GraphCache(Ledger(), capture_at=0)


def test_a_ramped_clips_first_shapes_run_uncaptured(tiny_state):
    """With the edge's default (a key captured at its third call), a ramped clip's first chunks of
    1, 1, 2 and 4 pairs, and a last chunk of 3, pay no capture: only the steady batch's key (8 pairs,
    both stages) is captured; every middle is the eager one's."""
    edge = EdgeModel(module_from_state(tiny_state, "edge", CONFIG), CONFIG)
    chunks = [[a_pair(seed) for seed in range(first, first + n)] for first, n in ((0, 1), (1, 1), (2, 2), (4, 4), (8, 8), (16, 8), (24, 8), (32, 3))]
    expected = [middles_of(edge, chunk) for chunk in chunks]
    api = Ledger()
    edge.accelerate(Acceleration(), graph_api=api)
    assert all(torch.equal(middles_of(edge, chunk), want) for chunk, want in zip(chunks, expected))
    assert {key[:2] for key in edge.runner.graphs.keys()} == {("sample", 8), ("render_uint8", 8)} and api.captured == 2
    with pytest.raises(BadInputError, match="capture_at"):
        Acceleration(capture_at=0)
