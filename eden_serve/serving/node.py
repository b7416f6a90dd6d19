"""``eden-serve serve``: one TorchServe node of eden-serve in the foreground, the container's process.

    eden-serve serve edge --model-store /models --properties /etc/eden/serve.properties
    eden-serve serve cloud --model-store /models --checkpoint hf://zhZ524/EDEN/eden.pt --threads 4
    eden-serve serve edge --tls-cert node.pem --tls-key node.key --wire-key-file /etc/eden/wire.key

It serves the cloud half (eden_encoder.mar), the edge half (eden_ditdec.mar) or both from a model
store, building the archives first when given a checkpoint. The configuration is the repository's
config.properties with the ``--properties`` files over it (addresses, token authorization...);
TorchServe's log goes to stdout, and SIGTERM stops it in order (``torchserve --stop``). The
process ends when TorchServe does, non-zero, so that a supervisor restarts it. With a certificate
(``--tls-cert``/``--tls-key``, or an https:// address in the properties) every address serves
HTTPS and gRPC TLS; with a wire key file, the workers tag or check payloads (docs/tls.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..checkpoint import load_official
from ..config import preset
from ..errors import BadInputError, CheckpointError
from ..hub import resolve_checkpoint
from ..wire import keyed
from .launcher import build_archives, read_properties, torchserve
from .tls import ServerTLS

ARCHIVES = {"cloud": ["eden_encoder.mar"], "edge": ["eden_ditdec.mar"], "both": ["eden_encoder.mar", "eden_ditdec.mar"]}
# The launcher picks free ports for a test instance; a node keeps the ones its configuration names.
ADDRESSES = ("inference_address", "management_address", "metrics_address")


def _build(args, store: Path) -> None:
    checkpoint = None
    if args.checkpoint is not None:
        # Checked here, so that a wrong checkpoint is one line, not archive.sh's output; a hub
        # file is fetched once, and archive.sh gets its local copy.
        checkpoint = resolve_checkpoint(args.checkpoint)
        load_official(checkpoint, preset(args.config))
    print(f"building the {args.config} archives into {store} from {checkpoint or 'synthetic weights'}", flush=True)
    try:
        build_archives(store, config=args.config, codec=args.codec, checkpoint=checkpoint, threads=args.threads)
    except RuntimeError as exc:  # archive.sh's own last word, e.g. a tool missing
        raise CheckpointError([line for line in str(exc).splitlines() if line.strip()][-1]) from None


def serve(args) -> int:
    store = Path(args.model_store).resolve()
    if args.checkpoint is not None or args.synthetic:
        _build(args, store)
    missing = [name for name in ARCHIVES[args.side] if not (store / name).is_file()]
    if missing:
        raise BadInputError(f"no {missing[0]} in {store}; build the archives (archive.sh), or pass --checkpoint")
    base = Path(args.ts_config)
    if not base.is_file():
        raise BadInputError(f"--ts-config {base}: no such file")
    overrides = {}
    for path in map(Path, args.properties):
        if not path.is_file():
            raise BadInputError(f"--properties {path}: no such file")
        overrides.update(read_properties(path))
    settings = read_properties(base) | overrides
    overrides = {key: settings[key] for key in ADDRESSES} | overrides
    token_auth = settings.get("disable_token_authorization", "false").lower() != "true"
    tls = _tls(args.tls_cert, args.tls_key, settings)
    env = _wire_key_environment(args.wire_key_file)

    with torchserve(
        store, models=ARCHIVES[args.side], token_auth=token_auth, properties=overrides, startup_timeout=args.startup_timeout,
        config=base, console=True, tls=tls, env=env,
    ) as server:
        keys = f"; keys in {server.workdir / 'key_file.json'}" if token_auth else "; token authorization off"
        print(f"eden-serve: {args.side} ready: inference {server.inference_url}, management {server.management_url}, "
              f"metrics {server.metrics_url}{keys}", flush=True)
        code = server.process.wait()
    print(f"eden-serve: TorchServe exited with code {code}", file=sys.stderr)
    return code or 1


def _tls(cert: str | None, key: str | None, settings: dict[str, str]) -> ServerTLS | None:
    if (cert is None) != (key is None):
        raise BadInputError("--tls-cert and --tls-key go together: the certificate and its private key")
    return ServerTLS.from_files(cert, key) if cert is not None else ServerTLS.from_properties(settings)


def _wire_key_environment(path: str | None) -> dict[str, str]:
    """The workers' environment naming the key file; read here first, so that a bad file is one
    line rather than workers failing to load. Without ``path``, a key file already named by the
    environment is checked."""
    if path is None:
        keyed.key_from_environment()
        return {}
    keyed.read_key(path)
    return {keyed.KEY_FILE_ENV: str(Path(path).resolve())}
