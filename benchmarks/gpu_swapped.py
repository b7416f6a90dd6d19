"""The GPU check's compile arm (benchmarks/gpu_process.py) replayed through the edge's ``Runner`` on
any device: ramped clips' forwards, one clip after another in one process, the background
compilations waited for after the first, and per clip what the compiler did beside it.

    .venv/bin/python benchmarks/gpu_swapped.py                      # dynamo's eager backend: seconds
    .venv/bin/python benchmarks/gpu_swapped.py --backend inductor   # real compiles: minutes on a CPU

The batches are those of a clip's pipeline beside a GPU (ramped chunks, then ``--chunk`` pairs a
forward, the last what is left), through the tiny model. Graphs are on, replayed through a stand-in
that keeps the function captured and calls it again (a CUDA graph keeps no function; the stand-in
that keeps only what CUDA keeps records under a dispatch mode, which stops dynamo compiling new
shapes, so the counts would be wrong under it). Per clip: its seconds, the keys asked of the
compiler during it (each compiles beside the forwards), the stage calls replayed, dynamo's frames
compiled, and the compilations' seconds. Found with it: the H200's "compiled, swapped in" clip of
2026-11-28 was the process's second ramped clip, and asked for four more keys (docs/gpu.md,
"Compiled in the background").
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eden_serve import edge as edge_package  # noqa: E402
from eden_serve.clips.levels import chunk_end  # noqa: E402
from eden_serve.config import PRESETS  # noqa: E402
from eden_serve.edge import Acceleration, Compile, EdgeModel, middles_of  # noqa: E402
from eden_serve.model import synthetic  # noqa: E402
from eden_serve.model.checkpoint import module_from_state  # noqa: E402
from eden_serve.wire import Conditions  # noqa: E402

CONFIG = PRESETS["tiny"]


class CallingGraphs:
    """A graph API whose "graph" is the function captured and its static output: a replay calls
    the function again and writes the result there. Replays counted."""

    def __init__(self):
        self.replays = 0

    def capture(self, fn):
        fn()  # the warm-up, as CUDA's
        out = fn()
        return (fn, out), out, 0

    def replay(self, graph):
        self.replays += 1
        fn, out = graph
        out.copy_(fn())

    def release(self, graph):
        pass

    def ordered(self):
        return contextlib.nullcontext()


def ramped(pairs: int, chunk: int) -> list[int]:
    """The batches of a clip of ``pairs`` pairs as its pipeline cuts them beside a GPU."""
    batches, first = [], 0
    while first < pairs:
        end = min(chunk_end(first, chunk, ramp=True), pairs)
        batches.append(end - first)
        first = end
    return batches


def conditions(seed: int, batch: int) -> list[Conditions]:
    tokens = torch.randn(2, 48, CONFIG.hidden_dim, generator=torch.Generator().manual_seed(seed))
    return [Conditions(tokens, tokens.flip(0), 0.4, 0.2, 0.3, (6, 8), (91, 125), seed + i) for i in range(batch)]


def frames() -> int:
    """Dynamo's frames compiled so far (none before its import, which the compiling thread may be
    in the middle of)."""
    counters = getattr(sys.modules.get("torch._dynamo.utils"), "counters", None)
    return counters["frames"]["total"] if counters is not None else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="eager", help="dynamo's backend (eager: dynamo alone, seconds; inductor: minutes on a CPU)")
    parser.add_argument("--clips", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=199, help="pairs a clip (199: the GPU check's 200 frames)")
    parser.add_argument("--chunk", type=int, default=16, help="pairs a forward once ramped (480x854's batch on a GPU)")
    args = parser.parse_args()
    edge_package.onednn_linear_available = lambda *a: False  # compiled code runs torch's products
    edge = EdgeModel(module_from_state(synthetic.state_dict(CONFIG, seed=0), "edge", CONFIG), CONFIG)
    graphs = CallingGraphs()
    edge.accelerate(Acceleration(compile=Compile(backend=args.backend), capture_at=3), graphs)
    runner, batches = edge.runner, ramped(args.pairs, args.chunk)
    print(f"batches of a clip: {batches}; torch {torch.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}", flush=True)
    for clip in range(args.clips):
        asked, replays, compiled, started = set(runner.background.asked), graphs.replays, frames(), time.monotonic()
        for seed, batch in enumerate(batches):
            middles_of(edge, conditions(seed, batch))
        seconds = time.monotonic() - started
        new = sorted((key[0], key[1]) for key in runner.background.asked - asked)
        print(f"clip {clip + 1}: {seconds:.2f} s; keys asked during it {len(new)} {new}; stage calls replayed "
              f"{graphs.replays - replays} of {2 * len(batches)}; dynamo frames {frames() - compiled}", flush=True)
        waited, compiled = time.monotonic(), frames()
        runner.wait_compiled()
        took = [round(runner.background.seconds[key], 1) for key in runner.background.asked - asked if key in runner.background.seconds]
        print(f"  then waited {time.monotonic() - waited:.1f} s for its compilations ({took} s each; dynamo frames "
              f"{frames() - compiled}); swapped in: {sorted((key[0], key[1]) for key in runner.swapped)}", flush=True)
    runner.close()


if __name__ == "__main__":
    main()
