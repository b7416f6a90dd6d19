"""Milliseconds per pair by stage (encode, codec, denoise, decode), per frame size and edge precision.

    .venv/bin/python benchmarks/stages.py [--config official] [--sizes 256x448,480x854] [--precisions fp32,bf16] [--repeat 3]

Runs ``eden-serve bench`` (synthetic weights, the optimised path) once per size and precision, each
in its own process so that one run's caches do not favour the next, and keeps its last line (JSON).
The processes run with ``OMP_WAIT_POLICY=PASSIVE``, as the servers' workers do: on a machine shared
with other jobs, OpenMP threads that spin while waiting for a descheduled sibling made pairs many
times slower (docs/serving.md, "GPUs and threads").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="official", choices=["official", "tiny"])
    parser.add_argument("--sizes", default="256x448,480x854", help="HxW list (default 256x448,480x854)")
    parser.add_argument("--precisions", default="fp32,bf16", help="edge precisions (default fp32,bf16)")
    parser.add_argument("--repeat", type=int, default=3, help="timed pairs after a warm-up (default 3)")
    args = parser.parse_args()
    command = [str(Path(sys.executable).parent / "eden-serve"), "bench", "--config", args.config, "--repeat", str(args.repeat),
               "--no-reference"]
    rows = []
    for size in args.sizes.split(","):
        for precision in args.precisions.split(","):
            run = subprocess.run([*command, "--size", size, "--precision", precision], capture_output=True, text=True,
                                 env={**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")})
            if run.returncode != 0:
                raise SystemExit(f"stages.py: eden-serve bench --size {size} --precision {precision} failed:\n{run.stderr}")
            result = json.loads(run.stdout.strip().splitlines()[-1])
            print(f"{size} {precision} -> {result['precision_used']}: {result['ms_per_pair']:.0f} ms/pair", flush=True)
            rows.append({key: result[key] for key in ("size", "precision", "precision_used", "encode_ms", "codec_ms", "denoise_ms",
                                                      "decode_ms", "ms_per_pair", "threads")})
    results.write("stages", rows)


if __name__ == "__main__":
    main()
