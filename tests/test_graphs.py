"""The graph cache (eden_serve/edge/graphs.py) against a stand-in for the CUDA graph API: capture
once per key, replay after, the static buffers, the outputs, the bounds and the eviction order."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from eden_serve.edge.graphs import GraphCache, RerunGraphs


class Ledger(RerunGraphs):
    """The stand-in, with the memory each capture holds set by the test and every call recorded."""

    def __init__(self, pool_bytes: int = 0, fail_captures: int = 0):
        super().__init__()
        self.pool_bytes = pool_bytes
        self.fail_captures = fail_captures  # the next captures to run out of memory
        self.calls = []

    def capture(self, fn):
        if self.fail_captures:
            self.fail_captures -= 1
            raise torch.OutOfMemoryError("CUDA out of memory (stand-in)")
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
    assert taken == [True]  # no other capture or release meanwhile
    assert ("release", old) in api.calls and cache.keys() == ["b", "a"] and cache.captures == 3
    assert torch.equal(run(cache, "a", torch.full((2, 3), 2.0), batch=4), torch.full((2, 3), 6.0))  # the new graph
    cache.replace("c", triple, (torch.zeros(4, 3),), 4)  # a new key: the count bound evicts the oldest
    assert cache.keys() == ["a", "c"]
