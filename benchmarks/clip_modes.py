"""Pairs/s of a clip in each deployment mode on this machine: in process, --server (the workflow on
one TorchServe), --cloud/--edge (two TorchServe instances, both on this machine), for pairs and
chunks of K pairs per request.

    .venv/bin/python benchmarks/clip_modes.py [--config official|tiny] [--frames 17] [--size 256x448] [--chunks 1,4,8,16]
    .venv/bin/python benchmarks/clip_modes.py --clip ../shared/clips/bikes_640x272   # a real clip: its first --frames frames

Builds its own archives (synthetic weights) in a temporary directory and stops every server it starts.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from PIL import Image

from eden_serve.client import Client
from eden_serve.clips.pipeline import interpolate_clip_in_process
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import load_archived
from eden_serve.serving.worker import default_threads, usable_cores
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.servers import build_archives, torchserve
import results


def best_of(runs: int, run) -> object:
    return max((run(k) for k in range(runs)), key=lambda summary: summary.pairs_per_second)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="official", choices=["official", "tiny"])
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--size", default="256x448", help="HxW of the generated clip (default 256x448)")
    parser.add_argument("--clip", type=Path, help="a directory of frames to use instead of a generated clip")
    parser.add_argument("--chunks", default="1,8", help="pairs per request to compare (default 1,8)")
    parser.add_argument("--inflight", type=int, default=4, help="requests in flight when served (default 4)")
    parser.add_argument("--runs", type=int, default=2, help="best of this many runs per mode")
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    chunks = [int(k) for k in args.chunks.split(",")]
    warnings.simplefilter("ignore")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.clip is None:
            frames = synthetic.write_clip(root / "frames", args.frames, height, width)
        else:
            frames = root / "frames"
            frames.mkdir()
            for path in sorted(p for p in args.clip.iterdir() if p.suffix.lower() == ".png")[: args.frames]:
                shutil.copy(path, frames / path.name)
        first, second = sorted(frames.iterdir())[:2]
        with Image.open(first) as image:
            shape = f"{image.width}x{image.height}"
        store = build_archives(root / "store", config=args.config)
        cloud, edge = load_archived(store)
        torch.set_num_threads(default_threads("edge", usable_cores()))
        print(f"{len(list(frames.iterdir()))} frames of {shape} ({args.clip or 'generated'}), {args.config} dimensions, "
              f"synthetic weights; CPU {torch.backends.cpu.get_cpu_capability()}, {usable_cores()} cores; best of {args.runs}",
              flush=True)

        rows = {}
        for k in chunks:
            summary = best_of(args.runs, lambda n: interpolate_clip_in_process(
                frames, root / f"local-{k}-{n}", cloud, edge, chunk=k, inflight=2, progress=False))
            rows[("in process", k)] = summary
            print(f"in process, chunk {k}: {summary}", flush=True)

        with torchserve(store, workflows=["eden.war"], token_auth=False) as server, Client(server.inference_url) as client:
            client.interpolate(first, second)  # warm-up
            for k in chunks:
                summary = best_of(args.runs, lambda n: client.interpolate_clip(
                    frames, root / f"server-{k}-{n}", chunk=k, inflight=args.inflight, progress=False))
                rows[("--server", k)] = summary
                print(f"--server, chunk {k}: {summary}", flush=True)

        with torchserve(store, models=["eden_encoder.mar"], token_auth=False) as cloud_ts, \
                torchserve(store, models=["eden_ditdec.mar"], token_auth=False) as edge_ts, \
                Client(cloud=cloud_ts.inference_url, edge=edge_ts.inference_url) as client:
            client.interpolate(first, second)
            for k in chunks:
                summary = best_of(args.runs, lambda n: client.interpolate_clip(
                    frames, root / f"split-{k}-{n}", chunk=k, inflight=args.inflight, progress=False))
                rows[("--cloud/--edge", k)] = summary
                print(f"--cloud/--edge, chunk {k}: {summary}", flush=True)

    print("\n| mode | " + " | ".join(f"chunk {k}" for k in chunks) + " |")
    print("| --- | " + " | ".join("---:" for _ in chunks) + " |")
    for mode in ("in process", "--server", "--cloud/--edge"):
        print(f"| {mode} | " + " | ".join(f"{rows[mode, k].pairs_per_second:.2f}" for k in chunks) + " |")
    results.write("clip_modes", [{"clip": args.clip or f"generated {shape}", "frames": args.frames, "config": args.config, "mode": mode,
                                  "chunk": k, "pairs_per_second": summary.pairs_per_second} for (mode, k), summary in rows.items()])


if __name__ == "__main__":
    main()
