"""The pure edge forward (eden_serve/edge/forward.py): bit for bit what the eager forward computed
step by step, run on the device alone (no host work, no state), and the same through static
buffers replayed as a CUDA graph replays them."""

import contextlib
import gc
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eden_serve.cloud.encoder import CloudEncoder
from eden_serve.config import PRESETS
from eden_serve.edge import Acceleration, EdgeModel, initial_noise, middles_of
from eden_serve.edge.blocks import query_blocks
from eden_serve.edge.forward import as_uint8
from eden_serve.edge.graphs import RerunGraphs
from eden_serve.edge.precision import Bf16Check
from eden_serve.media.frames import load_frame
from eden_serve.model import weights as model_module
from eden_serve.model.checkpoint import module_from_state
from eden_serve.model.synthetic import state_dict as synthetic_state_dict
from eden_serve.model.weights import EdgeWeights, pos_embedding
from eden_serve.wire import Conditions

REAL_FRAMES = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))[:4]  # 160x68, before the cut


def stepwise(edge: EdgeModel, batch) -> torch.Tensor:
    """The eager forward as it was written before the pure one (fp32, on the CPU): the noise drawn,
    the tensors made from Python values and each pair's condition tokens gathered inside it, then
    G_DiT and D_dec through the model's fast blocks."""
    cfg, w, impl = edge.config, edge.weights, edge.paths["fast"]
    (ph, pw), b, p = batch[0].grid, len(batch), cfg.patch_size
    cond = impl.dit_conditions(*(torch.cat([query_blocks(c.cond_dit[i], ph, pw) for c in batch]) for i in (0, 1)))
    difference = torch.tensor([[c.difference] for c in batch])
    z = torch.cat([initial_noise(c.seed, (ph // 2) * (pw // 2), cfg) for c in batch])
    for t0, t1 in zip(cfg.timesteps[:-1], cfg.timesteps[1:]):
        c = w.denoise_timestep_embedder(torch.tensor([t0])) + w.difference_embedder(difference)
        mods = w.adaLN_modulation(c)[:, None].chunk(6, dim=-1)
        x = w.proj_in(z) + pos_embedding(cfg, ph, pw, 2)
        for blk in w.dit_blocks:
            x = impl.dit_block(blk, x, mods, cond)
        z = z + (t1 - t0) * w.proj_out(w.norm_out(x))[..., : cfg.latent_dim].float()
    latents = z / cfg.vae_scaler + cfg.vae_shift
    cond = impl.decoder_conditions(*(torch.cat([c.cond_dec[i] for c in batch]) for i in (0, 1)))
    q = w.proj_token(latents)
    up = torch.nn.functional.interpolate(q.transpose(1, 2).reshape(b, -1, ph // 2, pw // 2), scale_factor=2, mode="bicubic",
                                         align_corners=False)
    r = up.flatten(2).transpose(1, 2) + pos_embedding(cfg, ph, pw, 1)
    q = q + pos_embedding(cfg, ph, pw, 2)
    for blk in w.decoder_blocks:
        r = impl.decoder_block(blk, r, q, cond)
    image = w.unpatchify(r).reshape(b, ph, pw, p, p, 3).permute(0, 5, 1, 3, 2, 4).reshape(b, 3, ph * p, pw * p)
    stats = torch.tensor([[c.mean, c.std] for c in batch])[:, :, None, None, None]
    image = image * stats[:, 1] + stats[:, 0]
    (height, width), (top, _, left, _) = batch[0].size, cfg.padding(*batch[0].size)
    return image[:, :, top : top + height, left : left + width].clamp(0, 1)


@pytest.fixture(scope="module")
def official():
    """Official dimensions (synthetic weights) and a real chunk: three pairs of video frames."""
    config = PRESETS["official"]
    state = synthetic_state_dict(config, seed=3)
    cloud = CloudEncoder(module_from_state(state, "cloud", config), config)
    edge = EdgeModel(module_from_state(state, "edge", config), config)
    chunk = cloud.encode_chunk([load_frame(path) for path in REAL_FRAMES], seed=9)
    return edge, [chunk.pair(j) for j in range(chunk.pairs)]


def test_the_pure_forward_equals_the_stepwise_forward_bit_for_bit(golden):
    cond = golden.cloud().encode(golden.frame0, golden.frame1, seed=golden.seed)
    edge = golden.edge()
    pure = edge.forward(edge.prepare([cond]), uint8=False)
    with torch.inference_mode():
        assert torch.equal(pure, stepwise(edge, [cond]))
    assert (pure[0] - golden.arrays["output"]).abs().max().item() <= 1e-4  # and still the official output


@pytest.mark.slow  # two encoders run: the whole suite's, not the inner loop's
def test_the_pure_forward_of_a_real_chunk_equals_the_stepwise_forward_bit_for_bit(official):
    edge, pairs = official
    with torch.inference_mode():
        expected = stepwise(edge, pairs)
    assert torch.equal(edge.forward(edge.prepare(pairs), uint8=False), expected)
    assert torch.equal(middles_of(edge, pairs, uint8=False), expected)
    assert torch.equal(middles_of(edge, pairs), as_uint8(expected.clone()))


def graphed(edge: EdgeModel) -> RerunGraphs:
    api = RerunGraphs()
    edge.accelerate(Acceleration(capture_at=1), graph_api=api)
    return api


def test_replayed_graphs_equal_the_eager_forward_bit_for_bit(golden):
    """Static buffers filled, the stages replayed: the eager forward's middles, for each case in
    turn through the same graphs (the second replay reads its own inputs, not the first's)."""
    cloud, edge = golden.cloud(), golden.edge()
    pairs = [cloud.encode(golden.frame0, golden.frame1, seed=seed) for seed in (golden.seed, 7)]
    eager = [middles_of(edge, [pair], uint8=False) for pair in pairs]
    api = graphed(edge)
    replayed = [middles_of(edge, [pair], uint8=False) for pair in pairs]
    assert api.captured == 2 and len(edge.runner.graphs) == 2  # sample and render, once each
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager))
    assert not torch.equal(replayed[0], replayed[1])
    assert torch.equal(middles_of(edge, pairs[:1]), as_uint8(eager[0].clone()))


@pytest.mark.slow  # two encoders run: the whole suite's, not the inner loop's
def test_a_batch_replays_from_the_graph_of_its_bucket(official):
    """Three pairs run in the graph of four (the fourth row holds earlier inputs): each middle as
    the eager batch's within float rounding (tests/test_edge.py's batch bound), four bit for bit."""
    edge, pairs = official
    four = pairs + pairs[:1]
    eager_three, eager_four = middles_of(edge, pairs, uint8=False), middles_of(edge, four, uint8=False)
    graphed(edge)
    try:
        assert torch.equal(middles_of(edge, four, uint8=False), eager_four)
        three = middles_of(edge, pairs, uint8=False)
        assert three.shape == eager_three.shape and (three - eager_three).abs().max().item() <= 1e-5
        assert {key[:2] for key in edge.runner.graphs.keys()} == {("sample", 4), ("render", 4)}
    finally:
        edge.accelerate(Acceleration())


def test_a_graph_holds_its_positional_embeddings_past_the_cache(tiny_state):
    """A graph reads the embeddings it was captured with: evicted from the cache, they stay alive
    while the graph does, and go with it."""
    config = PRESETS["tiny"]
    edge = EdgeModel(module_from_state(tiny_state, "edge", config), config)
    graphed(edge)
    tokens = torch.randn(2, 6 * 8, config.hidden_dim, generator=torch.Generator().manual_seed(0))
    pair = conditions(tokens, (6, 8))
    inputs = edge.prepare([pair])
    first = edge.forward(inputs)
    held = weakref.ref(inputs.render.pos_patch)
    del inputs
    model_module.EMBEDDINGS.clear()
    gc.collect()
    assert held() is not None
    assert torch.equal(edge.forward(edge.prepare([pair])), first)
    edge.runner.graphs.clear()
    model_module.EMBEDDINGS.clear()
    gc.collect()
    assert held() is None


def conditions(tokens: torch.Tensor, grid: tuple[int, int]) -> Conditions:
    """A pair of the tiny model's frames a few pixels short of ``grid``'s (so that the crop counts)."""
    side = PRESETS["tiny"].patch_size
    return Conditions(tokens, tokens.flip(0), 0.45, 0.2, 0.3, grid, (grid[0] * side - 5, grid[1] * side - 3), seed=5)


# --- no host work -------------------------------------------------------------------------------


class HostWork(TorchDispatchMode):
    """Fails on an operation that makes or reads a tensor of the host: a tensor made from Python
    values (``lift_fresh``), a value read back (``_local_scalar_dense``), and where the forward runs
    on the meta device, any CPU tensor among an operation's arguments."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        on_host = self.device.type != "cpu" and any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in leaves)
        if on_host or func in (torch.ops.aten.lift_fresh.default, torch.ops.aten._local_scalar_dense.default):
            raise AssertionError(f"host work in the forward: {func}")
        return func(*args, **(kwargs or {}))


def refused(*_args, **_kwargs):
    raise AssertionError("host work in the forward")


@contextlib.contextmanager
def no_host_work(monkeypatch, device: torch.device):
    """The forward must not make tensors from Python values, copy to the host, pin memory or wait."""
    with monkeypatch.context() as patch:
        for owner, name in ((torch, "tensor"), (torch, "as_tensor"), (torch, "from_numpy"), (torch.Tensor, "tolist"),
                            (torch.Tensor, "item"), (torch.Tensor, "cpu"), (torch.Tensor, "numpy"),
                            (torch.Tensor, "pin_memory"), (torch.cuda, "synchronize")):
            patch.setattr(owner, name, refused)
        with HostWork(device):
            yield


def tiny_edge(device: str, precision: str) -> EdgeModel:
    """On the meta device nothing is computed, and a tensor on the wrong device fails as on a GPU;
    autocast has no meta device, so bf16 runs on the CPU."""
    config = PRESETS["tiny"]
    with torch.device(device):
        weights = EdgeWeights(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 on a CPU without it
        return EdgeModel(weights, config, device, precision, bf16_check=lambda device: Bf16Check(True, "assumed"))


@pytest.mark.parametrize("device, precision", [("meta", "fp32"), ("cpu", "bf16")])
def test_the_forward_does_no_host_work_and_keeps_no_state(monkeypatch, device, precision):
    edge = tiny_edge(device, precision)
    tokens = torch.zeros(2, 6 * 8, edge.config.hidden_dim, device=device)
    inputs = edge.prepare([conditions(tokens, (6, 8))] * 3)
    fast = edge.paths["fast"]
    before = (dict(vars(edge)), dict(vars(fast)))
    with no_host_work(monkeypatch, edge.device):
        middles = edge.forward(inputs)
        floats = edge.forward(inputs, uint8=False)
    assert (middles.device.type, middles.dtype, middles.shape) == (device, torch.uint8, (3, 91, 125, 3))
    assert (floats.dtype, floats.shape) == (torch.float32, (3, 3, 91, 125))
    assert (dict(vars(edge)), dict(vars(fast))) == before
    assert inputs.render.latents is None  # the caller's inputs are left as they were


def test_the_host_work_check_catches_host_work(monkeypatch):
    """The checks above would see a forward that read a value back or made a tensor from a list."""
    x = torch.zeros(3, device="meta")
    for work in (lambda: torch.tensor([1.0, 2.0]).to("meta"), lambda: x + torch.ones(3), lambda: x.sum().item(),
                 lambda: x.cpu()):
        with pytest.raises((AssertionError, RuntimeError)), no_host_work(monkeypatch, x.device):
            work()
