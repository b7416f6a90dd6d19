"""CUDA graphs of the edge's forward: captured once per fixed shape, replayed after.

A replay launches every kernel of a stage in one call, so the host no longer sets the pace (a 480x854
pair launches about 1270 kernels; docs/gpu.md). :class:`GraphCache` keeps the graphs least recently
used first, bounded by their count and by the memory they hold (each graph has its own memory pool,
freed when it is evicted). The CUDA calls sit behind :class:`GraphAPI`, so that the cache's logic runs
on a CPU against a stand-in (:class:`RerunGraphs`) that keeps no more than CUDA keeps.

What a CUDA graph keeps: its memory pool and its static output, nothing of the function captured. A
replay reads the addresses the capture read, whoever owns them now. So each cache entry holds,
besides its static input buffers, every tensor the replay reads (``holds``: the positional
embeddings and the other constants of the key's shape, :mod:`.forward`): the embedding cache may
evict them, or a thread's own copy of them may die, while the graph lives. The function captured
must do no host work and return its output in memory of its own. A batch smaller than its key's is
written into the first rows of the static buffers: the pairs of a batch do not mix, and the rows
past it hold earlier inputs, finite numbers whose middles are dropped. Callers on several threads
and streams take turns: a run (copies in, replay, copy out) holds a lock on the host and runs on the
graphs' stream of the device (:func:`.streams.role_stream`). A key is captured at its
``capture_at``-th call (the edge's default: the third, :class:`~.acceleration.Acceleration`): its
first calls run uncaptured, so that a shape met once or twice (a ramped clip's first chunks, its
last, an odd request) costs no capture, and a capture's warm-up meets initialised kernels. A
capture that fails for any reason but memory leaves its key eager, with one warning. A capture
never meets a wait for the whole device (:class:`.streams.CaptureGate`): where one is under way (a
compiler's first run), the call runs uncaptured and its key is captured at a later call.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable, Protocol, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from .streams import CaptureGate, indexed, role_lock, role_stream

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
    """:class:`GraphAPI` on a CUDA device: warm-up, then capture into a memory pool of the graph's
    own (``torch.cuda.graph``'s default), both on the device's graphs stream, which every cache of
    the process shares, taking turns under its lock (a capture must meet no other work on its
    stream, nor a release's emptying of the allocator's cache). The bytes are the pool's segments,
    read once the capture is over (it empties the allocator's cache as it begins)."""

    def __init__(self, device: torch.device, warmup: int = 2):
        self.device = device
        self.warmup = warmup  # eager runs before capture: lazy initialisation (cuBLAS workspaces, compiled kernels)
        self.stream = role_stream(device, "graphs")
        self.lock = role_lock(device, "graphs")

    def capture(self, fn):
        with self.lock:  # within ordered(): on the graphs stream, after the caller's work
            for _ in range(self.warmup):
                fn()
            graph = torch.cuda.CUDAGraph()
            try:
                # thread_local: other threads (the cloud's E_cond, the next request's preparation, a
                # compiler) may use the device meanwhile, on streams of their own. The device made
                # current: a capture begins by synchronising the current device, GPU 0 for a thread
                # that never chose one.
                with torch.cuda.device(self.device), torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                    out = fn()
            except Exception:
                del graph  # its pool freed before the caller goes on
                torch.cuda.empty_cache()
                raise
            return graph, out, pool_bytes(graph, self.device)

    def replay(self, graph):
        graph.replay()

    def release(self, graph):
        with self.lock:
            self.stream.synchronize()  # its last replay may still run
            graph.reset()
            torch.cuda.empty_cache()  # the pool's segments go back to the device

    @contextlib.contextmanager
    def ordered(self):
        with self.lock:
            caller = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(caller)
            with torch.cuda.stream(self.stream):
                yield
            caller.wait_stream(self.stream)


def pool_bytes(graph: "torch.cuda.CUDAGraph", device: torch.device) -> int:
    """The bytes of the segments the caching allocator holds in ``graph``'s memory pool."""
    pool, index = tuple(graph.pool()), indexed(device).index
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if s["device"] == index and tuple(s["segment_pool_id"]) == pool)


class RerunGraphs:
    """A stand-in for :class:`CudaGraphs` on any device that keeps what a CUDA graph keeps and no
    more. "Capture" warms ``fn`` up once, then records the operations of a second run (what a CUDA
    graph records: the kernels and the tensors they read), keeping the static output and, of the
    tensors made before the capture, weak references only; a "replay" runs those operations again,
    on the same tensors, and writes the result into the static output. A replay that would read a
    tensor that has died fails loudly, where a CUDA graph would read freed memory. It computes what
    a graph computes, bit for bit on the CPU; for tests and for trying the graphed path of a
    benchmark where there is no GPU. The bytes are the output's."""

    def __init__(self):
        self.captured = 0
        self.released = 0

    def capture(self, fn):
        fn()
        with _Recorder() as recorder:
            out = fn()
        self.captured += 1
        graph = recorder.tape(out)
        return graph, out, out.numel() * out.element_size()

    def replay(self, graph):
        graph.replay()

    def release(self, graph):
        self.released += 1

    def ordered(self):
        return contextlib.nullcontext()


class DeadTensorError(RuntimeError):
    """A replay would read a tensor that died after the capture: on a GPU, memory reused."""


@dataclass
class _Tape:
    """The operations of a capture: each an operation, its arguments' structure, and per argument
    a constant, a weak reference (made before the capture) or the slot of an earlier result."""

    steps: list = field(default_factory=list)
    result: int = -1  # the slot of the static output's value
    out: "weakref.ref[torch.Tensor] | None" = None
    slots: int = 0

    def replay(self) -> None:
        values: list = [None] * self.slots
        for func, spec, arguments, results in self.steps:
            flat = [_resolve(kind, value, values) for kind, value in arguments]
            args, kwargs = tree_unflatten(flat, spec)
            made, _ = tree_flatten(func(*args, **kwargs))
            for slot, tensor in zip(results, made):
                if slot is not None:
                    values[slot] = tensor
        out = self.out()
        if out is None:
            raise DeadTensorError("the graph's static output is gone")
        out.copy_(values[self.result])


def _resolve(kind: str, value, values: list):
    if kind == "slot":
        return values[value]
    if kind == "before":
        tensor = value()
        if tensor is None:
            raise DeadTensorError("a replay reads a tensor that died after its capture (on a GPU: freed memory, "
                                  "reused): the graph's entry must hold what it reads")
        return tensor
    return value


class _Recorder(TorchDispatchMode):
    """Records the operations of the calling thread (dispatch modes are per thread, as a
    ``thread_local`` capture is)."""

    def __init__(self):
        super().__init__()
        self.steps: list = []
        self.made: dict[int, tuple[int, torch.Tensor]] = {}  # id -> (slot, the tensor, kept while recording)
        self.before: dict[int, torch.Tensor] = {}  # kept while recording, so that ids stay unique

    def _argument(self, value) -> tuple[str, object]:
        if not isinstance(value, torch.Tensor):
            return "constant", value
        if id(value) in self.made:
            return "slot", self.made[id(value)][0]
        if value.dim() == 0 and value.device.type == "cpu":
            return "constant", value.clone()  # a host scalar: a kernel's argument, by value
        self.before[id(value)] = value
        return "before", weakref.ref(value)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat, spec = tree_flatten((args, kwargs or {}))
        arguments = [self._argument(value) for value in flat]
        made = func(*args, **(kwargs or {}))
        results = []
        for tensor in tree_flatten(made)[0]:
            new = isinstance(tensor, torch.Tensor) and id(tensor) not in self.made and id(tensor) not in self.before
            if new:
                self.made[id(tensor)] = (len(self.made), tensor)
            results.append(self.made[id(tensor)][0] if new else None)
        self.steps.append((func, spec, arguments, results))
        return made

    def tape(self, out: torch.Tensor) -> _Tape:
        return _Tape(self.steps, self.made[id(out)][0], weakref.ref(out), len(self.made))


@dataclass
class Entry:
    graph: object
    inputs: tuple[torch.Tensor, ...]  # the static buffers, [batch of the key, ...] each
    out: torch.Tensor  # the static output
    holds: object  # what else the replay reads (the key's constants), alive as long as the graph
    bytes: int  # the pool's and the static inputs'


StaticFn = Callable[[Sequence[torch.Tensor]], torch.Tensor]  # a stage of the static buffers
# Keys whose calls are counted before their capture, the least recent forgotten first: a served
# edge meets as many keys as frame sizes and batches are asked of it.
MAX_COUNTED = 1024


class GraphCache:
    """Graphs by key, least recently used first, within ``max_graphs`` and ``max_bytes``: an
    evicted graph is released, and captured again when its key comes back. A key whose capture
    failed (other than for memory) runs eagerly from then on."""

    def __init__(self, api: GraphAPI, max_graphs: int = 16, max_bytes: int = 1 << 62, gate: CaptureGate | None = None,
                 capture_at: int = 1):
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be at least 1, got {max_graphs}")
        if capture_at < 1:
            raise ValueError(f"capture_at must be at least 1, got {capture_at}")
        self.capture_at = capture_at
        self._calls: OrderedDict[Hashable, int] = OrderedDict()  # calls so far of each key, least recent first
        self.api = api
        self.gate = gate or CaptureGate()  # the device's (streams.capture_gate): a capture meets no device-wide wait
        self.deferred = 0  # captures put off (their call ran uncaptured) while the gate was held
        self.max_graphs = max_graphs
        self.max_bytes = max_bytes
        self.bytes = 0
        self.captures = 0
        self.eager: dict[Hashable, str] = {}  # keys whose capture failed, and why
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

    def run(self, key: Hashable, fn: StaticFn, inputs: Sequence[torch.Tensor], batch: int, holds: object = None) -> torch.Tensor:
        """``fn(static)`` for ``inputs``, replayed from the graph of ``key`` (captured on first use,
        with static buffers of ``batch`` rows, keeping ``holds``: whatever else ``fn`` reads): the
        rows of ``inputs`` are copied into the static buffers, and the output's first rows come back
        in memory of their own (the next replay overwrites the static output)."""
        if key not in self.eager and self._due(key):
            with self._lock, self.api.ordered():
                out = self._replayed(key, fn, inputs, batch, holds)
            if out is not None:
                if out.device.type == "cuda":
                    out.record_stream(torch.cuda.current_stream(out.device))  # made on the graphs' stream, used on the caller's
                return out
        return fn(inputs)

    def _due(self, key: Hashable) -> bool:
        """Whether ``key``'s call replays (its graph captured first where it has none): from its
        ``capture_at``-th call on; an evicted key's return is captured at once."""
        if key in self._entries or self.capture_at == 1:
            return True
        with self._lock:
            self._calls[key] = calls = self._calls.pop(key, 0) + 1  # kept once due: an evicted key is due again
            while len(self._calls) > MAX_COUNTED:
                self._calls.popitem(last=False)
            return calls >= self.capture_at

    def _replayed(self, key, fn, inputs, batch, holds) -> torch.Tensor | None:
        """Under the turn: the key's graph replayed on ``inputs`` (captured first where it has
        none), its output's rows copied out; None where the key runs eagerly."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._capture(key, fn, inputs, batch, holds)
            if entry is None:
                return None
        else:
            self._entries.move_to_end(key)
            for static, tensor in zip(entry.inputs, inputs, strict=True):
                static[: len(tensor)].copy_(tensor)
        self.api.replay(entry.graph)
        return entry.out[: len(inputs[0])].clone()

    def replace(self, key: Hashable, fn: StaticFn, inputs: Sequence[torch.Tensor], batch: int, holds: object = None) -> None:
        """Capture ``fn`` as ``key``'s graph and put it in place of the key's graph, in one turn (a
        compiled stage, :mod:`.compiling`: compiled before, so the turn lasts a capture). Under the
        turn, a capture never meets another thread's, nor a release's emptying of the cache. A
        capture that fails leaves the key's graph as it was, and raises."""
        with self._lock, self.api.ordered():
            with self.gate.capturing(wait=True):
                entry = self._make(fn, inputs, batch, holds)
            old = self._entries.pop(key, None)
            if old is not None:
                self._release(key, old)
            self._insert(key, entry)

    def _capture(self, key, fn, inputs, batch, holds) -> Entry | None:
        with self.gate.capturing(wait=False) as free:
            if not free:  # a compiler's first run (a minute) or a wait for the device: capture at a later call
                self.deferred += 1
                logger.debug("the graph of %s is captured later: the device is being waited for", key)
                return None
            return self._captured(key, fn, inputs, batch, holds)

    def _captured(self, key, fn, inputs, batch, holds) -> Entry | None:
        while len(self._entries) >= self.max_graphs:
            self._evict()
        try:
            try:
                entry = self._make(fn, inputs, batch, holds)
            except torch.OutOfMemoryError:
                if not self._entries:
                    raise
                logger.warning("out of memory capturing a graph; releasing %d graphs and trying once more", len(self._entries))
                self.clear()
                entry = self._make(fn, inputs, batch, holds)
        except torch.OutOfMemoryError:
            raise  # the caller's to answer (a served batch is retried in halves)
        except Exception as exc:  # a graph is a speed-up: without it the key runs as it would uncaptured
            self.eager[key] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            logger.warning("capturing the graph of %s failed (%s); that key runs eagerly", key, self.eager[key])
            return None
        self._insert(key, entry)
        return entry

    def _make(self, fn, inputs, batch, holds) -> Entry:
        """Static buffers of ``batch`` rows holding ``inputs``, and ``fn`` captured reading them."""
        static = tuple(torch.zeros((batch, *t.shape[1:]), dtype=t.dtype, device=t.device) for t in inputs)
        for buffer, tensor in zip(static, inputs):
            buffer[: len(tensor)].copy_(tensor)
        graph, out, pool_bytes = self.api.capture(lambda: fn(static))
        return Entry(graph, static, out, holds, pool_bytes + sum(t.numel() * t.element_size() for t in static))

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
        # The pool's tensors dropped before it is freed; what the replay read, after.
        entry.inputs, entry.out, entry.graph = (), None, None
        self.api.release(graph)
        entry.holds = None
        logger.info("released the graph of %s (%d bytes)", key, entry.bytes)

    def clear(self) -> None:
        with self._lock:
            while self._entries:
                self._evict()
