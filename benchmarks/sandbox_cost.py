"""What the decoder sandbox costs the edge (docs/errors-and-limits.md, "The decoder's sandbox"):
a bitstream chunk of 9 frames (8 pairs) of real H.264, decoded in this process and in the sandbox,
at a few frame sizes.

    .venv/bin/python benchmarks/sandbox_cost.py [--sizes 480x854,720x1280,1080x1920] [--repeat 9]

Prints per size the median wall time of a chunk's decode both ways (taking turns, 0.1 s apart), the
difference per decoded frame, and the CPU time of this process per chunk (the worker's); writes
benchmarks/results/sandbox_cost.csv. The clips are bikes.mp4's first frames scaled and encoded with
libx264 (B-frames, a key frame every 30), the chunk taken after the key frame so it skips 3 frames.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from eden_serve.media import packets, sandbox
from eden_serve.media.packets import PacketReader
from harness.videos import make_clip
import results

FRAMES = 9
PAUSE_S = 0.1


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="480x854,720x1280,1080x1920", help="HEIGHTxWIDTH,... (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    box = sandbox.Sandbox()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for size in args.sizes.split(","):
            height, width = map(int, size.split("x"))
            path = make_clip(Path(scratch) / f"{size}.mp4", "libx264", {"g": "30", "bf": "2"}, (height, width), 3 + FRAMES)
            reader = PacketReader(path)
            span = reader.needed(3, 3 + FRAMES - 1)
            job = (reader.parameters, reader.packets(span), span.skip, FRAMES)
            box.decode(*job)  # the zygote starts
            (here, here_cpu), (boxed, boxed_cpu) = timed([packets.decode, box.decode], job, args.repeat)
            decoded = len(job[1])
            rows.append({"size": f"{width}x{height}", "frames_decoded": decoded, "in_process_ms": round(here * 1e3, 2),
                         "sandbox_ms": round(boxed * 1e3, 2), "extra_ms_per_frame": round((boxed - here) * 1e3 / decoded, 2),
                         "worker_cpu_ms_in_process": round(here_cpu * 1e3, 2), "worker_cpu_ms_sandbox": round(boxed_cpu * 1e3, 2)})
            print(rows[-1], flush=True)
    box.close()
    results.write("sandbox_cost", rows)


if __name__ == "__main__":
    main()
