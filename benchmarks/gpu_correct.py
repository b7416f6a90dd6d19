"""The GPU check's correctness sections, which run first (benchmarks/gpu_check.py): the golden cases;
one graphed edge under three threads, each on a stream of its own; the served edge's preparation
thread beside its forwards; the CPU against the GPU.

Under the threads, each key (a frame size and a batch) runs pairs A, B and A again (A'): A and B
against the eager forward as the fidelity contract says (fp32: within one 8-bit level on under 0.1%
of the values, harness/rounding.py; bf16: bf16's own bounds against fp32, max 0.03 and mean 0.005),
A' equal to A bit for
bit, every thread's middles equal. Then what a graph reads is put at risk: the embedding cache
cleared, the garbage collected, the allocator's cache emptied, fresh allocations filled with NaN;
the same replays must give the same middles, bit for bit (a graph that read freed memory would now
read NaN). On a CPU (``--quick``) the graphs are the stand-in that keeps what CUDA keeps
(eden_serve/edge/graphs.py), and the streams are nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from eden_serve import wire
from eden_serve.cloud.encoder import CloudEncoder
from eden_serve.config import PRESETS
from eden_serve.edge import Acceleration, EdgeModel, middles_of
from eden_serve.edge.conditions import EdgeSide
from eden_serve.edge.graphs import RerunGraphs
from eden_serve.model import synthetic
from eden_serve.model import weights as model_module
from eden_serve.model.checkpoint import WEIGHTS_FILES, module_from_state, write_halves
from eden_serve.serving.services import EdgeService
from eden_serve.serving.worker import Settings
from eden_serve.wire.raw import whole_raw
from harness.rounding import rounding_difference

import gpu_served

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
BOUNDS = {"fp32": 1e-4, "bf16_max": 0.03, "bf16_mean": 0.005}  # the CPU tests' (tests/test_edge.py)
THREADS = 3
NAN_FILL = 8 << 30  # bytes at most of fresh allocations filled with NaN (half the free memory at most)
# (float32 elements, count): the allocator's small blocks (under 1 MB, in 2 MB segments) and middling
# ones, where the embeddings of small frames were, before the large ones.
FILL_PIECES = ((128 << 10, 256), (1 << 20, 64))


def golden_case(name: str):
    data = np.load(GOLDEN / f"{name}.npz")
    meta = json.loads(str(data["config"]))
    state = {k.removeprefix("weights/"): torch.from_numpy(data[k]) for k in data.files if k.startswith("weights/")}
    frames = [torch.from_numpy(data[k]).permute(2, 0, 1).float() / 255 for k in ("frame0", "frame1")]
    return state, frames, meta["noise_seed"], torch.from_numpy(data["output"])


def within(error: torch.Tensor, precision: str) -> bool:
    worst, mean = error.max().item(), error.mean().item()
    return worst <= BOUNDS["fp32"] if precision == "fp32" else worst < BOUNDS["bf16_max"] and mean < BOUNDS["bf16_mean"]


def golden(run, modes=("eager", "graphed")) -> None:
    """The golden cases (tiny model) in each precision and mode (eager on both paths), within the
    CPU tests' bounds of the official output."""
    tiny = PRESETS["tiny"]
    for name in ("tiny_70x100", "tiny_64x96"):
        state, frames, seed, expected = golden_case(name)
        cloud = CloudEncoder(module_from_state(state, "cloud", tiny), tiny, run.device)
        cond = cloud.encode(*(f.to(run.device) for f in frames), seed=seed)
        for precision in run.precisions():
            for mode, path in [(m, p) for m in modes for p in (("fast", "reference") if m == "eager" else ("fast",))]:
                edge = run.edge(precision, mode, state, tiny)
                error = (middles_of(edge, [cond], uint8=False, path=path)[0] - expected).abs()
                run.row("golden", case=name, precision=precision, mode=mode, path=path, max_error=error.max().item(),
                        mean_error=error.mean().item(), within_bounds=within(error, precision))
                edge.runner.close()


def middles_agree(got: torch.Tensor, expected: torch.Tensor, precision: str) -> tuple[bool, dict]:
    """8-bit middles against the eager ones, as the fidelity contract says for ``precision``."""
    levels = (got.int() - expected.int()).abs()
    if precision == "fp32":
        held = rounding_difference(got.numpy(), expected.numpy()) is None
    else:
        held = within(levels.float() / 255, precision)
    return held, {"max_levels": levels.max().item(), "share_differing": (levels > 0).float().mean().item()}


def put_at_risk(run) -> list[torch.Tensor]:
    """The embedding cache cleared, the garbage collected, the allocator's cache emptied, then fresh
    allocations filled with NaN (kept until the caller drops them)."""
    model_module.EMBEDDINGS.clear()
    gc.collect()
    if run.device.type != "cuda":
        return [torch.full((1 << 22,), float("nan"))]
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(run.device)
    fill = [torch.full((n,), float("nan"), device=run.device) for n, count in FILL_PIECES for _ in range(count)]  # both pools' blocks
    large = (min(NAN_FILL, free // 2) - sum(t.numel() * 4 for t in fill)) // (256 << 20)
    return fill + [torch.full((64 << 20,), float("nan"), device=run.device) for _ in range(max(0, large))]


def _thread_stream(run):
    return torch.cuda.stream(torch.cuda.Stream(run.device)) if run.device.type == "cuda" else contextlib.nullcontext()


def graphs_under_threads(run) -> None:
    """One graphed edge, three threads on streams of their own, pairs A, B, A' per key, before and
    after what the graphs read was put at risk (the module's docstring)."""
    size = (64, 96) if run.args.quick else (256, 448)
    precision = run.precisions()[-1]
    eager, graphed = run.edge(precision, "eager"), run.edge(precision, "graphed")
    keys = {"batch 1": 1, "batch 3 (graph of 4)": 3}
    a, b = run.pairs(eager, size, 3, chunk_seed=1), run.pairs(eager, size, 3, chunk_seed=2)
    expected = {(key, name): middles_of(eager, pairs[:n]) for key, n in keys.items() for name, pairs in (("A", a), ("B", b))}
    start = threading.Barrier(THREADS)

    def thread(_):
        start.wait(timeout=60)
        with _thread_stream(run):
            return {(key, name): middles_of(graphed, pairs[:n]) for key, n in keys.items() for name, pairs in (("A", a), ("B", b), ("A'", a))}

    def rounds():
        with ThreadPoolExecutor(THREADS) as pool:
            return list(pool.map(thread, range(THREADS)))

    first = rounds()
    fill = put_at_risk(run)
    second = rounds()
    del fill
    for key in keys:
        for name in ("A", "B", "A'"):
            outs = [r[key, name] for r in first]
            agree = [middles_agree(out, expected[key, name.rstrip("'")], precision) for out in outs]
            run.row("graphs under threads", size=f"{size[0]}x{size[1]}", precision=precision, key=key, pair=name,
                    within_bounds=all(held for held, _ in agree), **max((found for _, found in agree), key=lambda f: f["max_levels"]),
                    threads_equal=all(torch.equal(out, outs[0]) for out in outs),
                    replay_equal=name != "A'" or all(torch.equal(r[key, "A'"], r[key, "A"]) for r in first),
                    equal_after_reuse=all(torch.equal(s[key, name], f[key, name]) for s, f in zip(second, first)),
                    graphs=len(graphed.runner.graphs), eager_keys=len(graphed.runner.graphs.eager))
    graphed.runner.close()


def preparation_beside_forwards(run) -> None:
    """The served edge (graphed, uncompiled) answering worker calls of four requests, each opened on
    its preparation thread while the forwards of the one before run: each middle against the eager
    edge's, then again after what the graphs read was put at risk."""
    size = (64, 96) if run.args.quick else (256, 448)
    with tempfile.TemporaryDirectory(prefix="eden-gpu-correct-") as scratch:
        write_halves(run.state(), Path(scratch), run.config)
        settings = Settings(precision="auto" if run.device.type == "cuda" else "fp32", raw_answers="any", compile=None)
        model = EdgeService.load_model(Path(scratch) / WEIGHTS_FILES["edge"], run.device, settings)
        if run.device.type != "cuda":
            model.accelerate(Acceleration(compile=None), RerunGraphs())
        service = EdgeService(model, settings, gpu_served.Context(Path(scratch), {}))
        chunks = [synthetic.chunk(run.config, size, frames=5, seed=10 + r) for r in range(4)]
        bodies = [wire.encode(chunk, run.config, "fp32") for chunk in chunks]
        eager = EdgeModel(module_from_state(run.state(), "edge", run.config), run.config, run.device, model.precision)
        eager.accelerate(Acceleration("off", None))
        expected = [middles_of(eager, [EdgeSide(eager).receive(c).pair(j) for j in range(c.pairs)]) for c in chunks]
        answers = []
        for _ in range(2):
            fill = put_at_risk(run) if answers else None
            outcomes, _ = gpu_served.call(service, bodies, "raw")
            answers.append([np.stack(whole_raw(body, c.pairs, (size[1], size[0]), "")) for body, c in zip(outcomes, chunks)])
            del fill
        agree = [middles_agree(torch.from_numpy(got), want, model.precision) for got, want in zip(answers[0], expected)]
        run.row("preparation beside forwards", size=f"{size[0]}x{size[1]}", precision=model.precision, requests=len(bodies),
                within_bounds=all(held for held, _ in agree), max_levels=max(found["max_levels"] for _, found in agree),
                equal_after_reuse=all(np.array_equal(x, y) for x, y in zip(answers[0], answers[1])),
                prepared_ahead=service.preparation.ahead)
        service.preparation.close()
        model.runner.close()


def devices_agree(run) -> None:
    """The same pair, seed and weights on the CPU and on the GPU, fp32 (256x448)."""
    if run.device.type == "cpu":
        return
    size, outputs = (256, 448), {}
    for where in ("cpu", run.device):
        edge = EdgeModel(module_from_state(run.state(), "edge", run.config), run.config, where, "fp32")
        edge.accelerate(Acceleration("off", None))
        outputs[str(where)] = middles_of(edge, run.pairs(edge, size, 1), uint8=False)[0]
    diff = (outputs["cpu"] - outputs[str(run.device)]).abs()
    run.row("cpu vs device", size=f"{size[0]}x{size[1]}", max_abs_diff=diff.max().item(), mean_abs_diff=diff.mean().item(),
            within_bounds=diff.max().item() <= BOUNDS["fp32"])


def pairs_of(edge: EdgeModel, size: tuple[int, int], count: int, chunk_seed: int = 1) -> list:
    """``count`` pairs of ``size`` on ``edge``'s device: one synthetic chunk's pair, each with a seed of its own."""
    pair = EdgeSide(edge).receive(synthetic.chunk(edge.config, size, frames=2, seed=chunk_seed)).pair(0)
    return [dataclasses.replace(pair, seed=i) for i in range(count)]
