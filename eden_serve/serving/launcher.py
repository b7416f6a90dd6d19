"""TorchServe run as a program: started on a configuration file, waited for, and always stopped.

    with running(config_file, model_store, workdir, models=["eden_ditdec.mar"]) as server:
        requests.post(f"{server.inference_url}/predictions/eden_ditdec", data=payload, headers=...)

``workdir`` is the instance's own: its working directory (TorchServe writes key_file.json there),
TMPDIR (the pid file, the JVM's temp files, unpacked archives) and log directory, so instances
with their own directories and addresses run side by side. ``eden-serve serve`` (the container's
process) starts its node here; the tests and benchmarks add free ports and temporary directories on
top (``harness/servers.py`` in the checkout). TorchServe is never imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import requests

from .tls import ServerTLS

# The base configuration, shipped with the package next to the archives' handler files.
BASE_CONFIG = Path(__file__).resolve().parent / "torchserve" / "config.properties"
# Entries of config.properties that name files, resolved against the file's own directory.
PATH_KEYS = ("model_store", "workflow_store", "metrics_config")
# TorchServe's allowed_urls pattern that matches no URL (config.properties says why).
NO_URLS = "^$"


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


def write_properties(path: Path, settings: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


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
    # The launcher's own requests (readiness, models); with TLS, pinned to the server's certificate.
    session: requests.Session = field(default_factory=requests.Session)
    grpc_url: str = ""  # grpc://HOST:PORT (grpcs:// with TLS) of the gRPC inference API

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
        response = self.session.get(f"{self.management_url}/models", headers=self.management_headers, timeout=10)
        response.raise_for_status()
        return [m["modelName"] for m in response.json()["models"]]

    def describe(self, model: str) -> dict:
        response = self.session.get(f"{self.management_url}/models/{model}", headers=self.management_headers, timeout=10)
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
        response = self.session.post(
            f"{self.management_url}/workflows", params={"url": url}, headers=self.management_headers, timeout=timeout
        )
        if response.status_code != 200:
            raise RuntimeError(f"registering workflow {url}: {response.status_code} {response.text}\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        log = self.log_dir / "ts_log.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no ts_log.log)"


def find_torchserve() -> str:
    """The torchserve command of this interpreter's environment, else the one on PATH."""
    found = shutil.which("torchserve", path=str(Path(sys.executable).parent)) or shutil.which("torchserve")
    if found is None:
        raise RuntimeError("torchserve not found; install eden-serve with its serve extra")
    return found


@dataclass(frozen=True)
class Launch:
    """How :func:`running` starts TorchServe: the ``models`` it serves (archive names in the model
    store, loaded at start) and the ``workflows`` (registered through the management API), ready
    within ``startup_timeout`` seconds. ``prefix`` is put before the torchserve command (e.g. ``ip
    netns exec cloud`` to start it on another network host). TorchServe's output goes to
    ``workdir/logs/launcher.out``, or with ``console`` to this process's stdout (a container's
    log). ``tls`` is the certificate the configuration's https:// addresses serve (its
    ``properties`` written into the file), which the launcher's own requests pin; ``env`` adds to
    the environment of TorchServe and its workers."""

    models: Sequence[str] = ()
    workflows: Sequence[str] = ()
    startup_timeout: float = 180
    prefix: Sequence[str] = ()
    console: bool = False
    tls: ServerTLS | None = None
    env: dict[str, str] | None = None


@contextlib.contextmanager
def running(config_file: Path, model_store: Path, workdir: Path, launch: Launch | None = None, **given) -> Iterator[Server]:
    """TorchServe on ``config_file``, as ``launch`` (or its fields ``given`` by name) says, ready when
    yielded, stopped on exit. Its addresses and token authorization are the file's."""
    launch = replace(launch, **given) if launch is not None else Launch(**given)
    settings = read_properties(config_file, resolve=False)
    env = _environment(workdir, launch.env)
    launcher = find_torchserve()
    models = list(launch.models)
    command = [*launch.prefix, launcher, "--start", "--foreground", "--ncs", "--ts-config", str(config_file),
               "--model-store", str(model_store), *(["--models", *models] if models else [])]
    server = _server(settings, workdir, launch.tls)
    with contextlib.nullcontext(None) if launch.console else open(server.log_dir / "launcher.out", "wb") as out:
        # A session of its own: the launcher, the JVM and the workers form one process group that
        # _stop can kill as a whole if the orderly stop leaves anything behind.
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server.process = process
    with _ended_by_sigterm():
        try:
            _wait_started(server, process, launch.startup_timeout)
            missing = {m.partition("=")[0] if "=" in m else Path(m).stem for m in models} - set(server.models())
            if missing:
                raise RuntimeError(f"TorchServe did not load {', '.join(sorted(missing))}:\n{server.log_tail()}")
            server.wait_ready(launch.startup_timeout)
            for workflow in launch.workflows:
                server.register_workflow(workflow)
            server.wait_ready(launch.startup_timeout)
            yield server
        finally:
            _stop([*launch.prefix, launcher], process, workdir, env)
            server.session.close()


@contextlib.contextmanager
def _ended_by_sigterm() -> Iterator[None]:
    """SIGTERM ends this process through its ``finally`` blocks, so the servers it started are
    stopped: Python's default ends it on the spot, and their sessions of their own outlive it. As
    an interrupt, which a test run also ends on (after its teardown), where a SystemExit would only
    fail the test at hand. Only where nothing else handles SIGTERM, and from the main thread, where
    handlers are set."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupted(*_):
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _environment(workdir: Path, env: dict[str, str] | None) -> dict[str, str]:
    """TorchServe's environment: this one's, ``env`` over it, temporary files and logs under ``workdir``."""
    tmp, log_dir = workdir / "tmp", workdir / "logs"
    tmp.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(exist_ok=True)
    env = {**os.environ, **(env or {}), "TMPDIR": str(tmp), "TEMP": str(tmp), "LOG_LOCATION": str(log_dir), "METRICS_LOCATION": str(log_dir)}
    # Workers share the cores (both halves, or other programs): an OpenMP thread that waits for a
    # descheduled sibling must give its core up rather than spin on it (docs/serving.md: "GPUs and threads").
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Java decodes file names by the locale: under C or POSIX (a container's, a service's) it cannot
    # find an archive whose path is not ASCII ("TorchServe did not load"). Python's own answer to
    # that locale is UTF-8 (PEP 538, 540), and so is the JVM's here.
    ctype = next((env[name] for name in ("LC_ALL", "LC_CTYPE", "LANG") if env.get(name)), "C")
    if "utf8" not in ctype.lower().replace("-", ""):
        env["LC_ALL"] = "C.UTF-8"
    return env


def _server(settings: dict[str, str], workdir: Path, tls: ServerTLS | None) -> Server:
    """The server that ``settings`` describe, its requests pinned to ``tls``'s certificate."""
    return Server(
        inference_url=settings["inference_address"],
        management_url=settings["management_address"],
        metrics_url=settings["metrics_address"],
        workdir=workdir,
        log_dir=workdir / "logs",
        token_auth=settings.get("disable_token_authorization", "false").lower() != "true",
        session=tls.pinned_session() if tls is not None else requests.Session(),
        # TorchServe's defaults where the file names none.
        grpc_url=f"{'grpcs' if tls is not None else 'grpc'}://{settings.get('grpc_inference_address', '127.0.0.1')}:"
                 f"{settings.get('grpc_inference_port', '7070')}",
    )


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
            server.session.get(f"{server.management_url}/models", headers=server.management_headers, timeout=5).raise_for_status()
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
