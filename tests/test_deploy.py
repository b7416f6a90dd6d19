"""The deployment files: the container entrypoint (run here, without Docker), the Dockerfile (hadolint),
the Kubernetes overlays (kubectl kustomize, the Kubernetes JSON schemas) and the KServe manifests.

Each checker comes from a package of the deploy-check extra, so no Docker engine and no cluster is needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from eden_serve import serving
from eden_serve.checkpoint import load_cloud, load_edge
from eden_serve.client import Client
from eden_serve.frames import load_frame, to_uint8
from eden_serve.launcher import REPO, build_archives, free_port
from eden_serve.pipeline import interpolate_pair

DEPLOY = REPO / "deploy"
ENTRYPOINT = DEPLOY / "docker" / "entrypoint.sh"
CLUSTER_PROPERTIES = DEPLOY / "kubernetes" / "base" / "serve.properties"
BIN = Path(sys.executable).parent


# --- the entrypoint, serving -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # One thread per worker (archive.sh --threads), so the in-process oracle can match it exactly.
    return build_archives(tmp_path_factory.mktemp("model_store"), config="tiny", threads=1)


def wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line for line in log.read_text(errors="replace").splitlines() if text in line]
        if lines:
            return lines[0]
        if process.poll() is not None:
            pytest.fail(f"the entrypoint exited with {process.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"no {text!r} within {timeout:.0f} s:\n{log.read_text(errors='replace')[-4000:]}")


def stop(process: subprocess.Popen) -> int:
    """SIGTERM, as Kubernetes stops a container; SIGINT, then SIGKILL only if that is ignored."""
    for sig, grace in ((signal.SIGTERM, 120), (signal.SIGINT, 60), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            break
        process.send_signal(sig)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return process.returncode


@pytest.mark.serving
def test_entrypoint_serves_from_another_directory_and_stops_on_sigterm(store, tmp_path):
    """The image's entrypoint, started elsewhere with the cluster's properties: a real prediction,
    no token needed (token authorization is off in the cluster), then SIGTERM stops TorchServe."""
    ports = {name: free_port() for name in ("inference", "management", "metrics")}
    local = tmp_path / "local.properties"  # loopback and free ports over the cluster's addresses
    local.write_text("".join(f"{name}_address=http://127.0.0.1:{port}\n" for name, port in ports.items()))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    log = tmp_path / "entrypoint.log"
    # PATH without the project's environment: the entrypoint finds it from its own location.
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["bash", str(ENTRYPOINT), "serve", "both", "--model-store", str(store),
             "--properties", str(CLUSTER_PROPERTIES), "--properties", str(local)],
            cwd=elsewhere, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        ready = wait_for_line(log, "eden-serve: both ready", process, timeout=300)
        assert "token authorization off" in ready
        url = f"http://127.0.0.1:{ports['inference']}"
        ping = requests.get(f"{url}/ping", timeout=10)
        assert ping.status_code == 200 and ping.json() == {"status": "Healthy"}

        frame0, frame1 = REPO / "examples" / "frame0.png", REPO / "examples" / "frame1.png"
        with Client(cloud=url, edge=url) as client:
            served = np.asarray(client.interpolate(frame0, frame1, seed=5))

        with zipfile.ZipFile(store / "eden_encoder.mar") as z:
            z.extract(serving.CLOUD_WEIGHTS, tmp_path)
        with zipfile.ZipFile(store / "eden_ditdec.mar") as z:
            z.extract(serving.EDGE_WEIGHTS, tmp_path)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            expected, _ = interpolate_pair(
                load_cloud(tmp_path / serving.CLOUD_WEIGHTS), load_edge(tmp_path / serving.EDGE_WEIGHTS),
                load_frame(frame0), load_frame(frame1), seed=5,
            )
        finally:
            torch.set_num_threads(threads)
        assert np.array_equal(served, to_uint8(expected))
        assert not list(elsewhere.iterdir()), "the entrypoint wrote into its working directory"
    finally:
        code = stop(process)
    assert code == 143, log.read_text(errors="replace")[-4000:]
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{ports['inference']}/ping", timeout=5)


def test_serve_without_archives_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "serve", "edge", "--model-store", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"eden-serve: error: no eden_ditdec.mar in {tmp_path}; build the archives (archive.sh), or pass --checkpoint"
    ]


def test_serve_refuses_a_wrong_checkpoint_before_building(tmp_path):
    checkpoint = tmp_path / "eden.pt"
    checkpoint.write_bytes(b"junk")
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "serve", "edge", "--model-store", str(tmp_path / "store"), "--checkpoint", str(checkpoint)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "not a PyTorch checkpoint" in result.stderr
    assert not (tmp_path / "store").exists()
