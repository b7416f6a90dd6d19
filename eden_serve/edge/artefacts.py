"""The edge's compiled forward made ahead of use (docs/gpu.md, "Compiled ahead"): inductor's cache
for the shapes asked (frame size, pairs per forward, precision), written as one file that ships in
the edge archive and that ``eden-serve interpolate --compiled`` reads.

Why inductor's cache and not AOTInductor's packages: TorchServe's ``pt2`` section switches
``torch.compile`` (``pt2: {compile: {...}}``, which the edge archive follows), and its AOTInductor
convention (``pt2: {export: {aot_compile: true}}``) loads one exported ``.so`` as the whole model.
The edge's forward is compiled region by region, replayed from our own CUDA graphs and swapped in
beside the serving (:mod:`.compiling`); an exported package would replace that forward with one
function per shape, its weights inside it (632 MB again per shape). The cache keeps our forward:
loaded, the same ``torch.compile`` finds every artefact on disk and only traces (dynamo): 13.5 s a
480x854 key on an H200 beside a clip, where whole stages took inductor a minute on an H100. The cache is inductor's directory
as the preparation left it, compiled kernels included: PyTorch's own portable form of it
(``torch.compiler.save_cache_artifacts``) leaves the CPU's C++ kernels to be compiled again where it
is loaded (measured on this CPU with the tiny model: 34.5 s from it into an empty cache, 3.0 s from
the directory, 66.7 s without either).

The file: magic, the length of a JSON header, the header, then the directory as a tar. The header
is the key: what the artefacts are only right for (this PyTorch, CUDA and Triton, the GPU and its
driver, or the CPU's capability; the model's dimensions and weights; the precision and the compile
options) and the shapes they hold. A file whose key differs from this process's, or whose bytes do
not match their digest, is refused before anything of it is extracted: one warning, and the
forward compiles in the background as without it. What is extracted is plain files under the
cache directory (the tar's own paths checked), which inductor reads as it reads the entries it
writes itself. Only those checks run where the file is loaded; extracting it and compiling its
shapes wait on the compiling thread until a clip's first middle is handed to the writer
(:func:`load_into`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import struct
import tarfile
from pathlib import Path
from typing import Iterable

import torch

from ..errors import BadInputError
from ..wire import Conditions
from .compiling import persistent_cache

logger = logging.getLogger(__name__)

MAGIC = b"EDENPT2C"
VERSION = 1
_LENGTH = struct.Struct("<I")
MAX_HEADER = 1 << 20
FILE_NAME = "compiled.bin"  # in the edge archive, beside the weights


def environment(device: torch.device) -> dict:
    """What compiled code is specific to on ``device``: PyTorch and its toolchain, the GPU and its driver."""
    found = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": _version("triton")}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        found |= {"device": properties.name, "capability": f"{properties.major}.{properties.minor}",
                  "driver": _driver_version()}
        if torch.version.hip is not None:  # ROCm's capability is not the GPU's arch, which its kernels are built for
            found |= {"hip": torch.version.hip, "arch": getattr(properties, "gcnArchName", None)}
    else:
        found |= {"device": "cpu", "capability": torch.backends.cpu.get_cpu_capability()}
    return found


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _driver_version() -> str | None:
    """The CUDA driver's version as the CUDA runtime sees it (13000: CUDA 13.0), which decides what
    compiled kernels it runs."""
    query = getattr(torch._C, "_cuda_getDriverVersion", None)
    return str(query()) if query is not None else None


def weights_digest(model: torch.nn.Module) -> str:
    """The weights' names, shapes, dtypes and a sample of each tensor's bytes (its first and last
    4 KiB): compiled code takes the weights as inputs, so it depends on their layout, not their
    values; the sample still tells another checkpoint apart without reading 632 MB at start-up."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in model.state_dict().items():
        data = tensor.detach().reshape(-1).view(torch.uint8)
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\n".encode())
        digest.update(data[:4096].cpu().numpy().tobytes() + data[-4096:].cpu().numpy().tobytes())
    return digest.hexdigest()


def key(edge, compile) -> dict:
    """The key of artefacts compiled by ``edge`` (an :class:`~eden_serve.edge.EdgeModel`) with the
    options ``compile`` (:class:`~.acceleration.Compile`)."""
    options = {name: getattr(compile, name) for name in ("backend", "mode", "fullgraph", "scope")}
    found = {"version": VERSION, **environment(edge.device), "precision": edge.precision,
             "config": dataclasses.asdict(edge.config), "weights": weights_digest(edge.weights), "compile": options}
    return json.loads(json.dumps(found))  # as a file's header reads back (tuples as lists)


def write(path: str | Path, key: dict, shapes: Iterable[tuple[int, int, int]], data: bytes) -> Path:
    """The file of ``data`` (inductor's cache as a tar) under ``key``, holding ``shapes`` (height, width, pairs)."""
    header = json.dumps({"key": key, "shapes": [list(s) for s in shapes], "bytes": len(data),
                         "digest": hashlib.blake2b(data, digest_size=32).hexdigest()}, sort_keys=True).encode()
    path = Path(path)
    path.write_bytes(MAGIC + _LENGTH.pack(len(header)) + header + data)
    return path


def read_header(path: str | Path) -> tuple[dict, int]:
    """The file's header and where its data starts; :class:`BadInputError` for what is not such a file."""
    with open(path, "rb") as file:
        start = file.read(len(MAGIC) + _LENGTH.size)
        if len(start) < len(MAGIC) + _LENGTH.size or start[: len(MAGIC)] != MAGIC:
            raise BadInputError(f"{path}: not a file of compiled artefacts (eden-serve archive --prepare makes them)")
        (length,) = _LENGTH.unpack_from(start, len(MAGIC))
        if length > MAX_HEADER:
            raise BadInputError(f"{path}: its header claims {length} bytes")
        try:
            header = json.loads(file.read(length))
        except ValueError:
            raise BadInputError(f"{path}: its header is not JSON") from None
    if not isinstance(header, dict) or not {"key", "shapes", "bytes", "digest"} <= set(header):
        raise BadInputError(f"{path}: its header lacks the key, the shapes or the digest")
    return header, len(MAGIC) + _LENGTH.size + length


def differences(found: dict, wanted: dict) -> list[str]:
    """The fields of the key where a file's (``found``) differs from this process's."""
    return sorted(name for name in set(found) | set(wanted) if found.get(name) != wanted.get(name))


def check(path: str | Path, wanted: dict) -> tuple[list[tuple[int, int, int]], bytes] | None:
    """The shapes of ``path`` and its tar, checked: its key is ``wanted``, its bytes match their
    digest, and its tar holds plain files and folders under the cache alone; None (one warning says
    why) where it is refused. Nothing is written."""
    header, start = read_header(path)
    refused = differences(header["key"], wanted)
    if refused:
        fields = ", ".join(f"{name} {header['key'].get(name)!r} (here {wanted.get(name)!r})" for name in refused)[:400]
        logger.warning("compiled artefacts %s were made for another %s; compiling in the background instead", path, fields)
        return None
    with open(path, "rb") as file:
        file.seek(start)
        data = file.read()
    if len(data) != header["bytes"] or hashlib.blake2b(data, digest_size=32).hexdigest() != header["digest"]:
        logger.warning("compiled artefacts %s are damaged (their bytes do not match their digest); compiling in the background instead", path)
        return None
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                tarfile.data_filter(member, persistent_cache())
                if not (member.isfile() or member.isdir()):
                    raise tarfile.FilterError(f"{member.name!r} is neither a file nor a folder")
    except tarfile.TarError as exc:
        logger.warning("compiled artefacts %s cannot be extracted (%s); compiling in the background instead", path, exc)
        return None
    return [tuple(shape) for shape in header["shapes"]], data


def extract(path: str | Path, data: bytes) -> bool:
    """The tar ``data`` of ``path`` (checked by :func:`check`) extracted into inductor's cache; False (one
    warning) where the disk refuses. Entries already there are inductor's own, the same by their
    hashed names."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(persistent_cache(), filter="data")
    except (tarfile.TarError, OSError) as exc:
        logger.warning("compiled artefacts %s cannot be extracted (%s); compiling in the background instead", path, exc)
        return False
    return True


def saved() -> bytes:
    """Inductor's cache directory as a tar: what this process compiled (and found there before)."""
    cache, out = Path(persistent_cache()), io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for item in sorted(cache.rglob("*")):
            if item.is_file() and "locks" not in item.relative_to(cache).parts:
                tar.add(item, arcname=str(item.relative_to(cache)), recursive=False)
    return out.getvalue()


@torch.inference_mode()
def compile_ahead(edge, size: tuple[int, int], pairs: int) -> None:
    """Ask ``edge``'s compiler for forwards of ``pairs`` pairs of ``size`` (height, width) now, in
    the background: its two stages as a clip's and a served edge's forwards call them (the middles
    as 8-bit pixels), on zeros of their shapes."""
    grid = edge.config.patch_grid(*size)
    tokens = torch.zeros(2, grid[0] * grid[1], edge.config.hidden_dim, device=edge.device)
    inputs = edge.prepare([Conditions(tokens, tokens, 0.5, 0.25, 0.0, grid, size, seed) for seed in range(pairs)])
    edge.runner.ahead("sample", inputs.sample)
    edge.runner.ahead("render_uint8", dataclasses.replace(inputs.render, latents=torch.zeros_like(inputs.sample.noise)))


def prepare(edge, sizes: Iterable[tuple[int, ...]], path: str | Path) -> Path:
    """Compile ``edge``'s forward for each of ``sizes`` (height, width, and the pairs per forward
    where given, else those it takes there), wait, and write the artefacts to ``path`` (``eden-serve
    archive --prepare``): inductor's cache directory, best a fresh one, which then holds these alone."""
    compile = edge.runner.compile
    if compile is None or edge.runner.background is None:
        raise BadInputError("preparing compiled artefacts needs the edge compiled in the background (--compile auto or a mode)")
    shapes = [(size[0], size[1], size[2] if len(size) > 2 else edge.sizing.pairs(edge.config.patch_grid(*size[:2])))
              for size in sizes]
    for height, width, pairs in shapes:
        compile_ahead(edge, (height, width), pairs)
    edge.runner.wait_compiled()
    if edge.runner.background.failed:
        raise RuntimeError(f"compiling the edge failed: {edge.runner.background.failed}")
    return write(path, key(edge, compile), shapes, saved())


def load_into(edge, path: str | Path) -> list[tuple[int, int, int]] | None:
    """Check ``path``'s artefacts for ``edge`` now (refused, with one warning, where its key differs,
    its bytes are damaged or its tar would write outside the cache: None), and hold the rest for the
    compiling thread (:meth:`~.acceleration.Runner.hold`): extracting them into inductor's cache,
    then asking for their shapes (:func:`compile_ahead`). It starts when the runner is released:
    by a clip in process once its first middle has been handed to the writer, by a served edge at
    load, by a wait for the compilations. On an H200 the compilations begun at load (dynamo's
    tracing, 13.5 s a key even from the cache) held the interpreter against the clip's reader,
    workers and writer, and its first middle came at 9.85 s instead of 5.9. The shapes."""
    compile = edge.runner.compile
    if compile is None or edge.runner.background is None:
        logger.warning("compiled artefacts %s are not used: the edge is not compiled in the background here", path)
        return None
    checked = check(path, key(edge, compile))
    if checked is None:
        return None
    shapes, data = checked

    def start() -> None:
        if extract(path, data):
            for height, width, pairs in shapes:
                compile_ahead(edge, (height, width), pairs)

    edge.runner.hold(start)
    return shapes
