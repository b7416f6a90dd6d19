"""Generates the gRPC messages of TorchServe's inference API from the ``inference.proto`` inside
the installed TorchServe's jar, with grpcio-tools (the ``grpc`` extra; no network)::

    python -m eden_serve.client.transports.protos     # setup.sh runs it

It writes ``generated/inference_pb2.py`` beside this file (not in git: made from the TorchServe
that is installed, so the two always agree). Only the messages are generated: the two methods the
client calls are named in :mod:`eden_serve.client.transports.grpc`, which the generated service stub would
import by a top-level module name that a package cannot offer.
"""

from __future__ import annotations

import sys
import tempfile
import zipfile
from importlib import resources
from pathlib import Path

GENERATED = Path(__file__).parent / "generated"
PROTOS = ("inference.proto", "google/rpc/status.proto")  # inference.proto imports status.proto


def jar() -> Path:
    """TorchServe's frontend jar, from the installed ``ts`` package."""
    try:
        path = Path(str(resources.files("ts") / "frontend" / "model-server.jar"))
    except ModuleNotFoundError:
        raise SystemExit("protos: TorchServe is not installed (the serve extra); its jar holds inference.proto") from None
    if not path.is_file():
        raise SystemExit(f"protos: {path} is missing")
    return path


def generate() -> Path:
    from grpc_tools import protoc

    GENERATED.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(jar()) as archive:
        for name in PROTOS:
            archive.extract(name, tmp)
        well_known = resources.files("grpc_tools") / "_proto"  # google/protobuf/empty.proto
        status = protoc.main(["protoc", f"-I{tmp}", f"-I{well_known}", f"--python_out={GENERATED}", f"{tmp}/inference.proto"])
    if status != 0:
        raise SystemExit(f"protos: protoc failed with status {status}")
    (GENERATED / "__init__.py").write_text('"""Made by python -m eden_serve.client.transports.protos; not in git."""\n')
    return GENERATED / "inference_pb2.py"


if __name__ == "__main__":
    print(f"protos: wrote {generate()}")
    sys.exit(0)
