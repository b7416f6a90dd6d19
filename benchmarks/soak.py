"""A soak for memory growth: resident memory (VmRSS, /proc/PID/status) while one long-lived process
does much of the same work, with the tiny model on this machine's CPU. No thresholds: it prints
the curves and, after a warm-up, each curve's growth and its slope.

    .venv/bin/python benchmarks/soak.py [--pairs 600] [--size 48x64] [--chunk 8] [--every 8]
                                        [--requests 600] [--split-pairs 600] [--clips 6] [--clip-frames 41] [--skip-served]

1. In process: one clip of ``--pairs`` + 1 synthetic frames (x264) through
   :func:`eden_serve.clips.pipeline.interpolate_clip_in_process` into an MP4, ``--chunk`` pairs a
   chunk; this process's RSS every ``--every`` chunks.
2. Served: one real TorchServe of the tiny archives (harness/servers.py, stopped on the way out)
   holding the encoder, the edge and the workflow; ``--requests`` workflow pairs (cycling through 8
   distinct ones) from one client; one clip of ``--split-pairs`` + 1 frames through
   :class:`eden_serve.client.Client` over the split (``--cloud/--edge``), ``--chunk`` pairs a
   chunk, this process's RSS every ``--every`` chunks; then ``--clips`` clips of ``--clip-frames``
   frames over the split, a new client each. The RSS of each of the
   server's workers (found under its process tree), of its frontend and of this process every
   ``--every`` requests and after every twentieth of the clips.

The warm-up is the first quarter of each curve's samples; the growth is the last sample less the
first after it, and the slope the least-squares fit over the samples after it, in KiB per 100 pairs
(or requests). Writes benchmarks/results/NAME.csv (``--name``, default soak): every sample.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))  # harness/ is in the checkout, not installed

from eden_serve.client import Client  # noqa: E402
from eden_serve.clips.pipeline import interpolate_clip_in_process  # noqa: E402
from eden_serve.clips.processors import Wrapper  # noqa: E402
from eden_serve.cloud.encoder import CloudEncoder  # noqa: E402
from eden_serve.config import PRESETS  # noqa: E402
from eden_serve.edge import EdgeModel  # noqa: E402
from eden_serve.model import synthetic  # noqa: E402
from eden_serve.model.checkpoint import module_from_state  # noqa: E402
from harness.load import MODEL_NAMES, good_pairs  # noqa: E402
from harness.servers import build_archives, torchserve  # noqa: E402
from harness.videos import make_clip  # noqa: E402
import results  # noqa: E402


def rss_kib(pid: int | str = "self") -> int | None:
    """VmRSS of ``pid`` in KiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def descendants(root: int) -> list[int]:
    """Every process under ``root`` (children, theirs, ...), from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])  # after the name, which may hold spaces
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def server_processes(server) -> dict[str, int]:
    """The server's processes by role: each model's workers (``eden_encoder``, ..., and the
    workflow's own, ``eden__eden_encoder``, ...), the Java frontend, and any other worker under it."""
    roles = {pid: name for name in server.models() for pid in server.worker_pids(name)}
    found = {}
    for pid in descendants(server.process.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pid in roles:
            found[roles[pid]] = pid
        elif "java" in command.split(" ", 1)[0]:
            found["frontend"] = pid
        elif "python" in command.split(" ", 1)[0] and "model_service_worker" in command:
            found[f"worker {pid}"] = pid
    return found


def summarise(label: str, xs: list[int], ys: list[int], unit: str) -> None:
    """The curve after its warm-up (the first quarter): growth, and slope per 100 ``unit``."""
    start = len(xs) // 4
    x, y = xs[start:], ys[start:]
    mean_x, mean_y = sum(x) / len(x), sum(y) / len(y)
    spread = sum((a - mean_x) ** 2 for a in x)
    slope = sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y)) / spread if spread else 0.0
    print(f"  {label}: {y[0] / 1024:.1f} MiB after {x[0]} {unit}, {y[-1] / 1024:.1f} MiB after {x[-1]} "
          f"(growth {y[-1] - y[0]:+d} KiB, slope {100 * slope:+.1f} KiB per 100 {unit}; peak {max(ys) / 1024:.1f} MiB)", flush=True)


class Sampled(Wrapper):
    """A processor whose chunks are counted, this process's RSS noted every ``every`` chunks."""

    def __init__(self, inner, every: int, samples: list):
        super().__init__(inner)
        self.every, self.samples, self.chunks, self.pairs = every, samples, 0, 0

    def __call__(self, index, frames, seed, arrived=None):
        result = self.inner(index, frames, seed, arrived)
        self.chunks, self.pairs = self.chunks + 1, self.pairs + len(frames) - 1
        if self.chunks % self.every == 0:
            self.samples.append((self.pairs, rss_kib()))
        return result


def in_process(args, folder: Path) -> list[dict]:
    config = PRESETS["tiny"]
    state = synthetic.state_dict(config, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cloud = CloudEncoder(module_from_state(state, "cloud", config), config)
        edge = EdgeModel(module_from_state(state, "edge", config), config)
    src = make_clip(folder / "long.mp4", "libx264", {}, args.size, args.pairs + 1, synthetic=True)
    samples: list[tuple[int, int]] = [(0, rss_kib())]
    interpolate_clip_in_process(src, folder / "long-out.mp4", cloud, edge, chunk=args.chunk, progress=False,
                                watch=lambda processor: Sampled(processor, args.every, samples))
    samples.append((args.pairs, rss_kib()))
    print(f"in process: {args.pairs} pairs of {args.size[1]}x{args.size[0]} (WxH), chunks of {args.chunk}; RSS (MiB) by pairs:")
    print("  " + ", ".join(f"{p}: {r / 1024:.1f}" for p, r in samples), flush=True)
    summarise("this process", [p for p, _ in samples], [r for _, r in samples], "pairs")
    return [{"part": "in_process", "role": "this process", "count": p, "rss_kib": r} for p, r in samples]


def served(args, folder: Path) -> list[dict]:
    store = build_archives(folder / "store", config="tiny")
    pairs = good_pairs(store)
    clip_src = synthetic.write_clip(folder / "clip", args.clip_frames, *args.size)
    rows: list[dict] = []
    with torchserve(store, models=[f"{n}.mar" for n in MODEL_NAMES], workflows=["eden.war"]) as server:
        token = server.keys["inference"]

        def sample(part: str, count: int) -> None:
            for role, pid in {**server_processes(server), "this process": os.getpid()}.items():
                rows.append({"part": part, "role": role, "count": count, "rss_kib": rss_kib(pid)})

        sample("requests", 0)
        with Client(server.inference_url, token=token, timeout=60) as client:
            for i in range(args.requests):
                pair = pairs[i % len(pairs)]
                client.interpolate(pair.frame0, pair.frame1, pair.seed)
                if (i + 1) % args.every == 0:
                    sample("requests", i + 1)
        url = server.inference_url
        if args.split_pairs:
            long_src = make_clip(folder / "split.mp4", "libx264", {}, args.size, args.split_pairs + 1, synthetic=True)
            samples: list[tuple[int, int]] = []
            with Client(cloud=url, edge=url, token=token, timeout=60) as client:
                client.interpolate_clip(long_src, folder / "split-out.mp4", chunk=args.chunk, progress=False,
                                        watch=lambda processor: Sampled(processor, args.every, samples))
            rows += [{"part": "split", "role": "this process", "count": p, "rss_kib": r} for p, r in samples]
        for k in range(args.clips):
            with Client(cloud=url, edge=url, token=token, timeout=60) as client:
                client.interpolate_clip(clip_src, folder / f"clip-out-{k}", progress=False)
            if (k + 1) % max(1, args.clips // 20) == 0 or k + 1 == args.clips:  # some 20 samples
                sample("clips", (k + 1) * (args.clip_frames - 1))
    for part, unit in (("requests", "requests"), ("split", "pairs"), ("clips", "pairs")):
        chosen = [r for r in rows if r["part"] == part]
        if not chosen:
            continue
        print(f"served, {part}: RSS (MiB) by {unit}:")
        for role in dict.fromkeys(r["role"] for r in chosen):
            curve = [(r["count"], r["rss_kib"]) for r in chosen if r["role"] == role and r["rss_kib"] is not None]
            print(f"  {role}: " + ", ".join(f"{c}: {v / 1024:.1f}" for c, v in curve))
            if len(curve) >= 4:
                summarise(role, [c for c, _ in curve], [v for _, v in curve], unit)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=600, help="pairs of the in-process clip")
    parser.add_argument("--size", default="48x64", help="HxW of the frames (default 48x64)")
    parser.add_argument("--chunk", type=int, default=8, help="pairs a chunk, in process")
    parser.add_argument("--every", type=int, default=8, help="chunks (of a long clip) or requests between samples")
    parser.add_argument("--requests", type=int, default=600, help="workflow pairs sent to the server")
    parser.add_argument("--split-pairs", type=int, default=600, help="pairs of the long clip sent over --cloud/--edge")
    parser.add_argument("--clips", type=int, default=6, help="short clips sent over --cloud/--edge, a client each")
    parser.add_argument("--clip-frames", type=int, default=41)
    parser.add_argument("--skip-served", action="store_true", help="only the in-process part")
    parser.add_argument("--skip-in-process", action="store_true", help="only the served part")
    parser.add_argument("--name", default="soak")
    args = parser.parse_args()
    args.size = tuple(map(int, args.size.split("x")))
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} threads", flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="eden-soak-") as tmp:
        if not args.skip_in_process:
            rows += in_process(args, Path(tmp))
        if not args.skip_served:
            rows += served(args, Path(tmp))
    results.write(args.name, rows)


if __name__ == "__main__":
    main()
