"""What the largest allowed requests cost a TorchServe node of eden-serve (docs/deploy.md "Capacity").

    .venv/bin/python benchmarks/capacity.py largest [--config tiny] [--size 2160x3840]
    .venv/bin/python benchmarks/capacity.py queue --heap 4g [--arriving 4]

``largest``: one edge request for frames at the pixel limit (all-zero conditions, which compress to
almost nothing): payload bytes, wall time, the worker's CPU time and its peak memory growth.
``queue``: the frontend's heap under a full queue of bodies at max_request_size. The edge worker is
stopped (SIGSTOP) so that bodies pile up: job_queue_size + 1 arrive one by one (the first two
together), then ``--arriving`` more at once; then the worker goes on. Prints each answer's status
and whether the frontend lived.

Builds its own archives (synthetic weights) in a temporary directory and stops every server it starts.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
import torch

from eden_serve import wire
from eden_serve.config import preset
from eden_serve.sandbox.confine import cpu_seconds
from eden_serve.serving.launcher import BASE_CONFIG, read_properties
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.servers import build_archives, torchserve
import results

OCTET = {"Content-Type": "application/octet-stream"}


def proc_status(pid: int, key: str) -> int:
    """A /proc/PID/status entry in bytes (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(f"{key}:"))


def largest(store: Path, config: str, size: tuple[int, int]) -> None:
    model = preset(config)
    grid = model.patch_grid(*size)
    tokens = torch.zeros(2, grid[0] * grid[1], model.hidden_dim)  # zeros: the payload compresses to nothing
    chunk = wire.Chunk(wire.Tokens(tokens), wire.Tokens(tokens), [0.5, 0.5], [0.25, 0.25], wire.Decisions([0.0], [0]), grid, size)
    payload = wire.encode(chunk, model)
    with torchserve(store, models=["eden_ditdec.mar"], token_auth=False) as server:
        (pid,) = server.worker_pids("eden_ditdec")
        start_rss, start_cpu = proc_status(pid, "VmRSS"), cpu_seconds(pid)
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from here
        started = time.perf_counter()
        response = requests.post(f"{server.inference_url}/predictions/eden_ditdec", data=payload, headers=OCTET, timeout=3600)
        wall = time.perf_counter() - started
        cpu, peak = cpu_seconds(pid) - start_cpu, proc_status(pid, "VmHWM") - start_rss
        results.write("capacity_largest", [{"config": config, "size": f"{size[1]}x{size[0]}", "payload_bytes": len(payload),
                                            "status": response.status_code, "wall_s": wall, "worker_cpu_s": cpu, "peak_bytes": peak}])
        print(f"{config} dims, {size[1]}x{size[0]} frames: payload {len(payload)} bytes, HTTP {response.status_code}, "
              f"{wall:.1f} s wall, {cpu_seconds(pid) - start_cpu:.1f} s worker CPU, "
              f"peak +{(proc_status(pid, 'VmHWM') - start_rss) / 2**20:.0f} MiB")


def queue(store: Path, heap: str, arriving: int) -> None:
    properties = read_properties(BASE_CONFIG)
    limit, depth = int(properties["max_request_size"]), int(properties["job_queue_size"])
    body = wire.MAGIC + bytes(limit - len(wire.MAGIC))  # refused at once when the worker reads it
    vmargs = properties["vmargs"].replace("-XX:MaxRAMPercentage=50", f"-Xmx{heap}")
    answers: dict[str, object] = {}

    with torchserve(store, models=["eden_ditdec.mar"], token_auth=False, properties={"vmargs": vmargs}) as server:
        url = f"{server.inference_url}/predictions/eden_ditdec"

        def send(name: str) -> None:
            try:
                answers[name] = requests.post(url, data=body, headers=OCTET, timeout=1800).status_code
            except requests.RequestException as exc:
                answers[name] = type(exc).__name__

        (pid,) = server.worker_pids("eden_ditdec")
        os.kill(pid, signal.SIGSTOP)
        threads = []
        try:
            for k in range(depth + 1):  # the stopped worker takes the first, the queue holds the rest
                threads.append(threading.Thread(target=send, args=(f"held {k}",)))
                threads[-1].start()
                while k and server.describe("eden_ditdec")["jobQueueStatus"]["pendingRequests"] < k:
                    time.sleep(0.5)  # until this body has arrived and waits in the queue
            burst = [threading.Thread(target=send, args=(f"arriving {k}",)) for k in range(arriving)]
            for thread in burst:
                thread.start()
            for thread in burst:
                thread.join()
        finally:
            os.kill(pid, signal.SIGCONT)
        for thread in threads:
            thread.join()
        try:
            after = f"/ping answers {requests.get(f'{server.inference_url}/ping', timeout=10).status_code}"
        except requests.RequestException:
            after = "the frontend is gone"
    results.write("capacity_queue", [{"heap": heap, "body_bytes": limit, "request": name, "answer": answer, "after": after}
                                     for name, answer in sorted(answers.items())])
    print(f"heap {heap}, {depth + 1} bodies of {limit} bytes held, {arriving} arriving: {dict(sorted(answers.items()))}; {after}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("largest")
    one.add_argument("--config", default="tiny", choices=["official", "tiny"])
    one.add_argument("--size", default="2160x3840", help="HxW at the pixel limit (default 4K UHD)")
    many = commands.add_parser("queue")
    many.add_argument("--heap", default="4g", help="the frontend's -Xmx")
    many.add_argument("--arriving", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = build_archives(Path(tmp) / "store", config=getattr(args, "config", "tiny"))
        if args.command == "largest":
            largest(store, args.config, tuple(int(v) for v in args.size.split("x")))
        else:
            queue(store, args.heap, args.arriving)


if __name__ == "__main__":
    main()
