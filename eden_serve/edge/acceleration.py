"""How the edge's forward runs on its device, switched in one place: eagerly, compiled with
``torch.compile``, and/or replayed from CUDA graphs. Each is named, optional and measured
(``benchmarks/gpu_check.py``; docs/gpu.md "CUDA graphs and torch.compile").

Users switch them where they look: ``eden-serve interpolate|bench --cuda-graphs auto|on|off
--compile auto|off|MODE``, and for TorchServe the edge archive's model-config.yaml
(``handler.cuda_graphs``; the ``pt2`` section for ``torch.compile``, as TorchServe documents it).
``auto`` (both defaults): graphs on a GPU, nothing on a CPU, and nothing compiled unless asked: by a
mode, by ``pt2``, or by compiled artefacts prepared ahead (:meth:`Acceleration.with_prepared`), which
inductor then compiles from in the background (:mod:`.compiling`), block by block
(:class:`~.forward.Regions`). Compiling beside the forwards shares the host with them: on an H200
a 1080p clip ran 20.6 pairs/s while inductor compiled in the background, 34.7 with graphs alone,
and its first middle took 9.5 s instead of 3.8 (docs/gpu.md, 2026-11-28).
"""

from __future__ import annotations

import argparse
import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Hashable, Literal

import torch

from ..errors import BadInputError
from .compiling import Background, allow_recompiles, persistent_cache, settle_device_guards
from .forward import StageInputs
from .graphs import CudaGraphs, GraphAPI, GraphCache
from .streams import capture_gate

GRAPH_MODES = ("auto", "on", "off")  # auto: on for CUDA devices
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_SETTINGS = ("auto", "off", *COMPILE_MODES)  # the command line's: auto compiles only from prepared artefacts
# Inductor's modes that capture CUDA graphs of their own: ours stay off under them.
INDUCTOR_GRAPH_MODES = ("reduce-overhead", "max-autotune")
SCOPES = ("blocks", "stages")
PT2_KEYS = ("enable", "backend", "mode", "fullgraph", "scope", "background")


@dataclass(frozen=True)
class Compile:
    """``torch.compile``'s options for the forward (static shapes: one compilation per key).
    ``scope``: ``blocks`` compiles the repeated block functions (one artefact per shape for all the
    DiT's blocks, one for the decoder's) and the small work around them, ``stages`` each stage
    whole. ``background``: compile beside the forwards and swap the result in when ready
    (:mod:`.compiling`), a key once it has run ``after`` times among its stage's last ``within``
    calls; else at a key's first forward, which waits. Counted within a window, not over the
    process's life, so that shapes met once or twice per clip (a ramped clip's chunks of 1 and 8
    pairs, its last) stay uncompiled however many clips a process runs: counted for life, an H200's
    second compiled clip ran 72.5 pairs/s where graphs alone had run 186.5, and a replay of its
    forwards on a CPU showed it asking for four more keys, compiled beside it (docs/gpu.md,
    "Compiled in the background")."""

    backend: str = "inductor"
    mode: str = "default"
    fullgraph: bool = False
    scope: str = "blocks"
    background: bool = True
    after: int = 3
    within: int = 16  # a 200-frame clip at 480x854 is 17 forwards

    def __post_init__(self):
        if self.mode not in COMPILE_MODES:
            raise BadInputError(f"unknown compile mode {self.mode!r}; use one of {', '.join(COMPILE_MODES)}")
        if self.scope not in SCOPES:
            raise BadInputError(f"unknown compile scope {self.scope!r}; use one of {', '.join(SCOPES)}")
        if not isinstance(self.backend, str) or not all(isinstance(v, bool) for v in (self.fullgraph, self.background)):
            raise BadInputError(f"compile backend must be a name, fullgraph and background true or false, got "
                                f"{self.backend!r}, {self.fullgraph!r}, {self.background!r}")

    @classmethod
    def from_pt2(cls, pt2: object) -> "Compile | None | Literal['auto']":
        """model-config.yaml's ``pt2`` section, ``{compile: {enable: true, backend: inductor, mode:
        ...}}`` as TorchServe documents it: the options, None where not enabled, ``auto`` where the
        section is absent (as the command line's default: compiled only from prepared artefacts)."""
        if pt2 is None:
            return "auto"
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
        """``fn`` under ``torch.compile``, made at its first call: making it imports dynamo and the
        backend (2.6 s on a CPU, about half of the 8.8 s an H200 spent loading the model before its
        first middle), which in the background belongs on the compiling thread."""
        made: list[Callable] = []
        lock = threading.Lock()

        def compiled(*args, **kwargs):
            if not made:
                with lock:
                    if not made:
                        allow_recompiles()
                        made.append(torch.compile(fn, backend=self.backend, mode=None if self.mode == "default" else self.mode,
                                                  fullgraph=self.fullgraph, dynamic=False))
            return made[0](*args, **kwargs)

        return compiled

    def prepare(self) -> None:
        """The process's compiler settings that must precede any use: inductor's artefacts kept on
        disk, the device guards settled (dynamo's own, enough recompilations, are set as the first
        function compiles)."""
        settle_device_guards()
        if self.backend == "inductor":
            persistent_cache()


@dataclass(frozen=True)
class Acceleration:
    """What runs the forward: ``cuda_graphs`` (auto: on for CUDA), ``compile`` (None: off; auto:
    off, and :class:`Compile`'s defaults on CUDA where artefacts were prepared), and the graph
    cache's bounds, ``max_graphs`` graphs and ``graph_bytes`` of memory (None: half the GPU's), and
    the call of a key that captures its graph, ``capture_at``: the third, so that shapes met once or
    twice (a ramped clip's first chunks of 1, 1, 2, 4 pairs, its last chunk, an odd request) run
    uncaptured rather than each paying a capture (two warm-up runs and the capture) and a pool."""

    cuda_graphs: str = "auto"
    compile: Compile | None | Literal["auto"] = "auto"
    max_graphs: int = 16
    graph_bytes: int | None = None
    capture_at: int = 3

    def __post_init__(self):
        if self.cuda_graphs not in GRAPH_MODES:
            raise BadInputError(f"unknown cuda graphs setting {self.cuda_graphs!r}; use one of {', '.join(GRAPH_MODES)}")
        if not isinstance(self.capture_at, int) or self.capture_at < 1:
            raise BadInputError(f"capture_at must be a whole number of calls from 1, got {self.capture_at!r:.60}")
        if not (self.compile is None or self.compile == "auto" or isinstance(self.compile, Compile)):
            raise BadInputError(f"compile must be auto, None or a Compile, got {self.compile!r:.60}")

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The command line's switches (``eden-serve interpolate``); :meth:`from_arguments` reads them."""
        parser.add_argument("--cuda-graphs", choices=GRAPH_MODES, default="auto",
                            help="replay the edge's forward from CUDA graphs, one per frame size and batch; auto: on a GPU (default auto)")
        parser.add_argument("--compile", choices=COMPILE_SETTINGS, default="auto",
                            help="torch.compile the edge's forward with inductor, in the background (the first middles do "
                                 "not wait; cached on disk for the next run): a mode compiles in that mode; auto compiles "
                                 "only from --compiled artefacts; off never (default auto)")
        parser.add_argument("--compiled", metavar="FILE",
                            help="the compiled forward made ahead (eden-serve archive --prepare writes MODEL_STORE/"
                                 "eden_ditdec.compiled.bin): auto then compiles its shapes from it, in the background; one made for another "
                                 "GPU, driver, PyTorch or model is refused with a warning")

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> "Acceleration":
        """The switches of :meth:`add_arguments`, their defaults where a command has none of them."""
        setting = getattr(args, "compile", "auto")
        compile = setting if setting == "auto" else None if setting == "off" else Compile(mode=setting)
        return cls(getattr(args, "cuda_graphs", "auto"), compile)

    def compiler(self, device: torch.device) -> Compile | None:
        """The compile options on ``device``, ``auto`` resolved (uncompiled); None: uncompiled."""
        return None if self.compile == "auto" else self.compile

    def with_prepared(self, device: torch.device) -> "Acceleration":
        """These settings where compiled artefacts were prepared for the edge (``--compiled``, the
        archive's ``compiled.bin``): ``auto`` then compiles from them in the background on a GPU."""
        if self.compile == "auto" and device.type == "cuda":
            return replace(self, compile=Compile())
        return self

    def graphs_on(self, device: torch.device) -> bool:
        """Whether this edge replays CUDA graphs on ``device``; a contradiction is a clear error."""
        compile = self.compiler(device)
        inductors = compile is not None and compile.mode in INDUCTOR_GRAPH_MODES
        if self.cuda_graphs == "on" and device.type != "cuda":
            raise BadInputError(f"CUDA graphs need a CUDA device, and the edge runs on {device}; use --cuda-graphs auto or off")
        if self.cuda_graphs == "on" and inductors:
            raise BadInputError(f"compile mode {compile.mode} captures CUDA graphs itself; use --cuda-graphs auto or off with it")
        return self.cuda_graphs != "off" and device.type == "cuda" and not inductors

    def describe(self, device: torch.device) -> str:
        graphs, compile = "CUDA graphs" if self.graphs_on(device) else "eager", self.compiler(device)
        if compile is None:
            return graphs
        how = "in the background" if compile.background else "at first use"
        return f"{graphs}, compiled {how} ({compile.backend}, {compile.mode}, {compile.scope})"


def bucket(batch: int) -> int:
    """The batch a graph is captured for: the next power of two, so that a few graphs serve every
    batch size (scene cuts and a clip's last chunk make odd ones)."""
    return 1 << (batch - 1).bit_length()


Stage = Callable[[StageInputs], torch.Tensor]


@dataclass(frozen=True)
class _Job:
    """What compiling a key takes: its stage, what the compiled code is specialised on of its
    per-call tensors (shape, strides, dtype, device, whether made under inference mode), and its
    constants."""

    name: str
    specs: tuple[tuple, ...]
    constants: StageInputs
    batch: int

    def zeros(self) -> tuple[torch.Tensor, ...]:
        made = []
        for shape, stride, dtype, device, inference in self.specs:
            with torch.inference_mode(inference):
                made.append(torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_())
        return tuple(made)


class Runner:
    """Runs the forward's named ``stages`` as :class:`Acceleration` says: replayed from a graph of
    their key where graphs are on, else called; compiled (``compiled``: the same stages under
    ``torch.compile``) where asked, at once or, in the background, once ready. ``api`` puts a
    stand-in for CUDA graphs on any device."""

    def __init__(self, acceleration: Acceleration, device: torch.device, stages: dict[str, Stage],
                 compiled: dict[str, Stage] | None = None, api: GraphAPI | None = None):
        self.acceleration, self.device, self.stages = acceleration, device, stages
        self.compile = acceleration.compiler(device) if compiled is not None else None
        self.compiled = compiled if self.compile is not None else None
        self.graphs: GraphCache | None = None
        self.gate = capture_gate(device)
        if api is not None or acceleration.graphs_on(device):
            limit = acceleration.graph_bytes
            if limit is None:
                limit = torch.cuda.get_device_properties(device).total_memory // 2 if device.type == "cuda" else 1 << 62
            self.graphs = GraphCache(api or CudaGraphs(device), acceleration.max_graphs, limit, self.gate, acceleration.capture_at)
        self.background: Background | None = None
        if self.compile is not None:
            self.compile.prepare()
            if self.compile.background:
                self.background = Background(self._swap_in, device)
        self.swapped: set[Hashable] = set()  # keys whose compiled form runs now
        self._recent: dict[str, deque] = {}  # each stage's last keys called, up to ``within``

    def __call__(self, name: str, inputs: StageInputs) -> torch.Tensor:
        """Stage ``name`` of the forward on ``inputs``."""
        tensors = inputs.per_call()
        key, batch = self._key(name, inputs)
        fn = self._function(name, key, inputs, batch)
        if self.graphs is None:
            return fn(inputs)
        # The graph reads these, not the call's own: its entry holds them (the embedding cache may evict them).
        constants = inputs.with_per_call([None] * len(tensors))
        return self.graphs.run(key, lambda static: fn(constants.with_per_call(static)), tensors, batch, holds=constants)

    def _key(self, name: str, inputs: StageInputs) -> tuple[Hashable, int]:
        """The key of a call (its stage, the batch of its graph, its fixed shape, its tensors' own) and that batch."""
        tensors = inputs.per_call()
        batch = bucket(len(tensors[0])) if self.graphs is not None else len(tensors[0])
        return (name, batch, inputs.shape_key(), tuple((tuple(t.shape[1:]), t.dtype) for t in tensors)), batch

    def ahead(self, name: str, inputs: StageInputs) -> None:
        """Compile stage ``name`` for calls shaped as ``inputs`` now, in the background, before any
        such call: a shape whose artefacts were loaded (:mod:`.artefacts`) then compiles from them
        while the first forwards run uncompiled, and is swapped in seconds later."""
        if self.background is not None:
            key, batch = self._key(name, inputs)
            self._ask(name, key, inputs, batch)

    def _function(self, name: str, key: Hashable, inputs: StageInputs, batch: int) -> Stage:
        """The compiled stage where it is ready (or compiles at its first use), else the eager one,
        asking for its compilation once the key has run often enough."""
        if self.compiled is None:
            return self.stages[name]
        if self.background is None:
            return self.compiled[name]
        recent = self._recent.setdefault(name, deque(maxlen=self.compile.within))
        recent.append(key)  # the swapped keys' calls too: the window is the stage's last calls, whatever ran them
        if key in self.swapped:
            return self.compiled[name]
        if key not in self.background.asked and recent.count(key) >= self.compile.after:
            self._ask(name, key, inputs, batch)
        return self.stages[name]

    def _ask(self, name: str, key: Hashable, inputs: StageInputs, batch: int) -> None:
        tensors = inputs.per_call()
        if self.graphs is not None:  # the graph's static buffers: the batch of the key, contiguous, made by the cache
            specs = tuple(((batch, *t.shape[1:]), torch.empty((batch, *t.shape[1:]), device="meta").stride(), t.dtype, t.device,
                           torch.is_inference_mode_enabled()) for t in tensors)
        else:
            specs = tuple((tuple(t.shape), t.stride(), t.dtype, t.device, t.is_inference()) for t in tensors)
        self.background.ask(key, _Job(name, specs, inputs.with_per_call([None] * len(tensors)), batch))

    def _swap_in(self, key: Hashable, job: _Job) -> None:
        """On the compiling thread: ``key``'s stage compiled (run once on zeros of its shapes, beside
        the forwards), then its graph captured anew in place of the eager one, in one turn."""
        fn, tensors = self.compiled[job.name], job.zeros()
        with self.gate.shared():  # compiled, autotuned and run once: it waits for the whole device, so no capture meanwhile
            fn(job.constants.with_per_call(tensors))
        if self.graphs is not None and not self.background.closed:
            self.graphs.replace(key, lambda static: fn(job.constants.with_per_call(static)), tensors, job.batch, holds=job.constants)
        if not self.background.closed:
            self.swapped.add(key)

    def hold(self, call: Callable[[], None]) -> None:
        """Run ``call`` (work toward compiling ahead: :func:`.artefacts.load_into`'s) on the compiling
        thread once :meth:`release` is called, not before: until then nothing of it shares the
        interpreter with the forwards."""
        if self.background is not None:
            self.background.hold(call)

    def release(self) -> None:
        """Start what :meth:`hold` holds: a clip in process calls it once its first middle has been
        handed to the writer (:func:`eden_serve.clips.pipeline.interpolate_clip_in_process`), a
        served edge at load (:class:`eden_serve.serving.services.EdgeService`); idempotent."""
        if self.background is not None:
            self.background.release()

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait for the compilations asked so far, those held released first (whoever waits for
        them wants them now); False on the timeout."""
        self.release()
        return self.background is None or self.background.wait(timeout)

    def close(self) -> None:
        """Compile nothing more and release the graphs."""
        if self.background is not None:
            self.background.close()
        if self.graphs is not None:
            self.graphs.clear()
