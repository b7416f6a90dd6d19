"""``eden-serve bench``: median time per pair, split by stage, optimised path vs reference path,
and the edge's roofline: its arithmetic rate against the peak of a matrix product of its own.

The reference path always runs in fp32: it stands for the official implementation, so the speedup
and the output difference printed are those of the chosen precision and path against it.

The roofline: the floating-point operations of one pair's denoise and decode, counted on the meta
device with ``F.linear`` products (:func:`pair_flops`), over their time, against the GEMM peak
(:func:`gemm_rate`): the faster of the MLP's two products on the decoder's tokens, in the edge's
dtype and through its own kernels. The peak is measured between the pairs, in the same process, so that a machine
shared with other work slows both alike; each round's fraction is its pair's rate over its
peak, and the medians are printed. The same fraction in CPU time is printed too: where other jobs
take the cores it is the steadier figure, exact on one thread (``OMP_NUM_THREADS=1``); on more,
threads that wait for one another spin, and the waits count as work.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from .. import wire
from ..config import EdenConfig
from ..edge import EdgeModel, StageClock, synchronize
from ..edge.conditions import EdgeSide
from ..model import synthetic
from ..model.checkpoint import load_pair
from ..model.weights import EdgeWeights
from ..wire import Conditions

GEMM_TRIES = 3  # per round; the best is the round's peak


def _timed(fn, device: torch.device):
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, (time.perf_counter() - start) * 1000


def pair_flops(config: EdenConfig, size: tuple[int, int]) -> int:
    """Floating-point operations of one pair's denoise and decode on the fast path, counted on
    the meta device (nothing computed) with ``F.linear`` products: oneDNN's are not counted by
    PyTorch, and they do the same arithmetic."""
    with torch.device("meta"):
        weights = EdgeWeights(config)
    edge = EdgeModel(weights, config, "meta", "fp32")
    ph, pw = config.patch_grid(*size)
    tokens = torch.zeros(2, ph * pw, config.hidden_dim, device="meta")
    pair = [Conditions(tokens, tokens, 0.5, 0.25, 0.0, (ph, pw), size)]
    with FlopCounterMode(display=False) as counter:
        edge.forward(edge.prepare(pair), uint8=False)
    return counter.get_total_flops()


def gemm_rate(edge: EdgeModel, tokens: int) -> tuple[float, float]:
    """GFLOP/s of the edge's largest products (the MLP's two) on ``tokens`` tokens, in its dtype
    and through its kernels, the best of a few each and the faster of the two: per second of wall
    time, and per second of this process's CPU time (see :func:`run_bench`). Both, because the
    second (3072 inputs, 768 outputs) runs a few percent faster than the first in fp32 here."""
    cfg = edge.config
    mlp = edge.weights.decoder_blocks[0].mlp
    generator = torch.Generator().manual_seed(0)
    best, best_cpu = float("inf"), float("inf")
    flops = 2 * tokens * cfg.hidden_dim * cfg.mlp_dim  # the same for both
    with torch.inference_mode():
        for linear in (mlp.fc1, mlp.fc2):
            x = torch.randn(tokens, linear.in_features, generator=generator).to(edge.device, edge.dtype)
            for _ in range(GEMM_TRIES):
                cpu = time.process_time()
                _, ms = _timed(lambda: edge.linears.module(linear, x), edge.device)
                best, best_cpu = min(best, ms), min(best_cpu, (time.process_time() - cpu) * 1000)
    return flops / best / 1e6, flops / best_cpu / 1e6


def _stages(cloud, edge_side: EdgeSide, frames, kind: wire.Kind, path: str) -> tuple[dict[str, float], torch.Tensor, int, float]:
    """One pair's stages, in ms: the cloud's chunk, the codec's round trip (the edge's E_cond counts
    as codec work), the denoise (the host's preparation of the forward in it) and the decode, from
    the forward's own clock; its middle, payload bytes and the edge's CPU ms."""
    edge, device = edge_side.model, edge_side.model.device

    def round_trip(chunk):
        received, payload_bytes = kind.cross(chunk, cloud.config, edge.config)
        return [kind.conditions(received, edge_side).pair(0)], payload_bytes

    chunk, encode_ms = _timed(lambda: kind.make(cloud, frames), cloud.device)
    (received, payload_bytes), codec_ms = _timed(lambda: round_trip(chunk), device)
    cpu = time.process_time()
    clock = StageClock(device)
    frame = edge.to_host(edge.forward(edge.prepare(received), uint8=False, path=path, clock=clock))[0]
    edge_cpu_ms = (time.process_time() - cpu) * 1000
    stages = {stage: seconds * 1000 for stage, seconds in clock.seconds().items()}
    return {"encode": encode_ms, "codec": codec_ms, **stages}, frame, payload_bytes, edge_cpu_ms


def _interleaved(jobs: dict, repeat: int) -> dict[str, list]:
    """Each job's runs, the jobs taking turns pair by pair, so that a busy spell on a shared
    machine slows them alike and their ratio holds."""
    for job in jobs.values():
        job()  # warm-up: allocator, kernels, cached embeddings, prepared weights
    runs = {name: [] for name in jobs}
    for _ in range(repeat):
        for name, job in jobs.items():
            runs[name].append(job())
    return runs


def _summary(runs: list) -> tuple[dict[str, float], float, torch.Tensor, int]:
    medians = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
    totals = [sum(r[0].values()) for r in runs]
    return medians, statistics.median(totals), runs[-1][1], runs[-1][2]


@dataclass(frozen=True)
class Bench:
    """What ``eden-serve bench`` times: frames of ``size`` through ``codec`` and the edge in
    ``precision``, the cloud and the edge on ``devices`` (the reference path runs on the edge's),
    ``repeat`` pairs after a warm-up; ``reference``: the reference path too."""

    config: EdenConfig
    size: tuple[int, int]
    codec: str = wire.DEFAULT_CODEC
    precision: str = "fp32"
    devices: tuple[str, str] = ("cpu", "cpu")
    checkpoint: str | None = None
    repeat: int = 3
    reference: bool = True

    @property
    def device(self) -> str:
        return self.devices[0] if self.devices[0] == self.devices[1] else ",".join(self.devices)


def run_bench(bench: Bench) -> dict:
    """Times ``bench``, prints its tables and, last, its result as a JSON line; returns the result."""
    kind = wire.kind(bench.codec, in_process=True)
    config, size = bench.config, bench.size
    cloud, edge = load_pair(bench.checkpoint, config, bench.devices[0], bench.precision, edge_device=bench.devices[1])
    print(f"config {config.name}, {size[0]}x{size[1]}, codec {bench.codec}, precision {bench.precision} -> {edge.precision} "
          f"({edge.precision_reason}), device {bench.device}, CPU {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads, {bench.repeat} timed pairs after a warm-up")
    frames = synthetic.frame_pair(*size)
    ph, pw = config.patch_grid(*size)
    edge_side = EdgeSide.beside(edge, cloud.weights)
    jobs = {"peak": lambda: gemm_rate(edge, ph * pw), "optimised": lambda: _stages(cloud, edge_side, frames, kind, "fast")}
    if bench.reference:
        fp32 = edge_side if edge.precision == "fp32" else EdgeSide.beside(
            load_pair(bench.checkpoint, config, bench.devices[1], "fp32")[1], cloud.weights)
        jobs["reference"] = lambda: _stages(cloud, fp32, frames, wire.kind("fp32"), "reference")
    runs = _interleaved(jobs, bench.repeat)
    stages, total, frame, payload = _summary(runs["optimised"])
    raw_bytes = 2 * 3 * size[0] * size[1]
    print("optimised: " + ", ".join(f"{k} {v:.1f} ms" for k, v in stages.items()) + f"; total {total:.1f} ms/pair")
    print(f"payload {payload} bytes ({payload / raw_bytes:.2f}x the raw 8-bit frame pair, {raw_bytes} bytes)")
    result = {
        "ms_per_pair": round(total, 2), "payload_bytes": payload, "raw_pair_bytes": raw_bytes,
        **{f"{k}_ms": round(v, 2) for k, v in stages.items()},
        "config": config.name, "size": f"{size[0]}x{size[1]}", "codec": bench.codec, "precision": bench.precision,
        "precision_used": edge.precision, "device": bench.device, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(), **_roofline(bench, edge, runs),
    }
    if bench.reference:
        result.update(_against_reference(runs, frame))
    print(json.dumps(result))
    return result


def _roofline(bench: Bench, edge: EdgeModel, runs: dict[str, list]) -> dict:
    """The optimised pairs' arithmetic rate against the GEMM peak measured between them (printed)."""
    flops = pair_flops(bench.config, bench.size)
    achieved = [flops / (r[0]["denoise"] + r[0]["decode"]) / 1e6 for r in runs["optimised"]]
    fractions = [a / p for a, (p, _) in zip(achieved, runs["peak"])]
    cpu_fractions = [flops / r[3] / 1e6 / p for r, (_, p) in zip(runs["optimised"], runs["peak"])]
    roofline = {"gflop_per_pair": round(flops / 1e9, 2), "achieved_gflops": round(statistics.median(achieved), 3),
                "peak_gflops": round(statistics.median(p for p, _ in runs["peak"]), 3),
                "roofline_fraction": round(statistics.median(fractions), 3),
                "roofline_fraction_cpu_time": round(statistics.median(cpu_fractions), 3)}
    ph, pw = bench.config.patch_grid(*bench.size)
    print(f"roofline: {roofline['gflop_per_pair']} GFLOP per pair (denoise + decode), {roofline['achieved_gflops']:.1f} GFLOP/s, "
          f"{roofline['roofline_fraction']:.2f} of the {roofline['peak_gflops']:.1f} GFLOP/s of a {edge.precision} GEMM "
          f"(the MLP's, {ph * pw} tokens) measured between the pairs; "
          f"{roofline['roofline_fraction_cpu_time']:.2f} in this process's CPU time")
    return roofline


def _against_reference(runs: dict[str, list], frame: torch.Tensor) -> dict:
    """The reference path's time, the speedup over it and the output's difference from it (printed)."""
    ref_stages, ref_total, ref_frame, _ = _summary(runs["reference"])
    speedup = statistics.median(sum(r[0].values()) / sum(o[0].values()) for r, o in zip(runs["reference"], runs["optimised"]))
    diff = (frame - ref_frame).abs().max().item()
    diff_u8 = ((frame * 255).round() - (ref_frame * 255).round()).abs().max().item()
    print("reference (fp32, fp32 codec): " + ", ".join(f"{k} {v:.1f} ms" for k, v in ref_stages.items())
          + f"; total {ref_total:.1f} ms/pair")
    print(f"speedup {speedup:.2f}x (median of the pairs' ratios); output max abs difference from the reference "
          f"{diff:.2e} ({diff_u8:.0f} of 255)")
    return {"reference_ms_per_pair": round(ref_total, 2), "speedup": round(speedup, 3), "max_abs_diff": diff, "max_u8_diff": int(diff_u8)}
