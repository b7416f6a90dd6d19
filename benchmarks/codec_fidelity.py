"""What each wire codec costs in fidelity on real frames, per pair position in a chunk, against fp32.

    .venv/bin/python benchmarks/codec_fidelity.py [--clip DIR] [--frames 9] [--config official]
        [--codecs frames,bf16+zstd,fp16+zstd,int8+zstd,int8-token+zstd] [--plot docs/img/wire-codecs-fidelity]

One chunk of the first --frames frames of --clip (default ../shared/clips/bikes_640x272, camera
video, outside the repository), synthetic weights, in process: cloud -> wire -> edge with each codec,
the same seeds. Each middle frame is compared with the fp32 codec's, pair by pair: max abs error
and PSNR on a [0, 1] scale, and the share of 8-bit pixels that differ. Prints the table and the
payload bytes per pair; ``--plot PREFIX`` writes PREFIX.csv and PREFIX.png.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import torch

from eden_serve.clips.pipeline import interpolate_chunk
from eden_serve.config import PRESETS
from eden_serve.media.frames import load_frame, to_uint8
from eden_serve.model.checkpoint import load_pair
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.servers import REPO
import results

CLIP = REPO.parent / "shared" / "clips" / "bikes_640x272"


def compare(got: torch.Tensor, reference: torch.Tensor) -> tuple[float, float, float]:
    """(max abs error, PSNR in dB, share of 8-bit pixels that differ) of one middle frame."""
    err = got - reference
    mse = err.square().mean().item()
    psnr = math.inf if mse == 0 else -10 * math.log10(mse)
    levels = (torch.from_numpy(to_uint8(got)) != torch.from_numpy(to_uint8(reference))).float().mean().item()
    return err.abs().max().item(), psnr, levels


def plot(prefix: Path, rows: list[dict]) -> None:
    with results.plotted(prefix, rows) as axes:
        for codec in dict.fromkeys(r["codec"] for r in rows):
            mine = [r for r in rows if r["codec"] == codec and math.isfinite(r["psnr_db"])]
            if mine:
                axes.plot([r["pair"] for r in mine], [r["psnr_db"] for r in mine], marker="o", label=codec)
        axes.set(xlabel="pair position in the chunk", ylabel="PSNR against the fp32 codec's middle (dB)",
                 title="Output fidelity per codec (frames codec: identical, not drawn)")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, default=CLIP, help=f"a directory of PNG frames (default {CLIP})")
    parser.add_argument("--frames", type=int, default=9, help="frames of the one chunk (default 9: K = 8 pairs)")
    parser.add_argument("--config", default="official", choices=sorted(PRESETS))
    parser.add_argument("--codecs", default="frames,bf16+zstd,fp16+zstd,int8+zstd,int8-token+zstd")
    parser.add_argument("--plot", type=Path, help="write the table as PLOT.csv and PLOT.png")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    config = PRESETS[args.config]
    cloud, edge = load_pair(None, config)  # synthetic weights, seed 0
    paths = sorted(p for p in args.clip.iterdir() if p.suffix.lower() == ".png")[: args.frames]
    frames = [load_frame(path) for path in paths]
    pairs = len(frames) - 1
    print(f"{args.config} dimensions, synthetic weights; {len(frames)} frames of {args.clip.name} in one chunk; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    reference, reference_bytes = interpolate_chunk(cloud, edge, frames, seed=0, codec="fp32", scene_threshold=None)
    rows, sizes = [], {"fp32": reference_bytes / pairs}
    for codec in args.codecs.split(","):
        middles, payload_bytes = interpolate_chunk(cloud, edge, frames, seed=0, codec=codec, scene_threshold=None)
        sizes[codec] = payload_bytes / pairs
        for j in range(pairs):
            worst, psnr, levels = compare(middles[j], reference[j])
            rows.append({"codec": codec, "pair": j, "max_abs": worst, "psnr_db": psnr, "pixels_off_8bit": levels})
    print("\n| codec | bytes per pair | " + " | ".join(f"pair {j}" for j in range(pairs)) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in range(pairs)) + " |")
    print(f"| fp32 | {sizes['fp32'] / 1e6:.3f} MB | " + " | ".join("reference" for _ in range(pairs)) + " |")
    for codec in args.codecs.split(","):
        cells = [r for r in rows if r["codec"] == codec]
        text = ["identical" if r["max_abs"] == 0 else f"{r['max_abs']:.1e} / {r['psnr_db']:.1f} dB / {r['pixels_off_8bit']:.1%}"
                for r in cells]
        print(f"| {codec} | {sizes[codec] / 1e6:.3f} MB | " + " | ".join(text) + " |")
    print("\ncells: max abs error / PSNR / share of 8-bit pixels that differ, against the fp32 codec's middle")
    if args.plot:
        plot(args.plot, rows)


if __name__ == "__main__":
    main()
