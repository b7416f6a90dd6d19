"""x264 in one instance against several on segments, as the clip's writer runs them (docs/video.md
"Encoder speed"): frames a second, paired per round, and PSNR against the frames given.

    .venv/bin/python benchmarks/x264_instances.py [--size 1080x1920] [--frames 96] [--rounds 3]
        [--case 1:auto:all --case 2:share:48 ...]

A case is INSTANCES:THREADS:SEGMENT: THREADS ``auto`` (x264's own count, one and a half per core, in
every instance), ``share`` (the host's cores shared among the instances, as the writer opens them) or
a number; SEGMENT a segment's frames (``all``: one segment), or the writer's rule: ``queue`` (the
queue's bound alone, as where the output's frames are unknown) or ``spread`` (the frames known, a
share for each instance). The frames are the GPU check's source
video at the size asked, converted to 4:2:0 before the clock starts, so that only the encoders are
timed, at the writer's settings beside a GPU (crf 18, preset veryfast). The cases run in turn in each
round; each round's frames a second is divided by the first case's of the same round.
"""

from __future__ import annotations

import argparse
import statistics

import av
import numpy as np
import torch

from eden_serve.media import segments
from gpu_clip import encode_segmented, source_frames
import results

CASES = ["1:auto:all", "2:share:48", "2:auto:48", "2:share:24", "1:share:all"]


def encode(pictures: list, given: np.ndarray, size: tuple[int, int], case: str) -> tuple[float, float]:
    """Frames a second and PSNR against ``given`` (the pictures' planes), for one case."""
    instances, threads, length = case.split(":")
    instances = int(instances)
    threads = {"auto": 0, "share": segments.instance_threads(instances)}.get(threads) if threads in ("auto", "share") else int(threads)
    bounds = segments.SEGMENT_FRAMES
    if length not in ("queue", "spread"):
        segments.SEGMENT_FRAMES = (len(pictures),) * 2 if length == "all" else (int(length),) * 2
    try:
        seconds, got, _ = encode_segmented(size, pictures, instances, threads, known=length != "queue")
    finally:
        segments.SEGMENT_FRAMES = bounds
    return len(pictures) / seconds, float(10 * np.log10(255 ** 2 / np.mean((got.astype(np.float64) - given) ** 2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1080x1920", help="HEIGHTxWIDTH")
    parser.add_argument("--frames", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--case", action="append", help="INSTANCES:THREADS:SEGMENT (repeatable; default: " + " ".join(CASES) + ")")
    args = parser.parse_args()
    cases = args.case or CASES
    size = tuple(int(v) for v in args.size.split("x"))
    pictures = [av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p") for rgb in source_frames(size, args.frames)]
    given = np.stack([p.to_ndarray() for p in pictures]).astype(np.float64)
    fps: dict[str, list[float]] = {case: [] for case in cases}
    quality: dict[str, float] = {}
    for _ in range(args.rounds):
        for case in cases:
            speed, quality[case] = encode(pictures, given, size, case)
            fps[case].append(speed)
    rows = []
    print(f"x264 veryfast crf 18 at {args.size}, {args.frames} frames, {args.rounds} rounds, {segments.host_cores()} cores, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'instances:threads:segment':>26} {'median fps':>10} {'paired ratio':>12} {'PSNR dB':>8}")
    for case in cases:
        ratio = statistics.median(a / b for a, b in zip(fps[case], fps[cases[0]]))
        rows.append({"size": args.size, "frames": args.frames, "case": case, "median_fps": statistics.median(fps[case]),
                     "ratio_to_first": ratio, "psnr_db": quality[case]})
        print(f"{case:>26} {statistics.median(fps[case]):10.1f} {ratio:12.2f} {quality[case]:8.3f}")
    results.write("x264_instances", rows)


if __name__ == "__main__":
    main()
