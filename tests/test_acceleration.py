"""How the edge's forward runs (eden_serve/edge/acceleration.py): the switches, where users set
them, and the forward compiled (dynamo's tracing on the CPU; inductor takes minutes here)."""

import os
import subprocess
import sys

import pytest
import torch

from eden_serve import edge as edge_package
from eden_serve.config import PRESETS
from eden_serve.edge import Acceleration, EdgeModel, middles_of
from eden_serve.edge import compiling
from eden_serve.edge.acceleration import Compile, Runner, bucket
from eden_serve.edge.forward import SampleInputs
from eden_serve.edge.graphs import RerunGraphs
from eden_serve.errors import BadInputError
from eden_serve.model.checkpoint import module_from_state
from eden_serve.wire import Conditions

CUDA, CPU = torch.device("cuda:0"), torch.device("cpu")


def test_cuda_graphs_are_on_by_default_on_a_gpu_only():
    assert Acceleration().graphs_on(CUDA) and not Acceleration().graphs_on(CPU)
    assert Acceleration("on").graphs_on(CUDA) and not Acceleration("off").graphs_on(CUDA)


def test_inductors_own_graphs_turn_ours_off():
    assert not Acceleration(compile=Compile(mode="reduce-overhead")).graphs_on(CUDA)
    assert Acceleration(compile=Compile(mode="max-autotune-no-cudagraphs")).graphs_on(CUDA)


@pytest.mark.parametrize("acceleration, device, message", [
    (Acceleration("on"), CPU, "CUDA graphs need a CUDA device"),
    (Acceleration("on", Compile(mode="max-autotune")), CUDA, "captures CUDA graphs itself"),
])
def test_contradictions_are_refused(acceleration, device, message):
    with pytest.raises(BadInputError, match=message):
        acceleration.graphs_on(device)


def test_unknown_settings_are_refused():
    with pytest.raises(BadInputError, match="unknown cuda graphs setting 'yes'"):
        Acceleration("yes")
    with pytest.raises(BadInputError, match="unknown compile mode 'fast'"):
        Compile(mode="fast")


def test_the_pt2_section_as_torchserve_documents_it():
    assert Compile.from_pt2(None) == "auto"  # absent: the default, compiled only from prepared artefacts
    assert Compile.from_pt2({"compile": {"enable": False, "backend": "inductor"}}) is None
    assert Compile.from_pt2({"compile": {"enable": True}}) == Compile()
    assert Compile.from_pt2({"compile": {"enable": True, "backend": "inductor", "mode": "max-autotune-no-cudagraphs"}}) == Compile(
        "inductor", "max-autotune-no-cudagraphs")
    assert Compile.from_pt2({"compile": {"enable": True, "scope": "stages", "background": False}}) == Compile(scope="stages", background=False)
    for bad in ("inductor", {"compile": {"backend": "inductor"}}, {"compile": {"enable": "yes"}},
                {"compile": {"enable": True, "dynamic": True}}, {"export": {"aot_compile": True}}):
        with pytest.raises(BadInputError, match="model-config.yaml: pt2 must be"):
            Compile.from_pt2(bad)


def test_a_graph_serves_batches_up_to_the_next_power_of_two():
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]


def test_a_runner_without_graphs_calls_the_stage():
    runner = Runner(Acceleration(), CPU, {"stage": lambda inputs: inputs.noise * 2})
    assert runner.graphs is None and runner.compiled is None and runner.background is None
    inputs = SampleInputs(torch.ones(2, 1), torch.ones(2, 1), torch.ones(2, 1), torch.ones(1), torch.ones(2), (2, 2))
    assert runner("stage", inputs).tolist() == [[2.0], [2.0]]


def test_the_graph_cache_takes_its_bounds_from_the_settings():
    runner = Runner(Acceleration(max_graphs=3, graph_bytes=1 << 20), CPU, {}, api=RerunGraphs())
    assert (runner.graphs.max_graphs, runner.graphs.max_bytes) == (3, 1 << 20)


def test_compile_auto_compiles_only_from_prepared_artefacts_on_a_gpu():
    """The default everywhere (the command line, the edge archive without a pt2 section, EdgeModel):
    nothing compiled (compiling beside the forwards cost an H200's 1080p clip 40% of its pairs a
    second); where artefacts were prepared, inductor block by block in the background from them on
    a GPU, still nothing on a CPU. An explicit setting stays as given."""
    assert Acceleration().compiler(CUDA) is None and Acceleration().compiler(CPU) is None
    assert Acceleration().with_prepared(CUDA).compiler(CUDA) == Compile()
    assert Acceleration().with_prepared(CPU).compiler(CPU) is None
    assert Acceleration(compile=None).with_prepared(CUDA).compiler(CUDA) is None
    assert Acceleration(compile=Compile(mode="max-autotune-no-cudagraphs")).with_prepared(CUDA).compiler(CUDA).mode == "max-autotune-no-cudagraphs"
    assert (Compile().backend, Compile().scope, Compile().background) == ("inductor", "blocks", True)
    assert Acceleration(compile=Compile(backend="eager")).compiler(CPU) == Compile(backend="eager")
    assert Compile.from_pt2(None) == "auto"
    assert Acceleration().describe(CUDA) == "CUDA graphs" and Acceleration().describe(CPU) == "eager"
    assert Acceleration().with_prepared(CUDA).describe(CUDA) == "CUDA graphs, compiled in the background (inductor, default, blocks)"


def test_inductors_cache_is_kept_under_the_users_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compiling.persistent_cache() == str(tmp_path / "eden-serve" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compiling.persistent_cache() == str(tmp_path / "mine")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    Compile().prepare()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "home" / ".cache" / "eden-serve" / "inductor")


def test_a_relative_cache_home_is_ignored_as_the_xdg_specification_says(monkeypatch, tmp_path):
    """A relative ``XDG_CACHE_HOME`` would follow the current directory (a cache in every folder a
    command is run from): the specification says to ignore it, and ``~/.cache`` is taken. Was: used
    as given, for compiled artefacts and the decoders' memory alike."""
    from eden_serve.media import decoder_memory
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # what persistent_cache() sets is undone after the test
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.delenv(decoder_memory.FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert compiling.persistent_cache() == str(tmp_path / "home" / ".cache" / "eden-serve" / "inductor")
    assert decoder_memory.default_path() == tmp_path / "home" / ".cache" / "eden-serve" / "decoders.json"
    assert not (tmp_path / "relative").exists()


def test_a_cache_directory_that_cannot_be_written_compiles_into_a_private_one_said_once(monkeypatch, tmp_path, caplog):
    """A cache directory that cannot be made or written (here under a regular file, which refuses
    root as a read-only home refuses anyone) leaves ``--compile`` a private directory of the run's,
    said in one warning, as a user without a home gets (was: inductor's writes failed, and the run
    went uncompiled)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # what persistent_cache() sets is undone after the test
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    (tmp_path / "a-file").write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    with caplog.at_level("WARNING", logger=compiling.logger.name):
        first, second = compiling.persistent_cache(), compiling.persistent_cache()
    assert first == second and not first.startswith(str(tmp_path)) and os.path.isdir(first)
    assert oct(os.stat(first).st_mode & 0o777) == "0o700"
    said = [r.getMessage() for r in caplog.records if "compiled artefacts" in r.getMessage()]
    assert len(said) == 1 and "no cache directory that can be written" in said[0], said


@pytest.fixture(scope="module")
def tiny_edge(tiny_state):
    config = PRESETS["tiny"]
    return EdgeModel(module_from_state(tiny_state, "edge", config), config)


def pair(seed: int) -> Conditions:
    tokens = torch.randn(2, 48, PRESETS["tiny"].hidden_dim, generator=torch.Generator().manual_seed(seed))
    return Conditions(tokens, tokens.flip(0), 0.4, 0.2, 0.3, (6, 8), (91, 125), seed)


@pytest.mark.parametrize("scope", ["blocks", "stages"])
def test_the_compiled_forward_equals_the_eager_one(tiny_edge, monkeypatch, scope):
    """dynamo's graphs run by its eager backend: the same operations as the eager forward with
    torch's products, bit for bit; compiled at first use (not in the background here) and kept (a
    second pair runs the compiled code). Compiled, the oneDNN products give way to torch's (the
    compiler picks its own), and come back after."""
    with monkeypatch.context() as patch:
        patch.setattr(edge_package, "onednn_linear_available", lambda *args: False)
        tiny_edge.accelerate(Acceleration())
        eager = [middles_of(tiny_edge, [pair(s)], uint8=False) for s in (1, 2)]
    tiny_edge.accelerate(Acceleration(compile=Compile(backend="eager", scope=scope, background=False)))
    try:
        assert tiny_edge.linears.kind == "torch" and set(tiny_edge.runner.compiled) == {"sample", "render", "render_uint8"}
        compiled = [middles_of(tiny_edge, [pair(s)], uint8=False) for s in (1, 2)]
        assert all(torch.equal(a, b) for a, b in zip(compiled, eager))
    finally:
        tiny_edge.accelerate(Acceleration())
    assert tiny_edge.runner.compiled is None and tiny_edge.runner.graphs is None
    assert tiny_edge.linears.kind == ("onednn" if edge_package.onednn_linear_available(CPU) else "torch")


LAZY_COMPILER = """
import sys, torch
from eden_serve.config import PRESETS
from eden_serve.edge import Acceleration, EdgeModel, middles_of
from eden_serve.edge.acceleration import Compile
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import module_from_state
from eden_serve.wire import Conditions
config = PRESETS["tiny"]
edge = EdgeModel(module_from_state(synthetic.state_dict(config, 0), "edge", config), config)
edge.accelerate(Acceleration(compile=Compile(backend="eager", after=1)))
print("accelerated", "torch._dynamo" in sys.modules)
tokens = torch.randn(2, 48, config.hidden_dim, generator=torch.Generator().manual_seed(1))
pair = [Conditions(tokens, tokens.flip(0), 0.4, 0.2, 0.3, (6, 8), (91, 125), 1)]
middles_of(edge, pair)
assert edge.runner.wait_compiled(300)
print("compiled", "torch._dynamo" in sys.modules, bool(edge.runner.swapped), edge.runner.background.failed)
"""


def test_the_compiler_is_imported_on_its_own_thread_not_before_the_first_middle():
    """Asking for a forward compiled in the background imports nothing of dynamo or its backend
    (2.6 s on this CPU, about half of an H200's 8.8 s from the weights read to the model ready):
    the compiling thread does, at its first key, while the first middles run eager. A fresh process,
    since this one has imported dynamo already."""
    done = subprocess.run([sys.executable, "-c", LAZY_COMPILER], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["accelerated False", "compiled True True None"], done.stdout
