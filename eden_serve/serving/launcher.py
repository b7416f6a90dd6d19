"""TorchServe instances of eden-serve, started from any directory and always stopped.

    store = build_archives(tmp / "store", config="tiny")       # archive.sh, synthetic weights
    with torchserve(store, models=["eden_encoder.mar"], workflows=["eden.war"]) as server:
        requests.post(f"{server.inference_url}/wfpredict/eden", files=..., headers=server.inference_headers)

Each instance gets its own working directory (its key_file.json), TMPDIR (TorchServe's pid file,
the JVM's temp files, unpacked archives), log directory and free ports (HTTP, gRPC, worker), so
several run side by side. Its configuration is the repository's ``config.properties`` with the
relative paths resolved and those entries overridden. The tests, the benchmarks and the container
entrypoint start their servers here; TorchServe is run as a program, never imported.
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
from typing import Iterable, Iterator, Sequence

import requests

# A source checkout: the directory above the package holds archive.sh, config.properties and handlers/.
REPO = Path(__file__).resolve().parents[2]
BASE_CONFIG = REPO / "config.properties"
# Entries of config.properties that name files, resolved against the file's own directory.
PATH_KEYS = ("model_store", "workflow_store", "metrics_config")
# TorchServe's allowed_urls pattern that matches no URL (config.properties says why).
NO_URLS = "^$"


def build_archives(
    model_store: str | Path,
    config: str = "tiny",
    codec: str | None = None,
    checkpoint: str | Path | None = None,
    threads: int | None = None,
) -> Path:
    """Run archive.sh into ``model_store`` (synthetic weights unless ``checkpoint``); returns it."""
    model_store = Path(model_store)
    command = ["bash", str(REPO / "archive.sh"), "--config", config, "--model-store", str(model_store)]
    if codec is not None:
        command += ["--codec", codec]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    if threads is not None:
        command += ["--threads", str(threads)]
    # archive.sh finds the project's tools in .venv or on PATH; this interpreter's first.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"archive.sh failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return model_store


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def read_properties(path: Path, resolve: bool = True) -> dict[str, str]:
    """A TorchServe config.properties as a dict, with its file entries made absolute (``resolve``)."""
    properties = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            properties[key.strip()] = value.strip()
    for key in PATH_KEYS:
        if resolve and key in properties and not Path(properties[key]).is_absolute():
            properties[key] = str((path.parent / properties[key]).resolve())
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
    process: subprocess.Popen | None = None  # the torchserve launcher, in the foreground
    grpc_url: str = ""  # grpc://HOST:PORT of the gRPC inference API

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
    host: str = "127.0.0.1",
    prefix: Sequence[str] = (),
    config: str | Path = BASE_CONFIG,
    console: bool = False,
    as_written: bool = False,
) -> Iterator[Server]:
    """A TorchServe serving ``models`` (archive names in ``model_store``, loaded at start) and
    ``workflows`` (registered through the management API), ready when yielded, stopped on exit.

    ``host`` is the address it listens on; ``prefix`` is put before the torchserve command (e.g.
    ``ip netns exec cloud`` to start it on another network host); ``properties`` override entries
    of ``config`` (e.g. max_request_size). TorchServe's output goes to ``logs/launcher.out``, or
    with ``console`` to this process's stdout (a container's log). ``as_written`` passes ``config``'s
    stores and relative paths to TorchServe untouched, as a plain ``torchserve --ts-config FILE
    --model-store STORE`` run from another directory would (the working directory is not the file's).
    """
    model_store = Path(model_store).resolve()
    workdir = Path(tempfile.mkdtemp(prefix="eden-torchserve-"))
    tmp, log_dir = workdir / "tmp", workdir / "logs"
    tmp.mkdir()
    log_dir.mkdir()
    # Ports are probed here; with a prefix that moves the server to another network namespace,
    # they are probed on this side's loopback, which is as good as any guess there.
    probe = "127.0.0.1" if prefix else host
    ports = {n: free_port(probe) for n in ("inference", "management", "metrics", "grpc_inference", "grpc_management", "worker")}

    settings = read_properties(Path(config), resolve=not as_written)
    if not as_written:
        settings.update(model_store=str(model_store), workflow_store=str(model_store))
    settings.update(
        inference_address=f"http://{host}:{ports['inference']}",
        management_address=f"http://{host}:{ports['management']}",
        metrics_address=f"http://{host}:{ports['metrics']}",
        grpc_inference_address=host,
        grpc_management_address=host,
        grpc_inference_port=str(ports["grpc_inference"]),
        grpc_management_port=str(ports["grpc_management"]),
        # Workers talk to the frontend over Unix sockets named after consecutive "ports" from
        # here, inside this instance's TMPDIR; a free port just keeps instances apart.
        initial_worker_port=str(ports["worker"]),
        allowed_urls=NO_URLS,  # whatever the base file says: only archives already in the store register
        disable_token_authorization="false" if token_auth else "true",
    )
    settings.update(properties or {})
    config_file = workdir / "config.properties"
    config_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))

    env = {**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp), "LOG_LOCATION": str(log_dir), "METRICS_LOCATION": str(log_dir)}
    # Workers share the cores (both halves, or other programs): an OpenMP thread that waits for a
    # descheduled sibling must give its core up rather than spin on it (README: "GPUs and threads").
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    launcher = shutil.which("torchserve", path=str(Path(sys.executable).parent)) or shutil.which("torchserve")
    if launcher is None:
        raise RuntimeError("torchserve not found; install the project with its serve extra")
    command = [*prefix, launcher, "--start", "--foreground", "--ncs", "--ts-config", str(config_file),
               "--model-store", str(model_store)]
    models = list(models)
    if models:
        command += ["--models", *models]

    server = Server(
        inference_url=settings["inference_address"],
        management_url=settings["management_address"],
        metrics_url=settings["metrics_address"],
        workdir=workdir,
        log_dir=log_dir,
        token_auth=token_auth,
        grpc_url=f"grpc://{settings['grpc_inference_address']}:{settings['grpc_inference_port']}",
    )
    with contextlib.nullcontext(None) if console else open(log_dir / "launcher.out", "wb") as out:
        # A session of its own: the launcher, the JVM and the workers form one process group that
        # _stop can kill as a whole if the orderly stop leaves anything behind.
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server.process = process
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
        _stop([*prefix, launcher], process, workdir, env)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_started(server: Server, process: subprocess.Popen, timeout: float) -> None:
    """Until the management API answers (and, with token auth, the keys are readable)."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            out = server.log_dir / "launcher.out"
            launcher_out = out.read_text(errors="replace") if out.exists() else "(output on the console)"
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


def _stop(launcher: list[str], process: subprocess.Popen, workdir: Path, env: dict[str, str]) -> None:
    """torchserve --stop (it finds the JVM through the pid file in this instance's TMPDIR), then
    make sure nothing of the process group survives."""
    try:
        subprocess.run([*launcher, "--stop", "--foreground"], cwd=workdir, env=env, capture_output=True, timeout=90)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group's id is the launcher's pid
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
