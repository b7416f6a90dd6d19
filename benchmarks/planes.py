"""Middles as the output's planes against RGB, per frame, paired (eden_serve/edge/yuv.py,
media/planes.py): what the writer's thread spends handing a middle to the encoder (RGB converted by
swscale, or the planes as they are), what the conversion costs on the edge's device, and the bytes
that cross back. JSON lines on stdout; the GPU check's clip rows measure the whole clip.
``--siting left`` (H.264's and HEVC's outputs) converts RGB as the writer does for chroma sited
left, through FFmpeg's ``scale`` filter (media/siting.py), and the planes with taps 1, 2, 1.

    .venv/bin/python benchmarks/planes.py --size 1080x1920 --rounds 20 [--siting left] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import av
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eden_serve.edge.yuv import to_planes  # noqa: E402
from eden_serve.media.planes import PlaneFormat, Planes  # noqa: E402
from eden_serve.media.siting import CENTER, LEFT, Subsampler  # noqa: E402


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1080x1920")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--siting", choices=("centred", "left"), default="centred")
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    left = args.siting == "left"
    device, format = torch.device(args.device), PlaneFormat("yuv420p", left=left)
    subsample = Subsampler("yuv420p", 2, 0, LEFT if left else CENTER)  # the writer's conversion of RGB
    rgb = torch.randint(0, 256, (args.batch, height, width, 3), dtype=torch.uint8, device=device)
    planes = to_planes(rgb, format).cpu()
    host_rgb = rgb.cpu().numpy()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    writer_rgb, writer_planes, convert = [], [], []
    for k in range(args.rounds):
        j = k % args.batch
        writer_rgb.append(timed(lambda: subsample(av.VideoFrame.from_ndarray(host_rgb[j], format="rgb24"))))
        writer_planes.append(timed(lambda: av.VideoFrame.from_ndarray(Planes(planes[j], width, height, format).array(), format="yuv420p")))
        convert.append(timed(lambda: (to_planes(rgb, format), sync())) / args.batch)
    ratios = [p / r for p, r in zip(writer_planes, writer_rgb)]
    print(json.dumps({"size": args.size, "siting": args.siting, "device": str(device), "cpu": torch.backends.cpu.get_cpu_capability(),
                      "writer_rgb_ms": 1000 * statistics.median(writer_rgb), "writer_planes_ms": 1000 * statistics.median(writer_planes),
                      "planes_of_rgb_writer": statistics.median(ratios), "device_convert_ms_per_frame": 1000 * statistics.median(convert),
                      "bytes_rgb": height * width * 3, "bytes_planes": height * width * 3 // 2}))


if __name__ == "__main__":
    main()
