"""The forward compiled in the background (eden_serve/edge/compiling.py, acceleration.Runner): the
first forwards never wait for the compiler, the compiled stages are swapped in per key once ready
(their graphs captured anew) and compute what the eager ones do, a compiler that fails leaves the
forward uncompiled, and the block functions are compiled once for all their blocks.

The compiler is dynamo with backends of the tests' own (``torch._dynamo.register_backend``): the
eager operations dynamo traced, run as they are (bit for bit the eager forward's), counted, held
back or failing on purpose. Inductor takes minutes on this CPU; the GPU check measures it."""

import itertools
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from eden_serve import edge as edge_package
from eden_serve.config import PRESETS
from eden_serve.edge import Acceleration, Compile, EdgeModel, middles_of
from eden_serve.edge import streams
from eden_serve.edge.compiling import Background
from eden_serve.edge.graphs import RerunGraphs
from eden_serve.model.checkpoint import module_from_state
from eden_serve.wire import Conditions
from harness.cuda_streams import FakeStreams
from harness.rounding import assert_within_rounding
from harness.servers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from gpu_swapped import ramped  # noqa: E402  (benchmarks/: a clip's batches as its pipeline cuts them beside a GPU)

CONFIG = PRESETS["tiny"]
NAMES = itertools.count()  # dynamo keeps every backend registered: each stand-in has a name of its own


class Compiler:
    """A dynamo backend that records each graph it compiles (by the function it came from), counts
    the calls of the compiled code, and may wait for ``release`` or fail first."""

    def __init__(self, hold: bool = False, fail: bool = False):
        self.name, self.hold, self.fail = f"eden_test_{next(NAMES)}", hold, fail
        self.graphs: list[str] = []
        self.calls = 0
        self.started, self.release = threading.Event(), threading.Event()
        torch._dynamo.register_backend(self, name=self.name)

    def __call__(self, gm, example_inputs):
        self.started.set()
        if self.hold:
            assert self.release.wait(120), "the test never released the compiler"
        if self.fail:
            raise RuntimeError("the stand-in compiler fails on purpose")
        self.graphs.append(gm.meta.get("dynamo_compile_id", len(self.graphs)))

        def run(*args):
            self.calls += 1
            return gm.forward(*args)

        return run


@pytest.fixture
def edge(tiny_state, monkeypatch):
    """The tiny edge with torch's products (what compiled code runs) and dynamo's caches emptied."""
    monkeypatch.setattr(edge_package, "onednn_linear_available", lambda *args: False)
    torch._dynamo.reset()
    model = EdgeModel(module_from_state(tiny_state, "edge", CONFIG), CONFIG)
    yield model
    model.runner.close()
    torch._dynamo.reset()


def pair(seed: int, batch: int = 1) -> list[Conditions]:
    tokens = torch.randn(2, 48, CONFIG.hidden_dim, generator=torch.Generator().manual_seed(seed))
    return [Conditions(tokens, tokens.flip(0), 0.4, 0.2, 0.3, (6, 8), (91, 125), seed + i) for i in range(batch)]


def eager_middles(edge: EdgeModel, batches) -> list[torch.Tensor]:
    edge.accelerate(Acceleration(compile=None))
    return [middles_of(edge, batch) for batch in batches]


@pytest.mark.parametrize("graphs", [True, False], ids=["graphed", "ungraphed"])
def test_the_first_forward_never_waits_for_the_compiler(edge, graphs):
    """The compiler is held until the first forward has returned: that forward ran eagerly. Once
    released and done, the compiled stages run and give the eager middles: called where there are
    no graphs, replayed from graphs captured of the compiled code where there are (a replay runs
    the operations captured, not the Python code)."""
    expected = eager_middles(edge, [pair(1)])[0]
    compiler = Compiler(hold=True)
    edge.accelerate(Acceleration(compile=Compile(backend=compiler.name, after=1), capture_at=1), RerunGraphs() if graphs else None)
    first = middles_of(edge, pair(1))
    assert compiler.started.wait(60) and not compiler.release.is_set()  # compiling, and the forward is back
    assert torch.equal(first, expected) and compiler.calls == 0 and not edge.runner.swapped
    compiler.release.set()
    assert edge.runner.wait_compiled(120) and edge.runner.background.failed is None
    assert {key[0] for key in edge.runner.swapped} == {"sample", "render_uint8"}
    calls = compiler.calls
    assert calls > 0 and torch.equal(middles_of(edge, pair(1)), expected)
    if graphs:  # each stage's graph captured eagerly (or put off: the compiler was running), then compiled in its place
        assert edge.runner.graphs.captures + edge.runner.graphs.deferred == 4 and len(edge.runner.graphs) == 2
    else:
        assert compiler.calls > calls  # the compiled code ran


def test_the_device_guards_are_settled_before_the_compiling_thread_starts(edge, monkeypatch):
    """Where PyTorch is built with CUDA but sees no GPU, tracing's first fake tensor mode swaps the
    CUDA device guard for a no-op one, which PyTorch 2.11 does unsynchronised: tracing on the
    compiling thread beside eager forwards crashed the process there. The runner does it first, on
    the thread that accelerates the edge, before its compiling thread exists."""
    settled = []
    monkeypatch.setattr(torch._C, "_ensureCUDADeviceGuardSet", lambda: settled.append(threading.current_thread()), raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    started = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda thread: (settled.append("thread started"), started(thread))[1])
    edge.accelerate(Acceleration(compile=Compile(backend=Compiler().name, after=1)))
    assert settled == [threading.current_thread()]
    middles_of(edge, pair(1))
    assert edge.runner.wait_compiled(120) and "thread started" in settled[1:]


def test_a_key_is_compiled_once_it_has_run_often_enough(edge):
    """One-off shapes (a clip's first chunks and its last) stay eager: a key is compiled from its
    ``after``-th forward on, and each key on its own."""
    compiler = Compiler()
    edge.accelerate(Acceleration(compile=Compile(backend=compiler.name, after=3), capture_at=1), RerunGraphs())
    for _ in range(2):
        middles_of(edge, pair(1))
    assert edge.runner.wait_compiled(120) and not edge.runner.swapped and not compiler.graphs
    middles_of(edge, pair(1))
    middles_of(edge, pair(2, batch=2))  # another key (batch 2): its first forward
    assert edge.runner.wait_compiled(120)
    assert {(key[0], key[1]) for key in edge.runner.swapped} == {("sample", 1), ("render_uint8", 1)}


def test_a_ramped_clips_one_off_shapes_stay_uncompiled_however_many_clips_run(edge):
    """A 200-frame clip's forwards take 1, 1, 2, 4 and 8 pairs, then 16 eleven times, then 7 (a
    graph's batch of 8): only the 16 is met three times. Three such clips in one process compile
    that key alone: counted over the process's life, the second clip's first and fifth forwards
    asked for four more keys, compiled beside it (the H200's 72.5 pairs/s against 186.5)."""
    compiler = Compiler()
    edge.accelerate(Acceleration(compile=Compile(backend=compiler.name), capture_at=3), RerunGraphs())
    batches = ramped(199, 16)
    assert batches == [1, 1, 2, 4, 8] + [16] * 11 + [7]
    for _ in range(3):
        for seed, batch in enumerate(batches):
            middles_of(edge, pair(seed, batch))
        assert edge.runner.wait_compiled(120)
    assert {(key[0], key[1]) for key in edge.runner.background.asked} == {("sample", 16), ("render_uint8", 16)}
    assert edge.runner.swapped == edge.runner.background.asked


def test_the_blocks_share_one_compiled_function(edge):
    """Scope ``blocks``: the DiT's two blocks in both Euler steps run one compiled block function,
    the decoder's two another, plus the work before and after them: six graphs for a key, however
    many blocks (the official model's 12 and 4 compile no more than the tiny one's 2 and 2)."""
    compiler = Compiler()
    edge.accelerate(Acceleration(compile=Compile(backend=compiler.name, background=False), capture_at=1), RerunGraphs())
    middles_of(edge, pair(1))
    assert len(compiler.graphs) == 6
    middles_of(edge, pair(2))
    assert len(compiler.graphs) == 6  # the same shapes: no new compilation


def test_a_failing_compiler_leaves_the_forward_uncompiled(edge, caplog):
    """One warning line, the eager middles, nothing swapped, and no later key compiled."""
    expected = eager_middles(edge, [pair(1), pair(2, batch=2)])
    compiler = Compiler(fail=True)
    edge.accelerate(Acceleration(compile=Compile(backend=compiler.name, after=1), capture_at=1), RerunGraphs())
    with caplog.at_level(logging.WARNING, logger="eden_serve.edge.compiling"):
        assert torch.equal(middles_of(edge, pair(1)), expected[0])
        assert edge.runner.wait_compiled(120)
        assert torch.equal(middles_of(edge, pair(2, batch=2)), expected[1]) and edge.runner.wait_compiled(120)
    assert not edge.runner.swapped and compiler.started.is_set() and not compiler.graphs
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "runs uncompiled" in warnings[0].getMessage()
    assert "fails on purpose" in edge.runner.background.failed


def test_callers_on_several_threads_while_the_compiled_graphs_swap_in(edge):
    """Forwards from four threads take their turns at the graph cache while the compiler swaps the
    compiled graphs in: every middle is the eager one, before, during and after the swap."""
    batches = [pair(seed, batch=1 + seed % 2) for seed in range(8)]
    expected = eager_middles(edge, batches)
    compiler = Compiler(hold=True)
    edge.accelerate(Acceleration(compile=Compile(backend=compiler.name, after=1), capture_at=1), RerunGraphs())

    def forward(i: int) -> bool:
        if i == 8:
            compiler.release.set()  # the swap happens among the forwards
        return torch.equal(middles_of(edge, batches[i % 8]), expected[i % 8])

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(forward, range(24)))
    assert edge.runner.wait_compiled(120) and len(edge.runner.swapped) == 4  # two stages, batches 1 and 2
    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(forward, range(9, 17)))
    assert compiler.calls > 0


class Capturing(RerunGraphs):
    """The graphs' stand-in, keeping what CUDA forbids while a stream is captured: a wait for the
    whole device from any thread fails, "operation not permitted when stream is capturing", and
    spoils the capture (``spoiled`` counts them). A capture takes some time, as a real one does."""

    def __init__(self):
        super().__init__()
        self.under_way = threading.Event()
        self.spoiled = 0

    def capture(self, fn):
        self.under_way.set()
        try:
            time.sleep(0.02)
            return super().capture(fn)
        finally:
            self.under_way.clear()

    def wait_for_device(self):
        if self.under_way.is_set():
            self.spoiled += 1
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


class Autotuning(Compiler):
    """A compiler whose code, at its first run, times itself between waits for the whole device, as
    inductor's autotuning does (the H200's background compile failed on it, 2026-11-28)."""

    def __init__(self, graphs: Capturing):
        super().__init__()
        self.device_graphs = graphs

    def __call__(self, gm, example_inputs):
        run = super().__call__(gm, example_inputs)
        tuned = []

        def first_run_tuned(*args):
            if not tuned:
                for _ in range(40):
                    self.device_graphs.wait_for_device()
                    time.sleep(0.005)
                tuned.append(True)
            return run(*args)

        return first_run_tuned


def test_a_compilers_first_run_never_meets_a_capture(edge):
    """While a key's compiled code first runs (and waits for the device), the forwards of new keys
    run uncaptured and capture later: no wait meets a capture, the compiler does not fail, and
    every middle is the eager one, up to the bound across batch shapes. The old code captured
    beside the compiler: it failed as on the H200."""
    batches = [pair(10 + n, batch=n) for n in (1, 2, 3, 5, 9, 1, 2, 3, 5, 9)]
    expected = eager_middles(edge, batches)
    graphs = Capturing()
    compiler = Autotuning(graphs)
    edge.accelerate(Acceleration(compile=Compile(backend=compiler.name, after=1), capture_at=1), graphs)
    got = [middles_of(edge, batch) for batch in batches]
    assert edge.runner.wait_compiled(120)
    assert graphs.spoiled == 0 and edge.runner.background.failed is None, (graphs.spoiled, edge.runner.background.failed)
    assert edge.runner.graphs.deferred > 0  # some forward met the compiler's first run, and ran uncaptured
    # Batches of 3, 5 and 9 pairs run padded to 4, 8 and 16 (the keys' batches): another batch shape
    # than the eager run's, so the documented bound, not equality (an AMD EPYC, AVX512, differed by
    # one level on one value in 10^5).
    for a, b in zip(got, expected, strict=True):
        assert_within_rounding(a, b)
    for batch, want in zip(batches, expected):
        assert_within_rounding(middles_of(edge, batch), want)


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_a_compiler_of_the_gpu_named_without_an_index_compiles(monkeypatch, device):
    """``--device cuda`` (and ``auto``) name the GPU without an index. The compiler's thread makes
    the device current before each job, and ``torch.cuda.set_device`` refuses plain ``cuda``: on an
    H200 every job failed so, and the edge never ran compiled (2026-11-28, docs/gpu.md)."""
    FakeStreams(monkeypatch)
    ran = []
    compiler = Background(lambda key, job: ran.append(key), torch.device(device))
    compiler.ask("key", None)
    assert compiler.wait(60)
    compiler.close()
    assert compiler.failed is None and ran == ["key"]


def test_the_device_of_an_edge_on_the_gpu_has_its_index(monkeypatch):
    """What the edge, its graphs and its compiler are given: the current GPU where none was named,
    so that ``set_device`` takes it and it equals the device of the tensors made there."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert streams.indexed("cuda") == torch.device("cuda:1")
    assert streams.indexed(torch.device("cuda:0")) == torch.device("cuda:0")
    assert streams.indexed("cpu") == torch.device("cpu")


def test_every_compile_job_runs_on_the_compilers_one_stream(monkeypatch):
    """The jobs of every compiler of a device run on one stream made once for the process (a stream
    per job would come round again from the pool, as the graphs' or the preparation's)."""
    fake = FakeStreams(monkeypatch)
    ran = []
    compilers = [Background(lambda key, job: ran.append(torch.cuda.current_stream()), torch.device("cuda:0")) for _ in range(2)]
    for n, compiler in enumerate(compilers):
        for key in range(3):
            compiler.ask((n, key), None)
    assert all(compiler.wait(60) for compiler in compilers)
    assert len(ran) == 6 and len(fake.made) == 1 and all(stream is fake.made[0] for stream in ran)
    for compiler in compilers:
        compiler.close()
