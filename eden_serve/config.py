"""The one place that states EDEN's dimensions and constants.

Two presets: ``official`` (the released ``eden.pt``) and ``tiny`` (same architecture, small enough
for tests). Everything else derives shapes from an :class:`EdenConfig`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInputError

# Noise seeds are unsigned 64-bit: the wire format's range, and what torch.Generator.manual_seed takes.
MAX_SEED = 2**64 - 1


def cache_home() -> Path:
    """The user's cache directory, as the XDG base directory specification has it: ``$XDG_CACHE_HOME``
    where that is an absolute path (a relative one is to be ignored, or it would follow the current
    directory), else ``~/.cache``. RuntimeError where the user has no home (HOME unset, and no entry
    in the password database: a container's arbitrary user)."""
    given = os.environ.get("XDG_CACHE_HOME", "")
    return Path(given) if os.path.isabs(given) else Path.home() / ".cache"


# The names the two halves are archived and served under; deployments depend on them.
MODEL_NAMES = {"cloud": "eden_encoder", "edge": "eden_ditdec"}


@dataclass(frozen=True)
class EdenConfig:
    patch_size: int = 16
    latent_dim: int = 16
    hidden_dim: int = 768
    num_heads: int = 12
    mlp_ratio: float = 4.0
    dit_depth: int = 12
    decoder_depth: int = 4
    ln_eps: float = 1e-6
    # Statistics of the training data, fixed by the official checkpoint.
    cos_sim_mean: float = 0.990539
    cos_sim_std: float = 0.0608093
    vae_scaler: float = 0.179437
    vae_shift: float = 0.770202
    # The flow-matching Euler grid 0 -> 0.75 -> 1.
    timesteps: tuple[float, ...] = (0.0, 0.75, 1.0)
    # Positions are measured in units of this patch grid (rows, columns), whatever the frame size.
    pos_grid: tuple[int, int] = (16, 28)

    @property
    def mlp_dim(self) -> int:
        return int(self.hidden_dim * self.mlp_ratio)

    @property
    def pad_multiple(self) -> int:
        """Frames are padded so the query grid (patch grid / 2) is whole."""
        return 2 * self.patch_size

    def padding(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) padding of a frame to whole query patches: on each axis half
        the total, rounded down, before, the rest after."""
        (top, bottom), (left, right) = (_split_padding(size, self.pad_multiple) for size in (height, width))
        return top, bottom, left, right

    def patch_grid(self, height: int, width: int) -> tuple[int, int]:
        """(ph, pw): the patch grid of a padded frame; the condition tokens number ph * pw."""
        top, bottom, left, right = self.padding(height, width)
        return (height + top + bottom) // self.patch_size, (width + left + right) // self.patch_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "EdenConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        for key in ("timesteps", "pos_grid"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)

    def fingerprint(self) -> str:
        """Short stable hash of everything that makes two models' tensors interchangeable."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def name(self) -> str:
        for preset_name, preset in PRESETS.items():
            if preset == self:
                return preset_name
        return f"custom-{self.fingerprint()}"


def _split_padding(size: int, multiple: int) -> tuple[int, int]:
    total = (multiple - size % multiple) % multiple
    return total // 2, total - total // 2


PRESETS: dict[str, EdenConfig] = {
    "official": EdenConfig(),
    "tiny": EdenConfig(hidden_dim=64, num_heads=4, dit_depth=2, decoder_depth=2),
}


def preset(name: str) -> EdenConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise BadInputError(f"unknown config {name!r}; choose one of {', '.join(PRESETS)}") from None
