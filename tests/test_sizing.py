"""Pairs per batched forward (eden_serve/edge/sizing.py) and the precision chosen where none is
asked, for a GPU as far as the code asks it (CUDA's answers monkeypatched: no GPU here)."""

from types import SimpleNamespace

import pytest
import torch

from eden_serve.clips.pipeline import interpolate_clip_in_process
from eden_serve.config import PRESETS
from eden_serve.edge import EdgeModel, default_precision, sizing
from eden_serve.edge.precision import Bf16Check, check_bf16, resolve
from eden_serve.model import synthetic
from eden_serve.model.weights import EdgeWeights

OFFICIAL = PRESETS["official"]
GRIDS = {"480x854": OFFICIAL.patch_grid(480, 854), "720p": OFFICIAL.patch_grid(720, 1280), "1080p": OFFICIAL.patch_grid(1080, 1920),
         "4K": OFFICIAL.patch_grid(2160, 3840)}
GIB = 1 << 30


@pytest.mark.parametrize("free_gib, expected", [
    (80, {"480x854": 16, "720p": 16, "1080p": 8, "4K": 2}),  # an idle H100: the caps
    (8, {"480x854": 16, "720p": 8, "1080p": 4, "4K": 1}),
    (1, {"480x854": 4, "720p": 1, "1080p": 1, "4K": 1}),  # at least one pair, whatever the memory
])
def test_pairs_per_forward_follow_the_free_memory(free_gib, expected):
    assert {name: sizing.pairs_for_memory(free_gib * GIB, OFFICIAL, grid) for name, grid in GRIDS.items()} == expected


def test_pairs_per_forward_are_a_power_of_two_within_the_share_of_memory():
    for free in range(1, 200):
        pairs = sizing.pairs_for_memory(free * GIB // 4, OFFICIAL, GRIDS["1080p"])
        assert pairs & (pairs - 1) == 0
        assert pairs == 1 or pairs * sizing.bytes_per_pair(OFFICIAL, GRIDS["1080p"]) <= sizing.MEMORY_SHARE * free * GIB // 4


@pytest.mark.parametrize("card, free_gib, precision", [("T4 or V100 16 GB", 14.5, "fp32"), ("L4 or A10", 21, "bf16"),
                                                       ("A100 40 GB", 37, "bf16"), ("RTX 4080 16 GB", 14, "bf16")])
def test_a_clips_forwards_in_flight_share_the_memory(monkeypatch, card, free_gib, precision):
    """A clip in process runs a forward per chunk in flight (3 on a GPU), each with activations of
    its own before its key's graph is captured: together within the share of the free memory. Before,
    a 16 GB card in fp32 took 8 pairs of 1080p for each, about 12.6 GB of its 14.5 beside their graph."""
    edge, _ = gpu_like_edge(monkeypatch, int(free_gib * GIB), precision)
    edge.sizing.forwards = 3
    for name, grid in GRIDS.items():
        pairs = edge.sizing.pairs(grid)
        assert pairs == 1 or 3 * pairs * sizing.bytes_per_pair(OFFICIAL, grid, precision) <= sizing.MEMORY_SHARE * free_gib * GIB, (card, name)


def test_an_idle_h100_or_h200_keeps_its_batches_with_three_forwards_in_flight(monkeypatch):
    """The caps bind there, not the memory: 16 pairs at 480x854, 8 at 1080p, 2 at 4K, as measured."""
    for free_gib in (77, 138):
        edge, _ = gpu_like_edge(monkeypatch, free_gib * GIB, "bf16")
        edge.sizing.forwards = 3
        assert {name: edge.sizing.pairs(grid) for name, grid in GRIDS.items()} == {"480x854": 16, "720p": 16, "1080p": 8, "4K": 2}


def test_a_clip_in_process_sizes_its_forwards_for_its_chunks_in_flight(tmp_path, tiny_models, monkeypatch):
    cloud, edge = tiny_models
    asked = []
    monkeypatch.setattr(edge.sizing, "batch_tokens", None)  # as on a GPU: from the free memory
    monkeypatch.setattr(edge.sizing, "forwards", 1, raising=False)
    monkeypatch.setattr(edge.sizing, "_pairs", {})
    monkeypatch.setattr(sizing, "free_memory", lambda device: 8 * GIB)
    monkeypatch.setattr(sizing, "pairs_for_memory", lambda *args, **kwargs: asked.append((args, kwargs)) or 1)
    src = synthetic.write_clip(tmp_path / "in", 5, 32, 48)
    interpolate_clip_in_process(src, tmp_path / "out", cloud, edge, chunk=2, inflight=3, progress=False)
    assert asked and all(3 in (*args[4:], kwargs.get("forwards")) for args, kwargs in asked)


def gpu_like_edge(monkeypatch, free_bytes: int, precision: str = "fp32") -> tuple[EdgeModel, list]:
    """The edge as on a GPU as far as sizing goes (no token budget, free memory asked of CUDA),
    on the meta device; the questions asked of the memory, recorded."""
    asked = []
    with torch.device("meta"):
        weights = EdgeWeights(OFFICIAL)
    edge = EdgeModel(weights, OFFICIAL, "meta", precision, bf16_check=lambda device: Bf16Check(True, "as on a GPU"))
    edge.sizing.batch_tokens = sizing.default_batch_tokens(torch.device("cuda"))
    monkeypatch.setattr(sizing, "free_memory", lambda device: asked.append(device) or free_bytes)
    return edge, asked


def test_a_gpu_edge_sizes_its_batches_from_free_memory_once_per_frame_size(monkeypatch):
    edge, asked = gpu_like_edge(monkeypatch, 80 * GIB)
    assert edge.sizing.batch_tokens is None
    assert [len(b) for b in edge.sizing.batches(list(range(20)), GRIDS["1080p"])] == [8, 8, 4]
    assert edge.sizing.pairs(GRIDS["1080p"]) == 8 and edge.sizing.pairs(GRIDS["480x854"]) == 16
    assert len(asked) == 2  # once per grid: the same batches, and graphs, for the rest of the run


def test_a_token_budget_set_for_the_edge_wins_over_memory(monkeypatch):
    """handler.max_batch_tokens (tests/test_serving.py) sets edge.sizing.batch_tokens."""
    edge, asked = gpu_like_edge(monkeypatch, 80 * GIB)
    edge.sizing.batch_tokens = 16384
    assert edge.sizing.pairs(GRIDS["1080p"]) == 2 and asked == []


def test_the_cpu_keeps_its_token_budget():
    assert sizing.default_batch_tokens(torch.device("cpu")) == sizing.CPU_BATCH_TOKENS


def test_the_free_memory_counts_what_the_allocator_holds_unused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 6 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2 * GIB)
    assert sizing.free_memory(torch.device("cuda:0")) == 14 * GIB


@pytest.mark.parametrize("capability, expected", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp32")])
def test_a_gpu_runs_bf16_by_default_where_it_has_bf16_tensor_cores(monkeypatch, capability, expected):
    properties = SimpleNamespace(name="NVIDIA", major=capability[0], minor=capability[1])
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    cuda = torch.device("cuda:0")
    assert default_precision(cuda) == "auto"
    assert resolve(default_precision(cuda), cuda, check_bf16)[0] == expected


def test_a_cpu_runs_fp32_by_default_without_probing(monkeypatch):
    cpu = torch.device("cpu")
    probed = []
    assert resolve(default_precision(cpu), cpu, lambda device: probed.append(device) or Bf16Check(True, "x")) == ("fp32", "asked for")
    assert probed == []
