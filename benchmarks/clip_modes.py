"""Pairs/s of a clip in each deployment mode on this machine: in process, --server (the workflow on
one TorchServe), --cloud/--edge (two TorchServe instances, both on this machine).

    .venv/bin/python benchmarks/clip_modes.py [--config official|tiny] [--frames 10] [--size 256x448]

Builds its own archives (synthetic weights) in a temporary directory and stops every server it starts.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

from eden_serve import synthetic
from eden_serve.checkpoint import load_archived
from eden_serve.client import Client
from eden_serve.serving.launcher import build_archives, torchserve
from eden_serve.streaming import interpolate_clip_in_process


def best_of(runs: int, label: str, run) -> None:
    summaries = [run(k) for k in range(runs)]
    print(f"{label}: {max(summaries, key=lambda s: s.pairs_per_second)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="official", choices=["official", "tiny"])
    parser.add_argument("--frames", type=int, default=10)
    parser.add_argument("--size", default="256x448")
    parser.add_argument("--runs", type=int, default=2, help="best of this many runs per mode")
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    warnings.simplefilter("ignore")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        frames = synthetic.write_clip(root / "frames", args.frames, height, width)
        store = build_archives(root / "store", config=args.config)
        cloud, edge = load_archived(store)
        print(f"{args.frames} frames of {width}x{height}, {args.config} dimensions, synthetic weights")

        for inflight in (1, 2):
            best_of(args.runs, f"in process, inflight {inflight}", lambda k: interpolate_clip_in_process(
                frames, root / f"local-{inflight}-{k}", cloud, edge, inflight=inflight, progress=False))

        with torchserve(store, workflows=["eden.war"], token_auth=False) as server, Client(server.inference_url) as client:
            client.interpolate(frames / "frame0.png", frames / "frame1.png")  # warm-up
            for inflight in (1, 4):
                best_of(args.runs, f"--server, inflight {inflight}", lambda k: client.interpolate_clip(
                    frames, root / f"server-{inflight}-{k}", inflight=inflight, progress=False))

        with torchserve(store, models=["eden_encoder.mar"], token_auth=False) as cloud_ts, \
                torchserve(store, models=["eden_ditdec.mar"], token_auth=False) as edge_ts, \
                Client(cloud=cloud_ts.inference_url, edge=edge_ts.inference_url) as client:
            client.interpolate(frames / "frame0.png", frames / "frame1.png")
            for inflight in (1, 4):
                best_of(args.runs, f"--cloud/--edge, inflight {inflight}", lambda k: client.interpolate_clip(
                    frames, root / f"split-{inflight}-{k}", inflight=inflight, progress=False))


if __name__ == "__main__":
    main()
