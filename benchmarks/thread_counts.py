"""How many middle frames change with the number of CPU threads (docs/clips-and-video.md "Clips": reproducible).

    .venv/bin/python benchmarks/thread_counts.py [--config tiny] [--pairs 400] [--size 256x448] [--threads 1 2]

Each pair of a synthetic clip (seed i for pair i, default codec) is interpolated in this process once
per thread count, as a server's worker with that many threads computes it; prints how many pairs
differ between the counts, by how many 8-bit levels at most, and in how many pixels.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch

from eden_serve.clips.pipeline import interpolate_pair
from eden_serve.config import preset
from eden_serve.media.frames import image_to_tensor, to_uint8
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import load_pair
import results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", choices=["official", "tiny"])
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--size", default="256x448")
    parser.add_argument("--threads", type=int, nargs=2, default=[1, 2])
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    warnings.simplefilter("ignore")
    config = preset(args.config)
    cloud, edge = load_pair(None, config)
    frames = [image_to_tensor(image) for image in synthetic.clip(args.pairs + 1, height, width)]

    middles = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        middles[threads] = [to_uint8(interpolate_pair(cloud, edge, frames[i], frames[i + 1], seed=i)[0]).astype(np.int16)
                            for i in range(args.pairs)]
    a, b = (middles[t] for t in args.threads)
    levels = [int(np.abs(x - y).max()) for x, y in zip(a, b)]
    pixels = [int((x != y).any(axis=-1).sum()) for x, y in zip(a, b)]
    differing = sum(level > 0 for level in levels)
    results.write("thread_counts", [{"config": args.config, "size": f"{width}x{height}", "pair": i, "max_level_difference": level,
                                     "pixels_differing": count} for i, (level, count) in enumerate(zip(levels, pixels))])
    print(f"{args.config} dims, {width}x{height}, {args.pairs} pairs, threads {args.threads[0]} vs {args.threads[1]}: "
          f"{differing} pairs differ, by at most {max(levels)} level(s), in at most {max(pixels)} of {width * height} pixels; "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")


if __name__ == "__main__":
    main()
