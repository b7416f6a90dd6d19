"""What a hostile chunk request costs the encoder worker (docs/errors-and-limits.md, issue 24).

    .venv/bin/python benchmarks/hostile_chunk.py [--config tiny] [--repeat 5]

Four requests against one real TorchServe encoder, each ``--repeat`` times: 17 black 3840x2160
PNGs (a few hundred kB; refused 413 for the chunk's tokens), 16 of them plus one 64x48 frame (400,
frames of two sizes), an accepted chunk of 17 small frames (64x48) for comparison, and the largest
chunk the server accepts: as many black 3840x2160 frames as its token budget takes. For each:
the status, the median wall time and the median peak growth of the worker's resident memory during
the request (VmHWM, reset before each request, over VmRSS before it).

Builds its own archives (synthetic weights) in a temporary directory and stops the server it starts.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests
import torch
from PIL import Image

from eden_serve.config import preset
from eden_serve.serving.worker import Settings, max_tokens_for
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.servers import build_archives, torchserve
import results

FRAMES = 17


def png(width: int, height: int, value: int = 0) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (value, value, value)).save(buffer, format="PNG")
    return buffer.getvalue()


def memory(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(f"{key}:"))


def measure(url: str, pid: int, frames: list[bytes]) -> tuple[int, float, int]:
    """(status, seconds, peak resident growth in bytes) of one request."""
    files = {f"frame{i}": (f"frame{i}", data, "image/png") for i, data in enumerate(frames)}
    before = memory(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from here
    started = time.perf_counter()
    response = requests.post(url, files=files, timeout=600)
    seconds = time.perf_counter() - started
    return response.status_code, seconds, memory(pid, "VmHWM") - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", help="model dimensions of the archives (default tiny)")
    parser.add_argument("--repeat", type=int, default=5, help="requests of each kind (default 5)")
    args = parser.parse_args()
    black_4k = png(3840, 2160)
    config, settings = preset(args.config), Settings()
    budget = max(settings.max_chunk_tokens, 2 * max_tokens_for(settings.max_pixels, config))
    rows, columns = config.patch_grid(2160, 3840)
    largest = min(settings.max_chunk_frames, budget // (rows * columns))
    cases = {
        f"{FRAMES} x 3840x2160 black": [black_4k] * FRAMES,
        f"{FRAMES - 1} x 3840x2160 + 64x48": [black_4k] * (FRAMES - 1) + [png(64, 48)],
        f"{FRAMES} x 64x48 (accepted)": [png(64, 48, 10 * i) for i in range(FRAMES)],
        f"{largest} x 3840x2160 (the largest)": [black_4k] * largest,
    }
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, config {args.config}")
    with tempfile.TemporaryDirectory() as tmp:
        store = build_archives(Path(tmp) / "store", config=args.config)
        with torchserve(store, models=["eden_encoder.mar"], token_auth=False) as server:
            url = f"{server.inference_url}/predictions/eden_encoder"
            (pid,) = server.worker_pids("eden_encoder")
            rows = []
            measure(url, pid, cases[f"{FRAMES} x 64x48 (accepted)"])  # warm-up
            for name, frames in cases.items():
                runs = [measure(url, pid, frames) for _ in range(args.repeat)]
                statuses = sorted({status for status, _, _ in runs})
                print(f"{name:28s} {sum(map(len, frames)) / 1e3:8.1f} kB  HTTP {statuses}  "
                      f"median {statistics.median(s for _, s, _ in runs) * 1e3:7.1f} ms  "
                      f"peak RSS growth median {statistics.median(g for _, _, g in runs) / 2**20:6.1f} MiB, "
                      f"max {max(g for _, _, g in runs) / 2**20:6.1f} MiB")
                rows.append({"config": args.config, "request": name, "body_bytes": sum(map(len, frames)),
                             "statuses": " ".join(map(str, statuses)), "median_ms": statistics.median(s for _, s, _ in runs) * 1e3,
                             "rss_growth_median_mib": statistics.median(g for _, _, g in runs) / 2**20,
                             "rss_growth_max_mib": max(g for _, _, g in runs) / 2**20})
            assert server.worker_pids("eden_encoder") == [pid], "the worker restarted"
    results.write("hostile_chunk", rows)


if __name__ == "__main__":
    main()
