"""TorchServe instances for the tests and benchmarks, started from any directory and always stopped.

    store = build_archives(tmp / "store", config="tiny")       # eden_serve.serving.archive, synthetic weights
    with torchserve(store, models=["eden_encoder.mar"], workflows=["eden.war"]) as server:
        requests.post(f"{server.inference_url}/wfpredict/eden", files=..., headers=server.inference_headers)

Each instance gets its own temporary working directory (its key_file.json, TMPDIR, logs) and free
ports (HTTP, gRPC, worker), so several run side by side. Its configuration is the package's
``config.properties`` with the relative paths resolved and those entries overridden; the server
itself is started, waited for and stopped by :func:`eden_serve.serving.launcher.running`, as a
production node is.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import warnings
import zipfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from eden_serve.serving.archive import Options, build
from eden_serve.serving.launcher import BASE_CONFIG, NO_URLS, Server, read_properties, running, write_properties
from eden_serve.serving.tls import ServerTLS

# The checkout: tests and benchmarks read its examples, test data and deployment files.
REPO = Path(__file__).resolve().parents[1]


def build_archives(
    model_store: str | Path,
    config: str = "tiny",
    codec: str | None = None,
    checkpoint: str | Path | None = None,
    threads: int | None = None,
    precision: str | None = None,
    media_root: str | Path | None = None,
) -> Path:
    """The archives in ``model_store`` (synthetic weights unless ``checkpoint``, without their
    warning); returns the store. Options left ``None`` keep the build's defaults."""
    given = {"codec": codec, "threads": threads, "precision": precision, "media_root": media_root and str(media_root)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build(model_store, checkpoint=checkpoint, config=config,
              options=Options(**{k: v for k, v in given.items() if v is not None}))
    return Path(model_store)


def set_handler(archive: str | Path, settings: dict) -> Path:
    """``archive`` (a .mar) rewritten with ``settings`` (JSON values, which YAML reads) appended to
    its model-config.yaml's ``handler:`` section, the last section of our model-configs."""
    archive = Path(archive)
    with zipfile.ZipFile(archive) as source:
        entries = [(info, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(archive.with_suffix(".tmp"), "w") as target:
        for info, data in entries:
            if info.filename == "model-config.yaml":
                data = data.rstrip(b"\n") + b"".join(f"\n  {key}: {json.dumps(value)}".encode() for key, value in settings.items()) + b"\n"
            target.writestr(info, data)
    archive.with_suffix(".tmp").replace(archive)
    return archive


@contextlib.contextmanager
def loopback_http(handler: type[http.server.BaseHTTPRequestHandler]):
    """A small HTTP server of our own on a free loopback port, in a thread: yields its URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()


# Ports handed out by this process, never handed out twice.
_given: set[int] = set()
LOWEST_PORT = 10000


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, below the kernel's range of ephemeral ports where there is
    room: a port the kernel picks from that range may be taken as the local end of an outgoing
    connection before the server binds it (the likely cause of one CI failure: a TorchServe that
    answered its management API once, then was gone, as it is when its gRPC port is taken)."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = list(range(LOWEST_PORT, ephemeral_low))
    random.shuffle(candidates)
    for port in candidates or [0]:
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _given:
            _given.add(port)
            return port
    raise OSError(f"no free port on {host}")


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
    tls: ServerTLS | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """A TorchServe serving ``models`` and ``workflows`` on free ports of ``host``, ready when
    yielded, stopped and its directory removed on exit.

    ``prefix`` is put before the torchserve command (e.g. ``ip netns exec cloud`` to start it on
    another network host); ``properties`` override entries of ``config`` (e.g. max_request_size).
    ``as_written`` passes ``config``'s stores and relative paths to TorchServe untouched, as a plain
    ``torchserve --ts-config FILE --model-store STORE`` run from another directory would (the working
    directory is not the file's). ``tls`` makes every address HTTPS and gRPC TLS with its certificate
    (applied last, over ``properties``); ``env`` adds to the environment of TorchServe and its workers.
    """
    model_store = Path(model_store).resolve()
    workdir = Path(tempfile.mkdtemp(prefix="eden-torchserve-"))
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
    if tls is not None:
        settings.update(tls.properties(settings))
    try:
        with running(write_properties(workdir / "config.properties", settings), model_store, workdir,
                     models=models, workflows=workflows, startup_timeout=startup_timeout, prefix=prefix,
                     console=console, tls=tls, env=env) as server:
            yield server
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_script(args: Sequence[str], timeout: float, **options) -> subprocess.CompletedProcess:
    """A script that may start TorchServes, run to its end and its output captured as text. Past
    ``timeout`` it is sent SIGTERM, on which the launcher stops its servers as it ends, and killed
    only if it is still there two minutes later; subprocess.run's own timeout kills it at once, and
    the servers it started, in sessions of their own, would outlive it."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                out, err = process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            raise AssertionError(f"{args[1] if len(args) > 1 else args[0]} ran past {timeout:.0f} s and was stopped:\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(args, process.returncode, out, err)
