"""A normal (not editable) install: the wheel carries what TorchServe reads, and the installed package
builds its archives and serves from a directory that is not the checkout.

The wheel is built from the checkout and installed with ``pip install --no-deps --target``: the
package lies outside the checkout, as in a fresh environment, and its dependencies come from this
environment (installing torch again would take minutes and the network)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import requests

from eden_serve.model.checkpoint import load_archived
from harness.servers import REPO, free_port

GLUE = ["config.properties", "eden.yaml", "eden_workflow_handler.py", "eden_encoder_handler.py", "eden_encoder-config.yaml",
        "eden_ditdec_handler.py", "eden_ditdec-config.yaml"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of what the image's build context holds, so that the build needs nothing else
    # and leaves no build/ directory in the checkout.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    shutil.copy(REPO / "pyproject.toml", source)
    shutil.copytree(REPO / "eden_serve", source / "eden_serve", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                             "--wheel-dir", str(out), str(source)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return next(out.glob("eden_serve-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target), str(wheel)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return target


def environment(installed: Path) -> dict[str, str]:
    # The target directory comes first on the path, ahead of the editable install's finder.
    return {**os.environ, "PYTHONPATH": str(installed)}


def test_the_wheel_carries_the_torchserve_files_and_not_the_harness(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"eden_serve/serving/torchserve/{name}" for name in GLUE} <= names
    assert "eden_serve/serving/archive.py" in names
    assert not [n for n in names if n.startswith(("harness/", "tests/", "benchmarks/"))]


def test_the_installed_package_builds_the_archives_elsewhere(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    which = subprocess.run([sys.executable, "-c", "import eden_serve.serving.archive as a; print(a.__file__)"], cwd=elsewhere,
                           env=environment(installed), capture_output=True, text=True, timeout=60)
    assert Path(which.stdout.strip()).is_relative_to(installed), "the checkout's package was imported, not the installed one"
    result = subprocess.run(
        [str(installed / "bin" / "eden-serve"), "archive", "--config", "tiny", "--precision", "bf16", "--threads", "1"],
        cwd=elsewhere, env=environment(installed), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    store = elsewhere / "model_store"
    assert sorted(p.name for p in store.iterdir()) == ["eden.war", "eden_ditdec.mar", "eden_encoder.mar"]
    with zipfile.ZipFile(store / "eden_ditdec.mar") as archive:
        config = archive.read("model-config.yaml").decode()
        assert "  precision: bf16  " in config and "  threads: 1  " in config
        # The package inside the archive is the installed one, without the TorchServe files.
        assert "eden_serve/serving/archive.py" in archive.namelist()
        assert not [n for n in archive.namelist() if "/torchserve/" in n or "__pycache__" in n]
    # The halves are the synthetic weights, as the editable install builds them.
    cloud, edge = load_archived(store)
    assert cloud.config.name == edge.config.name == "tiny"


@pytest.mark.serving
def test_the_installed_package_serves_both_halves_from_another_directory(installed, tmp_path):
    """``eden-serve serve both --synthetic`` from a directory that is not the checkout: it builds the
    archives, serves, answers /ping, and stops on SIGTERM."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ports = {name: free_port() for name in ("inference", "management", "metrics")}
    local = tmp_path / "local.properties"  # free loopback ports; token authorization off, to ping without a key
    local.write_text("".join(f"{name}_address=http://127.0.0.1:{port}\n" for name, port in ports.items())
                     + "".join(f"grpc_{api}_port={free_port()}\n" for api in ("inference", "management"))
                     + "disable_token_authorization=true\n")
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(installed / "bin" / "eden-serve"), "serve", "both", "--synthetic", "--config", "tiny", "--threads", "1",
             "--properties", str(local)],
            cwd=elsewhere, env=environment(installed), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while "eden-serve: both ready" not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        ping = requests.get(f"http://127.0.0.1:{ports['inference']}/ping", timeout=10)
        assert ping.status_code == 200 and ping.json() == {"status": "Healthy"}
        models = requests.get(f"http://127.0.0.1:{ports['management']}/models", timeout=10).json()["models"]
        assert sorted(m["modelName"] for m in models) == ["eden_ditdec", "eden_encoder"]
        assert (elsewhere / "model_store" / "eden_ditdec.mar").is_file()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
    assert code == 143, log.read_text(errors="replace")[-4000:]
