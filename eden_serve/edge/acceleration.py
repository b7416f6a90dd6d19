"""How the edge's forward runs on its device, switched in one place: eagerly, compiled with
``torch.compile``, and/or replayed from CUDA graphs. Each is named, optional and measured
(``benchmarks/gpu_check.py``; docs/gpu.md "CUDA graphs and torch.compile").

Users switch them where they look: ``eden-serve interpolate|bench --cuda-graphs auto|on|off
--compile MODE``, and for TorchServe the edge archive's model-config.yaml (``handler.cuda_graphs``;
the ``pt2`` section for ``torch.compile``, as TorchServe documents it).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import BadInputError
from .forward import StageInputs
from .graphs import CudaGraphs, GraphAPI, GraphCache

GRAPH_MODES = ("auto", "on", "off")  # auto: on for CUDA devices
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Inductor's modes that capture CUDA graphs of their own: ours stay off under them.
INDUCTOR_GRAPH_MODES = ("reduce-overhead", "max-autotune")
PT2_KEYS = ("enable", "backend", "mode", "fullgraph")


@dataclass(frozen=True)
class Compile:
    """``torch.compile``'s options for the forward's stages (static shapes: one compilation per key)."""

    backend: str = "inductor"
    mode: str = "default"
    fullgraph: bool = False

    def __post_init__(self):
        if self.mode not in COMPILE_MODES:
            raise BadInputError(f"unknown compile mode {self.mode!r}; use one of {', '.join(COMPILE_MODES)}")
        if not isinstance(self.backend, str) or not isinstance(self.fullgraph, bool):
            raise BadInputError(f"compile backend must be a name and fullgraph true or false, got {self.backend!r}, {self.fullgraph!r}")

    @classmethod
    def from_pt2(cls, pt2: object) -> "Compile | None":
        """model-config.yaml's ``pt2`` section, ``{compile: {enable: true, backend: inductor, mode:
        ...}}`` as TorchServe documents it: the options, or None where absent or not enabled."""
        if pt2 is None:
            return None
        options = pt2.get("compile") if isinstance(pt2, dict) and set(pt2) == {"compile"} else None
        if not isinstance(options, dict) or not set(options) <= set(PT2_KEYS) or not isinstance(options.get("enable"), bool):
            raise BadInputError(f"model-config.yaml: pt2 must be {{compile: {{enable: true|false, backend: ..., mode: ...}}}} "
                                f"with keys among {', '.join(PT2_KEYS)}, got {pt2!r:.200}")
        if not options["enable"]:
            return None
        try:
            return cls(**{k: v for k, v in options.items() if k != "enable" and v is not None})
        except BadInputError as exc:
            raise BadInputError(f"model-config.yaml: pt2.compile: {exc}") from None

    def wrap(self, fn: Callable) -> Callable:
        return torch.compile(fn, backend=self.backend, mode=None if self.mode == "default" else self.mode,
                             fullgraph=self.fullgraph, dynamic=False)


@dataclass(frozen=True)
class Acceleration:
    """What runs the forward: ``cuda_graphs`` (auto: on for CUDA), ``compile`` (None: off), and the
    bounds of the graph cache: ``max_graphs`` graphs, ``graph_bytes`` of memory (None: half the GPU's)."""

    cuda_graphs: str = "auto"
    compile: Compile | None = None
    max_graphs: int = 16
    graph_bytes: int | None = None

    def __post_init__(self):
        if self.cuda_graphs not in GRAPH_MODES:
            raise BadInputError(f"unknown cuda graphs setting {self.cuda_graphs!r}; use one of {', '.join(GRAPH_MODES)}")

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The command line's switches (``eden-serve interpolate``); :meth:`from_arguments` reads them."""
        parser.add_argument("--cuda-graphs", choices=GRAPH_MODES, default="auto",
                            help="replay the edge's forward from CUDA graphs, one per frame size and batch; auto: on a GPU (default auto)")
        parser.add_argument("--compile", choices=("off", *COMPILE_MODES), default="off",
                            help="torch.compile the edge's forward in this mode (compiling takes minutes at first use; default off)")

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> "Acceleration":
        """The switches of :meth:`add_arguments`, their defaults where a command has none of them."""
        mode = getattr(args, "compile", "off")
        return cls(getattr(args, "cuda_graphs", "auto"), None if mode == "off" else Compile(mode=mode))

    def graphs_on(self, device: torch.device) -> bool:
        """Whether this edge replays CUDA graphs on ``device``; a contradiction is a clear error."""
        inductors = self.compile is not None and self.compile.mode in INDUCTOR_GRAPH_MODES
        if self.cuda_graphs == "on" and device.type != "cuda":
            raise BadInputError(f"CUDA graphs need a CUDA device, and the edge runs on {device}; use --cuda-graphs auto or off")
        if self.cuda_graphs == "on" and inductors:
            raise BadInputError(f"compile mode {self.compile.mode} captures CUDA graphs itself; use --cuda-graphs auto or off with it")
        return self.cuda_graphs != "off" and device.type == "cuda" and not inductors

    def describe(self, device: torch.device) -> str:
        graphs = "CUDA graphs" if self.graphs_on(device) else "eager"
        return graphs if self.compile is None else f"{graphs}, compiled ({self.compile.backend}, {self.compile.mode})"


def bucket(batch: int) -> int:
    """The batch a graph is captured for: the next power of two, so that a few graphs serve every
    batch size (scene cuts and a clip's last chunk make odd ones)."""
    return 1 << (batch - 1).bit_length()


class Runner:
    """Runs the forward's stages as :class:`Acceleration` says: each stage function through
    ``torch.compile`` where asked (compiled on first use), then replayed from a graph of its key
    where graphs are on, else called. ``api`` puts a stand-in for CUDA graphs on any device."""

    def __init__(self, acceleration: Acceleration, device: torch.device, api: GraphAPI | None = None):
        self.acceleration = acceleration
        self.graphs: GraphCache | None = None
        if api is not None or acceleration.graphs_on(device):
            limit = acceleration.graph_bytes
            if limit is None:
                limit = torch.cuda.get_device_properties(device).total_memory // 2 if device.type == "cuda" else 1 << 62
            self.graphs = GraphCache(api or CudaGraphs(device), acceleration.max_graphs, limit)
        self._compiled: dict[str, Callable] = {}

    def __call__(self, name: str, fn: Callable[[StageInputs], torch.Tensor], inputs: StageInputs) -> torch.Tensor:
        """``fn(inputs)``, a stage of the forward; ``name`` tells the stage (and its output kind)."""
        if self.acceleration.compile is not None:
            if name not in self._compiled:
                self._compiled[name] = self.acceleration.compile.wrap(fn)
            fn = self._compiled[name]
        if self.graphs is None:
            return fn(inputs)
        tensors = inputs.per_call()
        batch = bucket(len(tensors[0]))
        key = (name, batch, inputs.shape_key(), tuple((tuple(t.shape[1:]), t.dtype) for t in tensors))
        constants = inputs.with_per_call([None] * len(tensors))  # the graph keeps these, not the call's tensors
        return self.graphs.run(key, lambda static: fn(constants.with_per_call(static)), tensors, batch)
