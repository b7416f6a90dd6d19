"""The package's shape: imports flow down through the layers, at the top of each module; every module
is short and named in the README's layout table."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from eden_serve.serving.launcher import REPO

PACKAGE = REPO / "eden_serve"
# Bottom first. A module imports only from layers below its own (a subpackage's modules may also
# import one another).
LAYERS = [
    {"errors"},
    {"config"},
    {"model", "wire", "frames", "atomic", "hub"},
    {"cloud", "edge", "synthetic", "answers"},
    {"checkpoint", "resume"},
    {"serving", "clips"},
    {"streaming", "transports"},
    {"pipeline", "client", "bench", "bench_wire"},
    {"cli"},
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
# Imported where they are used: optional extras (generated: the gRPC messages made at setup).
LAZY_IMPORTS = {"av", "huggingface_hub", "huggingface_hub.errors", "grpc", "grpc_tools", "generated"}
MAX_LINES = 400


def modules() -> list[Path]:
    # generated/: gRPC messages made at setup (eden_serve/transports/protos.py), not ours to shape.
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts and "generated" not in p.parts)


def unit_of(path: Path) -> str:
    """The layer unit of a module: its top-level name under the package (a subpackage counts as one)."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_units(path: Path) -> list[tuple[int, str]]:
    """(line, unit) for every import of another unit of the package in ``path``."""
    tree = ast.parse(path.read_text())
    package = path.parent.relative_to(REPO).parts  # e.g. ("eden_serve", "serving")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = [*base, *(node.module.split(".") if node.module else [])]
                names = [[*target, alias.name] for alias in node.names] if not node.module else [target]
            else:
                names = [node.module.split(".")] if node.module else []
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        else:
            continue
        for parts in names:
            if parts[0] == "eden_serve" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def test_every_module_belongs_to_a_layer():
    assert {unit_of(p) for p in modules()} - {"__init__"} <= set(LAYER)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_go_down(path):
    own = unit_of(path)
    for line, unit in imported_units(path):
        if unit == own:
            continue  # within a subpackage
        assert LAYER[unit] < LAYER[own], f"{path.name}:{line} imports {unit} (layer {LAYER[unit]}) from layer {LAYER[own]}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_are_at_the_top(path):
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
            assert set(names) <= LAZY_IMPORTS, f"{path.name}:{node.lineno} imports {names} inside a block"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_are_short(path):
    assert len(path.read_text().splitlines()) < MAX_LINES


def test_the_readme_names_every_module():
    table = (REPO / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]

    def named(path: Path) -> bool:
        if path.parent == PACKAGE:
            return f"`{path.relative_to(REPO)}`" in table
        return f"`{path.parent.relative_to(REPO)}/`" in table and f"`{path.name}`" in table

    missing = [str(p.relative_to(REPO)) for p in modules() if not named(p)]
    assert not missing, f"README.md's layout table lacks {missing}"


def test_the_layer_check_sees_imports():
    """The checks above would pass vacuously if the parser found nothing."""
    found = dict.fromkeys(unit for _, unit in imported_units(PACKAGE / "cli.py"))
    assert {"pipeline", "client", "config", "errors"} <= set(found)
    relative = {unit for _, unit in imported_units(PACKAGE / "serving" / "services.py")}
    assert {"checkpoint", "wire", "serving"} <= relative


@pytest.mark.parametrize("path", sorted((REPO / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_import(path, monkeypatch):
    """The benchmarks are not run by the tests, but what they import must exist."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
