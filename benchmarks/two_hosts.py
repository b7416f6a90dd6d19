"""Cloud and edge on two network hosts joined by a link of R Mbit/s: what the link sustains per codec.

    sudo .venv/bin/python benchmarks/two_hosts.py [--frames 17] [--size 272x640] [--rates 20,100,1000]
        [--codecs bf16+zstd,fp16+zstd,int8+zstd] [--inflight 4] [--config official]

Reads the real frames of ../shared/clips/bikes_640x272 (outside the repository; --clip names another
directory). Builds its own archives (synthetic weights), makes the two hosts (eden_serve.netns), runs
one TorchServe on each and the client on the edge host, and removes everything on exit, Ctrl-C and
SIGTERM included. Prints one line per run, then a markdown table; README.md ("Two hosts over a real
link") defines the columns.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import requests
import torch
from PIL import Image

from eden_serve import serving
from eden_serve.client import DECODER, ENCODER, Client
from eden_serve.launcher import REPO, build_archives, torchserve
from eden_serve.netns import two_hosts
from eden_serve.streaming import Middle, interpolate_clip

CLIP = REPO.parent / "shared" / "clips" / "bikes_640x272"
# Each mode is the client options it adds; a chunked mode would add its own option here.
MODES = {"pair": {}}


@dataclass
class Run:
    """One clip through the hosts (or, for the edge-compute bound, through the edge alone)."""

    pairs: int
    seconds: float  # first request to last frame written
    first_seconds: float  # to the first middle frame
    payload_bytes: int = 0  # wire payloads, whole clip
    down_bytes: int = 0  # over the link cloud -> edge, as its tbf charges them
    up_bytes: int = 0  # edge -> cloud: the frames sent to the encoder

    @property
    def rate(self) -> float:
        return self.pairs / self.seconds


def run_clip(clip: Path, out: Path, processor, inflight: int) -> Run:
    first: list[float] = []

    def process(*args):
        middle = processor(*args)
        first.append(time.perf_counter())
        return middle

    started = time.perf_counter()
    summary = interpolate_clip(clip, out, process, inflight=inflight, progress=False)
    shutil.rmtree(out)
    return Run(summary.pairs, summary.seconds, min(first) - started, summary.payload_bytes or 0)


def across_the_link(hosts, client: Client, clip: Path, out: Path, inflight: int) -> Run:
    before = hosts.cloud.sent_bytes(), hosts.edge.sent_bytes()
    run = run_clip(clip, out, client.processor(), inflight)
    run.down_bytes = hosts.cloud.sent_bytes() - before[0]
    run.up_bytes = hosts.edge.sent_bytes() - before[1]
    return run


def edge_alone(cloud, edge, clip: Path, out: Path, codec: str, inflight: int) -> Run:
    """The edge-compute bound: the same clip and client streaming on the edge host, with every
    payload fetched from the cloud beforehand, so each pair costs only the edge's request."""
    frames = sorted(clip.iterdir())
    payloads = []
    for seed, (frame0, frame1) in enumerate(zip(frames, frames[1:])):
        response = requests.post(f"{cloud.inference_url}/predictions/{ENCODER}", headers=cloud.inference_headers,
                                 files={"frame0": frame0.read_bytes(), "frame1": frame1.read_bytes()},
                                 data={"seed": str(seed), "codec": codec}, timeout=300)
        response.raise_for_status()
        payloads.append(response.content)
    session = requests.Session()
    headers = {**edge.inference_headers, "Content-Type": "application/octet-stream"}

    def process(index, frame0, frame1, seed):
        response = session.post(f"{edge.inference_url}/predictions/{DECODER}", data=payloads[index],
                                headers=headers, timeout=300)
        response.raise_for_status()
        return Middle(Image.open(io.BytesIO(response.content)).convert("RGB"), payload_bytes=len(payloads[index]))

    return run_clip(clip, out, process, inflight)


def measure_codec(hosts, cloud, edge, tokens, clip, out, codec, rates, modes, args) -> list[dict]:
    """The rows of one codec, best of ``args.runs``. Each repetition measures the edge bound next to
    the runs over the link, so that both see the same load on a shared machine."""
    bound, best = None, {}
    for _ in range(args.runs):
        hosts.set_rate(max(rates))  # fetching the payloads in advance is not timed
        alone = edge_alone(cloud, edge, clip, out, codec, args.inflight)
        print(f"{codec}, edge alone: {alone.rate:.3f} pairs/s, first middle after {alone.first_seconds:.1f} s", flush=True)
        bound = alone if bound is None or alone.rate > bound.rate else bound
        for rate in rates:
            hosts.set_rate(rate)
            for mode in modes:
                with Client(cloud=cloud.inference_url, edge=edge.inference_url, codec=codec, **tokens,
                            **MODES[mode]) as client:
                    run = across_the_link(hosts, client, clip, out, args.inflight)
                print(f"{codec}, {mode}, {rate:g} Mbit/s: {run.rate:.3f} pairs/s, first middle after "
                      f"{run.first_seconds:.1f} s", flush=True)
                if (rate, mode) not in best or run.rate > best[rate, mode].rate:
                    best[rate, mode] = run
    return [row(rate, codec, mode, run, bound) for (rate, mode), run in best.items()]


def prepare_clip(src: Path, dst: Path, count: int, size: tuple[int, int] | None) -> Path:
    """The first ``count`` frames of ``src``, resized to ``size`` (height, width) if given."""
    frames = sorted(p for p in src.iterdir() if p.suffix.lower() == ".png")[:count]
    if len(frames) < 2:
        raise SystemExit(f"{src}: need at least 2 PNG frames, found {len(frames)}")
    dst.mkdir()
    for path in frames:
        if size is None:
            shutil.copyfile(path, dst / path.name)
        else:
            Image.open(path).convert("RGB").resize(size[::-1], Image.BICUBIC).save(dst / path.name)
    return dst


def split_cpus(cpus: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Cloud and edge CPUs, in the proportion the workers' default threads assume: the cloud the
    encoder's share, the edge (with the client) the rest; one CPU is shared."""
    if len(cpus) == 1:
        return tuple(cpus), tuple(cpus)
    cloud = serving.default_threads("cloud", len(cpus))
    return tuple(cpus[:cloud]), tuple(cpus[cloud:])


def cpu_list(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(","))


def row(rate: float, codec: str, mode: str, run: Run, bound_compute: Run) -> dict:
    link_bytes_per_pair = max(run.down_bytes, run.up_bytes) / run.pairs
    link_rate = rate * 1e6 / 8 / link_bytes_per_pair
    bound = min(link_rate, bound_compute.rate)
    return {
        "R Mbit/s": f"{rate:g}", "codec": codec, "mode": mode,
        "pairs/s": f"{run.rate:.3f}", "first middle": f"{run.first_seconds:.1f} s",
        "payload B/pair": f"{run.payload_bytes / run.pairs / 1e6:.2f} MB",
        "link B/pair down / up": f"{run.down_bytes / run.pairs / 1e6:.2f} / {run.up_bytes / run.pairs / 1e6:.2f} MB",
        "link use down / up": " / ".join(f"{b * 8 / (rate * 1e6 * run.seconds):.0%}" for b in (run.down_bytes, run.up_bytes)),
        "link bound": f"{link_rate:.3f}", "edge bound": f"{bound_compute.rate:.3f}",
        "of min(bounds)": f"{run.rate / bound:.2f}",
    }


def markdown(rows: list[dict]) -> str:
    header = list(rows[0])
    numeric = [i for i, name in enumerate(header) if name not in ("codec", "mode")]
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---:" if i in numeric else "---" for i in range(len(header))) + " |"]
    lines += ["| " + " | ".join(r[name] for name in header) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, default=CLIP, help=f"a directory of PNG frames (default {CLIP})")
    parser.add_argument("--frames", type=int, default=17, help="the first N frames of the clip (default 17, at least 2)")
    parser.add_argument("--size", help="resize the frames to HxW (default: as they are)")
    parser.add_argument("--rates", default="20,100,1000", help="link rates in Mbit/s (default 20,100,1000)")
    parser.add_argument("--codecs", default="bf16+zstd,fp16+zstd,int8+zstd")
    parser.add_argument("--modes", default=",".join(MODES), help=f"client modes (default {','.join(MODES)})")
    parser.add_argument("--inflight", type=int, default=4, help="pairs in flight in the client (default 4)")
    parser.add_argument("--runs", type=int, default=1, help="best of this many runs per row (default 1)")
    parser.add_argument("--config", default="official", choices=["official", "tiny"])
    parser.add_argument("--cloud-cpus", type=cpu_list, help="CPUs of the cloud host, e.g. 0 (default: an eighth)")
    parser.add_argument("--edge-cpus", type=cpu_list, help="CPUs of the edge host and the client (default: the rest)")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    codecs, modes = args.codecs.split(","), args.modes.split(",")
    size = tuple(int(v) for v in args.size.split("x")) if args.size else None
    cloud_cpus, edge_cpus = split_cpus(sorted(os.sched_getaffinity(0)))
    cloud_cpus, edge_cpus = args.cloud_cpus or cloud_cpus, args.edge_cpus or edge_cpus
    warnings.simplefilter("ignore")

    with tempfile.TemporaryDirectory() as tmp, two_hosts(max(rates), cloud_cpus, edge_cpus) as hosts:
        root = Path(tmp)
        clip = prepare_clip(args.clip, root / "clip", args.frames, size)
        width, height = Image.open(next(clip.iterdir())).size
        store = build_archives(root / "store", config=args.config)
        print(f"{args.frames} frames of {width}x{height} from {args.clip}, {args.config} dimensions, synthetic weights; "
              f"cloud CPUs {cloud_cpus}, edge and client CPUs {edge_cpus}; inflight {args.inflight}; best of {args.runs}; "
              f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}", flush=True)
        # The client and its threads run on the edge host's CPUs (threads started later inherit this).
        os.sched_setaffinity(0, edge_cpus)
        with hosts.edge.entered(), contextlib.ExitStack() as servers:
            cloud = servers.enter_context(torchserve(store, models=["eden_encoder.mar"], host=hosts.cloud.address,
                                                     prefix=hosts.cloud.prefix))
            edge = servers.enter_context(torchserve(store, models=["eden_ditdec.mar"], host=hosts.edge.address,
                                                    prefix=hosts.edge.prefix))
            tokens = {"token": cloud.keys["inference"], "edge_token": edge.keys["inference"]}
            pair = sorted(clip.iterdir())[:2]
            with Client(cloud=cloud.inference_url, edge=edge.inference_url, **tokens) as client:
                client.interpolate(*pair)  # warm-up: first requests allocate

            rows = []
            for codec in codecs:
                rows += measure_codec(hosts, cloud, edge, tokens, clip, root / "out", codec, rates, modes, args)
    rows.sort(key=lambda r: (float(r["R Mbit/s"]), codecs.index(r["codec"]), modes.index(r["mode"])))
    print()
    print(markdown(rows))


if __name__ == "__main__":
    main()
