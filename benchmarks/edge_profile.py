"""Where one pair's denoise and decode spend their time on the CPU, and the best roofline fraction
that PyTorch's attention kernel leaves the edge.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/edge_profile.py [--size 480x854] [--precision bf16] [--config official]

Profiles one pair (synthetic weights, the fast path, after a warm-up) with ``torch.profiler`` and
prints the operations by their own CPU time. Then the bound: the fraction of the same-dtype GEMM
peak (``eden-serve bench``'s, in CPU time) that the pair would reach if every operation other than
``scaled_dot_product_attention`` ran at that peak and attention took the time measured here. A
goal above the bound cannot be met by work outside the attention kernel (docs/gpu.md). The last
line is JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from eden_serve.commands.bench import gemm_rate, pair_flops
from eden_serve.config import preset
from eden_serve.edge import middles_of
from eden_serve.edge.conditions import EdgeSide
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import load_pair

ATTENTION = "aten::_scaled_dot_product"  # the kernel: the public op above it only dispatches


def attention_flops(shapes: list) -> int:
    """The two products of one attention call: query [B, H, Nq, hd] against keys [B, H, Nk, hd]."""
    (b, h, nq, hd), (_, _, nk, _) = shapes[0], shapes[1]
    return 4 * b * h * nq * nk * hd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="480x854", help="HxW (default 480x854)")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--config", default="official", choices=["official", "tiny"])
    parser.add_argument("--top", type=int, default=10, help="operations to list (default 10)")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    config = preset(args.config)
    warnings.simplefilter("ignore")  # synthetic weights: this measures time, not pictures
    cloud, edge = load_pair(None, config, "cpu", args.precision)
    chunk = cloud.encode_chunk(synthetic.frame_pair(*size), seed=0, on_device=True)
    pair = [EdgeSide(edge).receive(chunk).pair(0)]

    def run():
        return middles_of(edge, pair, uint8=False)

    with torch.inference_mode():
        run()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            run()
        peak = gemm_rate(edge, math.prod(config.patch_grid(*size)))[1]  # per CPU second, as the profile's times
    flops = pair_flops(config, size)
    events = prof.key_averages(group_by_input_shape=True)
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    attention = [e for e in events if e.key.startswith(ATTENTION)]
    attention_s = sum(e.self_cpu_time_total for e in attention) / 1e6
    attention_gflop = sum(attention_flops(e.input_shapes) * e.count for e in attention) / 1e9
    by_op: dict[str, list] = {}
    for e in events:
        entry = by_op.setdefault(e.key, [0.0, 0])
        entry[0] += e.self_cpu_time_total / 1e6
        entry[1] += e.count
    print(f"{args.config} {args.size} {args.precision}, {torch.get_num_threads()} thread(s), CPU "
          f"{torch.backends.cpu.get_cpu_capability()}: {total * 1000:.0f} ms of CPU time, {flops / 1e9:.1f} GFLOP")
    for key, (seconds, calls) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {key:56s} {seconds * 1000:8.1f} ms {seconds / total:6.1%}  {calls} calls")
    for e in sorted(attention, key=lambda e: -e.self_cpu_time_total):
        rate = attention_flops(e.input_shapes) * e.count / (e.self_cpu_time_total / 1e6) / 1e9
        print(f"  attention {e.input_shapes[0]} over {e.input_shapes[1][2]} keys: {e.self_cpu_time_total / 1e3:.1f} ms "
              f"in {e.count} calls, {rate:.0f} GFLOP/s")
    gflop = flops / 1e9
    fraction = gflop / total / peak
    bound = gflop / ((gflop - attention_gflop) / peak + attention_s) / peak
    print(f"peak {peak:.1f} GFLOP/s; fraction as profiled {fraction:.3f}; attention {attention_gflop:.1f} GFLOP "
          f"({attention_gflop / gflop:.1%} of the operations, {attention_s / total:.1%} of the time, "
          f"{attention_gflop / attention_s:.0f} GFLOP/s); bound with everything else at the peak {bound:.3f}")
    print(json.dumps({"size": args.size, "precision": args.precision, "threads": torch.get_num_threads(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_ms": round(total * 1000, 1),
                      "gflop_per_pair": round(gflop, 2), "peak_gflops": round(peak, 1), "fraction": round(fraction, 3),
                      "attention_gflop": round(attention_gflop, 2), "attention_ms": round(attention_s * 1000, 1),
                      "bound": round(bound, 3)}))


if __name__ == "__main__":
    main()
