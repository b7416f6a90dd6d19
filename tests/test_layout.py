"""The package's shape: imports flow down through the layers, at the top of each module; every module
is short and named in the layout table of docs/development.md."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from harness.servers import REPO

PACKAGE = REPO / "eden_serve"
# Bottom first. A module imports only from layers below its own (a subpackage's modules may also
# import one another).
LAYERS = [
    {"errors"},
    {"config"},
    {"model", "wire", "atomic", "hub"},
    {"media", "synthetic"},
    {"cloud", "edge", "answers"},
    {"checkpoint"},
    {"serving", "client"},  # side by side: neither imports the other
    {"pipeline", "bench", "bench_wire", "clip_options"},
    {"commands"},
    {"page"},
    {"cli"},
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
# Imported where they are used: optional extras (generated: the gRPC messages made at setup).
LAZY_IMPORTS = {
    "av", "huggingface_hub", "huggingface_hub.errors", "grpc", "grpc_tools", "generated", "pyseccomp",
    "model_archiver.model_archiver_config", "model_archiver.model_packaging", "model_archiver.model_packaging_utils",
    "workflow_archiver.workflow_packaging", "workflow_archiver.workflow_packaging_utils",
    "asgi",  # the web page's server: the page extra (Starlette, uvicorn), imported when the page starts
}
# Where the layout table lives.
LAYOUT_PAGE = REPO / "docs" / "development.md"
MAX_LINES = 400


def modules() -> list[Path]:
    # generated/: gRPC messages made at setup (eden_serve/client/transports/protos.py), not ours to shape.
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


def test_the_layout_table_names_every_module():
    table = LAYOUT_PAGE.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]

    def named(path: Path) -> bool:
        if path.parent == PACKAGE:
            return f"`{path.relative_to(REPO)}`" in table
        return f"`{path.parent.relative_to(REPO)}/`" in table and f"`{path.name}`" in table

    missing = [str(p.relative_to(REPO)) for p in modules() if not named(p)]
    assert not missing, f"the layout table of {LAYOUT_PAGE.relative_to(REPO)} lacks {missing}"


def test_the_layer_check_sees_imports():
    """The checks above would pass vacuously if the parser found nothing."""
    found = dict.fromkeys(unit for _, unit in imported_units(PACKAGE / "cli.py"))
    assert {"pipeline", "commands", "config", "errors"} <= set(found)
    relative = {unit for _, unit in imported_units(PACKAGE / "serving" / "services.py")}
    assert {"checkpoint", "wire", "serving"} <= relative


@pytest.mark.parametrize("path", sorted((REPO / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_import(path, monkeypatch):
    """The benchmarks are not run by the tests, but what they import must exist."""
    monkeypatch.syspath_prepend(str(path.parent))  # as when run: their own directory first (results.py)
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)


@pytest.mark.parametrize("link", ["config.properties", "handlers/eden_encoder_handler.py", "handlers/eden_ditdec_handler.py",
                                  "handlers/eden_encoder-config.yaml", "handlers/eden_ditdec-config.yaml",
                                  "workflows/eden.yaml", "workflows/eden_workflow_handler.py"])
def test_the_top_level_glue_is_the_package_data(link):
    """The checkout shows the serving glue where TorchServe users look; the package holds the one copy."""
    path = REPO / link
    assert path.is_symlink() and path.resolve() == (PACKAGE / "serving" / "torchserve" / path.name).resolve()
