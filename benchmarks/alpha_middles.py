"""What a video writer spends making a middle's alpha of its neighbours' (media/video_writer.py,
``VideoWriter._alpha``), per middle: a ProRes 4444 clip (decoded yuva444p12le) written in 10 bits,
so that each original's alpha is converted to the output's format, and the middles given as RGB.
Prints one JSON line: the milliseconds per middle in ``_alpha`` and in the whole ``add_middle``,
the CPU's capability, and a digest of the output's decoded alpha (FFV1, lossless), which a change
that keeps the output must keep.

    PYTHONPATH=. .venv/bin/python benchmarks/alpha_middles.py --size 720x1280 --frames 4 --factor 8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
import warnings
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eden_serve.media import Encoding, Retiming, open_clip, write_clip  # noqa: E402
from eden_serve.media.video_writer import VideoWriter  # noqa: E402


def made(path: Path, height: int, width: int, frames: int) -> Path:
    """A ProRes 4444 clip whose alpha is a different ramp each frame."""
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("prores_ks", rate=25)
        stream.height, stream.width, stream.pix_fmt = height, width, "yuva444p10le"
        for k in range(frames):
            rgba = rng.integers(0, 65536, (height, width, 4), dtype=np.uint16)
            rgba[..., 3] = np.linspace(1000 * k, 65535 - 1000 * k, width, dtype=np.uint16)[None, :]
            frame = av.VideoFrame.from_ndarray(rgba, format="rgba64le").reformat(format="yuva444p10le")
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="720x1280")
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--factor", type=int, default=8)
    args = parser.parse_args()
    height, width = map(int, args.size.split("x"))
    spent = {"alpha": 0.0, "add_middle": 0.0}
    alpha = VideoWriter._alpha

    def timed_alpha(self, *given):
        started = time.perf_counter()
        alpha(self, *given)
        spent["alpha"] += time.perf_counter() - started

    VideoWriter._alpha = timed_alpha
    with tempfile.TemporaryDirectory() as folder:
        src, out = made(Path(folder) / "in.mov", height, width, args.frames), Path(folder) / "out.mkv"
        middle = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8))
        middles = 0
        with warnings.catch_warnings(), open_clip(src) as clip, \
                write_clip(clip, out, Retiming(factor=Fraction(args.factor)), encoding=Encoding(vcodec="ffv1", pix_fmt="yuva444p10le")) as writer:
            warnings.simplefilter("ignore")
            frames = list(clip)
            for before, after in zip(frames, frames[1:]):
                writer.add(before)
                for k in range(1, args.factor):
                    started = time.perf_counter()
                    writer.add_middle(middle, before, after, Fraction(k, args.factor))
                    spent["add_middle"] += time.perf_counter() - started
                    middles += 1
            writer.add(frames[-1])
        digest = hashlib.sha256()
        with av.open(str(out)) as container:
            for frame in container.decode(video=0):
                digest.update(bytes(frame.planes[3]))
    print(json.dumps({"size": args.size, "middles": middles, "alpha_ms_per_middle": round(1000 * spent["alpha"] / middles, 2),
                      "add_middle_ms_per_middle": round(1000 * spent["add_middle"] / middles, 2),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(), "alpha_sha256": digest.hexdigest()}))


if __name__ == "__main__":
    main()
