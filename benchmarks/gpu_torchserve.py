"""TorchServe itself on the GPU machine (benchmarks/gpu_torchserve.sh starts it there, with the Java
runtime and the wheels carried: docs/gpu.md, "TorchServe on the GPU"): both archives and the
workflow on GPU 0 (``deviceIds: [0]``), then, each figure a ``TS <name>: ...`` line as it comes:

- the start-up of the server, and the workers' GPU memory (nvidia-smi, per worker process);
- the workflow on a pair, its middle against this process's (the archives' weights, loaded here);
- a clip through ``eden-serve client --cloud/--edge --codec bitstream`` (1080p; ``--quick`` 64x96),
  payloads tagged with the wire key (decoded in the edge's process), against the same clip
  ``eden-serve interpolate`` in one process: the served edge's pairs a second against in process;
- the out-of-memory halving, provoked (harness/faults: a forward of several pairs asks for twice the
  device's memory, for real) and the sticky-error exit (a device-side assert), with the time the
  edge takes to serve again: on a GPU only;
- the same clip to an edge without the wire key (a second server), decoded in the sandbox: the
  sandbox's cost.

    .venv/bin/python benchmarks/gpu_torchserve.py --device cpu --quick     # here, with this machine's Java
    bash benchmarks/gpu_torchserve.sh                                      # on the GPU machine

The servers are real TorchServes on free ports (harness/servers.py), always stopped.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import requests
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from eden_serve import wire  # noqa: E402
from eden_serve.wire import keyed  # noqa: E402
from eden_serve.client.remote import PREFIX as CLOUD_PREFIX  # noqa: E402
from eden_serve.edge import middles_of  # noqa: E402
from eden_serve.model.checkpoint import load_archived  # noqa: E402
from eden_serve.media.frames import png_bytes  # noqa: E402
from eden_serve.serving.refusals import LEAVING  # noqa: E402
from harness import faults  # noqa: E402
from harness.servers import build_archives, torchserve  # noqa: E402

import gpu_clip  # noqa: E402  (benchmarks/, beside this script)

TIMEOUT = 300
MODELS = ["eden_encoder.mar", "eden_ditdec.mar"]


def figure(name: str, text: str) -> None:
    print(f"TS {name}: {text}", flush=True)


def on_gpu_zero(store: Path) -> None:
    """Both archives' workers pinned to GPU 0 (the edge archive says GPU 1, for two-GPU machines)."""
    for archive in MODELS:
        path = store / archive
        with zipfile.ZipFile(path) as source:
            entries = [(info, source.read(info)) for info in source.infolist()]
        with zipfile.ZipFile(path.with_suffix(".tmp"), "w") as target:
            for info, data in entries:
                if info.filename == "model-config.yaml":
                    data = re.sub(rb"(?m)^deviceIds: .*$", b"deviceIds: [0]", data)
                target.writestr(info, data)
        path.with_suffix(".tmp").replace(path)


def worker_memory(server) -> str:
    """Each process's GPU memory (nvidia-smi), the server's workers among them."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except OSError as exc:
        return f"none ({exc.strerror}: no nvidia-smi)"
    return "; ".join(line.strip() for line in done.stdout.splitlines()) or "no process on the GPU"


def workflow_pair(server, store: Path, args, size: tuple[int, int]) -> None:
    frames = gpu_clip.source_frames(size, 2)
    files = {f"frame{i}": (f"frame{i}.png", png_bytes(Image.fromarray(f), 1), "image/png") for i, f in enumerate(frames)}
    started = time.perf_counter()
    response = requests.post(f"{server.inference_url}/wfpredict/eden", files=files | {"seed": (None, "0")},
                             headers=server.inference_headers, timeout=TIMEOUT)
    seconds = time.perf_counter() - started
    if response.status_code != 200:
        figure("workflow_pair", f"FAIL {response.status_code} {response.text[:300]}")
        return
    served = np.asarray(Image.open(io.BytesIO(response.content)).convert("RGB"))
    cloud, edge = load_archived(store, args.device, "auto" if args.device == "cuda" else "fp32")
    tensors = [torch.from_numpy(f).permute(2, 0, 1).float().div(255).to(cloud.device) for f in frames]
    payload = wire.encode(cloud.encode_chunk(tensors, 0), cloud.config, wire.DEFAULT_CODEC)
    here = middles_of(edge, [wire.decode(payload, edge.config).pair(0)])[0].numpy()
    levels = np.abs(served.astype(int) - here.astype(int))
    figure("workflow_pair", f"200 in {seconds:.2f} s, {served.shape[1]}x{served.shape[0]}; against this process's middle: "
                            f"max {levels.max()} levels, {np.mean(levels > 0):.4%} of values differ (edge {edge.precision})")
    del cloud, edge


def pairs_per_second(command: list[str], env: dict | None = None) -> tuple[float | None, str]:
    """A command's own "N pairs/s" (its clip's time, without loading models or starting), and its tail."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, **(env or {})})
    found = re.search(r"([\d.]+) pairs/s", done.stdout)
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
    for line in done.stdout.splitlines()[:2]:  # with -v: the bytes a pair, the encoder's share
        print(f"   {command[3]} {command[4] if len(command) > 4 else ''}: {line.strip()[:300]}", flush=True)
    return (float(found.group(1)) if found and done.returncode == 0 else None), tail[0][:300]


# The clip as the cloud holds it (docs/cloud-sources.md): the bitstream codec's own case, the
# video's packets sent as they are stored. A local file's chunks are uploaded, and go as frames.
SOURCE = f"{CLOUD_PREFIX}clip.mp4"


COUNTER = re.compile(r'^(ts_inference_requests_total|ts_inference_latency_microseconds|ts_queue_latency_microseconds)'
                     r'\{model_name="(\w+)".*\} ([\d.eE+-]+)$', re.M)


def counters(server) -> dict[tuple[str, str], float]:
    """TorchServe's own counters per model (its Prometheus text): requests, and the microseconds
    they spent queued and in their workers, summed since the server started."""
    try:
        text = requests.get(f"{server.metrics_url}/metrics", timeout=30).text
    except requests.RequestException:
        return {}
    return {(name, model): float(value) for name, model, value in COUNTER.findall(text)}


def served_clip(server, source: str, scratch: Path) -> float | None:
    """The client's pairs a second on ``source`` (the cloud's clip, or a local file's path), and
    where the requests' time went, by TorchServe's counters."""
    url = server.inference_url
    before = counters(server)
    started = time.perf_counter()
    rate, tail = pairs_per_second([sys.executable, "-m", "eden_serve.commands.cli", "client", source, "-o", str(scratch / "served.mp4"),
                                   "--cloud", url, "--edge", url, "--codec", wire.BITSTREAM_CODEC, "--token", server.keys.get("inference", ""), "-v"])
    seconds = time.perf_counter() - started
    after = counters(server)
    for model in sorted({m for _, m in after}):
        count, worked, queued = (after.get((name, model), 0) - before.get((name, model), 0) for name in
                                 ("ts_inference_requests_total", "ts_inference_latency_microseconds", "ts_queue_latency_microseconds"))
        if count:
            print(f"   {model}: {count:.0f} requests, {worked / 1e6:.2f} s in all in its workers (mean {worked / 1e3 / count:.0f} ms), "
                  f"queued {queued / 1e6:.2f} s in all; the client's command took {seconds:.1f} s", flush=True)
    return rate if rate is not None else print(f"TS client failed: {tail}", flush=True)


def provoke(server, folder: Path, scratch: Path, gpu: bool) -> None:
    """The out-of-memory halving and the sticky-error exit, each on the next clip's forwards."""
    if not gpu:
        figure("oom_halving", "not provoked: a CPU has no device memory to run out of")
        figure("sticky_error_exit", "not provoked: a device-side assert needs CUDA")
        return
    faults.arm(folder, "edge-oom", "batch")
    rate = served_clip(server, SOURCE, scratch)
    logs = "\n".join(p.read_text(errors="replace") for p in server.log_dir.glob("*.log"))
    halved = len(re.findall(r"ran out of memory; trying", logs))
    figure("oom_halving", f"fired {faults.fired(folder, 'edge-oom')}, batches halved {halved}, the clip {'done' if rate else 'FAILED'} "
                          f"({rate or 0:.1f} pairs/s)")
    faults.arm(folder, "edge-device-assert", "next")
    started = time.monotonic()
    rate = served_clip(server, SOURCE, scratch)
    logs = "\n".join(p.read_text(errors="replace") for p in server.log_dir.glob("*.log"))
    # The worker's own line as it meets the failure (serving/refusals.py); the 503's body, which
    # names device_failure, is the client's and is not logged. Three H200 runs of 2026-11-28 read 0
    # when the line came as the worker left: C++ ended it first (docs/gpu.md).
    said = [line for line in logs.splitlines() if LEAVING in line]
    workers = {found.group(0) for found in map(WORKER.search, said) if found}
    figure("sticky_error_exit", f"fired {faults.fired(folder, 'edge-device-assert')}, workers that left on it "
                                f"{len(workers)} (the line {len(said)} times: once a request failed), the clip "
                                f"{'done after retries' if rate else 'FAILED'} in "
                                f"{time.monotonic() - started:.1f} s")
    # How the worker went, as logged.
    for line in fault_lines(logs):
        figure("sticky_error_log", line)


WORKER = re.compile(r"W-\d+-\w+")  # a worker's name in TorchServe's log lines: W-<port>-<model>_<version>
FAULT_WORDS = re.compile(r"device-side assert|CUDA error|AcceleratorError|Traceback|worker (?:process )?died|"
                         r"exit code|Killed|core dumped|SIGABRT|terminate called|Backend worker|device_failure|exits once")


def fault_lines(logs: str, most: int = 12) -> list[str]:
    """The logs' lines that tell how a worker met the device-side assert, deduplicated, the last
    ``most`` of them, each cut to 300 characters."""
    found = list(dict.fromkeys(line.strip()[:300] for line in logs.splitlines() if FAULT_WORDS.search(line)))
    return found[-most:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="the tiny model at 64x96 (the default on a CPU)")
    parser.add_argument("--frames", type=int, help="frames of the clip (default 96, one GOP; quick 9)")
    args = parser.parse_args()
    args.quick = args.quick or args.device == "cpu"
    gpu = args.device.startswith("cuda")
    size, frames = ((64, 96), args.frames or 9) if args.quick else ((1080, 1920), args.frames or 96)
    java = subprocess.run([f"{os.environ['JAVA_HOME']}/bin/java" if "JAVA_HOME" in os.environ else "java", "-version"],
                          capture_output=True, text=True)
    figure("environment", f"{args.device}, torch {torch.__version__}, Java {(java.stderr.splitlines() or ['none'])[0]}, "
                          f"JAVA_HOME {os.environ.get('JAVA_HOME', 'unset')}")
    with tempfile.TemporaryDirectory(prefix="eden-gpu-torchserve-") as scratch_name:
        scratch = Path(scratch_name)
        started = time.monotonic()
        media = scratch / "media"
        media.mkdir()
        store = build_archives(scratch / "store", config="tiny" if args.quick else "official", precision="auto" if gpu else None,
                               media_root=media)
        on_gpu_zero(store)
        clip = gpu_clip.make_clip(media / SOURCE.removeprefix(CLOUD_PREFIX), size, frames)
        figure("archives", f"built in {time.monotonic() - started:.1f} s, {sum(p.stat().st_size for p in store.iterdir()) >> 20} MiB")
        key = scratch / "wire.key"
        key.write_text(secrets.token_hex(32))
        key.chmod(0o600)
        folder = scratch / "faults"
        folder.mkdir()
        here, _ = pairs_per_second([sys.executable, "-m", "eden_serve.commands.cli", "interpolate", str(clip), "-o", str(scratch / "here.mp4"),
                                    "--config", "tiny" if args.quick else "official", "--device", args.device, "-v"])
        started = time.monotonic()
        with torchserve(store, models=MODELS, workflows=["eden.war"], env={keyed.KEY_FILE_ENV: str(key), **faults.environment(folder)},
                        startup_timeout=TIMEOUT) as server:
            figure("startup", f"both archives and the workflow ready in {time.monotonic() - started:.1f} s")
            figure("workers_gpu_memory", worker_memory(server))
            workflow_pair(server, store, args, size)
            tagged = served_clip(server, SOURCE, scratch)
            figure("served_bitstream", f"{tagged or 0:.2f} pairs/s served (keyed), {here or 0:.2f} in process: "
                                       f"{(tagged or 0) / (here or 1):.2f} of in process ({size[0]}x{size[1]}, {frames} frames, {SOURCE})")
            uploaded = served_clip(server, str(clip), scratch)
            figure("served_uploaded", f"{uploaded or 0:.2f} pairs/s served, {(uploaded or 0) / (here or 1):.2f} of in process "
                                      "(a local file's chunks, uploaded to the cloud as frames)")
            figure("workers_gpu_memory_after", worker_memory(server))
            # TorchServe's collector of system metrics logged a traceback a minute on the H200: why.
            collector = [line.split("MetricCollector - ", 1)[1].strip()[:300] for p in server.log_dir.glob("*.log")
                         for line in p.read_text(errors="replace").splitlines() if "MetricCollector - " in line]
            for line in list(dict.fromkeys(collector))[-8:]:
                figure("metric_collector", line)
            provoke(server, folder, scratch, gpu)
        with torchserve(store, models=MODELS, startup_timeout=TIMEOUT) as server:
            boxed = served_clip(server, SOURCE, scratch)
            figure("sandbox_cost", f"{boxed or 0:.2f} pairs/s in the sandbox against {tagged or 0:.2f} keyed: "
                                   f"cost {1 - (boxed or 0) / (tagged or 1):.1%}")


if __name__ == "__main__":
    main()
