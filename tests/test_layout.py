"""The package's shape: imports flow down through the layers, at the top of each module; every module
is short and named in the layout table of docs/development.md; every function is short, no signature
is long, and no module outside the wire chooses what to do by comparing a codec's name (it asks the
payload kind, ``eden_serve.wire.kind``)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from eden_serve import wire
from eden_serve.edge import EdgeModel
from harness.servers import REPO

PACKAGE = REPO / "eden_serve"
# Bottom first. A module imports only from layers below its own (a subpackage's modules may also
# import one another). A unit is a subpackage, or a module of one whose folder spans layers (the
# model's checkpoint sits above the halves it splits the weights into; the front ends around the page).
LAYERS = [
    {"errors"},
    {"config"},
    {"wire", "sandbox"},
    {"media", "model"},
    {"cloud", "edge"},
    {"clips", "model.checkpoint"},
    {"serving", "client"},  # side by side: neither imports the other
    {"commands.bench", "commands.bench_wire"},
    {"commands.shared"},
    {"page"},
    {"commands.cli", "commands"},  # "commands": the folder's __init__, which imports nothing
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
# The package's root holds only the bottom layers; everything else sits in the folder of its room.
ROOT_MODULES = {"__init__.py", "config.py", "errors.py"}
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
MAX_FUNCTION_LINES = 60  # from the def to the last line of the body
MAX_PARAMETERS = 7  # self and cls aside; *args and **options count one each (an options dataclass is one)
# The edge's one way in: set-up (accelerate, warm_up), then prepare -> forward -> to host.
MAX_EDGE_METHODS = 6
# What names a codec: the wire's constants, and the codec names themselves as strings compared with
# something called a codec ("none" aside, a word of other fields too).
CODEC_CONSTANTS = {"DEFAULT_CODEC", "FRAMES_CODEC", "BITSTREAM_CODEC", "NO_WIRE", "TOKEN_CODECS", "CODECS", "AUTO"}
CODEC_NAMES = set(wire.KINDS) - {wire.NO_WIRE}


def modules() -> list[Path]:
    # generated/: gRPC messages made at setup (eden_serve/client/transports/protos.py), not ours to shape.
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts and "generated" not in p.parts)


def unit(parts: list[str] | tuple[str, ...]) -> str:
    """The layer unit of a dotted name under the package (("model", "checkpoint", "load_pair") ->
    "model.checkpoint"): its longest leading part that has a layer of its own, else its first."""
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in LAYER:
            return ".".join(parts[:end])
    return parts[0]


def unit_of(path: Path) -> str:
    """The layer unit of a module."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return unit(parts[:-1] if parts[-1] == "__init__" else parts) if len(parts) > 1 else parts[0]


def imported_names(path: Path) -> list[tuple[int, list[str]]]:
    """(line, dotted name as parts) of every name of the package that ``path`` imports, at its top or
    inside a function, relative imports made absolute."""
    tree = ast.parse(path.read_text())
    package = path.parent.relative_to(REPO).parts  # e.g. ("eden_serve", "serving")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            target = [*base, *(node.module.split(".") if node.module else [])]
            names = [[*target, alias.name] for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        else:
            continue
        found += [(node.lineno, parts) for parts in names if parts[0] == "eden_serve" and len(parts) > 1]
    return found


def imported_units(path: Path) -> list[tuple[int, str]]:
    """(line, unit) for every import of another unit of the package in ``path``."""
    return [(line, unit(parts[1:])) for line, parts in imported_names(path)]


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
    found = dict.fromkeys(unit for _, unit in imported_units(PACKAGE / "commands" / "cli.py"))
    assert {"clips", "commands.shared", "commands.bench", "config", "errors", "model", "model.checkpoint"} <= set(found)
    relative = {unit for _, unit in imported_units(PACKAGE / "serving" / "services.py")}
    assert {"model.checkpoint", "wire", "serving"} <= relative
    assert unit_of(PACKAGE / "model" / "checkpoint.py") == "model.checkpoint" and unit_of(PACKAGE / "model" / "hub.py") == "model"


# Package data, not modules: the handler files TorchServe loads by path from an archive.
PACKAGE_DATA = PACKAGE / "serving" / "torchserve"


def tracked_modules() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--", "eden_serve/*.py"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in listed.decode().split("\0") if name and PACKAGE_DATA not in (REPO / name).parents]


def test_no_tracked_module_is_outside_a_package():
    """Every tracked module sits in a regular package, up to eden_serve itself (a folder without
    an __init__.py would be a namespace package, and packaged whatever it holds)."""
    def folders(path: Path) -> list[Path]:
        return [folder for folder in (path.parent, *path.parent.parents) if folder == PACKAGE or PACKAGE in folder.parents]

    outside = [str(p.relative_to(REPO)) for p in tracked_modules() if any(not (f / "__init__.py").is_file() for f in folders(p))]
    assert tracked_modules() and not outside, f"modules outside a package: {outside}"


def test_the_root_holds_only_the_bottom_layers():
    assert {p.name for p in PACKAGE.glob("*.py")} <= ROOT_MODULES


def test_the_pipeline_imports_no_client_module():
    """The in-process pipeline runs a clip through the clip engine, not through the client."""
    (pipeline,) = [p for p in modules() if p.name == "pipeline.py"]
    assert "client" not in {unit for _, unit in imported_units(pipeline)}


def imported_modules(path: Path) -> set[Path]:
    """The package's modules that ``path`` imports, at its top or inside a function."""
    found = set()
    for _, parts in imported_names(path):
        for end in range(len(parts), 0, -1):  # the longest leading part that is a module or a package
            candidates = [REPO.joinpath(*parts[:end]).with_suffix(".py"), REPO.joinpath(*parts[:end], "__init__.py")]
            hit = next((c for c in candidates if c.is_file()), None)
            if hit:
                found.add(hit)
                break
    return found


def reachable(starts: list[Path]) -> set[Path]:
    seen, todo = set(), list(starts)
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo.extend(imported_modules(path))
    return seen


# What may unpickle: torch.load, with weights_only=True, on the checkpoint the operator names on the
# command line or to the archive builder. It runs nowhere a request, a payload or an upload reaches.
OPERATOR_CHECKPOINT = {PACKAGE / "commands" / "cli.py", PACKAGE / "serving" / "archive.py"}


def test_only_the_operators_checkpoint_is_ever_unpickled():
    calls, readers = [], set()
    for path in modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = {alias.name.split(".")[0] for alias in node.names} | {(getattr(node, "module", None) or "").split(".")[0]}
                assert not names & {"pickle", "cPickle", "marshal", "shelve", "dill", "joblib"}, (path, node.lineno)
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.load", "np.load", "numpy.load"):
                calls.append((path, {k.arg: ast.unparse(k.value) for k in node.keywords}))
            if isinstance(node, ast.Name) and node.id in ("load_official", "resolve_checkpoint") or \
                    isinstance(node, ast.alias) and node.name in ("load_official", "resolve_checkpoint"):
                readers.add(path)
    assert calls == [(PACKAGE / "model" / "checkpoint.py", {"map_location": "'cpu'", "weights_only": "True"})]
    assert readers - {PACKAGE / "model" / "checkpoint.py", PACKAGE / "model" / "hub.py"} == OPERATOR_CHECKPOINT
    # The servers' and the page's code: the TorchServe handlers (workers, cloud and edge) and the page.
    served = reachable([*PACKAGE_DATA.glob("*.py"), PACKAGE / "page" / "__init__.py", PACKAGE / "page" / "asgi.py"])
    assert PACKAGE / "serving" / "services.py" in served and PACKAGE / "page" / "runs.py" in served  # the walk sees them
    assert not served & OPERATOR_CHECKPOINT


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


def functions(tree: ast.AST):
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def parameters(node: ast.FunctionDef) -> list[str]:
    args = node.args
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    rest = [f"*{a.arg}" for a in (args.vararg, args.kwarg) if a is not None]
    return [name for name in named if name not in ("self", "cls")] + rest


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_functions_are_short(path):
    long = [f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
            for node in functions(ast.parse(path.read_text())) if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_signatures_are_small(path):
    wide = [f"{node.name} (line {node.lineno}): {len(parameters(node))} parameters"
            for node in functions(ast.parse(path.read_text())) if len(parameters(node)) > MAX_PARAMETERS]
    assert not wide, f"{path.name}: signatures over {MAX_PARAMETERS} parameters (group options in a dataclass): {wide}"


def codec_comparisons(source: str) -> list[int]:
    """The lines of ``source`` that compare something with a codec's name."""

    def mentions(node: ast.AST, names: set[str]) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names or isinstance(n, ast.Attribute) and n.attr in names
                   for n in ast.walk(node))

    def codec_strings(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Constant) and n.value in CODEC_NAMES for n in ast.walk(node) if isinstance(n, ast.Constant))

    def about_codecs(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and "codec" in n.id.lower() or isinstance(n, ast.Attribute) and "codec" in n.attr.lower()
                   for n in ast.walk(node))

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(mentions(o, CODEC_CONSTANTS) for o in operands) or (
                    any(codec_strings(o) for o in operands) and any(about_codecs(o) for o in operands)):
                found.append(node.lineno)
    return found


@pytest.mark.parametrize("path", [p for p in modules() if "wire" not in p.relative_to(PACKAGE).parts[:1]],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_wire_compares_codec_names(path):
    lines = codec_comparisons(path.read_text())
    assert not lines, f"{path.name}:{lines} compares a codec's name; ask its kind (eden_serve.wire.kind) instead"


def test_the_code_checks_see_what_they_look_for():
    """The three checks above would pass vacuously if they found nothing."""
    long = "def f(a, b, c, d, e, f, g, h):\n" + "    x = 1\n" * 60
    (node,) = functions(ast.parse(long))
    assert len(parameters(node)) == 8 and node.end_lineno - node.lineno + 1 == 61
    assert codec_comparisons("if codec == wire.FRAMES_CODEC:\n    pass\nx = args.codec in ('bitstream', 'frames')\n"
                             "y = kind == NO_WIRE\nz = precision == 'bf16'\nw = job.codec != 'fp32'") == [1, 3, 4, 6]
    method = ast.parse("class A:\n    def m(self, *args, **options):\n        pass").body[0].body[0]
    assert parameters(method) == ["*args", "*options"]


def test_the_edge_has_one_way_in():
    """Everyone (the pipeline, the services, the bench, the tests) reaches the edge through the same
    few methods: its set-up, then prepare -> forward -> to host; a stage's time comes from the
    forward's clock, not from a method of its own."""
    public = [name for name, _ in inspect.getmembers(EdgeModel, inspect.isfunction) if not name.startswith("_")]
    assert len(public) <= MAX_EDGE_METHODS, f"EdgeModel has {len(public)} public methods: {public}"
