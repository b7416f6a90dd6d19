"""Faults injected into a real TorchServe's workers, or a real ``eden-serve page``, at chosen points
(``sitecustomize.py`` here says which)."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def environment(folder: Path) -> dict[str, str]:
    """The environment that makes a server's Python processes import this folder's sitecustomize
    (and find harness/standins.py's compromised decoders) and read armed faults from ``folder``."""
    path = os.pathsep.join([str(HERE), str(HERE.parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"PYTHONPATH": path, "EDEN_FAULT_DIR": str(folder)}


def arm(folder: Path, name: str, point: str) -> None:
    (folder / name).write_text(point)


def fired(folder: Path, name: str) -> bool:
    return (folder / f"fired-{name}").exists()
