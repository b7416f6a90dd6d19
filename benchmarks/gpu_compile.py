"""The GPU check's compile section (benchmarks/gpu_check.py runs it), and the top kernels of a
forward. torch.compile of the edge's forward, in child processes (a compilation that outlasts the
budget cannot overrun the run), most telling first: block by block from the inductor cache that
the clip sections left (the second run of the same shapes: the clip's own batches at the smallest
and the largest size, the largest's top kernels), whole stages from a cold cache at the smallest
size's clip batch (against the clip's compile wait there, block by block from cold; issue 31's
first measurement: 61-68 s a shape), and block by block from a cold cache for one pair. On a GPU
inductor with our CUDA graphs around it; on a CPU dynamo's eager backend (inductor takes minutes
there), which tries the code and times nothing."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from eden_serve.edge import Acceleration, Compile, middles_of

# case: (scope, the inductor cache it starts from: the clips' or a fresh one), most important first.
CASES = {"blocks, from the cache": ("blocks", "clips"), "stages, cold": ("stages", "fresh"), "blocks, cold": ("blocks", "fresh")}
LEAST = 45  # seconds a child needs to be worth starting


def compiled(run, check) -> None:
    """In the parent: each case in a child, within the budget. In a child (``--in-child``): its case."""
    if run.args.in_child:
        _case(run, check, run.args.compile_case)
        return
    for case, (_, cache) in CASES.items():
        timeout = run.left() - 5
        if timeout < (15 if run.args.quick else LEAST):
            run.row("compiled", case=case, skipped="out of time")
            continue
        command = [sys.executable, check.__file__, "--device", str(run.device), "--out", str(run.args.out), "--sections",
                   "compiled", "--in-child", "--compile-case", case, "--budget", str(int(timeout)),
                   "--repeat", str(run.args.repeat)] + (["--quick"] if run.args.quick else [])
        fresh = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="eden-inductor-")} if cache == "fresh" else {}
        run.out.flush()
        try:
            done = subprocess.run(command, timeout=timeout, capture_output=True, text=True, env={**os.environ, **fresh})
            run.rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode:
                run.row("compiled", case=case, failed=f"exit {done.returncode}: {done.stderr.strip()[-500:]}")
        except subprocess.TimeoutExpired:
            run.row("compiled", case=case, skipped=f"compilation outlasted the {timeout:.0f} s left")


def _points(edge, sizes: list, case: str) -> list:
    """(size, batch) to compile: a clip's batch (what the edge takes at that size) from the clips'
    cache at the smallest and largest sizes, at the smallest from cold, or one pair from cold."""
    def clip_batch(size):
        return edge.sizing.pairs(edge.config.patch_grid(*size[1]))

    if case == "blocks, from the cache":
        return [(sizes[0], clip_batch(sizes[0])), (sizes[-1], clip_batch(sizes[-1]))]
    if case == "stages, cold":
        return [(sizes[0], clip_batch(sizes[0]))]
    return [(sizes[0], 1)]


def _case(run, check, case: str) -> None:
    """Each point of ``case``: the first call (compile and capture), ms per pair, the difference
    from the eager forward, and at the largest size the top kernels."""
    scope, _ = CASES[case]
    backend = "inductor" if run.device.type == "cuda" else "eager"
    precision = run.precisions()[-1]
    eager = run.edge(precision, "eager")
    edge = run.edge(precision, "compiled")
    edge.accelerate(Acceleration(compile=Compile(backend=backend, scope=scope, background=False)))
    sizes = list(run.sizes.items())
    for (name, size), batch in _points(edge, sizes, case):
        if run.left() < 5:
            break
        pairs = check.pairs_of(edge, size, batch)
        inputs = edge.prepare(pairs)
        first = check.timed_ms(run, lambda: edge.forward(inputs), 1)[0]
        ms = statistics.median(check.timed_ms(run, lambda: edge.forward(inputs), run.args.repeat))
        diff = (middles_of(edge, pairs, uint8=False) - middles_of(eager, pairs, uint8=False)).abs().max().item()
        row = {"case": case, "size": name, "precision": precision, "batch": batch, "backend": backend, "scope": scope,
               "graphs": edge.runner.graphs is not None, "first_call_s": first / 1000, "ms_per_pair": ms / batch,
               "max_abs_diff_from_eager": diff, "cache": Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")).name}
        if name == sizes[-1][0] and run.left() > 10:
            row["top"] = top_kernels(run, lambda: edge.forward(inputs))  # per forward of ``batch`` pairs
        run.row("compiled", **row)


def top_kernels(run, forward, forwards: int = 3, count: int = 15) -> list[dict]:
    """``forward``'s ``count`` costliest kernels: name, launches and milliseconds per forward, share of the time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if run.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(forwards):
            forward()
        run.sync()

    def spent(event) -> float:
        if run.device.type != "cuda":
            return event.self_cpu_time_total
        return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)

    events = [e for e in prof.key_averages() if spent(e) > 0 and (run.device.type == "cuda" or e.key.startswith("aten::"))]
    total = sum(spent(e) for e in events) or 1
    return [{"name": e.key[:100], "calls": e.count / forwards, "ms": spent(e) / 1000 / forwards, "share": spent(e) / total}
            for e in sorted(events, key=spent, reverse=True)[:count]]
