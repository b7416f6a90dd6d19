"""CUDA graphs of the edge's forward: captured once per fixed shape, replayed after.

A replay launches every kernel of a stage in one call, so the host no longer sets the pace (a 480x854
pair launches about 1270 kernels; docs/gpu.md). :class:`GraphCache` keeps the graphs least recently
used first, bounded by their count and by the memory they hold (each graph has its own memory pool,
freed when it is evicted). The CUDA calls sit behind :class:`GraphAPI`, so that the cache's logic runs
on a CPU against a stand-in (:class:`RerunGraphs`).

What a replay assumes of the function captured: it reads only its static input buffers and tensors
that stay alive and unchanged for its key (the positional embeddings: :mod:`.forward`), does no host
work, and returns its output in memory of its own. A batch smaller than its key's is written into the
first rows of the static buffers: the pairs of a batch do not mix, and the rows past it hold earlier
inputs, finite numbers whose middles are dropped. Callers on several threads and streams take turns:
a run (copies in, replay, copy out) holds a lock on the host and runs on one stream of the cache's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable, Protocol, Sequence

import torch

logger = logging.getLogger(__name__)


class GraphAPI(Protocol):
    """What the cache needs of CUDA graphs."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[object, torch.Tensor, int]:
        """``fn`` (which reads static buffers holding real inputs) warmed up, then captured:
        (the graph, its static output, the bytes its memory pool holds)."""

    def replay(self, graph: object) -> None:
        """Run the captured work again on what the static buffers hold now."""

    def release(self, graph: object) -> None:
        """Free the graph and its memory pool (its output must be dropped before)."""

    def ordered(self) -> contextlib.AbstractContextManager:
        """A context in which a run's copies, replay and copy out are queued after the caller's
        work, and the caller's later work after them."""


class CudaGraphs:
    """:class:`GraphAPI` on a CUDA device: warm-up on a side stream, then capture into a memory pool
    of the graph's own (``torch.cuda.graph``'s default), measured by what the device's caching
    allocator reserved for it."""

    def __init__(self, device: torch.device, warmup: int = 2):
        self.device = device
        self.warmup = warmup  # eager runs before capture: lazy initialisation (cuBLAS workspaces, compiled kernels)
        self.stream = torch.cuda.Stream(device)  # every replay's: the static buffers are shared by all callers

    def capture(self, fn):
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn()
        current.wait_stream(side)
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (the cloud's E_cond, the next chunk's preparation, a compiler)
        # may use the device meanwhile.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = fn()
        return graph, out, torch.cuda.memory_reserved(self.device) - before

    def replay(self, graph):
        graph.replay()

    def release(self, graph):
        self.stream.synchronize()  # its last replay may still run
        graph.reset()
        torch.cuda.empty_cache()  # the pool's segments go back to the device

    @contextlib.contextmanager
    def ordered(self):
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream):
            yield
        caller.wait_stream(self.stream)


class RerunGraphs:
    """A stand-in for :class:`CudaGraphs` on any device: "capture" runs ``fn`` once and keeps it,
    a "replay" runs it again and writes its result into the static output, as a CUDA graph's replay
    overwrites its output. It computes what a graph computes, bit for bit on the CPU; for tests and
    for trying the graphed path of a benchmark where there is no GPU. The bytes are the output's."""

    def __init__(self):
        self.captured = 0
        self.released = 0

    def capture(self, fn):
        self.captured += 1
        graph = _Rerun(fn, fn())
        return graph, graph.out, graph.out.numel() * graph.out.element_size()

    def replay(self, graph):
        graph.out.copy_(graph.fn())

    def release(self, graph):
        self.released += 1

    def ordered(self):
        return contextlib.nullcontext()


@dataclass
class _Rerun:
    fn: Callable[[], torch.Tensor]
    out: torch.Tensor


@dataclass
class Entry:
    graph: object
    inputs: tuple[torch.Tensor, ...]  # the static buffers, [batch of the key, ...] each
    out: torch.Tensor  # the static output
    bytes: int  # the pool's and the static inputs'


class GraphCache:
    """Graphs by key, least recently used first, within ``max_graphs`` and ``max_bytes``: an
    evicted graph is released, and captured again when its key comes back."""

    def __init__(self, api: GraphAPI, max_graphs: int = 16, max_bytes: int = 1 << 62):
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be at least 1, got {max_graphs}")
        self.api = api
        self.max_graphs = max_graphs
        self.max_bytes = max_bytes
        self.bytes = 0
        self.captures = 0
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        # One run at a time: callers on several threads share the static buffers.
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def keys(self) -> list:
        """Least recently used first."""
        return list(self._entries)

    def run(self, key: Hashable, fn: Callable[[Sequence[torch.Tensor]], torch.Tensor], inputs: Sequence[torch.Tensor],
            batch: int) -> torch.Tensor:
        """``fn(static)`` for ``inputs``, replayed from the graph of ``key`` (captured on first use,
        with static buffers of ``batch`` rows): the rows of ``inputs`` are copied into the static
        buffers, and the output's first rows come back in memory of their own (the next replay
        overwrites the static output)."""
        with self._lock, self.api.ordered():
            entry = self._entries.get(key)
            if entry is None:
                entry = self._capture(key, fn, inputs, batch)
            else:
                self._entries.move_to_end(key)
                for static, tensor in zip(entry.inputs, inputs, strict=True):
                    static[: len(tensor)].copy_(tensor)
            self.api.replay(entry.graph)
            out = entry.out[: len(inputs[0])].clone()
        if out.device.type == "cuda":
            out.record_stream(torch.cuda.current_stream(out.device))  # made on the replays' stream, used on the caller's
        return out

    def replace(self, key: Hashable, fn: Callable[[Sequence[torch.Tensor]], torch.Tensor], inputs: Sequence[torch.Tensor],
                batch: int) -> None:
        """Capture ``fn`` as ``key``'s graph and put it in place of the key's graph, in one turn (a
        compiled stage, :mod:`.compiling`: compiled before, so the turn lasts a capture). Under the
        turn, a capture never meets another thread's, nor a release's emptying of the cache."""
        with self._lock, self.api.ordered():
            entry = self._make(fn, inputs, batch)
            old = self._entries.pop(key, None)
            if old is not None:
                self._release(key, old)
            self._insert(key, entry)

    def _capture(self, key, fn, inputs, batch) -> Entry:
        while len(self._entries) >= self.max_graphs:
            self._evict()
        try:
            entry = self._make(fn, inputs, batch)
        except torch.OutOfMemoryError:
            if not self._entries:
                raise
            logger.warning("out of memory capturing a graph; releasing %d graphs and trying once more", len(self._entries))
            self.clear()
            entry = self._make(fn, inputs, batch)
        self._insert(key, entry)
        return entry

    def _make(self, fn, inputs, batch) -> Entry:
        """Static buffers of ``batch`` rows holding ``inputs``, and ``fn`` captured reading them."""
        static = tuple(torch.zeros((batch, *t.shape[1:]), dtype=t.dtype, device=t.device) for t in inputs)
        for buffer, tensor in zip(static, inputs):
            buffer[: len(tensor)].copy_(tensor)
        graph, out, pool_bytes = self.api.capture(lambda: fn(static))
        return Entry(graph, static, out, pool_bytes + sum(t.numel() * t.element_size() for t in static))

    def _insert(self, key, entry: Entry) -> None:
        self.captures += 1
        self._entries[key] = entry
        self.bytes += entry.bytes
        while (self.bytes > self.max_bytes or len(self._entries) > self.max_graphs) and len(self._entries) > 1:
            self._evict()

    def _evict(self) -> None:
        self._release(*self._entries.popitem(last=False))

    def _release(self, key, entry: Entry) -> None:
        self.bytes -= entry.bytes
        graph = entry.graph
        entry.inputs, entry.out, entry.graph = (), None, None  # the pool's tensors dropped before it is freed
        self.api.release(graph)
        logger.info("released the graph of %s (%d bytes)", key, entry.bytes)

    def clear(self) -> None:
        with self._lock:
            while self._entries:
                self._evict()
