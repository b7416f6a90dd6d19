"""The edge on one GPU in one short run: correctness; the in-process clip (start-up and steady
state apart, defaults against the best options, the GPU's busy fraction) at 1080p and 480x854; the
video encoder and decoder alone; the top kernels of one 1080p pair; the edge alone per batch size
(eager, CUDA graphs), fp32 against bf16; torch.compile (block by block against whole stages, cold
and from the cache); the clip at 720p; and the place of the served edge.

    benchmarks/gpu_run.sh                                                     # on the GPU machine
    .venv/bin/python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu_check.jsonl   # here first

Official dimensions and synthetic weights at 480x854, 720p and 1080p (``--quick``: the tiny model at
small sizes). Each result is a JSON line in ``--out`` as soon as it is measured, each section runs on
its own (one failure does not lose the rest), in order of importance, and the run keeps within
``--budget`` seconds (what would not fit is recorded as skipped; the last :data:`RESERVE` seconds are
the served edge's), and a short table closes it. On a CPU the "graphed" rows replay through the
stand-in for CUDA graphs (eden_serve/edge/graphs.py): they try the code, their times mean nothing.
Runs from the checkout (the package importable); needs tests/golden and a real video (benchmarks/gpu_clip.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eden_serve.model import synthetic  # noqa: E402
from eden_serve.model.checkpoint import module_from_state  # noqa: E402
from eden_serve.cloud.encoder import CloudEncoder  # noqa: E402
from eden_serve.config import PRESETS  # noqa: E402
from eden_serve.edge import Acceleration, EdgeModel, middles_of  # noqa: E402
from eden_serve.edge.conditions import EdgeSide  # noqa: E402
from eden_serve.edge.graphs import RerunGraphs  # noqa: E402
from eden_serve.edge.precision import check_bf16  # noqa: E402
from eden_serve.edge.sizing import bytes_per_pair, free_memory, pairs_for_memory  # noqa: E402

import gpu_clip  # noqa: E402  (benchmarks/, beside this script)
import gpu_compile  # noqa: E402

GOLDEN = REPO / "tests" / "golden"
BOUNDS = {"fp32": 1e-4, "bf16_max": 0.03, "bf16_mean": 0.005}  # the CPU tests' (tests/test_edge.py)
SIZES = {"480x854": (480, 854), "720p": (720, 1280), "1080p": (1080, 1920)}
QUICK_SIZES = {"64x96": (64, 96), "128x224": (128, 224)}
BATCHES = (1, 4, 16)  # the informative ones: one pair, the knee, the most the defaults take
MODES = ("eager", "graphed")
RESERVE = 40  # seconds kept for the served edge, the last section


class Run:
    """The run's device, clock and rows: each row a JSON line in ``--out`` as it comes."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.device = args, torch.device(args.device)
        self.deadline = time.monotonic() + args.budget
        self.config = PRESETS["tiny" if args.quick else "official"]
        self.sizes = QUICK_SIZES if args.quick else SIZES
        self.rows: list[dict] = []
        self._state: dict | None = None
        self._models: tuple | None = None
        args.out.parent.mkdir(parents=True, exist_ok=True)
        self.out = args.out.open("a")

    def left(self) -> float:
        """Seconds left to a section, the served edge's :data:`RESERVE` kept (a child's budget is its own)."""
        return self.deadline - time.monotonic() - (0 if self.args.in_child else RESERVE)

    def row(self, section: str, **fields) -> dict:
        row = {"section": section, **fields}
        self.rows.append(row)
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        print(json.dumps(row), flush=True)
        return row

    def state(self) -> dict:
        if self._state is None:
            self._state = synthetic.state_dict(self.config, seed=0)
        return self._state

    def models(self) -> tuple[CloudEncoder, EdgeModel]:
        """The two halves as ``eden-serve interpolate`` loads them (precision auto), made once."""
        if self._models is None:
            config, state = self.config, self.state()
            precision = "auto" if self.device.type == "cuda" else "fp32"
            self._models = (CloudEncoder(module_from_state(state, "cloud", config), config, self.device),
                            EdgeModel(module_from_state(state, "edge", config), config, self.device, precision))
        return self._models

    def precisions(self) -> tuple[str, ...]:
        """bf16 where it runs fast (a GPU from compute capability 8.0); on an AVX2 CPU it is ~600x slower."""
        return ("fp32", "bf16") if check_bf16(self.device).fast else ("fp32",)

    def edge(self, precision: str, mode: str, state: dict | None = None, config=None) -> EdgeModel:
        config = config or self.config
        edge = EdgeModel(module_from_state(state or self.state(), "edge", config), config, self.device, precision)
        if mode == "graphed":
            edge.accelerate(Acceleration("on" if self.device.type == "cuda" else "auto", None), self._stand_in())
        elif mode == "eager":
            edge.accelerate(Acceleration("off", None))
        return edge

    def _stand_in(self):
        return None if self.device.type == "cuda" else RerunGraphs()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def pairs_of(edge: EdgeModel, size: tuple[int, int], count: int) -> list:
    """``count`` pairs of ``size`` on ``edge``'s device: one synthetic chunk's pair, each with a seed of its own."""
    pair = EdgeSide(edge).receive(synthetic.chunk(edge.config, size, frames=2, seed=1)).pair(0)
    return [dataclasses.replace(pair, seed=i) for i in range(count)]


def timed_ms(run: Run, fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        run.sync()
        start = time.perf_counter()
        fn()
        run.sync()
        times.append((time.perf_counter() - start) * 1000)
    return times


# --- sections -------------------------------------------------------------------------------------


def environment(run: Run) -> None:
    cuda = run.device.type == "cuda"
    run.row("environment", torch=torch.__version__, cuda=torch.version.cuda, device=str(run.device),
            name=torch.cuda.get_device_name(run.device) if cuda else "cpu",
            capability=".".join(map(str, torch.cuda.get_device_capability(run.device))) if cuda else None,
            memory_gib=round(torch.cuda.get_device_properties(run.device).total_memory / 2**30, 1) if cuda else None,
            cpu_capability=torch.backends.cpu.get_cpu_capability(), threads=torch.get_num_threads(),
            config=run.config.name, budget_s=run.args.budget)


def golden_case(name: str):
    data = np.load(GOLDEN / f"{name}.npz")
    meta = json.loads(str(data["config"]))
    state = {k.removeprefix("weights/"): torch.from_numpy(data[k]) for k in data.files if k.startswith("weights/")}
    frames = [torch.from_numpy(data[k]).permute(2, 0, 1).float() / 255 for k in ("frame0", "frame1")]
    return state, frames, meta["noise_seed"], torch.from_numpy(data["output"])


def correctness(run: Run) -> None:
    """The golden cases (tiny model) in each precision, path and mode, within the CPU tests' bounds."""
    tiny = PRESETS["tiny"]
    for name in ("tiny_70x100", "tiny_64x96"):
        state, frames, seed, expected = golden_case(name)
        cloud = CloudEncoder(module_from_state(state, "cloud", tiny), tiny, run.device)
        cond = cloud.encode(*(f.to(run.device) for f in frames), seed=seed)
        for precision in run.precisions():
            for mode, path in (("eager", "fast"), ("eager", "reference"), ("graphed", "fast")):
                edge = run.edge(precision, mode, state, tiny)
                error = (middles_of(edge, [cond], uint8=False, path=path)[0] - expected).abs()
                worst, mean = error.max().item(), error.mean().item()
                within = worst <= BOUNDS["fp32"] if precision == "fp32" else worst < BOUNDS["bf16_max"] and mean < BOUNDS["bf16_mean"]
                run.row("golden", case=name, precision=precision, mode=mode, path=path, max_error=worst, mean_error=mean,
                        within_bounds=within)


def graphed_equals_eager(run: Run) -> None:
    """Official dimensions at the first size: a batch of 1 and of 3 (replayed in the graph of 4)."""
    name, size = next(iter(run.sizes.items()))
    for precision in run.precisions():
        eager, graphed = run.edge(precision, "eager"), run.edge(precision, "graphed")
        for batch in (1, 3):
            pairs = pairs_of(eager, size, batch)
            diff = (middles_of(graphed, pairs, uint8=False) - middles_of(eager, pairs, uint8=False)).abs().max().item()
            run.row("graphed vs eager", size=name, precision=precision, batch=batch, max_abs_diff=diff, within_rounding=diff <= 1e-5)


def devices_agree(run: Run) -> None:
    """The same pair, seed and weights on the CPU and on the GPU, fp32 (256x448; quick: 64x96)."""
    if run.device.type == "cpu":
        return
    size = (64, 96) if run.args.quick else (256, 448)
    outputs = {}
    for where in ("cpu", run.device):
        edge = EdgeModel(module_from_state(run.state(), "edge", run.config), run.config, where, "fp32")
        outputs[str(where)] = middles_of(edge, pairs_of(edge, size, 1), uint8=False)[0]
    diff = (outputs["cpu"] - outputs[str(run.device)]).abs()
    run.row("cpu vs device", size=f"{size[0]}x{size[1]}", max_abs_diff=diff.max().item(), mean_abs_diff=diff.mean().item())


def profiled(run: Run, edge: EdgeModel, inputs, forwards: int) -> dict:
    """One forward's kernel time, kernels and host launch calls under torch.profiler; aten
    operations too (on a CPU, the stand-in for kernels)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if run.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(forwards):
            edge.forward(inputs)
        run.sync()
        wall = (time.perf_counter() - start) * 1000
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    launches = [e for e in events if e.name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch"))]
    return {"kernel_ms": sum(e.time_range.elapsed_us() for e in kernels) / 1000 / forwards, "kernels": len(kernels) / forwards,
            "host_launches": len(launches) / forwards, "aten_ops": sum(e.name.startswith("aten::") for e in events) / forwards,
            "wall_ms_profiled": wall / forwards}


def gpu_busy(run: Run) -> None:
    """One pair per forward at the largest size: the GPU's kernel time over the wall time (timed
    without the profiler, whose host work would stretch it), and kernels per pair."""
    name, size = list(run.sizes.items())[-1]
    for precision in run.precisions():
        for mode in MODES:
            if run.left() < 20:
                run.row("gpu busy", size=name, precision=precision, mode=mode, skipped="out of time")
                continue
            edge = run.edge(precision, mode)
            inputs = edge.prepare(pairs_of(edge, size, 1))
            timed_ms(run, lambda: edge.forward(inputs), 3)  # warm-up (and capture)
            wall = statistics.median(timed_ms(run, lambda: edge.forward(inputs), run.args.repeat))
            found = profiled(run, edge, inputs, 3)
            busy = found["kernel_ms"] / wall if run.device.type == "cuda" else None
            run.row("gpu busy", size=name, precision=precision, mode=mode, wall_ms=wall, busy=busy, **found)


def kernels(run: Run) -> None:
    """The top kernels by GPU time (on a CPU: operations by CPU time) of one graphed pair at the
    largest size, in the fastest precision (``torch.profiler``'s key averages)."""
    name, size = list(run.sizes.items())[-1]
    precision = run.precisions()[-1]
    edge = run.edge(precision, "graphed")
    inputs = edge.prepare(pairs_of(edge, size, 1))
    timed_ms(run, lambda: edge.forward(inputs), 2)  # the capture
    run.row("kernels", size=name, precision=precision, mode="graphed", top=gpu_compile.top_kernels(run, lambda: edge.forward(inputs)))


def edge_alone(run: Run) -> None:
    """Each size in the fastest precision (bf16 on a GPU) at batches 1, 4 and 16, the others at one
    pair of the largest size, eager and graphed: ms per pair, pairs/s, the first call (a graph's
    capture), and the peak memory per pair (eager) against :mod:`eden_serve.edge.sizing`'s estimate."""
    batches = BATCHES[:2] if run.args.quick else BATCHES
    largest = list(run.sizes)[-1]
    for name, size in run.sizes.items():
        for precision in run.precisions():
            wanted = batches if precision == run.precisions()[-1] else (1,) if name == largest else ()
            if not wanted:
                continue
            edges = {mode: run.edge(precision, mode) for mode in MODES}
            pairs = pairs_of(edges["eager"], size, max(wanted))
            failed = set()
            for batch in wanted:
                for mode in MODES:
                    if mode in failed or run.left() < 15:
                        run.row("edge alone", size=name, precision=precision, batch=batch, mode=mode,
                                skipped="out of memory before" if mode in failed else "out of time")
                        continue
                    try:
                        measure(run, edges[mode], pairs[:batch], {"size": name, "precision": precision, "batch": batch, "mode": mode})
                    except torch.OutOfMemoryError:
                        failed.add(mode)
                        run.row("edge alone", size=name, precision=precision, batch=batch, mode=mode, skipped="out of memory")
            del edges
            release(run)


def measure(run: Run, edge: EdgeModel, pairs: list, labels: dict) -> None:
    inputs = edge.prepare(pairs)
    cuda = run.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(run.device)
        before = torch.cuda.memory_allocated(run.device)
    first = timed_ms(run, lambda: edge.forward(inputs), 1)[0]
    peak = (torch.cuda.max_memory_allocated(run.device) - before) / len(pairs) / 2**20 if cuda else None
    ms = statistics.median(timed_ms(run, lambda: edge.forward(inputs), run.args.repeat))
    grid = pairs[0].grid
    run.row("edge alone", **labels, ms_per_forward=ms, ms_per_pair=ms / len(pairs), pairs_per_s=1000 * len(pairs) / ms,
            first_call_ms=first, peak_mib_per_pair=peak if labels["mode"] == "eager" else None,
            estimated_mib_per_pair=bytes_per_pair(edge.config, grid) / 2**20,
            default_batch=pairs_for_memory(free_memory(run.device), edge.config, grid) if cuda else None)


def release(run: Run) -> None:
    if run.device.type == "cuda":
        torch.cuda.empty_cache()


def clip_largest(run: Run) -> None:
    """At the largest size, the defaults against every alternative (is the encoder the bound?)."""
    name, size = list(run.sizes.items())[-1]
    gpu_clip.clip_size(run, name, size, gpu_clip.ALTERNATIVES)


def clip_smallest(run: Run) -> None:
    name, size = next(iter(run.sizes.items()))
    gpu_clip.clip_size(run, name, size, {"graphs, not compiled": gpu_clip.ALTERNATIVES["graphs, not compiled"]})


def clip_middle(run: Run) -> None:
    if len(run.sizes) < 3:
        return
    name, size = list(run.sizes.items())[1]
    gpu_clip.clip_size(run, name, size, {})


def served_edge(run: Run) -> None:
    """The place kept for the served edge (issue 31, item 4), within the budget's last :data:`RESERVE` seconds."""
    run.row("served edge", status="not measured yet: the edge's service fed real payloads (issue 31, item 4) adds it here")


# In order of importance: what is cut when time runs out comes last.
SECTIONS = {"environment": environment, "correctness": correctness, "graphed_equals_eager": graphed_equals_eager,
            "devices_agree": devices_agree, "clip_largest": clip_largest, "clip_smallest": clip_smallest,
            "encoder": gpu_clip.encoder_speed, "kernels": kernels,
            "compiled": lambda run: gpu_compile.compiled(run, sys.modules[__name__]), "gpu_busy": gpu_busy,
            "edge_alone": edge_alone, "clip_middle": clip_middle, "served_edge": served_edge}


def table(rows: list[dict]) -> str:
    """The run in short: the clip (start-up, steady state, defaults against the best), the
    encoder, the edge alone (eager and graphed side by side), the GPU's busy fraction,
    compilation, and whether every correctness check held."""
    lines = gpu_clip.table(rows)
    lines += ["", "| size | precision | batch | eager ms/pair | graphed ms/pair | graphed pairs/s | speedup |",
              "|---|---|---:|---:|---:|---:|---:|"]
    alone = {(r["size"], r["precision"], r["batch"], r["mode"]): r for r in rows if r["section"] == "edge alone" and "ms_per_pair" in r}
    for size, precision, batch, mode in alone:
        if mode == "eager":
            eager, graphed = alone[size, precision, batch, "eager"], alone.get((size, precision, batch, "graphed"))
            cells = [f"{graphed['ms_per_pair']:.2f}", f"{graphed['pairs_per_s']:.1f}", f"{eager['ms_per_pair'] / graphed['ms_per_pair']:.2f}x"] \
                if graphed else ["", "", ""]
            lines.append(f"| {size} | {precision} | {batch} | {eager['ms_per_pair']:.2f} | " + " | ".join(cells) + " |")
    for r in rows:
        if r["section"] == "gpu busy" and "wall_ms" in r:
            busy = "n/a (CPU)" if r["busy"] is None else f"{r['busy']:.2f}"
            lines.append(f"gpu busy, {r['size']} {r['precision']} {r['mode']}, one pair: {busy} ({r['kernel_ms']:.1f} ms of kernels in "
                         f"{r['wall_ms']:.1f} ms; {r['kernels']:.0f} kernels, {r['host_launches']:.0f} host launches, {r['aten_ops']:.0f} aten ops)")
        if r["section"] == "compiled" and "ms_per_pair" in r:
            lines.append(f"compiled ({r['case']}, {r['backend']}), {r['size']} {r['precision']} batch {r['batch']}: {r['ms_per_pair']:.2f} "
                         f"ms/pair, first call {r['first_call_s']:.1f} s, max diff from eager {r['max_abs_diff_from_eager']:.1e}")
        if r["section"] in ("kernels", "compiled") and r.get("top"):
            top = "; ".join(f"{k['name'][:40]} {k['share']:.0%}" for k in r["top"][:5])
            lines.append(f"top kernels, {r['size']} {r.get('case', r.get('mode'))}: {top}")
    checks = [r for r in rows if "within_bounds" in r or "within_rounding" in r]
    held = sum(bool(r.get("within_bounds", r.get("within_rounding"))) for r in checks)
    failed = [r["section"] for r in rows if "failed" in r]
    lines.append(f"correctness: {held} of {len(checks)} checks within bounds; sections failed: {', '.join(failed) or 'none'}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="the tiny model at small sizes: to try the script on a CPU")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.jsonl"), help="JSON lines, appended as measured")
    parser.add_argument("--budget", type=float, help="seconds for the whole run (default 330 on a GPU, 170 on a CPU)")
    parser.add_argument("--repeat", type=int, help="timed forwards per configuration, after the first (default 5; quick 2)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--in-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile-case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.budget = args.budget or (330 if args.device.startswith("cuda") else 170)
    args.repeat = args.repeat or (2 if args.quick else 5)
    run = Run(args)
    torch.set_float32_matmul_precision("highest")  # fp32 is float32 (as the worker sets it)
    for name in args.sections.split(","):
        try:
            SECTIONS[name](run)
        except Exception as exc:  # one failed section must not lose the others' results
            run.row(name, failed=f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}")
        release(run)
    if not args.in_child:
        print(f"\n{table(run.rows)}\n\n{len(run.rows)} rows in {args.out}", flush=True)


if __name__ == "__main__":
    main()
