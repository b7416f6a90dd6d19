"""``eden-serve bench``: median time per pair, split by stage, optimised path vs reference path.

The reference path always runs in fp32: it stands for the official implementation, so the speedup
and the output difference printed are those of the chosen precision and path against it.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from . import synthetic, wire
from .checkpoint import load_pair
from .config import EdenConfig
from .edge import EdgeModel


def _timed(fn, device: torch.device):
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, (time.perf_counter() - start) * 1000


def _stages(cloud, edge: EdgeModel, frames, codec: str, path: str) -> tuple[dict[str, float], torch.Tensor, int]:
    device = edge.device

    def round_trip(chunk):
        payload = wire.encode(chunk, cloud.config, codec)
        received = wire.decode(payload, edge.config)
        if isinstance(received, wire.FramesChunk):  # the edge's E_cond counts as codec work
            received = cloud.restore(received)
        return [received.pair(0)], len(payload)

    make = cloud.frames_chunk if codec == wire.FRAMES_CODEC else cloud.encode_chunk
    chunk, encode_ms = _timed(lambda: make(frames, seed=0), device)
    (received, payload_bytes), codec_ms = _timed(lambda: round_trip(chunk), device)
    latents, denoise_ms = _timed(lambda: edge.denoise(received, path), device)
    frame, decode_ms = _timed(lambda: edge.decode_latents(latents, received, path)[0], device)
    return {"encode": encode_ms, "codec": codec_ms, "denoise": denoise_ms, "decode": decode_ms}, frame, payload_bytes


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


def run_bench(
    checkpoint: str | None,
    config: EdenConfig,
    size: tuple[int, int],
    repeat: int,
    codec: str,
    precision: str,
    device: str,
    reference: bool = True,
) -> dict:
    wire.parse_codec(codec)
    frames = synthetic.frame_pair(*size)
    cloud, edge = load_pair(checkpoint, config, device, precision)
    raw_bytes = 2 * 3 * size[0] * size[1]
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"config {config.name}, {size[0]}x{size[1]}, codec {codec}, precision {precision} -> {edge.precision} "
          f"({edge.precision_reason}), device {device}, CPU {capability}, {torch.get_num_threads()} threads, "
          f"{repeat} timed pairs after a warm-up")

    jobs = {"optimised": lambda: _stages(cloud, edge, frames, codec, "fast")}
    if reference:
        fp32_edge = edge if edge.precision == "fp32" else load_pair(checkpoint, config, device, "fp32")[1]
        jobs["reference"] = lambda: _stages(cloud, fp32_edge, frames, "fp32", "reference")
    runs = _interleaved(jobs, repeat)
    stages, total, frame, payload = _summary(runs["optimised"])
    print("optimised: " + ", ".join(f"{k} {v:.1f} ms" for k, v in stages.items()) + f"; total {total:.1f} ms/pair")
    print(f"payload {payload} bytes ({payload / raw_bytes:.2f}x the raw 8-bit frame pair, {raw_bytes} bytes)")
    result = {
        "ms_per_pair": round(total, 2), "payload_bytes": payload, "raw_pair_bytes": raw_bytes,
        **{f"{k}_ms": round(v, 2) for k, v in stages.items()},
        "config": config.name, "size": f"{size[0]}x{size[1]}", "codec": codec, "precision": precision,
        "precision_used": edge.precision, "device": device, "cpu_capability": capability, "threads": torch.get_num_threads(),
    }
    if reference:
        ref_stages, ref_total, ref_frame, _ = _summary(runs["reference"])
        speedup = statistics.median(sum(r[0].values()) / sum(o[0].values()) for r, o in zip(runs["reference"], runs["optimised"]))
        diff = (frame - ref_frame).abs().max().item()
        diff_u8 = ((frame * 255).round() - (ref_frame * 255).round()).abs().max().item()
        print("reference (fp32, fp32 codec): " + ", ".join(f"{k} {v:.1f} ms" for k, v in ref_stages.items())
              + f"; total {ref_total:.1f} ms/pair")
        print(f"speedup {speedup:.2f}x (median of the pairs' ratios); output max abs difference from the reference "
              f"{diff:.2e} ({diff_u8:.0f} of 255)")
        result.update(reference_ms_per_pair=round(ref_total, 2), speedup=round(speedup, 3),
                      max_abs_diff=diff, max_u8_diff=int(diff_u8))
    print(json.dumps(result))
    return result
