"""``eden-serve serve``: one TorchServe node of eden-serve in the foreground, the container's process.

    eden-serve serve edge --model-store /models --properties /etc/eden/serve.properties
    eden-serve serve cloud --model-store /models --checkpoint hf://zhZ524/EDEN/eden.pt --threads 4
    eden-serve serve edge --tls-cert node.pem --tls-key node.key --wire-key-file /etc/eden/wire.key

It serves the cloud half (eden_encoder.mar), the edge half (eden_ditdec.mar) or both from a model
store, building the archives first (:mod:`eden_serve.serving.archive`, in this process) when given a
checkpoint or ``--synthetic``. The configuration is the package's config.properties with the
``--properties`` files over it (addresses, token authorization...); TorchServe runs in a temporary
directory of its own (its key_file.json, logs), its log goes to stdout, and SIGTERM stops it in
order (``torchserve --stop``). The process ends when TorchServe does, non-zero, so that a
supervisor restarts it. With a certificate (``--tls-cert``/``--tls-key``, or an https:// address in
the properties) every address serves HTTPS and gRPC TLS; with a wire key file, the workers tag or
check payloads (docs/tls.md).
"""

from __future__ import annotations

import sys
import tempfile
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import yaml

from ..errors import BadInputError
from ..wire import keyed
from .archive import Options, build
from .launcher import BASE_CONFIG, NO_URLS, read_properties, running, write_properties
from .tls import ServerTLS
from .worker import Settings

ARCHIVES = {"cloud": ["eden_encoder.mar"], "edge": ["eden_ditdec.mar"], "both": ["eden_encoder.mar", "eden_ditdec.mar"]}
MODEL_CONFIG = "model-config.yaml"  # where torch-model-archiver puts an archive's, at its root


@dataclass(frozen=True)
class NodeOptions:
    """How a node serves: with ``checkpoint`` (a path or an ``hf://`` reference) or ``synthetic``,
    the archives are built into the model store first, with ``config``'s dimensions and the
    ``archive`` options; ``ts_config`` is the base TorchServe configuration and ``properties`` the
    files over it; the workers load within ``startup_timeout`` seconds; ``tls_cert`` and
    ``tls_key`` serve TLS; ``wire_key_file`` is the key the workers tag or check payloads with."""

    checkpoint: str | None = None
    synthetic: bool = False
    config: str = "official"
    archive: Options = Options()
    ts_config: str | Path = BASE_CONFIG
    properties: Sequence[str | Path] = ()
    startup_timeout: float = 600
    tls_cert: str | None = None
    tls_key: str | None = None
    wire_key_file: str | None = None


def serve(side: str, model_store: str | Path, options: NodeOptions | None = None, **given) -> int:
    """Serve ``side`` (cloud, edge or both) until TorchServe exits, as ``options`` (or its fields
    ``given`` by name) say; returns the exit code to end with."""
    options = replace(options, **given) if options is not None else NodeOptions(**given)
    if side not in ARCHIVES:
        raise BadInputError(f"side must be one of {', '.join(ARCHIVES)}, got {side!r}")
    store = Path(model_store).resolve()
    _archives(side, store, options)
    settings = _settings(store, options)
    tls = _tls(options.tls_cert, options.tls_key, settings)
    if tls is not None:
        settings.update(tls.properties(settings))
    env = _wire_key_environment(options.wire_key_file)
    _check_handler_settings(store, ARCHIVES[side])

    with tempfile.TemporaryDirectory(prefix="eden-serve-") as tmp:
        workdir = Path(tmp)
        config_file = write_properties(workdir / "config.properties", settings)
        with running(config_file, store, workdir, models=ARCHIVES[side], startup_timeout=options.startup_timeout,
                     console=True, tls=tls, env=env) as server:
            keys = f"; keys in {server.workdir / 'key_file.json'}" if server.token_auth else "; token authorization off"
            print(f"eden-serve: {side} ready: inference {server.inference_url}, management {server.management_url}, "
                  f"metrics {server.metrics_url}{keys}", flush=True)
            code = server.process.wait()
    print(f"eden-serve: TorchServe exited with code {code}", file=sys.stderr)
    return code or 1


def _archives(side: str, store: Path, options: NodeOptions) -> None:
    """The side's archives in ``store``: built first where the options name weights."""
    if options.archive.media_root is not None and options.checkpoint is None and not options.synthetic:
        raise BadInputError("--media-root is written into the archives built at start: give --checkpoint or --synthetic, "
                            "or build the archives with eden-serve archive --media-root")
    if options.checkpoint is not None or options.synthetic:
        print(f"building the {options.config} archives into {store} from {options.checkpoint or 'synthetic weights'}", flush=True)
        build(store, checkpoint=options.checkpoint, config=options.config, options=options.archive)
    missing = [name for name in ARCHIVES[side] if not (store / name).is_file()]
    if missing:
        raise BadInputError(f"no {missing[0]} in {store}; build the archives (archive.sh), or pass --checkpoint")


def _settings(store: Path, options: NodeOptions) -> dict[str, str]:
    """The TorchServe configuration: the base file, then the properties files over it."""
    base = Path(options.ts_config)
    if not base.is_file():
        raise BadInputError(f"--ts-config {base}: no such file")
    # Only archives already in the store register, whatever the base says; --properties may say otherwise.
    settings = read_properties(base) | {"model_store": str(store), "workflow_store": str(store), "allowed_urls": NO_URLS}
    for path in map(Path, options.properties):
        if not path.is_file():
            raise BadInputError(f"--properties {path}: no such file")
        settings.update(read_properties(path))
    return settings


def _tls(cert: str | None, key: str | None, settings: dict[str, str]) -> ServerTLS | None:
    if (cert is None) != (key is None):
        raise BadInputError("--tls-cert and --tls-key go together: the certificate and its private key")
    return ServerTLS.from_files(cert, key) if cert is not None else ServerTLS.from_properties(settings)


def _check_handler_settings(store: Path, names: Sequence[str]) -> None:
    """Each archive's ``handler:`` settings, judged here as its workers judge them as they load: a
    value out of range (``max_pixels: 0``) failed every worker at once, and TorchServe loaded them
    again and again until the startup timeout (10 minutes), the reason buried in its log."""
    for name in names:
        try:
            with zipfile.ZipFile(store / name) as archive:
                text = archive.read(MODEL_CONFIG) if MODEL_CONFIG in archive.namelist() else None
            model_config = yaml.safe_load(text) if text is not None else None
        except (OSError, zipfile.BadZipFile, yaml.YAMLError) as exc:
            raise BadInputError(f"{store / name} is not a readable model archive ({' '.join(str(exc).split())[:200]}); "
                                "build the archives again (eden-serve archive)") from None
        try:
            Settings.from_yaml(model_config if isinstance(model_config, dict) else None)
        except ValueError as exc:
            raise BadInputError(f"{store / name}: {exc}") from None


def _wire_key_environment(path: str | None) -> dict[str, str]:
    """The workers' environment naming the key file; read here first, so that a bad file is one
    line rather than workers failing to load. Without ``path``, a key file already named by the
    environment is checked."""
    if path is None:
        keyed.key_from_environment()
        return {}
    keyed.read_key(path)
    return {keyed.KEY_FILE_ENV: str(Path(path).resolve())}
