"""The edge half, G_DiT + D_dec, against the official implementation's outputs (tests/golden), and
its two attention paths against each other."""

import math
import time

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eden_serve import wire
from eden_serve.cloud.encoder import CloudEncoder
from eden_serve.config import PRESETS, preset
from eden_serve.edge import EdgeModel, StageClock, initial_noise, middles_of, upload
from eden_serve.edge.blocks import _modulated
from eden_serve.edge.conditions import EdgeSide
from eden_serve.edge.kernels import Linears, bicubic_2x, modulated_layer_norm, onednn_linear_available
from eden_serve.edge.precision import Bf16Check
from eden_serve.edge.sizing import CPU_BATCH_TOKENS, batches
from eden_serve.media.frames import to_uint8
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import module_from_state
from eden_serve.model.synthetic import frame_pair
from eden_serve.model.synthetic import state_dict as synthetic_state_dict
from eden_serve.model.weights import EdgeWeights, Mlp


def test_noise_contract_matches_golden(golden):
    """The seed's noise, up to the last bits of the math that turns uniform draws into normal ones:
    vectorized on AVX2 and AVX512, scalar otherwise (docs/gpu.md: up to 1.1e-6 apart)."""
    noise = golden.arrays["noise"]
    drawn = initial_noise(golden.seed, noise.shape[1], golden.config)
    assert (drawn - noise).abs().max().item() <= 4e-6
    assert (initial_noise(golden.seed + 1, noise.shape[1], golden.config) - noise).abs().max().item() > 0.1


def middle(edge: EdgeModel, cond, path: str = "fast") -> torch.Tensor:
    """One pair's middle, [3, H, W] float32 in [0, 1], through the edge's one way in."""
    return middles_of(edge, [cond], uint8=False, path=path)[0]


def test_both_paths_reproduce_golden_output(golden):
    cond = golden.cloud().encode(golden.frame0, golden.frame1, seed=golden.seed)
    edge = golden.edge()
    for path in ("reference", "fast"):
        out = middle(edge, cond, path)
        assert out.shape == golden.arrays["output"].shape
        assert (out - golden.arrays["output"]).abs().max().item() <= 1e-4, path
        u8 = (out * 255).round().to(torch.int16)
        # A value within 1e-4 of a rounding boundary may land on the other side.
        assert (u8 - golden.arrays["output_u8"].to(torch.int16)).abs().max().item() <= 1, path


def test_bf16_stays_close_to_fp32(golden):
    """bf16 matrix products: measured max 6.6e-3, mean 1.1e-3 on tests/golden; bound 4x that."""
    cond = golden.cloud().encode(golden.frame0, golden.frame1, seed=golden.seed)
    out = middle(golden.edge("bf16"), cond)
    error = (out - golden.arrays["output"]).abs()
    assert error.max().item() < 0.03 and error.mean().item() < 0.005


@pytest.mark.slow  # official dimensions or real video: the whole suite's, not the inner loop's
def test_fast_path_equals_reference_with_official_dimensions():
    config = PRESETS["official"]
    state = synthetic_state_dict(config, seed=3)
    cloud = CloudEncoder(module_from_state(state, "cloud", config), config)
    edge = EdgeModel(module_from_state(state, "edge", config), config)
    cond = cloud.encode(*frame_pair(50, 70), seed=5)
    fast, reference = middle(edge, cond, "fast"), middle(edge, cond, "reference")
    assert (fast - reference).abs().max().item() <= 1e-4


def test_seed_changes_output_and_same_seed_repeats(tiny_models):
    cloud, edge = tiny_models
    frames = frame_pair(40, 60)
    a, b, c = (middle(edge, cloud.encode(*frames, seed=s)) for s in (0, 0, 1))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_batched_pairs_equal_one_at_a_time(tiny_models):
    """A batch of pairs gives each pair's frame up to float rounding: measured max 1.8e-7 here,
    which moves a rare pixel across an 8-bit rounding boundary."""
    cloud, edge = tiny_models
    frames = [torch.from_numpy(np.array(f)).permute(2, 0, 1).float() / 255 for f in synthetic.clip(5, 70, 100)]
    chunk = cloud.encode_chunk(frames, seed=11)
    pairs = [chunk.pair(j) for j in range(chunk.pairs)]
    for path in ("fast", "reference"):
        one = torch.stack([middle(edge, pair, path) for pair in pairs])
        batched = middles_of(edge, pairs, uint8=False, path=path)
        assert batched.shape == (4, 3, 70, 100)
        assert (batched - one).abs().max().item() <= 1e-5, path
    assert not torch.equal(one[0], one[1])  # the pairs differ, so the batch did not mix them up


def test_the_forwards_clock_times_its_stages(tiny_models):
    """A clock given to the forward is marked as G_DiT and then D_dec end: the seconds of each
    stage, the host's preparation in the first, together no longer than the calls took."""
    cloud, edge = tiny_models
    pairs = [cloud.encode(*frame_pair(40, 60), seed=s) for s in (1, 2)]
    start = time.perf_counter()
    clock = StageClock(edge.device)
    timed = edge.to_host(edge.forward(edge.prepare(pairs), clock=clock))
    wall = time.perf_counter() - start
    seconds = clock.seconds()
    assert list(seconds) == ["denoise", "decode"]
    assert all(spent > 0 for spent in seconds.values()) and sum(seconds.values()) <= wall
    assert torch.equal(timed, middles_of(edge, pairs))  # the clock changes nothing


class _Event:
    """``torch.cuda.Event`` as far as the clock uses it: recorded on the stream given, else on the
    current device's current stream, as PyTorch's ``record`` does."""

    def __init__(self, enable_timing=False, blocking=False):
        self.stream = None

    def record(self, stream=None):
        self.stream = torch.cuda.current_stream() if stream is None else stream

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 1.0


def test_the_clock_of_a_second_gpu_marks_that_gpus_stream(monkeypatch):
    """With ``--device cuda:1`` (or ``cuda:0,cuda:1``) the thread's current GPU stays 0: the
    clock's marks go on the edge's GPU's stream, where its stages run."""
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: ("stream of GPU", torch.cuda.current_device() if device is None else torch.device(device).index))
    clock = StageClock(torch.device("cuda:1"))
    clock.mark("denoise")
    clock.mark("decode")
    assert [event.stream for _, event in clock.marks] == [("stream of GPU", 1)] * 3
    assert clock.seconds() == {"denoise": 1e-3, "decode": 1e-3}


def test_batches_stay_within_the_token_budget():
    assert [list(b) for b in batches(range(7), 100, 250)] == [[0, 1], [2, 3], [4, 5], [6]]
    assert [list(b) for b in batches(range(3), 100, 50)] == [[0], [1], [2]]  # at least one pair each
    assert [list(b) for b in batches(range(3), 100, 10**6)] == [[0, 1, 2]]


def test_the_batch_budget_on_a_cpu_is_a_token_budget(tiny_models):
    """On a CPU only small frames batch (README "Clip chunks"): 6 pairs at 136x240, 2 at 256x448,
    one at 480x854 with the official patch grid (a GPU's: tests/test_sizing.py)."""
    _, edge = tiny_models
    assert edge.sizing.batch_tokens == CPU_BATCH_TOKENS == 1024
    official = preset("official")
    sizes = [len(next(batches(range(17), math.prod(official.patch_grid(h, w)), edge.sizing.batch_tokens)))
             for h, w in ((136, 240), (256, 448), (480, 854))]
    assert sizes == [6, 2, 1]
    assert [edge.sizing.pairs(official.patch_grid(h, w)) for h, w in ((136, 240), (256, 448), (480, 854))] == sizes


# --- devices ------------------------------------------------------------------------------------


def meta_edge(precision: str = "fp32") -> EdgeModel:
    """The tiny edge on the meta device: shapes and devices are checked, nothing is computed, so a
    tensor made on the wrong device fails here as it would on a GPU."""
    config = PRESETS["tiny"]
    with torch.device("meta"):
        weights = EdgeWeights(config)
    return EdgeModel(weights, config, "meta", precision, bf16_check=lambda device: Bf16Check(True, "meta"))


def test_both_paths_keep_every_tensor_on_the_models_device(tiny_models):
    cloud, _ = tiny_models
    edge = meta_edge()
    frames = [torch.from_numpy(np.array(f)).permute(2, 0, 1).float() / 255 for f in synthetic.clip(3, 40, 60)]
    for codec in ("fp32", "bf16+zstd", "int8"):
        chunk = EdgeSide(edge).receive(wire.decode(wire.encode(cloud.encode_chunk(frames), cloud.config, codec), edge.config))
        dtype = {"fp32": torch.float32, "bf16+zstd": torch.bfloat16, "int8": torch.int8}[codec]
        assert (chunk.cond_dit.values.device.type, chunk.cond_dit.values.dtype) == ("meta", dtype)  # as it travelled
        pairs = [chunk.pair(j) for j in range(chunk.pairs)]
        assert pairs[0].cond_dec.device.type == "meta" and pairs[0].cond_dec.dtype == torch.float32
        for path in ("fast", "reference"):
            inputs = edge.prepare(pairs)
            assert inputs.sample.noise.device.type == "meta" and inputs.render.cond_dec.device.type == "meta"
            pixels = edge.forward(inputs, uint8=False, path=path)
            assert pixels.device.type == "meta" and pixels.shape == (2, 3, 40, 60)


def test_uint8_middles_round_as_to_uint8_does(tiny_models):
    cloud, edge = tiny_models
    frames = [torch.from_numpy(np.array(f)).permute(2, 0, 1).float() / 255 for f in synthetic.clip(3, 40, 60)]
    chunk = cloud.encode_chunk(frames, seed=4)
    pairs = [chunk.pair(j) for j in range(chunk.pairs)]
    u8 = middles_of(edge, pairs)
    assert u8.dtype == torch.uint8 and u8.shape == (2, 40, 60, 3)
    assert all(np.array_equal(u8[i].numpy(), to_uint8(frame)) for i, frame in enumerate(middles_of(edge, pairs, uint8=False)))


def test_a_batch_is_modulated_by_one_layer_norm():
    """One LayerNorm kernel for the whole batch (not one per pair), equal to each pair's own."""
    norm = torch.nn.LayerNorm(16, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    generator = torch.Generator().manual_seed(0)
    x, shift, scale = torch.randn(5, 7, 16, generator=generator), torch.randn(5, 1, 16, generator=generator), torch.randn(5, 1, 16, generator=generator)
    with CountedOps() as counted, torch.no_grad():
        batched = _modulated(norm, x, shift, scale)
    assert counted.ops.count("aten.native_layer_norm.default") == 1
    with torch.no_grad():
        one_by_one = torch.stack([modulated_layer_norm(norm, x[b], shift[b, 0], scale[b, 0]) for b in range(5)])
    assert (batched - one_by_one).abs().max().item() < 1e-5


class CountedOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_warm_up_runs_the_smallest_frame(tiny_models):
    _, edge = tiny_models
    edge.warm_up()


def test_an_upload_to_a_gpu_is_pinned_and_does_not_wait(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin") or self)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: calls.append((args, kwargs)) or self)
    upload(torch.zeros(2), torch.device("cuda:1"))
    upload(torch.zeros(2), torch.device("meta"))
    monkeypatch.undo()
    assert calls == ["pin", ((torch.device("cuda:1"),), {"non_blocking": True}), ((torch.device("meta"),), {})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_mlps_gelu_fused_into_its_product_equals_the_modules(dtype):
    """oneDNN's GELU post-op (on the fp32 accumulators, before the hidden tokens are stored) against
    nn.Linear, exact GELU, nn.Linear: float32 rounding apart in fp32 (measured: bit for bit the same
    as the unfused oneDNN pair here), bf16's in bf16."""
    if not onednn_linear_available(torch.device("cpu"), dtype):
        pytest.skip(f"no oneDNN {dtype} linear on this CPU")
    torch.manual_seed(0)
    mlp = Mlp(64, 256)
    x = torch.randn(2, 37, 64)
    with torch.no_grad():
        expected = mlp(x)
        fused = Linears("onednn").mlp(mlp.to(dtype), x).float()
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    assert (fused - expected).abs().max().item() <= tolerance * expected.abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7, 112, 513])
def test_the_per_head_products_as_grouped_convolutions_equal_the_einsums(dtype, tokens):
    """The temporal attention's two per-head products through oneDNN (prepacked for 512 tokens)
    against the einsums, both ways, on a strided query view as the model gives it and with the
    official dimensions (12 heads of 64 into 768): float32 rounding in fp32, bf16's in bf16."""
    if not onednn_linear_available(torch.device("cpu"), dtype):
        pytest.skip(f"no oneDNN {dtype} products on this CPU")
    torch.manual_seed(tokens)
    weight = (torch.randn(3 * 768, 768) * 0.05).to(dtype)
    w_k, w_v = (weight[i * 768 : (i + 1) * 768].view(12, 64, 768) for i in (1, 2))
    q = torch.randn(tokens, 3, 12, 64).to(dtype)[:, 0]  # a view of a projection, as in the model
    mixed = torch.randn(tokens, 12, 768).to(dtype)
    linears = Linears("onednn")
    cases = [(linears.per_head(q, w_k, key=(weight, 768)), torch.einsum("thc,hcd->thd", q.float(), w_k.float())),
             (linears.per_head(mixed, w_v, transposed=True, key=(weight, 1536)),
              torch.einsum("thd,hcd->thc", mixed.float(), w_v.float()))]
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for got, expected in cases:
        assert got.shape == expected.shape and got.dtype == dtype
        assert (got.float() - expected).abs().max().item() <= tolerance * expected.abs().max().item()


@pytest.mark.parametrize("height, width", [(1, 1), (1, 3), (2, 2), (3, 5), (6, 8), (17, 30)])
def test_the_gpus_bicubic_taps_are_pytorchs_bicubic(height, width):
    """The decoder's x2 bicubic upsampling as the edge computes it on a GPU (four taps per axis on the
    tokens where they lie) against ``F.interpolate``, which the CPU runs: within float32's rounding,
    the borders' clamped reads included (grids of one or two tokens a side)."""
    tokens = torch.randn(2, height * width, 16, generator=torch.Generator().manual_seed(height * 100 + width))
    grid = tokens.transpose(1, 2).reshape(2, 16, height, width)
    expected = torch.nn.functional.interpolate(grid, scale_factor=2, mode="bicubic", align_corners=False).flatten(2).transpose(1, 2)
    got = bicubic_2x(tokens, height, width)
    assert got.shape == expected.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=4e-6)
    half = bicubic_2x(tokens.bfloat16(), height, width)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), bicubic_2x(tokens.bfloat16().float(), height, width).bfloat16().float(), rtol=0, atol=0)
