"""One fresh process of the GPU check (benchmarks/gpu_check.py starts it): ``eden-serve interpolate``
on video files as a user runs it, with the start-up timed from the command and taken apart
(interpreter and imports, CUDA context, weights read, first middle), then the other clips, and what
the process is for:

- ``cold`` (a fresh inductor cache): then the golden cases compiled (bf16, inductor, our graphs
  around it: the compiled fidelity); then the compile arm (``--compile-arm LABEL``): that clip again
  compiled in the background (``--compile default``, opt-in since 2026-11-28), the compilations
  waited for, and the clip once more with them swapped in; their artefacts written for the
  ``prepared`` process (``--save-compiled``, the file ``eden-serve archive --prepare`` makes:
  eden_serve/edge/artefacts.py);
- ``warm``: the defaults again in a second process (the disk's caches warm), then the first clip's
  defaults once more and the options against them (``--alternatives``), and the other clips' against
  the encoder's options;
- ``prepared``: an empty inductor cache and the cold process's compilations as prepared artefacts
  (``--compiled``), loaded as ``eden-serve interpolate --compiled`` loads them: the start-up with
  prepared artefacts, compiling from them, waited for, and the clip again with them swapped in.

``--t0`` is the wall-clock time at which the parent started this command. Each result is a JSON line
on stdout, as it comes. The process keeps within ``--budget`` seconds (what would not fit is a row
saying so).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# What the command imports as it starts, no more: the start-up's first part ends here. The benchmark's
# own modules are imported where they are first used (gpu_clip with the first clip, as the command
# imports PyAV when it opens the video; gpu_correct after the clips).
STARTED = time.time()  # the interpreter up, before any import of this script's own
import torch  # noqa: E402

TORCH_IMPORTED = time.time()
from eden_serve.commands import cli, shared as commands  # noqa: E402
from eden_serve.model.checkpoint import module_from_state  # noqa: E402
from eden_serve.config import PRESETS  # noqa: E402
from eden_serve.edge import Acceleration, Compile, EdgeModel, artefacts  # noqa: E402
from eden_serve.edge.graphs import RerunGraphs  # noqa: E402
from eden_serve.edge.precision import check_bf16  # noqa: E402

IMPORTED = time.time()
LAZY = ("gpu_clip", "gpu_correct")  # benchmarks/, beside this script
LEAST = {"clip": 20, "golden compiled": 30}  # seconds a step needs left to be started (quick: a quarter)


class Child:
    """This process's device, clock and rows (what gpu_correct's sections ask of a run)."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.device = args, torch.device(args.device)
        self.deadline = time.monotonic() + args.budget
        self.config = PRESETS[args.config]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def fits(self, step: str) -> bool:
        return self.left() >= LEAST[step] / (4 if self.args.quick else 1)

    def row(self, section: str, **fields) -> dict:
        row = {"section": section, "process": self.args.process, **fields}
        print(json.dumps(row), flush=True)
        return row

    def precisions(self) -> tuple[str, ...]:
        return ("bf16",) if check_bf16(self.device).fast else ("fp32",)

    def edge(self, precision: str, mode: str, state: dict, config) -> EdgeModel:
        """The golden edge compiled as this process's default would compile it, at first use."""
        edge = EdgeModel(module_from_state(state, "edge", config), config, self.device, precision)
        cuda = self.device.type == "cuda"
        compile = Compile(backend="inductor" if cuda else "eager", background=False)
        edge.accelerate(Acceleration("on" if cuda else "auto", compile, capture_at=1), None if cuda else RerunGraphs())
        return edge


def bench(name: str):
    """One of this directory's modules, imported at first use (see :data:`LAZY`)."""
    assert name in LAZY, name
    return importlib.import_module(name)


def command(args: argparse.Namespace, src: Path, argv: list[str] = ()) -> list[str]:
    prepared = ["--compiled", str(args.compiled)] if args.compiled else []
    return ["interpolate", str(src), "-o", "unused.mp4", "--device", args.device, "--config", args.config,
            "--checkpoint", str(args.checkpoint), *prepared, *argv]


def started(child: Child, clips: list[tuple[str, str, Path]]):
    """The first clip run as the command runs it, the models loaded by its own call (beside the
    decoder's choice): the start-up's parts, and the models for the rest."""
    args = child.args
    marks = {"interpreter and imports": IMPORTED}
    if child.device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=child.device)
    marks["CUDA context"] = time.time()
    parsed = cli._build_parser().parse_args(command(args, clips[0][2]))
    prepared = []

    def load():
        models = commands.load_models(parsed)
        background = models[1].runner.background
        # The artefacts accepted at load: their compilations held until the first middle is handed to the writer.
        prepared.append(len(artefacts.read_header(args.compiled)[0]["shapes"]) if background is not None and background.held else 0)
        return models

    label, pixels, src = clips[0]
    with timed_steps() as weights_parts:
        found = bench("gpu_clip").clip_run(load, src, command(args, src)[4:], command_started=args.t0)
    models = found.pop("models")
    marks["weights"] = found.pop("models_ready_at")  # and the prepared artefacts, where --compiled names them
    marks["first middle"] = args.t0 + found["startup_s"]
    times = [args.t0, *marks.values()]
    parts = {name: later - earlier for name, earlier, later in zip(marks, times, times[1:])}
    # The first part taken apart: the H200 spent 4.7-6.2 s there, 1.2 s on this CPU (torch 1.0).
    import_parts = {"interpreter": STARTED - args.t0, "torch": TORCH_IMPORTED - STARTED, "eden_serve": IMPORTED - TORCH_IMPORTED}
    child.row("clip", size=label, pixels=pixels, options="defaults", startup_parts=parts, import_parts=import_parts,
              weights_parts=weights_parts,
              device_name=device_name(child), prepared_shapes=prepared[0], **found)
    return models


# The steps of load_models, timed where the command calls them: the "weights" part of the start-up
# taken apart (8.8 s on the H200 of 2026-11-28, of which the steps were not known).
STEPS = (("checkpoint read", "eden_serve.model.checkpoint", "load_official"),
         ("models on the device", "eden_serve.commands.shared", "load_pair"),
         ("accelerated", "eden_serve.edge", "EdgeModel.accelerate"),
         ("artefacts loaded", "eden_serve.edge.artefacts", "load_into"))


@contextlib.contextmanager
def timed_steps():
    """Each of :data:`STEPS` wrapped, for the block, in a timer adding its seconds to the dict given.
    They nest: the models on the device include the checkpoint read and the edge's first
    acceleration (its constructor's), which "accelerated" also counts."""
    seconds: dict[str, float] = {}
    undo = []
    for label, module, name in STEPS:
        owner = importlib.import_module(module)
        *path, attribute = name.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, attribute)

        def timer(*a, _original=original, _label=label, **k):
            started = time.time()
            try:
                return _original(*a, **k)
            finally:
                seconds[_label] = seconds.get(_label, 0.0) + time.time() - started

        setattr(owner, attribute, timer)
        undo.append((owner, attribute, original))
    try:
        yield seconds
    finally:
        for owner, attribute, original in reversed(undo):
            setattr(owner, attribute, original)


def device_name(child: Child) -> str:
    return torch.cuda.get_device_name(child.device) if child.device.type == "cuda" else f"cpu ({torch.backends.cpu.get_cpu_capability()})"


def clip(child: Child, models, entry: tuple[str, str, Path], options: str, argv: list[str]) -> dict | None:
    label, pixels, src = entry
    if not child.fits("clip"):
        child.row("clip", size=label, pixels=pixels, options=options, skipped="out of time")
        return None
    found = bench("gpu_clip").clip_run(models, src, command(child.args, src, argv)[4:])
    return child.row("clip", size=label, pixels=pixels, options=options, argv=" ".join(argv), device_name=device_name(child), **found)


def alternatives(child: Child, models, entry, names=None) -> None:
    """The defaults again, then each option set (those ``names`` of them where given), then, where
    all ran, the code's own settings (gpu_clip.SETTINGS) and the defaults once more: the last option set of two H200 runs (the host's decoder
    named, where the trials had chosen it too) outran the defaults by 1.13-1.18, which an effect of
    the order would explain as well."""
    options = bench("gpu_clip").ALTERNATIVES
    rows = [clip(child, models, entry, "defaults, again", [])]
    rows += [clip(child, models, entry, name, options[name]) for name in (names or options)]
    if names is None:
        for name, (module, attribute, value) in bench("gpu_clip").SETTINGS.items():
            with mock.patch.object(importlib.import_module(module), attribute, value):
                rows.append(clip(child, models, entry, name, []))
        rows.append(clip(child, models, entry, "defaults, last", []))
    rows = [r for r in rows if r and "wall_s" in r]
    if any(r["options"] == "defaults, again" for r in rows):
        child.row("clip options", size=entry[0], pixels=entry[1], device_name=device_name(child), **bench("gpu_clip").best_of(rows))


def compiled(child: Child, edge: EdgeModel, waited_from: float) -> None:
    """The background compilations of the clips: waited for within the budget (``--reserve`` seconds
    kept for what follows), then what came of them."""
    background = edge.runner.background
    done = background is None or edge.runner.wait_compiled(max(0.0, child.left() - child.args.reserve - 5))
    child.row("compile", waited_s=time.monotonic() - waited_from, all_done=done,
              asked=len(background.asked) if background else 0, swapped=len(edge.runner.swapped),
              compile_failed=background.failed if background else None,
              seconds_per_key=sorted(background.seconds.values()) if background else [])


def compile_arm(child: Child, models, entry: tuple[str, str, Path]) -> None:
    """The clip ``entry`` compiled in the background: while inductor compiles beside it (a capture
    meanwhile put off: eden_serve/edge/streams.CaptureGate), then, the compilations waited for
    within the budget, again with the compiled keys swapped in."""
    argv = ["--compile", "default"]
    clip(child, models, entry, "compiled in the background", argv)
    swapped_in(child, models, entry, "compiled, swapped in", argv)


def swapped_in(child: Child, models, entry: tuple[str, str, Path], options: str, argv: list[str]) -> None:
    """The compilations asked so far waited for, then the clip ``entry`` again where any were swapped in."""
    compiled(child, models[1], time.monotonic())
    if models[1].runner.swapped:
        clip(child, models, entry, options, argv)


def save_compiled(child: Child, edge: EdgeModel, clips: list[tuple[str, str, Path]], path: Path) -> None:
    """The compilations of this process as prepared artefacts for the next (``eden-serve archive
    --prepare``'s file), the clips' shapes at the pairs a forward takes."""
    if edge.runner.compile is None:
        child.row("artefacts", skipped="the edge is not compiled here")
        return
    started = time.monotonic()
    shapes = []
    for _, pixels, _ in clips:
        height, width = (int(v) for v in pixels.split("x"))
        shapes.append((height, width, edge.sizing.pairs(edge.config.patch_grid(height, width))))
    artefacts.write(path, artefacts.key(edge, edge.runner.compile), shapes, artefacts.saved())
    child.row("artefacts", shapes=shapes, bytes=path.stat().st_size, write_s=time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t0", type=float, required=True, help="wall-clock time of the command's start")
    parser.add_argument("--process", choices=("cold", "warm", "prepared"), required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--config", default="official")
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--clip", action="append", required=True, metavar="LABEL=HxW=PATH", help="in order; the first is timed from the command")
    parser.add_argument("--alternatives", action="store_true", help="the options against the defaults, on the first clip; the encoder's on the others")
    parser.add_argument("--golden-compiled", action="store_true")
    parser.add_argument("--compile-arm", metavar="LABEL", help="that clip again compiled in the background, waited for, and swapped in")
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--reserve", type=float, default=0.0, help="seconds of the budget kept from the compile wait for what follows it")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--save-compiled", type=Path, help="write this process's compilations as prepared artefacts here")
    parser.add_argument("--compiled", type=Path, help="prepared artefacts, loaded as eden-serve interpolate --compiled loads them")
    args = parser.parse_args()
    child = Child(args)
    torch.set_float32_matmul_precision("highest")
    clips = [(label, pixels, Path(path)) for label, pixels, path in (entry.split("=", 2) for entry in args.clip)]
    models = started(child, clips)
    for entry in clips[1:]:
        clip(child, models, entry, "defaults", [])
    if args.golden_compiled:  # before the compile arm: dynamo compiles one thing at a time
        if child.fits("golden compiled"):
            bench("gpu_correct").golden(child, modes=("compiled",))
        else:
            child.row("golden", mode="compiled", skipped="out of time")
    arm = [entry for entry in clips if entry[0] == args.compile_arm]
    if arm:
        compile_arm(child, models, arm[0])
    if args.compiled:  # compiling from the prepared artefacts since the load
        swapped_in(child, models, clips[0], "prepared, swapped in", [])
    if args.save_compiled:
        save_compiled(child, models[1], arm, args.save_compiled)
    if args.alternatives:
        alternatives(child, models, clips[0])
        for entry in clips[1:]:
            alternatives(child, models, entry, bench("gpu_clip").SMALLER_ALTERNATIVES)


if __name__ == "__main__":
    main()
