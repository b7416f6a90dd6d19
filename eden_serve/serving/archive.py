"""``eden-serve archive``: the TorchServe archives of eden-serve, built in this process.

    build(Path("model_store"), checkpoint="hf://zhZ524/EDEN/eden.pt", precision="auto")

writes into the model store:

* ``eden_encoder.mar``: the cloud half (``eden_cloud.safetensors``, its handler, the package);
* ``eden_ditdec.mar``: the edge half (``eden_edge.safetensors``, and ``eden_cloud.safetensors`` with
  which the edge re-derives the conditions of frames payloads; its handler, the package);
* ``eden.war``: the workflow eden_encoder -> eden_ditdec;
* with ``prepared`` (``--prepare``), the edge's forward compiled ahead for those frame sizes on this
  machine's device (:mod:`eden_serve.edge.artefacts`), in ``eden_ditdec.mar`` as ``compiled.bin``
  and beside it as ``eden_ditdec.compiled.bin`` (for ``eden-serve interpolate --compiled``).

The checkpoint is read once (or synthetic weights are made, with a warning), checked strictly and
split into the two halves; each archive's model-config.yaml is the one in ``serving/torchserve/``
with the options of this build written into its ``handler:`` section. Each .mar carries the
eden_serve package, so workers import it from the archive, not from the environment TorchServe runs
in. torch-model-archiver and torch-workflow-archiver (the ``serve`` extra) are called as libraries.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import warnings
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .. import wire
from ..config import preset
from ..edge import PRECISIONS, Acceleration, Compile, artefacts
from ..errors import BadInputError
from ..media.atomic import check_output_directory
from ..model import synthetic
from ..model.checkpoint import load_edge, load_official, write_halves
from ..model.hub import resolve_checkpoint

PACKAGE = Path(__file__).resolve().parents[1]
# What TorchServe reads besides the package: handler files, model-configs, the workflow, config.properties.
GLUE = PACKAGE / "serving" / "torchserve"
ARCHIVES = ("eden_encoder.mar", "eden_ditdec.mar", "eden.war")
ARCHIVERS = {"model_archiver": "torch-model-archiver", "workflow_archiver": "torch-workflow-archiver"}
# The handler: keys each build sets, per archive (threads in both, codec in the cloud's, precision in the edge's).
SIDES = {"eden_encoder": ("codec", "threads", "media_root"), "eden_ditdec": ("precision", "threads")}


@dataclass(frozen=True)
class Options:
    """What a build writes into the ``handler:`` section of the archives' model-config.yaml."""

    codec: str = wire.DEFAULT_CODEC  # the encoder's codec for requests that name none
    precision: str = "fp32"  # the edge's compute precision (edge/precision.py)
    threads: int = 0  # CPU threads per worker; 0: the half's share of the cores
    media_root: str | None = None  # the cloud's directory of server-side sources (docs/cloud-sources.md); None: off

    def check(self) -> None:
        """Refuse a bad option now rather than when the workers load."""
        try:
            wire.kind(self.codec)
        except BadInputError as exc:
            raise BadInputError(f"--codec: {exc}") from None
        if self.precision not in PRECISIONS:
            raise BadInputError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise BadInputError(f"--threads must be an integer >= 0, got {self.threads}")
        if self.media_root is not None and not Path(self.media_root).is_absolute():
            raise BadInputError(f"--media-root must be an absolute directory path, got {self.media_root!r}")


@dataclass(frozen=True)
class Prepared:
    """The edge's forward compiled ahead at build time (``--prepare``): for frames of ``sizes``
    (height, width, and pairs per forward where given, else those the ``device`` takes), in the
    build's precision."""

    sizes: tuple[tuple[int, ...], ...]
    device: str = "cuda"


def build(
    model_store: str | Path,
    *,
    checkpoint: str | Path | None = None,
    config: str = "official",
    options: Options = Options(),
    seed: int = 0,
    prepared: Prepared | None = None,
) -> dict[str, Path]:
    """Build the three archives into ``model_store`` (made if missing); returns their paths by name.

    ``checkpoint`` is an official eden.pt, a path or an ``hf://`` reference; without one the
    weights are synthetic (``seed``), with a warning: not a real interpolation.
    """
    options.check()
    for module, package in ARCHIVERS.items():
        if importlib.util.find_spec(module) is None:
            raise BadInputError(f"{package} is not installed; install eden-serve with its serve extra: pip install 'eden-serve[serve]'")
    check_output_directory(model_store, "--model-store")
    dims = preset(config)
    if checkpoint is None:
        warnings.warn(synthetic.WEIGHTS_WARNING.format(seed=seed))
        state = synthetic.state_dict(dims, seed)
    else:
        state = load_official(resolve_checkpoint(checkpoint), dims)
    store = Path(model_store)
    store.mkdir(parents=True, exist_ok=True)
    store = store.resolve()
    with tempfile.TemporaryDirectory(prefix="eden-archive-") as tmp:
        work = Path(tmp)
        weights = write_halves(state, work / "weights", dims)
        del state  # the halves are on disk: the whole model need not stay in memory while zipping
        lib = _package_sources(work / "lib")
        extras = {"eden_encoder": [weights["cloud"]], "eden_ditdec": [weights["edge"], weights["cloud"]]}
        if prepared is not None:
            extras["eden_ditdec"].append(_compiled(weights["edge"], prepared, options.precision, work))
            shutil.copyfile(extras["eden_ditdec"][-1], store / "eden_ditdec.compiled.bin")
        # The edge carries the cloud half too: it re-derives the conditions of frames payloads.
        for name, extra in extras.items():
            model_config = work / name / "model-config.yaml"  # the manifest names it by its file name
            model_config.parent.mkdir()
            model_config.write_text(model_config_text(name, options))
            _model_archive(name, GLUE / f"{name}_handler.py", [*extra, lib], model_config, store, work)
        _workflow_archive(store, work)
    return {name: store / name for name in ARCHIVES}


def _compiled(edge_weights: Path, prepared: Prepared, precision: str, work: Path) -> Path:
    """The edge compiled ahead (inductor, in the background, as a worker compiles it) in a cache of
    its own, so that the artefacts hold these shapes alone."""
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")
    try:
        edge = load_edge(edge_weights, prepared.device, precision)
        edge.accelerate(Acceleration(compile=Compile()))
        path = artefacts.prepare(edge, prepared.sizes, work / artefacts.FILE_NAME)
        edge.runner.close()
        return path
    finally:
        if saved is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def model_config_text(name: str, options: Options) -> str:
    """The model-config.yaml of archive ``name`` with ``options`` written over its handler keys,
    line by line, so that the file's comments stay for the operator who reads it in the archive."""
    text = (GLUE / f"{name}-config.yaml").read_text()
    for key in SIDES[name]:
        value = getattr(options, key)
        if key == "media_root":  # YAML: null, or a double-quoted string (JSON's escapes are YAML's)
            value = "null" if value is None else json.dumps(value)
        text, count = re.subn(rf"^  {key}: [^#\n]*(#.*)?$", f"  {key}: {value}  # set by eden-serve archive --{key}",
                              text, flags=re.MULTILINE)
        if count != 1:
            raise RuntimeError(f"{GLUE / f'{name}-config.yaml'} has no handler.{key} line to set")
    return text


def _package_sources(lib: Path) -> Path:
    """The package's Python sources under ``lib/eden_serve``: what --extra-files puts in the archive
    root (it copies a directory's contents). No caches, and not the glue, which TorchServe gets apart."""

    def ignored(directory: str, names: list[str]) -> set[str]:
        return {n for n in names if n == "__pycache__" or Path(directory, n) == GLUE
                or (Path(directory, n).is_file() and not n.endswith(".py"))}

    shutil.copytree(PACKAGE, lib / PACKAGE.name, ignore=ignored)
    return lib


@contextlib.contextmanager
def _scratch(directory: Path) -> Iterator[None]:
    """The archivers stage files in ``gettempdir()/NAME``, a path shared by every build on the
    machine; pointing it into this build's own directory keeps concurrent builds apart."""
    saved = tempfile.tempdir
    tempfile.tempdir = str(directory)
    try:
        yield
    finally:
        tempfile.tempdir = saved


def _model_archive(name: str, handler: Path, extra: list[Path], model_config: Path, store: Path, work: Path) -> None:
    from model_archiver.model_archiver_config import ModelArchiverConfig
    from model_archiver.model_packaging import package_model
    from model_archiver.model_packaging_utils import ModelExportUtils

    settings = ModelArchiverConfig(
        model_name=name, handler=str(handler), version="1.0", extra_files=",".join(map(str, extra)),
        config_file=str(model_config), export_path=str(store), force=True,
        # zip-store: float weights barely deflate (the official edge half: 7% smaller for 24 s of
        # CPU), and TorchServe reads stored zip entries just the same.
        archive_format="zip-store",
    )
    scratch = work / "scratch" / name
    scratch.mkdir(parents=True)
    with _scratch(scratch):
        package_model(settings, manifest=ModelExportUtils.generate_manifest_json(settings))


def _workflow_archive(store: Path, work: Path) -> None:
    from workflow_archiver.workflow_packaging import package_workflow
    from workflow_archiver.workflow_packaging_utils import WorkflowExportUtils

    # The workflow archiver takes its command line's namespace.
    arguments = Namespace(workflow_name="eden", spec_file=str(GLUE / "eden.yaml"), handler=str(GLUE / "eden_workflow_handler.py"),
                          export_path=str(store), extra_files=None, force=True)
    scratch = work / "scratch" / "eden"
    scratch.mkdir(parents=True)
    with _scratch(scratch):
        package_workflow(arguments, manifest=WorkflowExportUtils.generate_manifest_json(arguments))


def describe(paths: dict[str, Path], config: str, options: Options) -> str:
    """What a build made, for the command line."""
    chosen = ", ".join(f"{key} {value}" for key, value in vars(options).items())
    lines = [f"archives of the {config} model ({chosen}):"]
    lines += [f"  {path}  {path.stat().st_size / 1e6:.1f} MB" for path in paths.values()]
    return "\n".join(lines)
