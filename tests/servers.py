"""Real TorchServe instances for tests: start one from a model store, use it, always stop it.

    store = build_archives(tmp_path / "store")  # tiny model, via archive.sh
    with torchserve(store, models=["eden_encoder.mar"], workflows=["eden.war"]) as server:
        requests.post(f"{server.inference_url}/wfpredict/eden", files=..., headers=server.inference_headers)

Each instance gets free loopback ports (HTTP, gRPC, worker), its own working directory (its
key_file.json), TMPDIR/TEMP (TorchServe's pid file, the JVM's temp files and unpacked archives) and
log directory, so several can run at once. Its configuration is the repository's config.properties
with those overridden. Nothing is built here except by :func:`build_archives`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import requests

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / "config.properties"


def build_archives(
    model_store: str | Path, config: str = "tiny", codec: str | None = None, checkpoint: str | Path | None = None
) -> Path:
    """Run archive.sh into ``model_store`` (synthetic weights unless ``checkpoint``); returns it."""
    model_store = Path(model_store)
    command = ["bash", str(ROOT / "archive.sh"), "--config", config, "--model-store", str(model_store)]
    if codec is not None:
        command += ["--codec", codec]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    # archive.sh finds the project's tools in .venv or on PATH; ours first.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"archive.sh failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return model_store


def free_port() -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_properties(path: Path) -> dict[str, str]:
    properties = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            properties[key.strip()] = value.strip()
    return properties


@dataclass
class Server:
    inference_url: str
    management_url: str
    metrics_url: str
    workdir: Path
    log_dir: Path
    token_auth: bool
    keys: dict[str, str] = field(default_factory=dict)  # "inference", "management" -> key

    @property
    def inference_headers(self) -> dict[str, str]:
        return self._bearer("inference")

    @property
    def management_headers(self) -> dict[str, str]:
        return self._bearer("management")

    def _bearer(self, api: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[api]}"} if self.token_auth else {}

    def read_keys(self) -> None:
        """The keys TorchServe wrote to key_file.json in its working directory."""
        document = json.loads((self.workdir / "key_file.json").read_text())
        self.keys = {api: document[api]["key"] for api in ("inference", "management")}

    def models(self) -> list[str]:
        response = requests.get(f"{self.management_url}/models", headers=self.management_headers, timeout=10)
        response.raise_for_status()
        return [m["modelName"] for m in response.json()["models"]]

    def describe(self, model: str) -> dict:
        response = requests.get(f"{self.management_url}/models/{model}", headers=self.management_headers, timeout=10)
        response.raise_for_status()
        return response.json()[0]

    def worker_pids(self, model: str) -> list[int]:
        return sorted(w["pid"] for w in self.describe(model)["workers"])

    def ready(self, model: str) -> bool:
        description = self.describe(model)
        ready = [w for w in description["workers"] if w["status"] == "READY"]
        return len(ready) >= max(1, description["minWorkers"])

    def wait_ready(self, timeout: float = 120) -> None:
        """Until every registered model has its minimum of workers READY."""
        deadline = time.monotonic() + timeout
        while not all(self.ready(m) for m in self.models()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"models not ready after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def register_workflow(self, url: str, timeout: float = 300) -> None:
        response = requests.post(
            f"{self.management_url}/workflows", params={"url": url}, headers=self.management_headers, timeout=timeout
        )
        if response.status_code != 200:
            raise RuntimeError(f"registering workflow {url}: {response.status_code} {response.text}\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        log = self.log_dir / "ts_log.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no ts_log.log)"


@contextlib.contextmanager
def torchserve(
    model_store: str | Path,
    *,
    models: Iterable[str] = (),
    workflows: Iterable[str] = (),
    token_auth: bool = True,
    properties: dict[str, str] | None = None,
    startup_timeout: float = 180,
) -> Iterator[Server]:
    """A TorchServe serving ``models`` (archive names in ``model_store``, loaded at start) and
    ``workflows`` (registered through the management API), ready when yielded, stopped on exit.

    ``properties`` override config.properties entries (e.g. max_request_size).
    """
    model_store = Path(model_store).resolve()
    workdir = Path(tempfile.mkdtemp(prefix="eden-torchserve-"))
    tmp, log_dir = workdir / "tmp", workdir / "logs"
    tmp.mkdir()
    log_dir.mkdir()
    ports = {name: free_port() for name in ("inference", "management", "metrics", "grpc_inference", "grpc_management", "worker")}

    config = read_properties(BASE_CONFIG)
    config.update(
        inference_address=f"http://127.0.0.1:{ports['inference']}",
        management_address=f"http://127.0.0.1:{ports['management']}",
        metrics_address=f"http://127.0.0.1:{ports['metrics']}",
        grpc_inference_port=str(ports["grpc_inference"]),
        grpc_management_port=str(ports["grpc_management"]),
        # Workers talk to the frontend over Unix sockets named after consecutive "ports" from
        # here, inside this instance's TMPDIR; a free port just keeps instances apart.
        initial_worker_port=str(ports["worker"]),
        model_store=str(model_store),
        workflow_store=str(model_store),
        metrics_config=str((ROOT / config["metrics_config"]).resolve()),
        disable_token_authorization="false" if token_auth else "true",
    )
    config.update(properties or {})
    config_file = workdir / "config.properties"
    config_file.write_text("".join(f"{k}={v}\n" for k, v in config.items()))

    env = {**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp), "LOG_LOCATION": str(log_dir), "METRICS_LOCATION": str(log_dir)}
    launcher = shutil.which("torchserve", path=str(Path(sys.executable).parent)) or shutil.which("torchserve")
    if launcher is None:
        raise RuntimeError("torchserve not found; install the project with its serve extra")
    command = [launcher, "--start", "--foreground", "--ncs", "--ts-config", str(config_file), "--model-store", str(model_store)]
    models = list(models)
    if models:
        command += ["--models", *models]

    server = Server(
        inference_url=config["inference_address"],
        management_url=config["management_address"],
        metrics_url=config["metrics_address"],
        workdir=workdir,
        log_dir=log_dir,
        token_auth=token_auth,
    )
    with open(log_dir / "launcher.out", "wb") as out:
        # A session of its own: the launcher, the JVM and the workers form one process group that
        # _stop can kill as a whole if the orderly stop leaves anything behind.
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_started(server, process, startup_timeout)
        missing = {m.partition("=")[0] if "=" in m else Path(m).stem for m in models} - set(server.models())
        if missing:
            raise RuntimeError(f"TorchServe did not load {', '.join(sorted(missing))}:\n{server.log_tail()}")
        server.wait_ready(startup_timeout)
        for workflow in workflows:
            server.register_workflow(workflow)
        server.wait_ready(startup_timeout)
        yield server
    finally:
        _stop(launcher, process, workdir, env)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_started(server: Server, process: subprocess.Popen, timeout: float) -> None:
    """Until the management API answers (and, with token auth, the keys are readable)."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            launcher_out = (server.log_dir / "launcher.out").read_text(errors="replace")
            raise RuntimeError(f"TorchServe exited with {process.returncode}:\n{launcher_out}\n{server.log_tail()}")
        try:
            if server.token_auth:
                server.read_keys()
            requests.get(f"{server.management_url}/models", headers=server.management_headers, timeout=5).raise_for_status()
            return
        except (OSError, ValueError, KeyError, requests.RequestException):
            pass  # not up yet: no key file, a half-written one, or no listener
        if time.monotonic() > deadline:
            raise TimeoutError(f"TorchServe did not start within {timeout:.0f} s:\n{server.log_tail()}")
        time.sleep(0.5)


def _stop(launcher: str, process: subprocess.Popen, workdir: Path, env: dict[str, str]) -> None:
    """torchserve --stop (it finds the JVM through the pid file in this instance's TMPDIR), then
    make sure nothing of the process group survives."""
    try:
        subprocess.run([launcher, "--stop", "--foreground"], cwd=workdir, env=env, capture_output=True, timeout=90)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group's id is the launcher's pid
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
