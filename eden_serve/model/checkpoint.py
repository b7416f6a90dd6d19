"""Weights: the official checkpoint, its split into a cloud half and an edge half, the halves in the archives.

The official ``eden.pt`` is a ``torch.save`` dict whose ``"eden"`` entry is the state dict (a bare
state dict is accepted too). It is read with ``weights_only=True``: a checkpoint is chosen by the
operator, never received over the network. The halves are written as safetensors files that carry
their side and model dimensions in the header, so nothing we load at serving time can run code.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import tempfile
import warnings
import zipfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..cloud.encoder import CloudEncoder
from ..config import MODEL_NAMES, EdenConfig
from ..edge import EdgeModel, Precision
from ..errors import CheckpointError
from . import synthetic
from .hub import resolve_checkpoint
from .weights import CloudWeights, EdgeWeights, expected_layout, is_cloud_key

SIDES = {"cloud": CloudWeights, "edge": EdgeWeights}
# Each archive carries its half under this name.
WEIGHTS_FILES = {side: f"eden_{side}.safetensors" for side in SIDES}


def check_layout(state_dict: dict, expected: dict[str, tuple[int, ...]], source: str) -> None:
    """Refuse a state dict that does not have exactly the expected keys and shapes, naming the key.

    Shapes are checked first: a checkpoint of other dimensions is then named as such, rather
    than by the first of the blocks it lacks.
    """
    for key in sorted(expected.keys() & state_dict.keys()):
        value, shape = state_dict[key], expected[key]
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{source}: key {key!r} is a {type(value).__name__}, not a tensor")
        if tuple(value.shape) != shape:
            raise CheckpointError(
                f"{source}: key {key!r} has shape {tuple(value.shape)}, expected {shape}; was it made with another --config?"
            )
    missing = sorted(set(expected) - set(state_dict))
    if missing:
        raise CheckpointError(f"{source}: missing key {missing[0]!r} ({len(missing)} missing); is this an EDEN checkpoint?")
    unexpected = sorted(set(state_dict) - set(expected))
    if unexpected:
        raise CheckpointError(f"{source}: unexpected key {unexpected[0]!r} ({len(unexpected)} unexpected); is this an EDEN checkpoint?")


def load_official(path: str | Path, config: EdenConfig) -> dict[str, torch.Tensor]:
    """The official checkpoint's state dict (a path or an ``hf://`` reference), validated against ``config``'s layout."""
    path = resolve_checkpoint(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: not a PyTorch checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    if isinstance(obj, dict) and isinstance(obj.get("eden"), dict):
        obj = obj["eden"]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a state dict or a dict with an 'eden' state dict, got {type(obj).__name__}")
    check_layout(obj, expected_layout(config), str(path))
    return {k: v.float().contiguous() for k, v in obj.items()}


def split(state_dict: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{"cloud": the four ``*_cond_*`` modules, "edge": everything else}."""
    halves: dict[str, dict[str, torch.Tensor]] = {"cloud": {}, "edge": {}}
    for key, value in state_dict.items():
        halves["cloud" if is_cloud_key(key) else "edge"][key] = value
    return halves


def save_half(path: str | Path, state_dict: dict[str, torch.Tensor], side: str, config: EdenConfig) -> None:
    """Write one half as safetensors with its side and config in the header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: no planted link followed. Made 0o666 less the umask, as a plain write makes a file:
    # the mode the weights get, as safetensors writes them 0o600 (was: 0o644 whatever the umask)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    os.close(fd)
    metadata = {"eden_side": side, "eden_config": json.dumps(config.to_dict())}
    try:
        save_file({k: v.contiguous() for k, v in state_dict.items()}, tmp, metadata=metadata)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_halves(state_dict: dict[str, torch.Tensor], out_dir: str | Path, config: EdenConfig) -> dict[str, Path]:
    out_dir = Path(out_dir)
    paths = {}
    for side, half in split(state_dict).items():
        paths[side] = out_dir / WEIGHTS_FILES[side]
        save_half(paths[side], half, side, config)
    return paths


def load_half(path: str | Path, side: str) -> tuple[torch.nn.Module, EdenConfig]:
    """A half's module with its weights (strict), and the config recorded in the file."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            # Copied into fresh (64-byte aligned) storage: MKL rounds some products of unaligned
            # operands differently, and the archived halves must compute what a checkpoint does.
            state = {k: f.get_tensor(k).clone() for k in f.keys()}
    except Exception as exc:
        raise CheckpointError(f"{path}: not a safetensors weights file ({exc})") from None
    if metadata.get("eden_side") != side:
        raise CheckpointError(f"{path}: holds {metadata.get('eden_side')!r} weights, expected {side!r}")
    try:
        config = EdenConfig.from_dict(json.loads(metadata["eden_config"]))
    except Exception:
        raise CheckpointError(f"{path}: header lacks a valid eden_config") from None
    with torch.device("meta"):
        module = SIDES[side](config)
    check_layout(state, {k: tuple(v.shape) for k, v in module.state_dict().items()}, str(path))
    module.load_state_dict(state, strict=True, assign=True)
    return module, config


def module_from_state(state_dict: dict[str, torch.Tensor], side: str, config: EdenConfig) -> torch.nn.Module:
    with torch.device("meta"):
        module = SIDES[side](config)
    module.load_state_dict(split(state_dict)[side], strict=True, assign=True)
    return module


def load_cloud(path: str | Path, device: str = "cpu") -> CloudEncoder:
    module, config = load_half(path, "cloud")
    return CloudEncoder(module, config, device)


def load_edge(path: str | Path, device: str = "cpu", precision: Precision = "fp32") -> EdgeModel:
    module, config = load_half(path, "edge")
    return EdgeModel(module, config, device, precision)


def load_pair(
    checkpoint: str | Path | None,
    config: EdenConfig,
    device: str = "cpu",
    precision: Precision = "fp32",
    seed: int = 0,
    edge_device: str | None = None,
) -> tuple[CloudEncoder, EdgeModel]:
    """Both halves in one process, from an official checkpoint or synthetic weights (with a warning):
    the cloud on ``device``, the edge on ``edge_device`` (default: the same)."""
    if checkpoint is None:
        warnings.warn(synthetic.WEIGHTS_WARNING.format(seed=seed), stacklevel=2)
        state = synthetic.state_dict(config, seed)
    else:
        state = load_official(checkpoint, config)
    cloud = CloudEncoder(module_from_state(state, "cloud", config), config, device)
    edge = EdgeModel(module_from_state(state, "edge", config), config, edge_device or device, precision)
    return cloud, edge


def load_archived(model_store: str | Path, device: str = "cpu", precision: Precision = "fp32") -> tuple[CloudEncoder, EdgeModel]:
    """Both halves out of the archives in ``model_store``: what its servers compute, in this process."""
    halves = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side, name in WEIGHTS_FILES.items():
            with zipfile.ZipFile(Path(model_store) / f"{MODEL_NAMES[side]}.mar") as archive:
                archive.extract(name, tmp)
            halves[side] = Path(tmp) / name
        return load_cloud(halves["cloud"], device), load_edge(halves["edge"], device, precision)
