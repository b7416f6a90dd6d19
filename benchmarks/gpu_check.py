"""What runs on a GPU, checked on one: the golden cases, the codecs, the CPU against the GPU, a batch
against its pairs, the worker's device settings, and ``eden-serve bench`` on the GPU.

    python benchmarks/gpu_check.py [--device cuda] [--out gpu_check.json] [--skip-bench]

Prints one line per check and writes them all as JSON. With ``--device cpu`` it runs the same checks
on the CPU (to try the script where there is no GPU). Needs the repository's tests/golden; runs with
the package importable from the checkout (``PYTHONPATH=.``), no install.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eden_serve import synthetic, wire  # noqa: E402
from eden_serve.checkpoint import module_from_state  # noqa: E402
from eden_serve.cloud.encoder import CloudEncoder  # noqa: E402
from eden_serve.config import PRESETS  # noqa: E402
from eden_serve.edge import EdgeModel  # noqa: E402
from eden_serve.pipeline import interpolate_pair  # noqa: E402
from eden_serve.serving.worker import choose_device, configure_torch  # noqa: E402

GOLDEN = REPO / "tests" / "golden"
# The CPU tests' bounds (tests/test_edge.py, tests/test_pipeline.py), the same here.
BOUNDS = {"fp32": 1e-4, "bf16_max": 0.03, "bf16_mean": 0.005}


def golden_case(name: str):
    data = np.load(GOLDEN / f"{name}.npz")
    meta = json.loads(str(data["config"]))
    state = {k.removeprefix("weights/"): torch.from_numpy(data[k]) for k in data.files if k.startswith("weights/")}
    frames = [torch.from_numpy(data[k]).permute(2, 0, 1).float() / 255 for k in ("frame0", "frame1")]
    return state, frames, meta["noise_seed"], torch.from_numpy(data["output"])


def models(state: dict, config, device: str, precision: str = "fp32"):
    cloud = CloudEncoder(module_from_state(state, "cloud", config), config, device)
    return cloud, EdgeModel(module_from_state(state, "edge", config), config, device, precision)


def check_golden(device: str) -> list[dict]:
    rows = []
    config = PRESETS["tiny"]
    for name in ("tiny_70x100", "tiny_64x96"):
        state, (frame0, frame1), seed, expected = golden_case(name)
        for precision in ("fp32", "bf16"):
            cloud, edge = models(state, config, device, precision)
            cond = cloud.encode(frame0.to(device), frame1.to(device), seed=seed)
            for path in ("fast", "reference") if precision == "fp32" else ("fast",):
                error = (edge.interpolate(cond, path).cpu() - expected).abs()
                ok = error.max().item() <= BOUNDS["fp32"] if precision == "fp32" else (
                    error.max().item() < BOUNDS["bf16_max"] and error.mean().item() < BOUNDS["bf16_mean"])
                rows.append({"check": "golden", "case": name, "precision": edge.precision, "path": path,
                             "max_error": error.max().item(), "mean_error": error.mean().item(), "within_cpu_bounds": ok})
        cloud, edge = models(state, config, device)
        for codec in ("fp32", "bf16+zstd", "frames", wire.NO_WIRE):
            out, size = interpolate_pair(cloud, edge, frame0.to(device), frame1.to(device), seed, codec)
            rows.append({"check": "golden codec", "case": name, "codec": codec, "payload_bytes": size,
                         "max_error": (out.cpu() - expected).abs().max().item()})
    return rows


def check_devices_agree(device: str) -> list[dict]:
    """The same pair, seed and weights (official dimensions) on the CPU and on ``device``."""
    config = PRESETS["official"]
    state = synthetic.state_dict(config, seed=3)
    frames = [torch.from_numpy(np.array(f)).permute(2, 0, 1).float() / 255 for f in synthetic.clip(2, 256, 448)]
    outputs = {}
    for where in ("cpu", device):
        cloud, edge = models(state, config, where)
        outputs[where] = interpolate_pair(cloud, edge, *[f.to(where) for f in frames], 7, "fp32")[0].cpu()
    diff = (outputs["cpu"] - outputs[device]).abs()
    u8 = ((outputs["cpu"] * 255).round() - (outputs[device] * 255).round()).abs()
    return [{"check": "cpu vs device", "size": "256x448", "max_error": diff.max().item(), "mean_error": diff.mean().item(),
             "u8_max": u8.max().item(), "u8_differing": (u8 > 0).float().mean().item()}]


def check_batch(device: str) -> list[dict]:
    """Four pairs in one batched forward against each alone (tiny dimensions, synthetic weights)."""
    config = PRESETS["tiny"]
    cloud, edge = models(synthetic.state_dict(config, seed=1), config, device)
    frames = [torch.from_numpy(np.array(f)).permute(2, 0, 1).float().to(device) / 255 for f in synthetic.clip(5, 64, 96)]
    conds = [cloud.encode(frames[i], frames[i + 1], seed=i) for i in range(4)]
    batched = edge.interpolate_batch(conds).cpu()
    alone = torch.stack([edge.interpolate(c).cpu() for c in conds])
    return [{"check": "batch vs alone", "pairs": 4, "max_error": (batched - alone).abs().max().item()}]


def check_worker(device: str) -> list[dict]:
    if device == "cpu":
        return []
    chosen = choose_device(0)
    configure_torch(chosen, 4, "edge")
    return [{"check": "worker device", "chosen": str(chosen), "current_device": torch.cuda.current_device(),
             "threads": torch.get_num_threads()}]


def bench(device: str) -> list[dict]:
    rows = []
    runs = [["--size", "480x854", "--precision", p] for p in ("fp32", "bf16", "auto")]
    runs += [["--size", "1080x1920", "--precision", "auto"], ["--size", "480x854", "--precision", "auto", "--wire-codec", "none"],
             ["--size", "480x854", "--precision", "auto", "--wire-codec", "frames"]]
    devices = [device] * len(runs) + ([f"{device}:0,{device}:1"] if device != "cpu" else [])
    runs += [["--size", "480x854", "--precision", "auto"]] if device != "cpu" else []
    for options, where in zip(runs, devices):
        command = [sys.executable, "-m", "eden_serve.cli", "bench", "--device", where, "--repeat", "5", "--no-reference", *options]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        rows.append({"check": "bench", "command": " ".join(["eden-serve", *command[3:]]), "rc": done.returncode,
                     "seconds": round(time.perf_counter() - started, 1), "stdout": done.stdout[-3000:],
                     "stderr": done.stderr[-1500:]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--skip-bench", action="store_true")
    args = parser.parse_args()
    rows = [{"check": "environment", "torch": torch.__version__, "cuda": torch.version.cuda,
             "device": torch.cuda.get_device_name(0) if args.device != "cpu" else "cpu"}]
    for check in (check_golden, check_devices_agree, check_batch, check_worker) + (() if args.skip_bench else (bench,)):
        done = len(rows)
        try:
            rows += check(args.device)
        except Exception as exc:  # one failed check must not hide the others' results
            rows.append({"check": check.__name__, "failed": f"{type(exc).__name__}: {exc}"})
        for row in rows[done:]:
            print(json.dumps({k: v for k, v in row.items() if k not in ("stdout", "stderr")}), flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
